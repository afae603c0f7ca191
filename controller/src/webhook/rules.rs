//! What the webhook decides about one object: the driver's own parse, merge and validation of
//! knic configs, and the controller's own validation of Networks, run on the object before it
//! is stored. Pure (the cluster is read through [`Cluster`]), so every verdict is unit-tested.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use knic_proto::netconfig::{self, ConfigErrors, FieldError, NetworkConfig};
use serde_json::Value;

use crate::network::Network;
use crate::plan::{Plan, plan};

/// What the webhook reads from the cluster: the DeviceClasses a claim's config is layered on,
/// and the Networks a new Network must not conflict with. `None` means "not known" (absent, or
/// the cache has not been filled yet): the verdict then says, as a warning, what it could not
/// check, rather than refuse an object over the webhook's own state.
pub trait Cluster: Send + Sync {
    /// The DeviceClass called `name`.
    fn device_class(&self, name: &str) -> Option<Arc<DeviceClass>>;
    /// Every Network, or `None` while the cache is not filled.
    fn networks(&self) -> Option<Vec<Arc<Network>>>;
}

/// A fixed cluster: for tests, and for a controller started without API access to the kinds.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// DeviceClasses by name.
    pub classes: std::collections::BTreeMap<String, Arc<DeviceClass>>,
    /// Every Network; `None` stands for a cache that is not ready.
    pub networks: Option<Vec<Arc<Network>>>,
}

impl Cluster for Snapshot {
    fn device_class(&self, name: &str) -> Option<Arc<DeviceClass>> {
        self.classes.get(name).cloned()
    }
    fn networks(&self) -> Option<Vec<Arc<Network>>> {
        self.networks.clone()
    }
}

/// The kinds the webhook validates, as the apiserver names them in a review's `request.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `resource.k8s.io/v1 DeviceClass`: its `spec.config[]`.
    DeviceClass,
    /// `resource.k8s.io/v1 ResourceClaim`: its `spec.devices.config[]`.
    ResourceClaim,
    /// `resource.k8s.io/v1 ResourceClaimTemplate`: its `spec.spec.devices.config[]`.
    ResourceClaimTemplate,
    /// `knic.dev/v1alpha1 Network`.
    Network,
}

impl Kind {
    /// The kind for a `request.kind`; `None` for anything else, other versions included (the
    /// webhook configuration asks for these versions with `matchPolicy: Equivalent`, so the
    /// apiserver converts objects of other versions before sending them).
    pub fn of(group: &str, version: &str, kind: &str) -> Option<Kind> {
        match (group, version, kind) {
            ("resource.k8s.io", "v1", "DeviceClass") => Some(Kind::DeviceClass),
            ("resource.k8s.io", "v1", "ResourceClaim") => Some(Kind::ResourceClaim),
            ("resource.k8s.io", "v1", "ResourceClaimTemplate") => Some(Kind::ResourceClaimTemplate),
            ("knic.dev", "v1alpha1", "Network") => Some(Kind::Network),
            _ => None,
        }
    }

    /// Where the part the webhook validates sits in the object: an update that leaves it alone
    /// (a label, a finalizer removed from a Network stored before the webhook existed) is never
    /// refused, or an object that predates a rule could not even be deleted.
    fn checked_part(self) -> &'static str {
        match self {
            Kind::DeviceClass => "/spec/config",
            Kind::ResourceClaim | Kind::ResourceClaimTemplate | Kind::Network => "/spec",
        }
    }
}

/// The webhook's answer about one object: every problem (empty means allowed) and warnings
/// for what it could not check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The problems, in the wording the driver or the reconciler would use later.
    pub errors: Vec<FieldError>,
    /// Shown to the client (`kubectl` prints them) without refusing the object.
    pub warnings: Vec<String>,
}

impl Verdict {
    /// The refusal message: the problems joined as the driver joins them (and capped at
    /// [`netconfig::MAX_SHOWN_PROBLEMS`] the same way); `None` when allowed.
    pub fn denial(&self) -> Option<String> {
        (!self.errors.is_empty()).then(|| ConfigErrors(self.errors.clone()).to_string())
    }
}

/// Checks `object` of `kind`; `old` is the stored object on an update.
pub fn check(kind: Kind, object: &Value, old: Option<&Value>, cluster: &dyn Cluster) -> Verdict {
    if object.pointer("/metadata/deletionTimestamp").is_some() {
        return Verdict::default();
    }
    if let Some(old) = old
        && old.pointer(kind.checked_part()) == object.pointer(kind.checked_part())
    {
        return Verdict::default();
    }
    match kind {
        Kind::DeviceClass => device_class(object),
        Kind::ResourceClaim => claim(object, "spec", cluster),
        Kind::ResourceClaimTemplate => claim(object, "spec.spec", cluster),
        Kind::Network => network(object, old, cluster),
    }
}

/// One `opaque` entry of driver knic.dev, parsed as the driver parses it.
struct Entry {
    /// The request names the entry is limited to; empty means every request.
    requests: Vec<String>,
    parsed: Option<NetworkConfig>,
}

/// The knic entries of the config list at `path` (dotted, as in the error paths), parsed with
/// their paths; parse errors go to `errors`. Entries of other drivers are none of knic's
/// business, exactly as the driver skips them.
fn entries(object: &Value, path: &str, errors: &mut Vec<FieldError>) -> Vec<Entry> {
    let pointer = format!("/{}", path.replace('.', "/"));
    let Some(list) = object.pointer(&pointer).and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, entry) in list.iter().enumerate() {
        let Some(opaque) = entry.get("opaque") else {
            continue;
        };
        if opaque.get("driver").and_then(Value::as_str) != Some(knic_proto::DRIVER_NAME) {
            continue;
        }
        let parameters = opaque.get("parameters").unwrap_or(&Value::Null);
        let parsed = match netconfig::parse(parameters, &format!("{path}[{i}].opaque.parameters")) {
            Ok(c) => Some(c),
            Err(e) => {
                errors.extend(e.0);
                None
            }
        };
        let requests = entry
            .get("requests")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        out.push(Entry { requests, parsed });
    }
    out
}

/// A class's knic entries merged, as every device of the class starts from them.
fn class_layers(class: &Value) -> (Vec<NetworkConfig>, Vec<FieldError>) {
    let mut errors = Vec::new();
    let layers = entries(class, "spec.config", &mut errors)
        .into_iter()
        .filter_map(|e| e.parsed)
        .collect();
    (layers, errors)
}

/// A DeviceClass: each knic entry parsed, and their merge validated as the config every device
/// of the class starts from (`spec.config: <path>: <rule>`). A class whose own config breaks a
/// rule is refused even though a claim could override the field: a claim that does not would
/// fail at prepare, far from whoever wrote the class.
fn device_class(object: &Value) -> Verdict {
    let (layers, mut errors) = class_layers(object);
    if !layers.is_empty()
        && let Err(e) = netconfig::validate(&netconfig::merge(&layers))
    {
        errors.extend(e.0.into_iter().map(|f| FieldError {
            path: format!("spec.config: {}", f.path),
            message: f.message,
        }));
    }
    Verdict {
        errors,
        warnings: Vec::new(),
    }
}

/// The names a claim's devices can be allocated under, each with its DeviceClass: `request`
/// for an exact request, `request/subrequest` for each alternative of `firstAvailable` (the
/// driver sees one of them, so each is checked as if it were chosen).
fn results(spec: &Value) -> Vec<(String, Option<String>)> {
    let Some(requests) = spec.pointer("/devices/requests").and_then(Value::as_array) else {
        return Vec::new();
    };
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut out = Vec::new();
    for request in requests {
        let Some(name) = text(request, "name") else {
            continue;
        };
        if let Some(alternatives) = request.get("firstAvailable").and_then(Value::as_array) {
            for sub in alternatives {
                if let Some(sub_name) = text(sub, "name") {
                    out.push((format!("{name}/{sub_name}"), text(sub, "deviceClassName")));
                }
            }
        } else {
            let class = request
                .get("exactly")
                .and_then(|e| text(e, "deviceClassName"));
            out.push((name, class));
        }
    }
    out
}

/// The driver's rule for which claim entries apply to an allocation result (`req` or
/// `req/sub`): no `requests` means all; naming `req` covers its subrequests.
fn applies(requests: &[String], result: &str) -> bool {
    let base = result.split('/').next().unwrap_or(result);
    requests.is_empty() || requests.iter().any(|r| r == result || r == base)
}

/// A ResourceClaim (`at` = `spec`) or a template (`spec.spec`): each knic entry parsed, then
/// for every allocation result one of the claim's entries applies to, the class's knic entries
/// and then the claim's merged and validated exactly as the driver will at prepare, with the
/// driver's paths (`request eth: interface.mtu: …`).
fn claim(object: &Value, at: &str, cluster: &dyn Cluster) -> Verdict {
    let mut verdict = Verdict::default();
    let own = entries(object, &format!("{at}.devices.config"), &mut verdict.errors);
    if own.is_empty() {
        return verdict;
    }
    let spec_pointer = format!("/{}", at.replace('.', "/"));
    let spec = object.pointer(&spec_pointer).unwrap_or(&Value::Null);
    for (result, class_name) in results(spec) {
        let mine: Vec<&Entry> = own
            .iter()
            .filter(|e| applies(&e.requests, &result))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut layers = Vec::new();
        if let Some(name) = class_name {
            match cluster.device_class(&name) {
                Some(class) => match serde_json::to_value(class.as_ref()) {
                    Ok(class) => {
                        let (class_layers, class_errors) = class_layers(&class);
                        if !class_errors.is_empty() {
                            verdict.warnings.push(format!(
                                "DeviceClass {name} has knic config the driver cannot parse; \
                                 request {result} was checked without it"
                            ));
                        }
                        layers.extend(class_layers);
                    }
                    Err(e) => verdict
                        .warnings
                        .push(format!("DeviceClass {name} could not be read: {e}")),
                },
                None => verdict.warnings.push(format!(
                    "DeviceClass {name} is not known to the webhook; request {result} was \
                     checked without the class's config"
                )),
            }
        }
        layers.extend(mine.iter().filter_map(|e| e.parsed.clone()));
        if let Err(e) = netconfig::validate(&netconfig::merge(&layers)) {
            verdict.errors.extend(e.0.into_iter().map(|f| FieldError {
                path: format!("request {result}: {}", f.path),
                message: f.message,
            }));
        }
    }
    verdict
}

/// A Network: the reconciler's own decision ([`plan`]), alone and against the Networks created
/// before it, so the refusal is the text the `Invalid` condition would carry. Without the
/// cache of Networks only the checks of the Network alone run, and a warning says the
/// reconciler still checks the rest.
///
/// On an update, the changes running pods cannot follow are refused too
/// ([`knic_proto::network::validate_update`]): the new spec alone may be valid, but pods
/// prepared under the old one would stay on the old VLAN, devices or addresses.
fn network(object: &Value, old: Option<&Value>, cluster: &dyn Cluster) -> Verdict {
    let mut verdict = Verdict::default();
    let mut network: Network = match serde_json::from_value(object.clone()) {
        Ok(n) => n,
        Err(e) => {
            verdict.errors.push(FieldError::new(
                "",
                format!("not a knic.dev/v1alpha1 Network: {e}"),
            ));
            return verdict;
        }
    };
    // On create the apiserver has stamped the object already; if not, it is the newest.
    if network.metadata.creation_timestamp.is_none() {
        network.metadata.creation_timestamp = Some(Time(Timestamp::now()));
    }
    let all: Vec<Network> = match cluster.networks() {
        Some(all) => all.iter().map(|n| n.as_ref().clone()).collect(),
        None => {
            verdict.warnings.push(
                "the webhook's cache of Networks is not ready: checked alone; the controller \
                 still checks conflicts with other Networks"
                    .to_owned(),
            );
            Vec::new()
        }
    };
    if let Some(old) = old {
        match serde_json::from_value::<Network>(old.clone()) {
            Ok(old) => verdict
                .errors
                .extend(knic_proto::network::validate_update(&old, &network)),
            // A stored object the current types cannot read (written before a field was
            // removed): its successor is checked alone rather than made unchangeable.
            Err(e) => verdict.warnings.push(format!(
                "the stored Network could not be read ({e}); the change was checked without \
                 comparing it"
            )),
        }
    }
    if let Plan::Invalid(message) = plan(&network, &all) {
        verdict.errors.push(FieldError::new("", message));
    }
    verdict
}
