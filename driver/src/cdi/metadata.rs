//! Device metadata for the containers that use a claim (KEP-5304, "DRA device attributes
//! downward API": alpha in Kubernetes 1.36, beta in 1.37).
//!
//! A VM launcher or a DPDK application needs to know which PCI function, VFIO group, interface
//! name, MAC and addresses it was given, without API access and without parsing knic's own
//! environment variables. The KEP fixes where that answer is (a JSON file per claim request at
//! `/var/run/kubernetes.io/dra-device-attributes/{resourceclaims/<claim>|resourceclaimtemplates/
//! <podClaimName>}/<request>/<driver>-metadata.json` inside the container) and what it holds (a
//! `metadata.resource.k8s.io/v1alpha1` `DeviceMetadata` object). The Go kubelet-plugin library
//! implements it for Go drivers; knic implements the same protocol: files under the plugin's
//! directory, bind-mounted read-only by a CDI device per request that prepare names in its
//! answer, so only containers that reference the request see them.
//!
//! Network data (the interface name, addresses and MAC in the pod) is written at prepare as far
//! as the plan knows it and rewritten when the interface is configured (before any container
//! starts) or updated live; each change raises `metadata.generation`, as the KEP requires. The
//! file is rewritten in place, not renamed over: the container's bind mount holds the inode, so a
//! renamed-in file would never reach a running container.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::claims::checkpoint::PreparedClaim;
use crate::error::{Error, Result};

/// Where the files appear inside containers.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The only version knic writes; consumers use the first object of a version they know.
pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// The file of knic's devices in a request's directory (several drivers may share one).
pub const FILE_NAME: &str = "knic.dev-metadata.json";
/// The annotation Kubernetes puts on a claim generated from a template: the pod's name for the
/// claim (`pod.spec.resourceClaims[].name`), which the container path uses instead of the
/// generated claim name nobody can predict.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// Bounds what a corrupt or planted file can make the driver read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// A request's file and where it appears in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The base request name (no `/subrequest`).
    pub request: String,
    /// The file on the host.
    pub host_path: PathBuf,
    /// The file in the container.
    pub container_path: String,
}

/// One device's network data as configured in the pod (`resource.k8s.io` `NetworkDeviceData`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkData {
    /// The device (pool-local name) it belongs to.
    pub device: String,
    /// Interface name in the pod.
    pub interface_name: Option<String>,
    /// Addresses in CIDR interface form.
    pub ips: Vec<String>,
    /// MAC in the pod.
    pub hardware_address: Option<String>,
}

/// The metadata files of prepared claims, under one host directory.
#[derive(Debug, Clone)]
pub struct Metadata {
    dir: PathBuf,
}

/// A name that becomes one path component: Kubernetes request names and UIDs are DNS labels
/// and RFC 4122 text, so anything else is refused rather than joined into a path.
fn component<'a>(what: &str, name: &'a str) -> Result<&'a str> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(name)
    } else {
        Err(Error::io(
            "naming a device metadata file",
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{what} {} is not a DNS name (letters, digits, '-' and '.')",
                    crate::bounded::quote(name, 64)
                ),
            ),
        ))
    }
}

fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

impl Metadata {
    /// Files under `dir` (the plugin's directory, e.g.
    /// `/var/lib/kubelet/plugins/knic.dev/metadata`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Metadata { dir: dir.into() }
    }

    /// The directory of all claims' files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The host file of a claim's request.
    pub fn file(&self, claim_uid: &str, request: &str) -> Result<PathBuf> {
        Ok(self
            .dir
            .join(component("claim UID", claim_uid)?)
            .join(component("request", base_request(request))?)
            .join(FILE_NAME))
    }

    /// The claim's base requests with their devices, in allocation order.
    fn requests(
        claim: &PreparedClaim,
    ) -> Vec<(&str, Vec<&crate::claims::checkpoint::PreparedDevice>)> {
        let mut out: Vec<(&str, Vec<_>)> = Vec::new();
        for d in &claim.devices {
            let base = base_request(&d.request);
            match out.iter_mut().find(|(r, _)| *r == base) {
                Some((_, devices)) => devices.push(d),
                None => out.push((base, vec![d])),
            }
        }
        out
    }

    /// Writes each request's file where it is missing (a repeated prepare keeps the file, whose
    /// generation may have been raised since) and returns where each appears in containers.
    /// `pod_claim_name` is the claim's [`POD_CLAIM_NAME_ANNOTATION`] at first prepare; later,
    /// the file written then is the record of it (the checkpoint does not carry it, so a
    /// rollback to a driver without metadata still reads every checkpoint).
    pub fn ensure(
        &self,
        claim: &PreparedClaim,
        pod_claim_name: Option<&str>,
    ) -> Result<Vec<Mount>> {
        let mut mounts = Vec::new();
        for (request, _) in Self::requests(claim) {
            let path = self.file(&claim.uid, request)?;
            // The annotation is anyone's to set on a hand-written claim: it becomes a path in
            // the container, so only a DNS label (what a pod's claim name is) is taken.
            let pod_claim_name =
                pod_claim_name.filter(|p| crate::inventory::names::is_dns_label(p));
            let pod_claim = match read(&path) {
                Some(existing) => existing
                    .get("podClaimName")
                    .and_then(Value::as_str)
                    .filter(|p| crate::inventory::names::is_dns_label(p))
                    .map(str::to_owned),
                None => {
                    let doc = document(claim, request, pod_claim_name, 1, &planned(claim));
                    create(&path, &doc)?;
                    pod_claim_name.map(str::to_owned)
                }
            };
            let container_path = match &pod_claim {
                Some(p) => {
                    format!("{CONTAINER_DIR}/resourceclaimtemplates/{p}/{request}/{FILE_NAME}")
                }
                None => format!(
                    "{CONTAINER_DIR}/resourceclaims/{}/{request}/{FILE_NAME}",
                    claim.name
                ),
            };
            mounts.push(Mount {
                request: request.to_owned(),
                host_path: path,
                container_path,
            });
        }
        Ok(mounts)
    }

    /// The claim's requests whose file is there, for prepare's answer (a request whose file
    /// could not be written has no mount in the spec either).
    pub fn present(&self, claim: &PreparedClaim) -> Vec<String> {
        Self::requests(claim)
            .into_iter()
            .filter(|(r, _)| self.file(&claim.uid, r).is_ok_and(|p| p.is_file()))
            .map(|(r, _)| r.to_owned())
            .collect()
    }

    /// Rewrites the claim's files with the interfaces as configured in the pod; a file whose
    /// content changes gets the next generation. Requests without a file are left alone (the
    /// claim was prepared without metadata).
    pub fn update(&self, claim: &PreparedClaim, network: &[NetworkData]) -> Result<()> {
        let mut data = planned(claim);
        for n in network {
            data.insert(n.device.clone(), n.clone());
        }
        for (request, _) in Self::requests(claim) {
            let path = self.file(&claim.uid, request)?;
            let Some(existing) = read(&path) else {
                continue;
            };
            let generation = existing["metadata"]["generation"].as_i64().unwrap_or(0);
            let pod_claim = existing.get("podClaimName").and_then(Value::as_str);
            let mut doc = document(claim, request, pod_claim, generation, &data);
            if doc == existing {
                continue;
            }
            doc["metadata"]["generation"] = json!(generation + 1);
            rewrite(&path, &doc)?;
        }
        Ok(())
    }

    /// Removes a claim's files; none there is fine.
    pub fn remove(&self, claim_uid: &str) -> Result<()> {
        let dir = self.dir.join(component("claim UID", claim_uid)?);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("removing {}", dir.display()), e))
            }
            _ => Ok(()),
        }
    }

    /// Removes the files of claims not in `prepared` (left by a crash between unprepare's
    /// record and its removal); returns the claim UIDs removed.
    pub fn sweep(&self, prepared: &dyn Fn(&str) -> bool) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", self.dir.display()), e)),
        };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if component("claim UID", &name).is_ok() && !prepared(&name) {
                self.remove(&name)?;
                removed.push(name);
            }
        }
        removed.sort();
        Ok(removed)
    }
}

/// The network data the plans give before attach: name and addresses always, the MAC when the
/// config or the device fixes it (a moved device keeps the one it was published with).
fn planned(claim: &PreparedClaim) -> BTreeMap<String, NetworkData> {
    let mut out = BTreeMap::new();
    for a in &claim.attachments {
        let p = &a.plan;
        let published_mac = claim
            .devices
            .iter()
            .find(|d| d.device == p.device)
            .and_then(|d| {
                d.published
                    .as_ref()?
                    .attributes
                    .as_ref()?
                    .get("mac")?
                    .string
                    .clone()
            });
        let mac = p.mac.as_ref().map(crate::netns::mac_text).or_else(|| {
            matches!(p.mode, crate::netns::AttachMode::Move)
                .then_some(published_mac)
                .flatten()
        });
        out.insert(
            p.device.clone(),
            NetworkData {
                device: p.device.clone(),
                interface_name: Some(p.pod_ifname.clone()),
                ips: p.addresses.iter().map(ToString::to_string).collect(),
                hardware_address: mac,
            },
        );
    }
    out
}

/// The `DeviceMetadata` object of one request.
fn document(
    claim: &PreparedClaim,
    request: &str,
    pod_claim_name: Option<&str>,
    generation: i64,
    network: &BTreeMap<String, NetworkData>,
) -> Value {
    let mut full_request = request.to_owned();
    let mut devices = Vec::new();
    for d in claim
        .devices
        .iter()
        .filter(|d| base_request(&d.request) == request)
    {
        full_request.clone_from(&d.request);
        let mut attributes = d
            .published
            .as_ref()
            .and_then(|p| p.attributes.as_ref())
            .map(|a| serde_json::to_value(a).unwrap_or_else(|_| json!({})))
            .unwrap_or_else(|| json!({}));
        if let Some(f) = claim.functions.iter().find(|f| f.device == d.device) {
            attributes["deviceMode"] = json!({"string": f.mode.as_str()});
            if let Some(vfio) = &f.vfio {
                attributes["vfioGroup"] = json!({"int": vfio.group});
            }
        }
        let mut device = json!({
            "driver": knic_proto::DRIVER_NAME,
            "pool": d.pool,
            "name": d.device,
            "attributes": attributes,
        });
        if let Some(n) = network.get(&d.device) {
            let mut data = json!({});
            if let Some(name) = &n.interface_name {
                data["interfaceName"] = json!(name);
            }
            if !n.ips.is_empty() {
                data["ips"] = json!(n.ips);
            }
            if let Some(mac) = &n.hardware_address {
                data["hardwareAddress"] = json!(mac);
            }
            device["networkData"] = data;
        }
        devices.push(device);
    }
    let mut doc = json!({
        "apiVersion": API_VERSION,
        "kind": "DeviceMetadata",
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": claim.uid,
            "generation": generation,
        },
        "requests": [{"name": full_request, "devices": devices}],
    });
    if let Some(p) = pod_claim_name {
        doc["podClaimName"] = json!(p);
    }
    doc
}

/// The file's object, if it is there and readable; a corrupt file counts as missing (it is
/// written again) rather than failing a prepare.
fn read(path: &Path) -> Option<Value> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES).read_to_end(&mut bytes).ok()?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) if v["apiVersion"] == API_VERSION => Some(v),
        _ => {
            tracing::warn!(path = %path.display(), "unreadable device metadata file; writing it again");
            None
        }
    }
}

fn encode(doc: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(doc).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// A new file, written whole under a temporary name first: nothing mounts it yet.
fn create(path: &Path, doc: &Value) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, encode(doc))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// An update in place (see the module comment for why not a rename).
fn rewrite(path: &Path, doc: &Value) -> Result<()> {
    let bytes = encode(doc);
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| {
            f.write_all(&bytes)?;
            f.set_len(bytes.len() as u64)?;
            f.sync_data()
        })
        .map_err(|e| Error::io(format!("updating {}", path.display()), e))
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
mod tests;
