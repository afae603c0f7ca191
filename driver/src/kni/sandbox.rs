//! What a KNI request names, checked: the sandbox (id, pod name, namespace, network
//! namespace), what to attach (a knic Network, or an inline `NetworkConfig` on a named
//! device), and the claim an attachment is recorded as.
//!
//! An attachment made through the KNI socket is a prepared claim like a kubelet's, so it goes
//! through the same plan, checkpoint, identity checks and undo. It has no ResourceClaim: its
//! UID is `kni.<sandbox id>.<network|device>.<name>` ([`SANDBOX_CLAIM_UID_PREFIX`]), which no
//! Kubernetes UID can be, and its "pod" is the sandbox (`kni.<sandbox id>`). A sandbox id is
//! limited to letters, digits, `-` and `_`, so the first dot after the prefix always ends it.
//!
//! Every refusal is a gRPC status whose message names the request field and the rule.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::resource::v1::ResourceClaim;
use knic_proto::names::{SANDBOX_CLAIM_UID_PREFIX, is_dns_label};
use serde_json::json;
use tonic::Status;

use crate::BoxFuture;
use crate::claims::ClaimSource;

/// The longest sandbox id: CRI ids are 64 hex digits, UUIDs 36 characters.
pub const MAX_ID_BYTES: usize = 128;
/// The longest inline `NetworkConfig` (`extradata.config`): a config is a few hundred bytes.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// The most entries of a request's `extradata`, `labels` or `annotations`.
pub const MAX_MAP_ENTRIES: usize = 64;
/// The longest key or value of those maps (other than `extradata.config`).
pub const MAX_VALUE_BYTES: usize = 4096;
/// The longest path (`isolation.path`, `netns_path`, `netns_path_prefix`): Linux's `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;
/// The request name of an attachment's devices, as a claim's request would be named.
pub const REQUEST: &str = "kni";
/// The `extradata` keys an attach reads; others are ignored and listed in the answer.
pub const ATTACH_KEYS: [&str; 3] = ["network", "config", "device"];

/// The sandbox an attach or detach is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// The sandbox id (the idempotency key).
    pub id: String,
    /// The pod (or VM) name.
    pub name: String,
    /// Its namespace (`default` when the request has none).
    pub namespace: String,
}

impl Sandbox {
    /// The "pod UID" the sandbox's attachments are recorded under.
    pub fn pod_uid(&self) -> String {
        sandbox_pod_uid(&self.id)
    }

    /// `namespace/name`, as log lines and errors name pods.
    pub fn pod_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The "pod UID" of sandbox `id`.
pub fn sandbox_pod_uid(id: &str) -> String {
    format!("{SANDBOX_CLAIM_UID_PREFIX}{id}")
}

/// The sandbox id of a KNI attachment's claim UID, if it is one.
pub fn sandbox_of(uid: &str) -> Option<&str> {
    let rest = uid.strip_prefix(SANDBOX_CLAIM_UID_PREFIX)?;
    Some(rest.split_once('.').map_or(rest, |(id, _)| id))
}

/// What an attach asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// A knic Network by name; optionally on a named device.
    Network {
        /// The Network.
        name: String,
        /// `extradata.device`, when the caller picks the device.
        device: Option<String>,
    },
    /// An inline `NetworkConfig` on a named device.
    Inline {
        /// The device, as this node publishes it.
        device: String,
        /// The config, as a claim's opaque parameters.
        config: serde_json::Value,
    },
}

impl Wanted {
    /// The part of the claim UID after the sandbox id: one attachment per network (or per
    /// device for inline configs) and sandbox.
    pub fn key(&self) -> String {
        match self {
            Wanted::Network { name, .. } => format!("network.{name}"),
            Wanted::Inline { device, .. } => format!("device.{device}"),
        }
    }

    /// What the answer's `extradata` and log lines call it.
    pub fn describe(&self) -> String {
        match self {
            Wanted::Network { name, .. } => format!("Network {name:?}"),
            Wanted::Inline { device, .. } => {
                format!("an inline NetworkConfig on device {device:?}")
            }
        }
    }
}

/// The claim UID of `wanted` in sandbox `id`.
pub fn claim_uid(id: &str, wanted: &Wanted) -> String {
    format!("{SANDBOX_CLAIM_UID_PREFIX}{id}.{}", wanted.key())
}

fn invalid(field: &str, rule: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {rule}"))
}

/// `id`: 1–128 letters, digits, `-` or `_`.
pub fn check_id(field: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(invalid(
            field,
            format!("must be 1 to {MAX_ID_BYTES} characters, got {}", id.len()),
        ));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(invalid(
            field,
            format!("may hold only letters, digits, '-' and '_', got {bad:?}"),
        ));
    }
    Ok(())
}

/// The sandbox of a request: `id` (required), `name` (a DNS subdomain, as a pod's), and
/// `namespace` (a DNS label; empty means `default`).
pub fn sandbox(id: &str, name: &str, namespace: &str) -> Result<Sandbox, Status> {
    check_id("id", id)?;
    let (name, namespace) = pod(name, namespace)?;
    Ok(Sandbox {
        id: id.to_owned(),
        name,
        namespace,
    })
}

/// A pod's `name` (a DNS subdomain) and `namespace` (a DNS label; empty means `default`).
pub fn pod(name: &str, namespace: &str) -> Result<(String, String), Status> {
    if let Err(e) = knic_proto::names::check_dns_subdomain(name) {
        return Err(invalid("name", format!("the pod's name {e}")));
    }
    let namespace = if namespace.is_empty() {
        "default"
    } else {
        namespace
    };
    if !is_dns_label(namespace) {
        return Err(invalid(
            "namespace",
            format!(
                "{} is not a DNS label (1 to 63 lower-case letters, digits and '-', starting \
                 and ending with a letter or digit)",
                crate::bounded::quote(namespace, 80)
            ),
        ));
    }
    Ok((name.to_owned(), namespace.to_owned()))
}

/// Bounds of a string map (`extradata`, `labels`, `annotations`): entries, key and value
/// lengths; `config` may be longer, up to [`MAX_CONFIG_BYTES`].
pub fn check_map(field: &str, map: &HashMap<String, String>) -> Result<(), Status> {
    if map.len() > MAX_MAP_ENTRIES {
        return Err(invalid(
            field,
            format!("at most {MAX_MAP_ENTRIES} entries, got {}", map.len()),
        ));
    }
    for (key, value) in map {
        if key.len() > MAX_VALUE_BYTES {
            return Err(invalid(
                field,
                format!(
                    "a key is {} bytes, over the {MAX_VALUE_BYTES}-byte limit",
                    key.len()
                ),
            ));
        }
        let limit = if key == "config" {
            MAX_CONFIG_BYTES
        } else {
            MAX_VALUE_BYTES
        };
        if value.len() > limit {
            return Err(invalid(
                &format!("{field}.{}", crate::bounded::quote(key, 64)),
                format!("{} bytes, over the {limit}-byte limit", value.len()),
            ));
        }
    }
    Ok(())
}

/// What `extradata` asks to attach, and the keys it ignores.
pub fn wanted(extradata: &HashMap<String, String>) -> Result<(Wanted, Vec<String>), Status> {
    check_map("extradata", extradata)?;
    let mut ignored: Vec<String> = extradata
        .keys()
        .filter(|k| !ATTACH_KEYS.contains(&k.as_str()))
        .map(|k| crate::bounded::quote(k, 64))
        .collect();
    ignored.sort();
    let device = extradata.get("device").map(String::as_str);
    if let Some(device) = device
        && !is_dns_label(device)
    {
        return Err(invalid(
            "extradata.device",
            format!(
                "{} is not a device name (a DNS label, as this node publishes them)",
                crate::bounded::quote(device, 80)
            ),
        ));
    }
    let wanted = match (extradata.get("network"), extradata.get("config")) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "extradata",
                "names both network and config: attach one knic Network, or one inline \
                 NetworkConfig with a device",
            ));
        }
        (None, None) => {
            return Err(invalid(
                "extradata.network",
                "required: the knic Network to attach (or extradata.config with \
                 extradata.device for an inline NetworkConfig)",
            ));
        }
        (Some(network), None) => {
            if let Err(e) = knic_proto::names::check_dns_subdomain(network) {
                return Err(invalid(
                    "extradata.network",
                    format!("the Network's name {e}"),
                ));
            }
            Wanted::Network {
                name: network.clone(),
                device: device.map(str::to_owned),
            }
        }
        (None, Some(text)) => {
            let Some(device) = device else {
                return Err(invalid(
                    "extradata.device",
                    "required with extradata.config: the device (as this node publishes it) \
                     the inline NetworkConfig is for",
                ));
            };
            let mut config: serde_json::Value = serde_yaml_ng::from_str(text).map_err(|e| {
                invalid(
                    "extradata.config",
                    format!("not a JSON or YAML NetworkConfig: {e}"),
                )
            })?;
            // The type is implied by the key: a config without apiVersion and kind gets them.
            if let Some(object) = config.as_object_mut()
                && !object.contains_key("apiVersion")
                && !object.contains_key("kind")
            {
                object.insert(
                    "apiVersion".into(),
                    knic_proto::netconfig::API_VERSION.into(),
                );
                object.insert("kind".into(), knic_proto::netconfig::KIND.into());
            }
            // The same parser and rules as a claim's opaque config, with the same paths.
            if let Err(e) = knic_proto::netconfig::parse(&config, "") {
                return Err(invalid("extradata.config", e));
            }
            Wanted::Inline {
                device: device.to_owned(),
                config,
            }
        }
    };
    Ok((wanted, ignored))
}

/// `isolation.path`: an absolute path to a network namespace other than the driver's own.
pub fn check_netns(field: &str, path: &str, kind: &str) -> Result<PathBuf, Status> {
    if !(kind.is_empty() || kind.eq_ignore_ascii_case("netns") || kind == "network namespace") {
        return Err(invalid(
            "isolation.type",
            format!(
                "{} is not served: knic attaches into network namespaces (\"netns\")",
                crate::bounded::quote(kind, 80)
            ),
        ));
    }
    let path = check_path(field, path)?;
    let meta = std::fs::metadata(&path)
        .map_err(|e| Status::failed_precondition(format!("{field}: {}: {e}", path.display())))?;
    match nix::sys::statfs::statfs(&path) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC => {}
        Ok(_) => {
            return Err(Status::failed_precondition(format!(
                "{field}: {} is not a namespace file (a pinned network namespace such as \
                 /var/run/netns/NAME, or /proc/PID/ns/net)",
                path.display()
            )));
        }
        Err(e) => {
            return Err(Status::failed_precondition(format!(
                "{field}: {}: {e}",
                path.display()
            )));
        }
    }
    if let Ok(own) = std::fs::metadata(crate::pods::HOST_NETNS)
        && own.dev() == meta.dev()
        && own.ino() == meta.ino()
    {
        return Err(Status::failed_precondition(format!(
            "{field}: {} is the driver's own network namespace (the node's); interfaces go \
             into a sandbox's",
            path.display()
        )));
    }
    Ok(path)
}

/// An absolute, normalised path of at most [`MAX_PATH_BYTES`], without `..`.
pub fn check_path(field: &str, path: &str) -> Result<PathBuf, Status> {
    if path.is_empty() {
        return Err(invalid(field, "required: an absolute path"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(invalid(
            field,
            format!("{} bytes, over the {MAX_PATH_BYTES}-byte limit", path.len()),
        ));
    }
    let p = Path::new(path);
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(invalid(
            field,
            format!(
                "{} must be an absolute path without '..'",
                crate::bounded::quote(path, 200)
            ),
        ));
    }
    if path.contains('\0') {
        return Err(invalid(field, "contains a NUL byte"));
    }
    Ok(p.components().collect())
}

/// The claim an attachment is prepared as: the devices chosen for it in this node's pool, the
/// config as the claim's opaque parameters, reserved for the sandbox.
pub fn claim(
    sandbox: &Sandbox,
    wanted: &Wanted,
    pool: &str,
    devices: &[(String, bool)],
    parameters: &serde_json::Value,
) -> Result<ResourceClaim, Status> {
    let uid = claim_uid(&sandbox.id, wanted);
    let results: Vec<serde_json::Value> = devices
        .iter()
        .map(|(device, shared)| {
            let mut result = json!({
                "request": REQUEST, "driver": knic_proto::DRIVER_NAME, "pool": pool,
                "device": device,
            });
            if *shared {
                // A share of a shared port, as consumable capacity would allocate it: its ID
                // is the attachment's own, so two sandboxes' shares never clash.
                result["shareID"] = json!(share_id(&uid));
            }
            result
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": claim_name(&sandbox.id, wanted), "namespace": sandbox.namespace, "uid": uid},
        "spec": {},
        "status": {
            "allocation": {"devices": {
                "results": results,
                "config": [{"source": "FromClaim", "requests": [REQUEST],
                    "opaque": {"driver": knic_proto::DRIVER_NAME, "parameters": parameters}}],
            }},
            "reservedFor": [{"resource": "pods", "name": sandbox.name, "uid": sandbox.pod_uid()}],
        },
    }))
    .map_err(|e| Status::internal(format!("building the attachment's claim: {e}")))
}

/// The claim name an attachment's errors and addresses carry (no such object exists): the
/// sandbox and what is attached, so two sandboxes' attachments never share one.
pub fn claim_name(id: &str, wanted: &Wanted) -> String {
    match wanted {
        Wanted::Network { name, .. } => format!("kni-{id}-{name}"),
        Wanted::Inline { device, .. } => format!("kni-{id}-{device}"),
    }
}

/// A UUID-shaped share ID derived from the attachment's UID (FNV-1a, twice).
fn share_id(uid: &str) -> String {
    let hash = |seed: u64| {
        uid.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (a, b) = (hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

/// The claims being prepared through the KNI door, answered to the preparer as if read from
/// the API (only for the UID an attach put there).
#[derive(Default)]
pub struct Pending(std::sync::Mutex<BTreeMap<(String, String), ResourceClaim>>);

impl Pending {
    /// Makes `claim` readable until [`Pending::take`].
    pub fn put(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, claim);
    }

    /// Forgets the claim of `namespace/name`.
    pub fn take(&self, namespace: &str, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
}

impl ClaimSource for Pending {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, crate::Result<Option<ResourceClaim>>> {
        Box::pin(async move {
            Ok(self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned())
        })
    }
}
