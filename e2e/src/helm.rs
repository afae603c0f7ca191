//! The chart rendered by Helm itself (v4's Go SDK through PyPI's `helm-python-sdk`, driven by
//! `e2e/python/helm_chart.py`), so the chart tests check what `helm install` would apply, and
//! every object typed: each must be one of the kinds below and deserialise into its
//! k8s-openapi type with nothing left over, so a misspelt or misplaced field fails here rather
//! than being dropped by the apiserver.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use k8s_openapi::Resource;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;
use serde_json::{Value, json};

pub mod certmanager;
pub mod release;

/// The release the tests render: the name and namespace README's install command uses.
pub const RELEASE_NAME: &str = "knic";
/// See [`RELEASE_NAME`].
pub const RELEASE_NAMESPACE: &str = "knic-system";

/// The chart in this repository.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/knic")
}

/// The values file that turns every optional part on (charts/knic/ci/).
pub fn all_on_values() -> anyhow::Result<Value> {
    let path = chart_dir().join("ci/all-on-values.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

macro_rules! kinds {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        /// One rendered object, typed. A kind the chart starts to render must be added here.
        #[derive(Debug, Clone)]
        pub enum Object {
            $(
                #[doc = concat!("Boxed: k8s-openapi's ", stringify!($variant), " is large.")]
                $variant(Box<$ty>),
            )*
        }

        /// The k8s-openapi types an [`Object`] can hold.
        pub trait Kind: Sized {
            /// The object when it is of this kind, for [`Rendered::all`].
            fn of(object: &Object) -> Option<&Self>;
        }

        $(impl Kind for $ty {
            fn of(object: &Object) -> Option<&Self> {
                match object {
                    Object::$variant(o) => Some(o),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        })*

        impl Object {
            /// Types `value` by its apiVersion and kind; unknown kinds and fields are errors.
            pub fn parse(value: &Value) -> anyhow::Result<Object> {
                let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or("");
                let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
                $(if api_version == <$ty>::API_VERSION && kind == <$ty>::KIND {
                    let typed: $ty = serde_json::from_value(value.clone())
                        .with_context(|| format!("a {kind} that does not parse: {value}"))?;
                    exact(value, &serde_json::to_value(&typed)?)
                        .with_context(|| format!("{kind} {}", name(value)))?;
                    return Ok(Object::$variant(Box::new(typed)));
                })*
                bail!(
                    "{kind} ({api_version}) {} is not a kind the chart tests know \
                     (add it to e2e/src/helm.rs)",
                    name(value)
                )
            }

            /// The object as the apiserver would receive it.
            pub fn to_json(&self) -> Value {
                match self {
                    $(Object::$variant(o) => serde_json::to_value(o).unwrap_or(Value::Null),)*
                }
            }
        }
    };
}

kinds! {
    ServiceAccount(ServiceAccount),
    ConfigMap(ConfigMap),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    DaemonSet(DaemonSet),
    Deployment(Deployment),
    DeviceClass(DeviceClass),
    ValidatingAdmissionPolicy(ValidatingAdmissionPolicy),
    ValidatingAdmissionPolicyBinding(ValidatingAdmissionPolicyBinding),
    CustomResourceDefinition(CustomResourceDefinition),
    Secret(Secret),
    Service(Service),
    ValidatingWebhookConfiguration(ValidatingWebhookConfiguration),
    Issuer(certmanager::Issuer),
    Certificate(certmanager::Certificate),
}

fn name(value: &Value) -> String {
    value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>")
        .to_owned()
}

/// The typed object written back equals what was rendered: any field the type does not have
/// (a typo, a field at the wrong level, one of a newer Kubernetes) would be missing.
fn exact(rendered: &Value, typed: &Value) -> anyhow::Result<()> {
    fn walk(a: &Value, b: &Value, at: &str) -> Option<String> {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (key, value) in a {
                    let here = format!("{at}/{key}");
                    match b.get(key) {
                        None if value.is_null() => {}
                        None => return Some(format!("{here} is not a field of the type")),
                        Some(other) => {
                            if let Some(difference) = walk(value, other, &here) {
                                return Some(difference);
                            }
                        }
                    }
                }
                b.keys()
                    .find(|k| !a.contains_key(*k))
                    .map(|k| format!("{at}/{k} appeared when typed"))
            }
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
                .iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (x, y))| walk(x, y, &format!("{at}/{i}"))),
            (a, b) if a == b => None,
            (a, b) => Some(format!("{at}: rendered {a}, typed {b}")),
        }
    }
    match walk(rendered, typed, "") {
        None => Ok(()),
        Some(difference) => bail!("{difference}"),
    }
}

/// Objects of one template file, in the order Helm wrote them.
#[derive(Debug, Clone)]
pub struct Source {
    /// `knic/templates/rbac.yaml`, or `knic/crds/...` for CRDs.
    pub path: String,
    /// One object of it.
    pub object: Object,
}

/// What `helm install --dry-run` would apply, typed.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// CRDs first (Helm installs them before the templates), then the manifest.
    pub objects: Vec<Source>,
    /// templates/NOTES.txt rendered, what `helm install` prints.
    pub notes: String,
}

impl Rendered {
    /// Every object of type `T`.
    pub fn all<T: Kind>(&self) -> Vec<&T> {
        self.objects
            .iter()
            .filter_map(|s| T::of(&s.object))
            .collect()
    }

    /// Objects rendered from template `file` (`rbac.yaml`).
    pub fn from_file(&self, file: &str) -> impl Iterator<Item = &Object> {
        let path = format!("{RELEASE_NAME}/templates/{file}");
        self.objects
            .iter()
            .filter(move |s| s.path == path)
            .map(|s| &s.object)
    }
}

/// Helm's answer to a render: the objects, or its refusal (bad values, wrong Kubernetes).
pub type Outcome = Result<Rendered, String>;

fn call(request: Value) -> anyhow::Result<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/helm_chart.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running python3 (the chart tests need it and helm-python-sdk)")?;
    let stdin = child.stdin.take().context("python3 stdin")?;
    serde_json::to_writer(stdin, &request)?;
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("python3 {script} failed ({}): {stderr}", out.status);
    }
    let answer: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("python3 {script} answered no JSON; stderr: {stderr}"))?;
    if let Some(why) = answer.get("unavailable").and_then(Value::as_str) {
        bail!("Helm's engine is not available: {why}");
    }
    Ok(answer)
}

/// Renders the chart with `values` (over values.yaml) for a cluster of `kube_version`
/// (`None`: Helm's default, the newest it knows).
pub fn template(values: &Value, kube_version: Option<&str>) -> anyhow::Result<Outcome> {
    template_release(values, kube_version, RELEASE_NAME, RELEASE_NAMESPACE)
}

/// [`template`] for release `name` in `namespace` (the real-cluster twins install into a
/// namespace of their own; a path stays `knic/templates/...` whatever the name).
pub fn template_release(
    values: &Value,
    kube_version: Option<&str>,
    name: &str,
    namespace: &str,
) -> anyhow::Result<Outcome> {
    let answer = call(json!({
        "op": "template",
        "chart": chart_dir(),
        "values": values,
        "name": name,
        "namespace": namespace,
        "kube_version": kube_version,
    }))?;
    if let Some(refusal) = answer.get("refused").and_then(Value::as_str) {
        return Ok(Err(refusal.to_owned()));
    }
    let manifest = answer
        .get("manifest")
        .and_then(Value::as_str)
        .context("no manifest in Helm's answer")?;
    let mut objects = Vec::new();
    for crd in answer
        .get("crds")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let path = crd.get("filename").and_then(Value::as_str).unwrap_or("crd");
        let data = crd.get("data").and_then(Value::as_str).unwrap_or("");
        objects.extend(documents(&format!("{RELEASE_NAME}/{path}"), data)?);
    }
    for chunk in manifest.split("\n---\n") {
        let chunk = chunk.trim_start_matches("---\n");
        let Some(path) = chunk
            .lines()
            .find_map(|l| l.strip_prefix("# Source: "))
            .map(str::to_owned)
        else {
            if chunk.trim().is_empty() {
                continue;
            }
            bail!("a manifest document without its # Source line:\n{chunk}");
        };
        objects.extend(documents(&path, chunk)?);
    }
    let notes = answer
        .get("notes")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Ok(Ok(Rendered { objects, notes }))
}

/// [`template`] that must succeed.
pub fn render(values: &Value, kube_version: Option<&str>) -> anyhow::Result<Rendered> {
    template(values, kube_version)?.map_err(|refusal| anyhow::anyhow!("Helm refused: {refusal}"))
}

fn documents(path: &str, text: &str) -> anyhow::Result<Vec<Source>> {
    let mut out = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = Value::deserialize(document)
            .with_context(|| format!("{path} does not render to YAML:\n{text}"))?;
        if value.is_null() {
            continue;
        }
        let object = Object::parse(&value).with_context(|| format!("in {path}"))?;
        out.push(Source {
            path: path.to_owned(),
            object,
        });
    }
    Ok(out)
}

/// One finding of `helm lint`.
#[derive(Debug, Clone, Deserialize)]
pub struct LintMessage {
    /// 1 info, 2 warning, 3 error.
    pub severity: u8,
    /// The chart file it is about.
    pub path: String,
    /// Helm's text.
    pub error: String,
}

/// `helm lint [--strict]` of the chart with `values`.
pub fn lint(
    values: &Value,
    strict: bool,
    kube_version: Option<&str>,
) -> anyhow::Result<Vec<LintMessage>> {
    let answer = call(json!({
        "op": "lint",
        "chart": chart_dir(),
        "values": values,
        "strict": strict,
        "namespace": RELEASE_NAMESPACE,
        "kube_version": kube_version,
    }))?;
    if let Some(refusal) = answer.get("refused").and_then(Value::as_str) {
        bail!("helm lint refused the chart: {refusal}");
    }
    let report = answer.get("report").context("no lint report")?;
    let mut messages: Vec<LintMessage> =
        serde_json::from_value(report.get("messages").cloned().unwrap_or(json!([])))?;
    for error in report
        .get("errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        messages.push(LintMessage {
            severity: 3,
            path: String::new(),
            error: error.as_str().unwrap_or_default().to_owned(),
        });
    }
    Ok(messages)
}
