//! The Helm chart against the binaries, rendered by Helm's own engine (v4's Go SDK through
//! PyPI's helm-python-sdk; knic_e2e::helm) the way `helm install` would apply it, with
//! values.yaml and with charts/knic/ci/all-on-values.yaml, every object typed (unknown kinds
//! and fields fail), and checked:
//!
//! * RBAC (chart/rbac.rs): every call of the driver and the controller is granted, nothing
//!   more.
//! * Admission policies (chart/policies.rs): evaluated against allowed and forbidden requests.
//! * The controller Deployment and the driver DaemonSet: the same image, only flags and
//!   variables the binaries know, probes on the HTTP port, the least privilege each needs.
//! * The driver's RBAC on a real apiserver with a node-bound token (chart/rbac_real.rs, a
//!   real twin): no pod readable by default, the opt-in's pod read, what the driver needs.
//! * Values (chart/values.rs): `helm lint --strict` clean, values.schema.json refusing bad
//!   values by name, kubeVersion refusing 1.33, extendedResourceName only on 1.36+, NOTES.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, ServiceAccount};
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use knic_e2e::helm::{self, Rendered};
use libtest_mimic::{Failed, Trial};
use serde_json::{Value, json};

#[path = "chart/policies.rs"]
mod policies;
#[path = "chart/rbac.rs"]
mod rbac;
#[path = "chart/rbac_real.rs"]
mod rbac_real;
#[path = "chart/values.rs"]
mod values;

use rbac::{CONTROLLER, DRIVER, DRIVER_POD_LABEL_READS, Rbac, covers, minimal};

/// The namespace the chart is rendered into.
const RELEASE_NAMESPACE: &str = helm::RELEASE_NAMESPACE;
const DRIVER_SA: &str = "knic-driver";
const CONTROLLER_SA: &str = "knic-controller";

/// Helm's render with the chart's default values (rendered once, shared by the trials).
fn defaults() -> anyhow::Result<&'static Rendered> {
    static DEFAULTS: OnceLock<Result<Rendered, String>> = OnceLock::new();
    DEFAULTS
        .get_or_init(|| helm::render(&json!({}), None).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("rendering the chart with its defaults: {e}"))
}

/// The objects of template files `files` of the default render, as the apiserver gets them.
fn objects(files: &[&str]) -> anyhow::Result<Vec<Value>> {
    let rendered = defaults()?;
    Ok(files
        .iter()
        .flat_map(|f| rendered.from_file(f))
        .map(helm::Object::to_json)
        .collect())
}

/// A file of the chart (values.yaml, Chart.yaml), parsed.
fn chart_file(name: &str) -> anyhow::Result<Value> {
    let path = helm::chart_dir().join(name);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// A default value of values.yaml by path (`controller.replicas`), as text.
fn default_value(path: &str) -> anyhow::Result<String> {
    let values = chart_file("values.yaml")?;
    let value = path
        .split('.')
        .try_fold(&values, |v, k| v.get(k))
        .with_context(|| format!("values.yaml has no {path}"))?;
    Ok(match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// The image reference the chart's defaults give: repository:appVersion.
fn default_image() -> anyhow::Result<String> {
    let chart = chart_file("Chart.yaml")?;
    let app_version = chart
        .get("appVersion")
        .and_then(Value::as_str)
        .context("Chart.yaml has no appVersion")?;
    Ok(format!(
        "{}:{app_version}",
        default_value("image.repository")?
    ))
}

fn one<'a, T>(items: Vec<&'a T>, what: &str) -> anyhow::Result<&'a T> {
    match items.as_slice() {
        [one] => Ok(one),
        other => bail!("the chart renders {} {what}s, want one", other.len()),
    }
}

/// The HTTP server of a binary (shared-contracts: `--http-address`, /healthz, /readyz): the
/// flag in `args` (after `prefix`), the port declared, and both probes on it.
fn http_wiring(container: &Container, prefix: &[&str], port: i32) -> anyhow::Result<()> {
    let mut want: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    want.push(format!("--http-address=0.0.0.0:{port}"));
    ensure!(
        container.args.as_ref() == Some(&want),
        "{}: args {:?}, want {want:?}",
        container.name,
        container.args
    );
    let ports = container.ports.as_deref().unwrap_or_default();
    // The controller also declares its webhook's port (checked with the webhook's chart tests).
    let http: Vec<_> = ports
        .iter()
        .filter(|p| p.name.as_deref() != Some("webhook"))
        .collect();
    let [declared] = http.as_slice() else {
        bail!("{}: one HTTP port, got {ports:?}", container.name);
    };
    ensure!(
        declared.container_port == port
            && declared.name.as_deref() == Some("http")
            && declared.protocol.as_deref() == Some("TCP"),
        "{}: port {declared:?}, want http {port}/TCP",
        container.name
    );
    for (probe, path) in [
        (&container.liveness_probe, "/healthz"),
        (&container.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .with_context(|| format!("{}: no HTTP probe for {path}", container.name))?;
        ensure!(
            get.path.as_deref() == Some(path)
                && get.port == IntOrString::String("http".into())
                && get.scheme.as_deref().is_none_or(|s| s == "HTTP"),
            "{}: probe {get:?}, want GET {path} on port http",
            container.name
        );
    }
    Ok(())
}

/// The environment variables `knic-controller` reads (`env = "..."` in its argument parser).
fn controller_env_names() -> anyhow::Result<BTreeSet<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../controller/src/main.rs");
    let source = std::fs::read_to_string(&path)?;
    let names: BTreeSet<String> = source
        .split("env = \"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(str::to_owned)
        .collect();
    ensure!(
        !names.is_empty(),
        "no `env = \"...\"` found in {}",
        path.display()
    );
    Ok(names)
}

fn controller_deployment() -> anyhow::Result<()> {
    let rendered = defaults()?;
    let deployment = one(rendered.all::<Deployment>(), "Deployment")?;
    ensure!(deployment.metadata.name.as_deref() == Some("knic-controller"));
    ensure!(deployment.metadata.namespace.as_deref() == Some(RELEASE_NAMESPACE));
    let spec = deployment.spec.as_ref().context("spec")?;
    ensure!(
        spec.replicas == Some(2) && default_value("controller.replicas")? == "2",
        "two replicas by default, got {:?}",
        spec.replicas
    );
    let selector = spec.selector.match_labels.as_ref().context("matchLabels")?;
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .context("pod labels")?;
    ensure!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the selector {selector:?} does not select the pod labels {labels:?}"
    );
    let pod = spec.template.spec.as_ref().context("pod spec")?;

    // Its own ServiceAccount, rendered in the release namespace.
    let accounts = rendered.all::<ServiceAccount>();
    ensure!(pod.service_account_name.as_deref() == Some(CONTROLLER_SA));
    ensure!(
        accounts
            .iter()
            .any(|a| a.metadata.name.as_deref() == Some(CONTROLLER_SA)
                && a.metadata.namespace.as_deref() == Some(RELEASE_NAMESPACE)),
        "ServiceAccount {CONTROLLER_SA} is not in serviceaccount.yaml"
    );

    let [container] = pod.containers.as_slice() else {
        bail!("one container, got {}", pod.containers.len());
    };
    // The driver's image, written the same way, and the controller binary in it.
    let driver = one(rendered.all::<DaemonSet>(), "DaemonSet")?;
    let driver_image = driver
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.as_deref());
    ensure!(
        container.image.as_deref() == driver_image,
        "the controller must use the driver's image: {:?} vs {driver_image:?}",
        container.image
    );
    let want = default_image()?;
    ensure!(container.image.as_deref() == Some(want.as_str()));
    ensure!(container.command.as_deref() == Some(&["knic-controller".to_owned()][..]));
    let port: i32 = default_value("controller.http.port")?.parse()?;
    ensure!(
        port == 9462,
        "the controller's HTTP port is 9462 by default"
    );
    http_wiring(container, &[], port)?;

    // Only variables the binary reads, identity from the pod name, the lease where the Role is.
    let known = controller_env_names()?;
    let env = container.env.as_ref().context("env")?;
    for var in env {
        ensure!(
            known.contains(&var.name),
            "env {} is not read by knic-controller (it reads {known:?})",
            var.name
        );
    }
    let value = |name: &str| env.iter().find(|v| v.name == name);
    let pod_name = value("POD_NAME")
        .and_then(|v| v.value_from.as_ref())
        .and_then(|f| f.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    ensure!(
        pod_name == Some("metadata.name"),
        "POD_NAME from the downward API"
    );
    ensure!(
        value("KNIC_LEADER_ELECT").and_then(|v| v.value.as_deref()) == Some("true"),
        "leader election on"
    );
    let lease_namespace = value("KNIC_LEADER_NAMESPACE").and_then(|v| v.value.as_deref());
    ensure!(lease_namespace == Some(RELEASE_NAMESPACE));
    let roles = rendered.all::<Role>();
    ensure!(
        roles
            .iter()
            .any(|r| r.metadata.namespace.as_deref() == lease_namespace
                && r.rules.iter().flatten().any(|rule| rule
                    .resources
                    .iter()
                    .flatten()
                    .any(|res| res == "leases"))),
        "no Role for leases in the lease namespace"
    );
    for (name, path) in [
        ("KNIC_RESYNC_SECONDS", "controller.resyncSeconds"),
        ("KNIC_GC_SECONDS", "controller.gcSeconds"),
        ("KNIC_LOG_LEVEL", "controller.logLevel"),
        ("KNIC_LOG_FORMAT", "controller.logFormat"),
    ] {
        ensure!(
            value(name).and_then(|v| v.value.clone()) == Some(default_value(path)?),
            "{name} from {path}"
        );
    }
    let format = value("KNIC_LOG_FORMAT").and_then(|v| v.value.as_deref());
    ensure!(
        format.is_some_and(|f| knic_proto::logging::LogFormat::parse(f).is_ok()),
        "KNIC_LOG_FORMAT {format:?} is not a log format the binaries take"
    );
    ensure!(
        container
            .resources
            .as_ref()
            .is_some_and(|r| r.requests.is_some()),
        "resources from values"
    );

    // No privilege: non-root, read-only root, no capability, nothing from the host.
    let pod_security = pod
        .security_context
        .as_ref()
        .context("pod securityContext")?;
    ensure!(pod_security.run_as_non_root == Some(true));
    ensure!(pod_security.run_as_user.is_some_and(|u| u != 0));
    let security = container
        .security_context
        .as_ref()
        .context("container securityContext")?;
    ensure!(security.privileged != Some(true));
    ensure!(security.allow_privilege_escalation == Some(false));
    ensure!(security.read_only_root_filesystem == Some(true));
    let caps = security.capabilities.as_ref().context("capabilities")?;
    ensure!(caps.drop.as_deref() == Some(&["ALL".to_owned()][..]));
    ensure!(caps.add.as_ref().is_none_or(Vec::is_empty));
    ensure!(pod.host_network != Some(true) && pod.host_pid != Some(true));
    ensure!(
        pod.volumes.iter().flatten().all(|v| v.host_path.is_none()),
        "no hostPath volume"
    );
    Ok(())
}

/// The driver DaemonSet: capabilities instead of `privileged`, and only the host paths it uses.
fn driver_daemonset() -> anyhow::Result<()> {
    let set = one(defaults()?.all::<DaemonSet>(), "DaemonSet")?;
    let pod = set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .context("pod spec")?;
    ensure!(pod.service_account_name.as_deref() == Some(DRIVER_SA));
    // hostNetwork: the driver's own namespace is the node's, where the devices are.
    ensure!(pod.host_network == Some(true));
    ensure!(pod.host_pid != Some(true) && pod.host_ipc != Some(true));
    let [container] = pod.containers.as_slice() else {
        bail!("one container, got {}", pod.containers.len());
    };
    let security = container
        .security_context
        .as_ref()
        .context("container securityContext")?;
    ensure!(
        security.privileged == Some(false),
        "the driver must not run privileged: {security:?}"
    );
    let caps = security.capabilities.as_ref().context("capabilities")?;
    ensure!(caps.drop.as_deref() == Some(&["ALL".to_owned()][..]));
    let mut added = caps.add.clone().unwrap_or_default();
    added.sort();
    ensure!(
        added == ["NET_ADMIN", "SYS_ADMIN"],
        "exactly NET_ADMIN (rtnetlink) and SYS_ADMIN (setns), got {added:?}"
    );
    ensure!(security.read_only_root_filesystem == Some(true));
    ensure!(
        security
            .seccomp_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "RuntimeDefault")
    );
    // The apiserver refuses allowPrivilegeEscalation false together with SYS_ADMIN.
    ensure!(security.allow_privilege_escalation.is_none());
    // Root whatever the image's USER (65532, for the controller): the host directories it
    // writes are root's.
    ensure!(
        security.run_as_user == Some(0) && security.run_as_group == Some(0),
        "the driver runs as root: {security:?}"
    );
    let port: i32 = default_value("driver.http.port")?.parse()?;
    ensure!(port == 9461, "the driver's HTTP port is 9461 by default");
    http_wiring(container, &["run"], port)?;
    // One malloc arena: part of what keeps the driver's peak RSS near 20 MiB with a
    // thousand devices (issue 14).
    let arenas = container
        .env
        .iter()
        .flatten()
        .find(|v| v.name == "MALLOC_ARENA_MAX")
        .and_then(|v| v.value.as_deref());
    ensure!(
        arenas == Some("1"),
        "MALLOC_ARENA_MAX is {arenas:?}, want 1"
    );

    // Host paths: exactly these, each mounted where the driver expects it.
    let kubelet = default_value("kubeletRootDir")?;
    let want: BTreeSet<String> = [
        format!("{kubelet}/plugins/knic.dev"),
        format!("{kubelet}/plugins_registry"),
        default_value("nriSocketDir")?,
        default_value("cdiDir")?,
        "/var/run/netns".to_owned(),
        "/proc/sys/net".to_owned(),
        // The KNI socket's directory (driver.kni.socket), where runtimes on the node find it.
        "/var/run/knic".to_owned(),
    ]
    .into();
    let kni = container
        .env
        .iter()
        .flatten()
        .find(|v| v.name == "KNIC_KNI_SOCKET")
        .and_then(|v| v.value.as_deref());
    ensure!(
        kni == Some(default_value("driver.kni.socket")?.as_str())
            && kni == Some("/var/run/knic/kni.sock"),
        "KNIC_KNI_SOCKET is {kni:?}, want driver.kni.socket's default"
    );
    let volumes = pod.volumes.as_deref().unwrap_or_default();
    let host_paths: BTreeSet<String> = volumes
        .iter()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
        .collect();
    ensure!(
        host_paths == want,
        "host paths {host_paths:?}, want {want:?}"
    );
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .with_context(|| format!("mount of unknown volume {}", mount.name))?;
        if let Some(host) = &volume.host_path {
            // The host's /proc/sys/net sits beside the container's own, read-only /proc.
            let expected = if host.path == "/proc/sys/net" {
                "/host/proc/sys/net".to_owned()
            } else {
                host.path.clone()
            };
            ensure!(
                mount.mount_path == expected,
                "{} mounted at {}, not at its host path",
                host.path,
                mount.mount_path
            );
        }
        let propagation = mount.mount_propagation.as_deref();
        if mount.mount_path == "/var/run/netns" {
            // Namespaces the runtime creates after the driver started must appear inside.
            ensure!(propagation == Some("HostToContainer"));
        } else {
            ensure!(
                propagation.is_none(),
                "{} propagates mounts",
                mount.mount_path
            );
        }
    }
    Ok(())
}

/// With SR-IOV pools and writableSysfs in the values: the ConfigMap carries the pools as a
/// policy the driver parses to the same entries, and the DaemonSet mounts the host's /sys
/// writable at /host/sys and points the SR-IOV root there; by default neither is there
/// (checked above).
fn driver_daemonset_with_sriov_pools() -> anyhow::Result<()> {
    let pools = json!([
        {"name": "fabric", "pfNames": ["ens1f*"], "numVfs": 8},
        {"name": "dpdk", "pciIds": ["8086:1593"], "numVfs": 4, "vfDriver": "vfio-pci"}
    ]);
    let values = json!({"driver": {"sriov": {"pools": pools, "writableSysfs": true}}});
    let rendered = helm::render(&values, None)?;
    let policy = rendered
        .all::<ConfigMap>()
        .iter()
        .find_map(|m| m.data.as_ref()?.get("sriov-policy.yaml"))
        .context("no sriov-policy.yaml in the ConfigMap")?;
    let parsed = knic_driver::sriov::SriovPolicy::parse(policy)?;
    let want = knic_driver::sriov::SriovPolicy::parse(&json!({"pools": pools}).to_string())?;
    ensure!(parsed == want, "{policy}");
    let set = one(rendered.all::<DaemonSet>(), "DaemonSet")?;
    let pod = set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .context("pod spec")?;
    let container = &pod.containers[0];
    let env: BTreeMap<String, String> = container
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    ensure!(
        env.get("KNIC_SRIOV_POLICY").map(String::as_str) == Some("/etc/knic/sriov-policy.yaml")
    );
    ensure!(env.get("KNIC_SRIOV_SYSFS_ROOT").map(String::as_str) == Some("/host"));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == "/sys"))
        .context("no /sys hostPath")?;
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .context("/sys not mounted")?;
    ensure!(
        mount.mount_path == "/host/sys" && mount.read_only != Some(true),
        "{mount:?}"
    );
    // Default values: the policy is there but empty, which provisions nothing.
    let empty = defaults()?
        .all::<ConfigMap>()
        .into_iter()
        .find_map(|m| m.data.as_ref()?.get("sriov-policy.yaml"))
        .context("no default sriov-policy.yaml")?;
    ensure!(
        knic_driver::sriov::SriovPolicy::parse(empty)?.is_empty(),
        "{empty}"
    );
    Ok(())
}

/// The driver's `KNIC_POD_LABEL_READS` in `rendered`'s DaemonSet.
fn pod_label_reads_env(rendered: &Rendered) -> anyhow::Result<Option<String>> {
    let set = one(rendered.all::<DaemonSet>(), "DaemonSet")?;
    Ok(set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|v| v.name == "KNIC_POD_LABEL_READS"))
        .and_then(|v| v.value.clone()))
}

/// By default the driver can read no pod and is told so; `driver.podLabelReads: true` adds
/// exactly `get` on pods and turns the driver's reads on, together (the all-on values too).
fn pod_label_reads_are_opt_in() -> anyhow::Result<()> {
    ensure!(
        default_value("driver.podLabelReads")? == "false",
        "podLabelReads must be off by default"
    );
    let defaults = defaults()?;
    let pod_grants: Vec<_> = Rbac::of(defaults)
        .grants(DRIVER_SA)?
        .into_iter()
        .filter(|(group, resource, ..)| group.is_empty() && resource == "pods")
        .collect();
    ensure!(
        pod_grants.is_empty(),
        "the default driver role grants pods: {pod_grants:?}"
    );
    ensure!(
        pod_label_reads_env(defaults)?.as_deref() == Some("false"),
        "default KNIC_POD_LABEL_READS {:?}",
        pod_label_reads_env(defaults)?
    );
    let with: Vec<_> = DRIVER
        .iter()
        .chain(DRIVER_POD_LABEL_READS)
        .copied()
        .collect();
    for values in [
        json!({"driver": {"podLabelReads": true}}),
        helm::all_on_values()?,
    ] {
        let rendered = helm::render(&values, None)?;
        let rbac = Rbac::of(&rendered);
        covers(&rbac, DRIVER_SA, &with).with_context(|| format!("values {values}"))?;
        minimal(&rbac, DRIVER_SA, &with).with_context(|| format!("values {values}"))?;
        ensure!(
            pod_label_reads_env(&rendered)?.as_deref() == Some("true"),
            "values {values}: KNIC_POD_LABEL_READS {:?}",
            pod_label_reads_env(&rendered)?
        );
    }
    Ok(())
}

/// Both binaries take one set of `--log-format` values: the schema's, each of which the shared
/// parser accepts, and the DaemonSet and the Deployment pass theirs on unchanged.
fn log_format_is_one_for_both() -> anyhow::Result<()> {
    let schema = chart_file("values.schema.json")?;
    let allowed = schema
        .pointer("/$defs/logFormat/enum")
        .and_then(Value::as_array)
        .context("values.schema.json has no $defs.logFormat enum")?;
    for value in allowed {
        let value = value.as_str().context("a log format that is no string")?;
        knic_proto::logging::LogFormat::parse(value)
            .with_context(|| format!("the schema allows {value:?}"))?;
    }
    for component in ["driver", "controller"] {
        let at = format!("/properties/{component}/properties/logFormat/$ref");
        ensure!(
            schema.pointer(&at).and_then(Value::as_str) == Some("#/$defs/logFormat"),
            "{component}.logFormat does not use $defs.logFormat"
        );
    }
    // Every allowed value (human, the old spelling, included) reaches both binaries as is.
    for value in allowed {
        let value = value.as_str().unwrap_or_default();
        let rendered = helm::render(
            &json!({"driver": {"logFormat": value}, "controller": {"logFormat": value}}),
            None,
        )?;
        let set = one(rendered.all::<DaemonSet>(), "DaemonSet")?;
        let deployment = one(rendered.all::<Deployment>(), "Deployment")?;
        let pods = [
            set.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
            deployment
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref()),
        ];
        for pod in pods {
            let passed = pod
                .and_then(|p| p.containers.first())
                .and_then(|c| c.env.as_ref())
                .and_then(|env| env.iter().find(|v| v.name == "KNIC_LOG_FORMAT"))
                .and_then(|v| v.value.as_deref());
            ensure!(passed == Some(value), "{value}: KNIC_LOG_FORMAT {passed:?}");
        }
    }
    Ok(())
}

fn check(name: &str, f: fn() -> anyhow::Result<()>) -> Trial {
    Trial::test(name, move || {
        f().map_err(|e| Failed::from(format!("{e:#}")))
    })
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let mut trials = vec![
        check("chart/rbac_driver_covers_its_calls", || {
            covers(&Rbac::load()?, DRIVER_SA, DRIVER)
        }),
        check("chart/rbac_controller_covers_its_calls", || {
            covers(&Rbac::load()?, CONTROLLER_SA, CONTROLLER)
        }),
        check("chart/rbac_driver_is_minimal", || {
            minimal(&Rbac::load()?, DRIVER_SA, DRIVER)
        }),
        check("chart/rbac_controller_is_minimal", || {
            minimal(&Rbac::load()?, CONTROLLER_SA, CONTROLLER)
        }),
        check(
            "chart/rbac_driver_pod_label_reads_are_opt_in",
            pod_label_reads_are_opt_in,
        ),
        check(
            "chart/log_format_is_one_for_both",
            log_format_is_one_for_both,
        ),
        check("chart/controller_deployment", controller_deployment),
        check("chart/driver_daemonset", driver_daemonset),
        check(
            "chart/driver_daemonset_with_sriov_pools",
            driver_daemonset_with_sriov_pools,
        ),
    ];
    trials.extend(values::trials());
    trials.extend(policies::trials());
    let real = knic_e2e::harness::real_cluster();
    trials.push(knic_e2e::harness::trial(
        "real/rbac_driver_token_reads_no_pod_by_default".into(),
        real.is_none(),
        move || async move {
            let real = real.context("no real cluster")?;
            rbac_real::driver_token_reads_no_pod_by_default(real).await
        },
    ));
    libtest_mimic::run(&args, trials).exit();
}
