//! The chart as Helm takes it: `helm lint --strict` clean, every object typed, values.schema.json
//! refusing bad values with a message naming the field, Chart.yaml's kubeVersion refusing
//! Kubernetes 1.33, DeviceClasses with extendedResourceName only on 1.36+, and the NOTES.

use std::collections::BTreeSet;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use knic_e2e::helm::{self, Object, Rendered};
use libtest_mimic::Trial;
use serde_json::{Value, json};

use super::{check, defaults, one};

/// The kinds the default render holds, and how many of each.
fn kinds(rendered: &Rendered) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for source in &rendered.objects {
        let kind = source.object.to_json()["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        *counts.entry(kind).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

fn typed_defaults() -> anyhow::Result<()> {
    let rendered = defaults()?;
    let want: Vec<(String, usize)> = [
        ("ClusterRole", 2),
        ("ClusterRoleBinding", 2),
        ("ConfigMap", 1),
        ("CustomResourceDefinition", 3),
        ("DaemonSet", 1),
        ("Deployment", 1),
        ("DeviceClass", 5),
        ("Role", 1),
        ("RoleBinding", 1),
        // The webhook's self-signed certificate and its Service.
        ("Secret", 1),
        ("Service", 1),
        ("ServiceAccount", 2),
        ("ValidatingAdmissionPolicy", 5),
        ("ValidatingAdmissionPolicyBinding", 5),
        ("ValidatingWebhookConfiguration", 1),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), *n))
    .collect();
    ensure!(kinds(rendered) == want, "kinds {:?}", kinds(rendered));
    let crds: BTreeSet<String> = rendered
        .all::<CustomResourceDefinition>()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    ensure!(
        crds == BTreeSet::from([
            "networks.knic.dev".into(),
            "networkaddresses.knic.dev".into(),
            "nodenetworks.knic.dev".into()
        ]),
        "{crds:?}"
    );
    Ok(())
}

/// Typing refuses what the apiserver would refuse or silently drop.
fn typing_refuses_unknowns() -> anyhow::Result<()> {
    let budget = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "x"}});
    let e = Object::parse(&budget).expect_err("a PodDisruptionBudget is not a chart kind");
    ensure!(
        format!("{e:#}")
            == "PodDisruptionBudget (policy/v1) x is not a kind the chart tests know (add it \
                to e2e/src/helm.rs)",
        "{e:#}"
    );
    let mut deployment = defaults()?
        .all::<Deployment>()
        .first()
        .map(serde_json::to_value)
        .context("no Deployment")??;
    deployment["spec"]["replica"] = json!(2);
    let e = Object::parse(&deployment).expect_err("spec.replica is no field");
    ensure!(
        format!("{e:#}") == "Deployment knic-controller: /spec/replica is not a field of the type",
        "{e:#}"
    );
    deployment["spec"]
        .as_object_mut()
        .context("spec")?
        .remove("replica");
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!(3);
    let e = Object::parse(&deployment).expect_err("a number for a string");
    ensure!(
        format!("{e:#}").starts_with("a Deployment that does not parse:"),
        "{e:#}"
    );
    Ok(())
}

fn all_on() -> anyhow::Result<()> {
    let values = helm::all_on_values()?;
    let rendered = helm::render(&values, Some("1.36.0"))?;
    let set = one(rendered.all::<DaemonSet>(), "DaemonSet")?;
    let pod = set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .context("pod spec")?;
    ensure!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get("knic.dev/nics"))
            == Some(&"true".into())
    );
    ensure!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("dedicated"))
    );
    let driver = &pod.containers[0];
    ensure!(driver.image.as_deref() == Some("registry.example.com/knic:0.1.0-test"));
    ensure!(driver.image_pull_policy.as_deref() == Some("Always"));
    super::http_wiring(driver, &["run"], 19461)?;
    ensure!(
        pod.volumes
            .iter()
            .flatten()
            .any(|v| v.host_path.as_ref().is_some_and(|h| h.path == "/sys"))
    );
    let deployment = one(rendered.all::<Deployment>(), "Deployment")?;
    let spec = deployment.spec.as_ref().context("spec")?;
    ensure!(spec.replicas == Some(3));
    let controller = &spec.template.spec.as_ref().context("pod")?.containers[0];
    super::http_wiring(controller, &[], 19462)?;
    ensure!(
        extended(&rendered).get("vf.knic.dev").map(String::as_str) == Some("example.com/knic-vf")
    );
    ensure!(
        rendered
            .notes
            .contains("SR-IOV pools: fabric (8 VFs), dpdk (4 VFs).")
            && !rendered.notes.contains("WARNING"),
        "{}",
        rendered.notes
    );
    Ok(())
}

fn lint_strict_clean() -> anyhow::Result<()> {
    for (what, values, kube) in [
        ("defaults", json!({}), None),
        ("defaults on 1.34", json!({}), Some("1.34.0")),
        (
            "ci/all-on-values.yaml",
            helm::all_on_values()?,
            Some("1.36.0"),
        ),
    ] {
        let messages = helm::lint(&values, true, kube)?;
        // Info findings (Chart.yaml's "icon is recommended") are advice, not problems.
        let problems: Vec<_> = messages.iter().filter(|m| m.severity >= 2).collect();
        ensure!(
            problems.is_empty(),
            "helm lint --strict ({what}): {problems:?}"
        );
    }
    // And lint does see problems: a value the schema refuses.
    let messages = helm::lint(&json!({"controller": {"replicas": 0}}), true, None)?;
    ensure!(
        messages
            .iter()
            .any(|m| m.severity == 3 && m.error.contains("at '/controller/replicas'")),
        "{messages:?}"
    );
    Ok(())
}

/// Helm's refusal for bad values: its header, then one line per violation.
fn schema_refusal(violations: &[&str]) -> String {
    let mut s = String::from(
        "values don't meet the specifications of the schema(s) in the following chart(s):\nknic:\n",
    );
    for v in violations {
        s.push_str(&format!("- {v}\n"));
    }
    s
}

fn schema_refuses_bad_values() -> anyhow::Result<()> {
    let cases = [
        (
            json!({"controller": {"replicas": 0}}),
            "at '/controller/replicas': minimum: got 0, want 1",
        ),
        (
            json!({"driver": {"logFormat": "xml"}}),
            "at '/driver/logFormat': value must be one of 'text', 'json', 'human'",
        ),
        (
            json!({"driver": {"podLabelReads": "yes"}}),
            "at '/driver/podLabelReads': got string, want boolean",
        ),
        (
            json!({"image": {"pullPolicy": "Sometimes"}}),
            "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
        ),
        (
            json!({"driver": {"http": {"port": 70000}}}),
            "at '/driver/http/port': maximum: got 70,000, want 65,535",
        ),
        (
            json!({"controller": {"replica": 3}}),
            "at '/controller': additional properties 'replica' not allowed",
        ),
        (
            json!({"kubeletRootDir": "var/lib/kubelet"}),
            "at '/kubeletRootDir': 'var/lib/kubelet' does not match pattern '^/'",
        ),
        (
            json!({"driver": {"sriov": {"pools": [{"name": "a", "numVfs": 2, "vfDriver": "igb"}]}}}),
            "at '/driver/sriov/pools/0/vfDriver': value must be one of 'netdev', 'vfio-pci'",
        ),
        (
            json!({"deviceClasses": {"extendedResourceNames": {"vf.knic.dev": "vf"}}}),
            "at '/deviceClasses/extendedResourceNames/vf.knic.dev': 'vf' does not match pattern \
             '^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'",
        ),
    ];
    let mut wrong = Vec::new();
    for (values, violation) in cases {
        let want = schema_refusal(&[violation]);
        match helm::template(&values, None)? {
            Err(refusal) if refusal == want => {}
            Err(refusal) => {
                wrong.push(format!("{values}: refused with {refusal:?}, want {want:?}"))
            }
            Ok(_) => wrong.push(format!("{values}: rendered, want {want:?}")),
        }
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}

fn kube_version_gate() -> anyhow::Result<()> {
    // `helm install --kube-version 1.33` (and a full version): refused, naming both versions.
    for (version, shown) in [("1.33", "v1.33"), ("1.33.7", "v1.33.7")] {
        let want = format!(
            "chart requires kubeVersion: >=1.34.0-0 which is incompatible with Kubernetes {shown}"
        );
        match helm::template(&json!({}), Some(version))? {
            Err(refusal) => ensure!(refusal == want, "{version}: {refusal:?}, want {want:?}"),
            Ok(_) => bail!("Kubernetes {version} was accepted"),
        }
    }
    // Pre-release builds of 1.34 (the `-0` in the constraint) and 1.34 itself are accepted.
    for version in ["1.34.0-rc.1", "1.34.0"] {
        helm::render(&json!({}), Some(version)).with_context(|| version.to_owned())?;
    }
    Ok(())
}

/// DeviceClass name → extendedResourceName, for the classes that carry one.
fn extended(rendered: &Rendered) -> std::collections::BTreeMap<String, String> {
    rendered
        .all::<DeviceClass>()
        .into_iter()
        .filter_map(|c| {
            Some((
                c.metadata.name.clone()?,
                c.spec.extended_resource_name.clone()?,
            ))
        })
        .collect()
}

fn extended_resources_from_1_36() -> anyhow::Result<()> {
    let on_1_36 = helm::render(&json!({}), Some("1.36.0"))?;
    let want: std::collections::BTreeMap<String, String> = [
        ("nic.knic.dev", "knic.dev/nic"),
        ("vf.knic.dev", "knic.dev/vf"),
        ("rdma.knic.dev", "knic.dev/rdma"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    ensure!(extended(&on_1_36) == want, "1.36: {:?}", extended(&on_1_36));
    let on_1_35 = helm::render(&json!({}), Some("1.35.3"))?;
    ensure!(
        extended(&on_1_35).is_empty(),
        "1.35: {:?}",
        extended(&on_1_35)
    );
    let off = helm::render(
        &json!({"deviceClasses": {"extendedResources": false}}),
        Some("1.36.0"),
    )?;
    ensure!(
        extended(&off).is_empty(),
        "turned off: {:?}",
        extended(&off)
    );
    ensure!(!off.notes.contains("resources.limits"), "{}", off.notes);
    let one_off = helm::render(
        &json!({"deviceClasses": {"extendedResourceNames": {"rdma.knic.dev": null}}}),
        Some("1.36.0"),
    )?;
    ensure!(
        extended(&one_off).keys().collect::<Vec<_>>() == ["nic.knic.dev", "vf.knic.dev"],
        "rdma turned off: {:?}",
        extended(&one_off)
    );
    // Apart from that field, the classes are deviceclasses/knic.yaml's.
    let path = helm::chart_dir().join("../../deviceclasses/knic.yaml");
    let text = std::fs::read_to_string(&path)?;
    let mut shipped = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        shipped.push(serde_json::from_value::<DeviceClass>(value)?);
    }
    for rendered in [&on_1_35, &on_1_36] {
        let mut classes: Vec<DeviceClass> =
            rendered.all::<DeviceClass>().into_iter().cloned().collect();
        for class in &mut classes {
            class.spec.extended_resource_name = None;
        }
        ensure!(
            classes == shipped,
            "the chart's classes differ from deviceclasses/knic.yaml"
        );
    }
    let none = helm::render(
        &json!({"deviceClasses": {"install": false}}),
        Some("1.36.0"),
    )?;
    ensure!(none.all::<DeviceClass>().is_empty());
    Ok(())
}

fn notes() -> anyhow::Result<()> {
    let on_1_36 = helm::render(&json!({}), Some("1.36.0"))?;
    let n = &on_1_36.notes;
    for line in [
        "knic 0.1.0 is installed in namespace knic-system (image ghcr.io/knic-dev/knic:0.1.0).",
        "  kubectl -n knic-system rollout status daemonset/knic-driver",
        "  kubectl -n knic-system rollout status deployment/knic-controller",
        "  resources.limits: {knic.dev/vf: 1} (DeviceClass vf.knic.dev)",
        "Health and metrics (plain HTTP): the driver on port 9461 of every node,",
    ] {
        ensure!(n.lines().any(|l| l == line), "no line {line:?} in:\n{n}");
    }
    let on_1_35 = helm::render(&json!({}), Some("1.35.0"))?;
    ensure!(
        !on_1_35.notes.contains("resources.limits"),
        "{}",
        on_1_35.notes
    );
    let pools_only = helm::render(
        &json!({"driver": {"sriov": {"pools": [{"name": "fabric", "numVfs": 8}]}}}),
        None,
    )?;
    ensure!(
        pools_only.notes.contains(
            "WARNING: driver.sriov.pools needs driver.sriov.writableSysfs=true; the driver \
             refuses to start without it."
        ),
        "{}",
        pools_only.notes
    );
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    vec![
        check("chart/objects_are_typed", typed_defaults),
        check(
            "chart/typing_refuses_unknown_kinds_and_fields",
            typing_refuses_unknowns,
        ),
        check("chart/all_on_values_render", all_on),
        check("chart/helm_lint_strict_clean", lint_strict_clean),
        check("chart/schema_refuses_bad_values", schema_refuses_bad_values),
        check("chart/kube_version_1_33_refused", kube_version_gate),
        check(
            "chart/extended_resources_only_from_1_36",
            extended_resources_from_1_36,
        ),
        check("chart/notes", notes),
    ]
}
