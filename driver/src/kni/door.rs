//! The KNI door's work: attach, detach and query, through the same code as the kubelet's door.
//!
//! An attach picks the device (the Network's free matching devices on this node, as
//! [`super::ready`] sees them, or the one the caller names), builds the claim the attachment
//! is recorded as ([`super::sandbox::claim`]) and hands it to a [`Preparer`] of its own (no
//! CDI, no NRI guard: nothing of a sandbox's starts through the runtime's hooks) that shares
//! the node's [`ClaimStore`], IPAM and sharing budget: the same device-busy and name checks,
//! plans, addresses and durable record as a kubelet prepare. Then [`PodNetworks`] attaches it
//! into the sandbox's namespace exactly as for a pod (host state recorded before the first
//! change, all or nothing, identity checked), and a failure unprepares it again, so nothing is
//! left behind. Detach is the pod's detach followed by the kubelet's unprepare.
//!
//! Attaches and detaches through this door run one at a time, so two of them never pick the
//! same free device.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;
use knic_proto::kni;
use knic_proto::network::{Network, template_config};
use tokio::sync::{Mutex, watch};
use tonic::Status;

use super::catalog::Catalog;
use super::ready::{self, Inputs, NodeFacts};
use super::sandbox::{self, Pending, Sandbox, Wanted};
use crate::claims::checkpoint::{Checkpoint, PreparedClaim};
use crate::claims::{ClaimRef, ClaimStore, Preparer};
use crate::error::Error;
use crate::netns::{Kernel, mac_text};
use crate::pods::PodNetworks;

/// What the door works with.
pub struct Door<K> {
    /// This node's pool.
    pub pool: String,
    /// The Networks and DeviceClasses.
    pub catalog: Arc<dyn Catalog>,
    /// The devices as this node offers them (published, minus the withheld).
    pub offered: watch::Receiver<Vec<Device>>,
    /// The driver's own readiness.
    pub facts: watch::Receiver<NodeFacts>,
    /// The prepared claims (shared with the kubelet's door).
    pub claims: Arc<ClaimStore>,
    /// The door's own preparer, reading claims from `pending`.
    pub preparer: Arc<Preparer>,
    /// Where the preparer reads an attachment's claim.
    pub pending: Arc<Pending>,
    /// Attach and detach.
    pub pods: Arc<PodNetworks<K>>,
    /// One attach or detach at a time.
    pub serial: Mutex<()>,
}

/// What the door answers an attach with (besides the status).
pub type Answer = (BTreeMap<String, kni::IpConfig>, BTreeMap<String, String>);

/// A driver error as the KNI caller gets it: the claim wording ("ResourceClaim ns/name: …") is
/// the kubelet's; a KNI caller gets the reason with what it asked for.
pub fn status(what: &str, e: &Error) -> Status {
    let text = match e {
        Error::Claim { reason, .. } => format!("{what}: {reason}"),
        other => format!("{what}: {other}"),
    };
    let text = crate::bounded::cap_text(&text, 16 * 1024).into_owned();
    match e {
        Error::Claim { .. } | Error::DeviceMismatch { .. } | Error::Ipam(_) => {
            Status::failed_precondition(text)
        }
        Error::CheckpointCorrupt { .. } | Error::CheckpointUnreadable(_) => {
            Status::unavailable(text)
        }
        _ => Status::internal(text),
    }
}

impl<K: Kernel> Door<K> {
    /// The readiness of every Network on this node, as it is now.
    pub async fn readiness(&self) -> Result<ready::NodeReadiness, Status> {
        let (networks, classes) = self.catalog_now().await?;
        let checkpoint = self.checkpoint().await?;
        let devices = self.offered.borrow().clone();
        Ok(ready::node_readiness(Inputs {
            networks: &networks,
            classes: &classes,
            devices: &devices,
            checkpoint: &checkpoint,
            node: *self.facts.borrow(),
            validate: self.catalog.validates(),
        }))
    }

    async fn catalog_now(&self) -> Result<(Vec<Network>, super::catalog::Classes), Status> {
        let networks = self
            .catalog
            .networks()
            .await
            .map_err(|e| Status::unavailable(format!("reading the knic Networks: {e}")))?;
        let classes = self
            .catalog
            .classes()
            .await
            .map_err(|e| Status::unavailable(format!("reading the DeviceClasses: {e}")))?;
        Ok((networks, classes))
    }

    async fn checkpoint(&self) -> Result<Checkpoint, Status> {
        self.claims
            .snapshot()
            .await
            .map_err(|e| status("reading the checkpoint", &e))
    }

    /// Attaches `wanted` into the sandbox's namespace at `netns`; a repeat of the same
    /// attachment (same sandbox id, same network or device) answers what is there.
    pub async fn attach(
        &self,
        sandbox: &Sandbox,
        wanted: &Wanted,
        netns: PathBuf,
    ) -> Result<Answer, Status> {
        let _serial = self.serial.lock().await;
        let uid = sandbox::claim_uid(&sandbox.id, wanted);
        let what = format!("attaching {} to sandbox {}", wanted.describe(), sandbox.id);
        let recorded = self
            .claims
            .claim(&uid)
            .await
            .map_err(|e| status(&what, &e))?;
        let claim = match recorded {
            Some(claim) => {
                if let Some(other) = claim
                    .attachments
                    .iter()
                    .filter(|a| a.restore.is_some())
                    .find_map(|a| a.netns.as_ref().filter(|p| **p != netns))
                {
                    return Err(Status::already_exists(format!(
                        "{what}: isolation.path: this sandbox id has it attached in {} already; \
                         detach it first (a sandbox id names one sandbox)",
                        other.display()
                    )));
                }
                claim
            }
            None => self.prepare(sandbox, wanted, &uid, &netns, &what).await?,
        };
        let attached = self
            .pods
            .attach_claims(
                vec![claim.clone()],
                &sandbox.pod_uid(),
                &sandbox.pod_name(),
                netns.clone(),
            )
            .await;
        let statuses = match attached {
            Ok(statuses) => statuses,
            Err(e) => {
                // Nothing may stay behind: the attach undid its kernel steps, the unprepare
                // forgets the record and releases the addresses.
                let refused = status(&what, &e);
                self.unprepare(&claim).await;
                return Err(refused);
            }
        };
        let mut ipconfigs = BTreeMap::new();
        for (_, entries) in statuses {
            for entry in entries {
                let Some(ifname) = entry.interface_name.clone() else {
                    continue;
                };
                let mut extradata = BTreeMap::from([
                    (
                        "device".to_owned(),
                        format!("{}/{}", entry.pool, entry.device),
                    ),
                    ("netns".to_owned(), netns.display().to_string()),
                ]);
                if let Wanted::Network { name, .. } = wanted {
                    extradata.insert("network".to_owned(), name.clone());
                }
                ipconfigs.insert(
                    ifname,
                    kni::IpConfig {
                        ip: entry.ips.clone(),
                        mac: entry.hardware_address.clone().unwrap_or_default(),
                        extradata: extradata.into_iter().collect(),
                    },
                );
            }
        }
        tracing::info!(sandbox = %sandbox.id, pod = %sandbox.pod_name(), what = %wanted.describe(),
            interfaces = ipconfigs.len(), "KNI attach");
        let extradata = BTreeMap::from([
            ("sandbox".to_owned(), sandbox.id.clone()),
            ("netns".to_owned(), netns.display().to_string()),
        ]);
        Ok((ipconfigs, extradata))
    }

    /// Prepares the attachment's claim: devices chosen, config built, recorded.
    async fn prepare(
        &self,
        sandbox: &Sandbox,
        wanted: &Wanted,
        uid: &str,
        netns: &std::path::Path,
        what: &str,
    ) -> Result<PreparedClaim, Status> {
        let (networks, classes) = self.catalog_now().await?;
        let checkpoint = self.checkpoint().await?;
        let devices = self.offered.borrow().clone();
        let inputs = Inputs {
            networks: &networks,
            classes: &classes,
            devices: &devices,
            checkpoint: &checkpoint,
            // An attach needs a device, not the kubelet or the runtime's hooks.
            node: NodeFacts::default(),
            validate: self.catalog.validates(),
        };
        let (chosen, mut parameters) = match wanted {
            Wanted::Network { name, device } => {
                let network = networks
                    .iter()
                    .find(|n| n.metadata.name.as_deref() == Some(name.as_str()))
                    .ok_or_else(|| {
                        Status::not_found(format!(
                            "{what}: extradata.network: Network {name:?} does not exist"
                        ))
                    })?;
                let readiness = ready::node_readiness(Inputs {
                    networks: std::slice::from_ref(network),
                    ..inputs
                });
                let readiness = &readiness.networks[0];
                let others: Vec<String> = readiness
                    .reasons
                    .iter()
                    .filter(|r| !r.contains("matching devices free"))
                    .cloned()
                    .collect();
                if !others.is_empty() {
                    return Err(Status::failed_precondition(format!(
                        "{what}: Network {name:?} is not ready on this node: {}",
                        others.join("; ")
                    )));
                }
                let shareable = ready::shareable_names(&devices);
                let chosen = choose(readiness, &shareable, device.as_deref(), what)?;
                let config = serde_json::to_value(template_config(name, &network.spec))
                    .map_err(|e| Status::internal(format!("{what}: {e}")))?;
                (chosen, config)
            }
            Wanted::Inline { device, config } => {
                let offered = devices.iter().find(|d| d.name == *device).ok_or_else(|| {
                    Status::not_found(format!(
                        "{what}: extradata.device: this node offers no device {device:?} \
                         (withheld, excluded, or not present)"
                    ))
                })?;
                let shared = ready::is_shareable(offered);
                if !shared && let Some(holder) = ready::held(&checkpoint).get(device) {
                    return Err(Status::failed_precondition(format!(
                        "{what}: extradata.device: device {device:?} is in use by {holder}"
                    )));
                }
                (vec![(device.clone(), shared)], config.clone())
            }
        };
        // A name of its own in the sandbox: interfaces other claims put into this namespace
        // (a pod's DRA claims, other attachments) keep theirs.
        if chosen.len() == 1 && parameters.pointer("/interface/name").is_none() {
            let taken = names_in(&checkpoint, netns, &sandbox.pod_uid());
            let free = (1..)
                .map(|n| format!("net{n}"))
                .find(|n| !taken.contains(n))
                .unwrap_or_default();
            if let Some(object) = parameters.as_object_mut() {
                let interface = object
                    .entry("interface")
                    .or_insert_with(|| serde_json::json!({}));
                if let Some(interface) = interface.as_object_mut() {
                    interface.insert("name".into(), free.into());
                }
            }
        }
        let claim = sandbox::claim(sandbox, wanted, &self.pool, &chosen, &parameters)?;
        let wanted_ref = ClaimRef {
            namespace: sandbox.namespace.clone(),
            name: sandbox::claim_name(&sandbox.id, wanted),
            uid: uid.to_owned(),
        };
        self.pending.put(claim);
        let prepared = self
            .preparer
            .prepare(std::slice::from_ref(&wanted_ref))
            .await
            .remove(uid)
            .unwrap_or(Ok(Vec::new()));
        self.pending.take(&wanted_ref.namespace, &wanted_ref.name);
        prepared.map_err(|e| status(what, &e))?;
        self.claims
            .claim(uid)
            .await
            .map_err(|e| status(what, &e))?
            .ok_or_else(|| Status::internal(format!("{what}: the prepared claim vanished")))
    }

    async fn unprepare(&self, claim: &PreparedClaim) {
        let wanted = ClaimRef {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        };
        if let Some(Err(e)) = self
            .preparer
            .unprepare(std::slice::from_ref(&wanted))
            .await
            .remove(&claim.uid)
        {
            tracing::error!(claim = %claim.uid, error = %e,
                "could not forget a KNI attachment whose attach failed; a detach retries");
        }
    }

    /// Detaches the sandbox's attachments (only `only`'s, when given): devices home, records
    /// forgotten, addresses released. A sandbox with none is success.
    pub async fn detach(&self, id: &str, only: Option<&Wanted>) -> Result<usize, Status> {
        let _serial = self.serial.lock().await;
        let what = format!("detaching from sandbox {id}");
        let checkpoint = self.checkpoint().await?;
        let claims: Vec<PreparedClaim> = checkpoint
            .claims
            .values()
            .filter(|c| sandbox::sandbox_of(&c.uid) == Some(id))
            .filter(|c| only.is_none_or(|w| c.uid == sandbox::claim_uid(id, w)))
            .cloned()
            .collect();
        let count = claims.len();
        self.pods
            .detach_claims(claims.clone(), None)
            .await
            .map_err(|e| status(&what, &e))?;
        let refs: Vec<ClaimRef> = claims
            .iter()
            .map(|c| ClaimRef {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
            })
            .collect();
        let mut errors = Vec::new();
        for (uid, outcome) in self.preparer.unprepare(&refs).await {
            if let Err(e) = outcome {
                errors.push(format!("{uid}: {e}"));
            }
        }
        if !errors.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{what}: {}",
                errors.join("; ")
            )));
        }
        if count > 0 {
            tracing::info!(sandbox = %id, attachments = count, "KNI detach");
        }
        Ok(count)
    }

    /// Every knic interface of a pod or sandbox: its DRA claims (by namespace and pod name, or
    /// pod UID) and its KNI attachments (by sandbox id), with addresses from the checkpoint and
    /// the MAC the kernel shows now.
    pub async fn query(&self, sandbox: &Query) -> Result<Answer, Status> {
        let checkpoint = self.checkpoint().await?;
        let mut ipconfigs = BTreeMap::new();
        for claim in checkpoint.claims.values() {
            let kni = sandbox::sandbox_of(&claim.uid);
            // By name in its namespace (pods and sandboxes alike), or by id: a sandbox's id, or
            // a pod's UID for its DRA claims.
            let by_name = sandbox.name.as_deref() == Some(claim.pod_name.as_str())
                && sandbox.namespace == claim.namespace;
            let by_id = match kni {
                Some(id) => sandbox.id.as_deref() == Some(id),
                None => sandbox.id.as_deref() == Some(claim.pod_uid.as_str()),
            };
            if !(by_name || by_id) {
                continue;
            }
            for a in &claim.attachments {
                let (Some(restore), Some(path)) = (&a.restore, &a.netns) else {
                    continue;
                };
                let link = self
                    .pods
                    .link_in(path, &a.plan.pod_ifname)
                    .await
                    .unwrap_or_default();
                let mac = link.as_ref().and_then(|l| l.mac).or(a.plan.mac).or(restore
                    .host
                    .mac
                    .filter(|_| a.plan.mode.new_child().is_none()));
                let mut extradata = BTreeMap::from([
                    (
                        "device".to_owned(),
                        format!("{}/{}", a.plan.pool, a.plan.device),
                    ),
                    ("netns".to_owned(), path.display().to_string()),
                    ("present".to_owned(), link.is_some().to_string()),
                ]);
                match kni {
                    Some(_) => extradata.insert("attachedBy".to_owned(), "kni".to_owned()),
                    None => extradata.insert(
                        "claim".to_owned(),
                        format!("{}/{}", claim.namespace, claim.name),
                    ),
                };
                ipconfigs.insert(
                    a.plan.pod_ifname.clone(),
                    kni::IpConfig {
                        ip: a.plan.addresses.iter().map(ToString::to_string).collect(),
                        mac: mac.as_ref().map(mac_text).unwrap_or_default(),
                        extradata: extradata.into_iter().collect(),
                    },
                );
            }
        }
        let extradata = BTreeMap::from([("interfaces".to_owned(), ipconfigs.len().to_string())]);
        Ok((ipconfigs, extradata))
    }

    /// Whether any recorded interface is in the namespace at `netns` (a DeleteNetwork must
    /// not take a namespace with devices in it from under their records).
    pub async fn users_of(&self, netns: &std::path::Path) -> Result<Vec<String>, Status> {
        let checkpoint = self.checkpoint().await?;
        Ok(checkpoint
            .claims
            .values()
            .flat_map(|c| {
                c.attachments
                    .iter()
                    .filter(|a| a.restore.is_some() && a.netns.as_deref() == Some(netns))
                    .map(move |a| format!("{} ({})", a.plan.pod_ifname, c.name))
            })
            .collect())
    }
}

/// Who a QueryPodNetwork asks about.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Pod name (DRA claims are found by it with the namespace).
    pub name: Option<String>,
    /// Sandbox id (KNI attachments) or pod UID (DRA claims).
    pub id: Option<String>,
    /// Pod namespace.
    pub namespace: String,
}

/// The devices an attach gets: the one named (it must match and be free), or the first free
/// matching ones, as many as one pod takes.
fn choose(
    readiness: &ready::NetworkReadiness,
    shareable: &BTreeSet<String>,
    named: Option<&str>,
    what: &str,
) -> Result<Vec<(String, bool)>, Status> {
    if let Some(device) = named {
        if !readiness.matching.iter().any(|d| d == device) {
            return Err(Status::failed_precondition(format!(
                "{what}: extradata.device: device {device:?} does not match the Network's \
                 spec.devices on this node (matching: {})",
                list(&readiness.matching)
            )));
        }
        if !readiness.free.iter().any(|d| d == device) {
            return Err(Status::failed_precondition(format!(
                "{what}: extradata.device: device {device:?} is in use ({})",
                readiness.reasons.join("; ")
            )));
        }
        if readiness.needed != 1 {
            return Err(Status::failed_precondition(format!(
                "{what}: extradata.device: the Network takes {} devices per pod \
                 (spec.interfacesPerPod); name none and knic picks them",
                readiness.needed
            )));
        }
        return Ok(vec![(device.to_owned(), shareable.contains(device))]);
    }
    if readiness.free.len() < readiness.needed as usize {
        return Err(Status::resource_exhausted(format!(
            "{what}: {}",
            readiness.reasons.join("; ")
        )));
    }
    Ok(readiness
        .free
        .iter()
        .take(readiness.needed as usize)
        .map(|d| (d.clone(), shareable.contains(d)))
        .collect())
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Interface names already used in the namespace at `netns` or by the sandbox `pod_uid`.
fn names_in(checkpoint: &Checkpoint, netns: &std::path::Path, pod_uid: &str) -> BTreeSet<String> {
    checkpoint
        .claims
        .values()
        .flat_map(|c| {
            let same_pod = c.pod_uid == pod_uid;
            c.attachments
                .iter()
                .filter(move |a| same_pod || a.netns.as_deref() == Some(netns))
                .map(|a| a.plan.pod_ifname.clone())
        })
        .collect()
}
