"""Helm's own engine for the chart tests (e2e/src/helm.rs): one JSON request on stdin, one JSON
answer on stdout.

It runs Helm v4's Go SDK through PyPI's helm-python-sdk (import name `helm_python`, a ctypes
binding of libhelm_c; no helm binary). Rendering and linting need no cluster; install and
uninstall act on the cluster of a kubeconfig, as the helm CLI does. Requests:

  {"op": "template", "chart": DIR, "values": {...}, "name": N, "namespace": NS,
   "kube_version": "1.36.0" | null}
      What `helm install --dry-run=client --kube-version V` applies: Helm checks the chart's
      kubeVersion against the target and the values against values.schema.json, then renders.
      Answer: {"manifest": "...", "notes": "...", "crds": [{"filename", "data"}]}.
  {"op": "lint", "chart": DIR, "values": {...}, "strict": bool, "kube_version": ...}
      Answer: helm lint's report {"messages": [{"severity", "path", "error"}], "errors": [...]}.
  {"op": "install", "chart": DIR, "values": {...}, "name": N, "namespace": NS,
   "kubeconfig": PATH, "timeout": SECONDS, "skip_crds": bool}
      `helm install N DIR -n NS --wait --timeout SECONDSs [--skip-crds]` against the cluster
      of PATH: the namespace must exist; the CRDs of crds/ first (server-side applied by Helm
      v4, so one another field manager applied differently is a conflict: skip_crds leaves
      them as they are), hooks, then the manifest in Helm's kind order; waits until every
      object is ready (kstatus watcher).
      Answer: {"release": {"name", "namespace", "version", "info": {"status", ...}}}.
  {"op": "uninstall", "name": N, "namespace": NS, "kubeconfig": PATH, "timeout": SECONDS}
      `helm uninstall N -n NS --wait --ignore-not-found`: deletes what the release made (not
      the CRDs, which Helm never deletes) and its release records, waiting until they are gone.
      Answer: {"release": {...}} (null when there was no such release).

Helm refusing (bad values, wrong Kubernetes version, a template error, a failed install) is
an answer, not a failure: {"refused": "<Helm's message>"}. A missing helm_python is
{"unavailable": "..."}.

The kube_version option is not in helm_python's Python signatures (0.2.2) but libhelm_c's
options JSON takes it (Helm's `--kube-version`), so the calls go through helm_python._native
with the same option objects the Python wrappers build.
"""

import json
import sys


def template(helm, native, request):
    name = request["name"]
    namespace = request["namespace"]
    values = request.get("values")
    kube_version = request.get("kube_version")
    values_json = None if values is None else json.dumps(values)
    with helm.Chart.load(request["chart"]) as chart:
        install_opts = {"dry_run": "client", "namespace": namespace}
        render_opts = {"name": name, "namespace": namespace, "is_install": True}
        if kube_version:
            install_opts["kube_version"] = kube_version
            render_opts["kube_version"] = kube_version
        # A memory-backed configuration: a client dry run never contacts a cluster.
        with helm.Config(namespace=namespace, storage_driver="memory") as config:
            release = json.loads(
                native.call_string(
                    "helm_install",
                    config._raw(),
                    native.HANDLE(0),
                    chart._raw(),
                    None,
                    name,
                    values_json,
                    json.dumps(install_opts),
                )
            )
        # The release summary carries no notes: NOTES.txt comes from the same engine's render.
        rendered = json.loads(
            native.call_string("helm_render", chart._raw(), values_json, json.dumps(render_opts))
        )
        notes = next((text for path, text in rendered.items() if path.endswith("/NOTES.txt")), "")
        crds = [{"filename": c["filename"], "data": c["data"]} for c in chart.crds]
    return {"manifest": release["manifest"], "notes": notes, "crds": crds}


def lint(helm, request):
    return helm.lint(
        request["chart"],
        request.get("values"),
        strict=request.get("strict"),
        namespace=request.get("namespace"),
        kube_version=request.get("kube_version"),
    )


def release_summary(release):
    """The release without its manifest and chart (large; the tests render those themselves)."""
    if not isinstance(release, dict):
        return release
    inner = release.get("release", release)
    if not isinstance(inner, dict):
        return inner
    return {k: v for k, v in inner.items() if k not in ("manifest", "chart", "config")}


def install(helm, native, request):
    namespace = request["namespace"]
    values = request.get("values")
    # Config.install's options plus skip_crds (Helm's --skip-crds), which its Python signature
    # lacks (0.2.2) but libhelm_c's options JSON takes: the same call, with one more option.
    options = {
        "namespace": namespace,
        "timeout_seconds": request.get("timeout"),
        "wait": "watcher",
        "skip_crds": bool(request.get("skip_crds")) or None,
    }
    options = {k: v for k, v in options.items() if v is not None}
    with helm.Chart.load(request["chart"]) as chart, helm.Config(
        kubeconfig_path=request["kubeconfig"], namespace=namespace
    ) as config:
        release = json.loads(
            native.call_string(
                "helm_install",
                config._raw(),
                native.HANDLE(0),
                chart._raw(),
                None,
                request["name"],
                None if values is None else json.dumps(values),
                json.dumps(options),
            )
        )
    return {"release": release_summary(release)}


def uninstall(helm, request):
    namespace = request["namespace"]
    with helm.Config(kubeconfig_path=request["kubeconfig"], namespace=namespace) as config:
        release = config.uninstall(
            request["name"],
            timeout=request.get("timeout"),
            wait="watcher",
            ignore_not_found=True,
        )
    return {"release": release_summary(release)}


def main():
    request = json.load(sys.stdin)
    try:
        import helm_python as helm
        from helm_python import _native as native
    except ImportError as e:
        why = f"{e} (pip install helm-python-sdk; .ci/run installs it)"
        json.dump({"unavailable": why}, sys.stdout)
        return
    try:
        if request["op"] == "template":
            answer = template(helm, native, request)
        elif request["op"] == "lint":
            answer = {"report": lint(helm, request)}
        elif request["op"] == "install":
            answer = install(helm, native, request)
        elif request["op"] == "uninstall":
            answer = uninstall(helm, request)
        else:
            raise SystemExit(f"unknown op {request['op']!r}")
    except helm.HelmError as e:
        answer = {"refused": str(e)}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
