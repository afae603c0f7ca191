//! Live update: a Network's `mtu` and subnet `routes` reach the pods already running on it, in
//! place. The new values are what prepare would plan today (the same [`plans`], so the same
//! validation), the checkpoint records them and the routes to take back before the kernel
//! changes, and a restart replays a record still marked pending (every step is idempotent:
//! a route already there or already gone is fine, an MTU set twice is one MTU). Each result
//! is the claim's `NetworkUpdated` device condition and an Event; changes the kernel refuses
//! (a macvlan above its parent's MTU) are reported in the kernel's words.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use knic_proto::netconfig::{Route, RouteConfig};
use knic_proto::network::Network;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::{DeviceStatus, PodNetworks, attached_data, vfio_statuses};
use crate::claims::checkpoint::{OpaqueConfig, PreparedClaim};
use crate::claims::ipam::Addressing;
use crate::claims::plan::{IpamAddresses, configure, plans};
use crate::events::{PodRef, Warning};
use crate::netns::{self, Kernel, LinkChange, Ns, Session};

/// How long the Networks must be quiet before a change is applied: an edit saved twice, or
/// a controller status write right after, is one update.
pub const DEBOUNCE: Duration = Duration::from_secs(2);

/// The claim condition type a live update reports under.
pub const CONDITION: &str = "NetworkUpdated";
/// Event and condition reason of an applied update.
pub const APPLIED: &str = "Applied";
/// Event and condition reason of an update refused or failed.
pub const FAILED: &str = "UpdateFailed";
/// The Event reason of an applied update (a `Normal` Event).
pub const EVENT_UPDATED: &str = "NetworkUpdated";
/// The Event reason of an update refused or failed.
pub const EVENT_FAILED: &str = "NetworkUpdateFailed";

/// A live update of one attachment, in the checkpoint: written before the kernel changes
/// (`pending`), so a restart finishes it, and kept after as the claim condition's source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveUpdate {
    /// The Network generation the update brought.
    pub generation: i64,
    /// What changed, as people read it (`MTU 1450→1400, routes +203.0.113.0/24`).
    pub summary: String,
    /// Routes the pod must lose; kept while `pending`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_routes: Vec<Route>,
    /// The kernel step has not finished.
    #[serde(default)]
    pub pending: bool,
    /// Why it was refused or failed; `None` when applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// What a Network change means for one attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveChange {
    /// The pod's routes after the update (the plan's new routes).
    pub routes: Vec<Route>,
    /// Routes to delete.
    pub remove: Vec<Route>,
    /// Routes to add.
    pub add: Vec<Route>,
    /// MTU before and after, when it changes.
    pub mtu: Option<(Option<u32>, u32)>,
}

impl LiveChange {
    /// `MTU 1450→1400, routes +203.0.113.0/24 −198.51.100.0/24 (Network blue generation 7)`.
    pub fn summary(&self, network: &str, generation: i64) -> String {
        let mut parts = Vec::new();
        if let Some((old, new)) = self.mtu {
            let old = old.map_or_else(|| "default".to_owned(), |m| m.to_string());
            parts.push(format!("MTU {old}→{new}"));
        }
        if !self.add.is_empty() || !self.remove.is_empty() {
            let routes: Vec<String> = (self.add.iter().map(|r| format!("+{}", r.destination)))
                .chain(self.remove.iter().map(|r| format!("−{}", r.destination)))
                .collect();
            parts.push(format!("routes {}", routes.join(" ")));
        }
        format!(
            "{} (Network {network} generation {generation})",
            parts.join(", ")
        )
    }
}

/// What `network` as it is now means for attachment `index` of `claim`: `Ok(None)` when
/// nothing the pod has changes, `Err` with the validation's text when prepare would refuse
/// the result (then nothing is applied). Routes: the new subnet routes of the subnets the
/// attachment's addresses come from, then the claim config's own, exactly as prepare orders
/// them. MTU: the Network's only for a claim made from its template (`from_template`); a
/// hand-written claim's MTU is its own.
pub fn live_change(
    claim: &PreparedClaim,
    index: usize,
    network: &Network,
) -> Result<Option<LiveChange>, String> {
    let Some(attachment) = claim.attachments.get(index) else {
        return Ok(None);
    };
    let plan = &attachment.plan;
    let Some(device) = claim
        .devices
        .iter()
        .find(|d| d.pool == plan.pool && d.device == plan.device && d.request == plan.request)
    else {
        return Err(format!(
            "device {}/{} is no longer in the claim",
            plan.pool, plan.device
        ));
    };
    let allocations: Vec<_> = claim
        .allocations
        .iter()
        .filter(|a| plan.addresses.contains(&a.address))
        .cloned()
        .collect();
    let mut routes = Vec::new();
    for a in &allocations {
        let subnet = network
            .spec
            .ipam
            .subnets
            .iter()
            .find(|s| s.pool().is_ok_and(|p| p.subnet().contains(a.address.addr)));
        if let Some(subnet) = subnet {
            routes.extend(subnet.routes.iter().map(|r| RouteConfig {
                gateway: r.gateway.clone().or_else(|| subnet.gateway.clone()),
                ..r.clone()
            }));
        }
    }
    let mut one = claim.clone();
    one.devices = vec![device.clone()];
    one.attachments = Vec::new();
    if plan.from_template
        && let Some(mtu) = network.spec.mtu
    {
        one.configs.push(OpaqueConfig {
            source: "FromClaim".into(),
            requests: Vec::new(),
            parameters: serde_json::json!({
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"mtu": mtu},
            }),
        });
    }
    let ipam = IpamAddresses::from([(
        0,
        Addressing {
            allocations,
            routes,
            // An overlay interface keeps its segment and announced MAC: only routes and MTU
            // change live.
            overlay: match &plan.mode {
                crate::netns::AttachMode::Overlay { segment, .. } => {
                    plan.mac.map(|mac| crate::claims::ipam::OverlayFacts {
                        vni: segment.vni,
                        port: segment.port,
                        mac,
                    })
                }
                _ => None,
            },
        },
    )]);
    let new = plans(&one, &configure(&one), &BTreeSet::new(), &ipam)
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or_else(|| format!("device {}/{} has no plan", plan.pool, plan.device))?;
    let remove: Vec<Route> = (plan.routes.iter())
        .filter(|r| !new.routes.contains(r))
        .copied()
        .collect();
    let add: Vec<Route> = (new.routes.iter())
        .filter(|r| !plan.routes.contains(r))
        .copied()
        .collect();
    let mtu = match new.mtu {
        Some(m) if plan.from_template && plan.mtu != Some(m) => Some((plan.mtu, m)),
        _ => None,
    };
    if remove.is_empty() && add.is_empty() && mtu.is_none() {
        return Ok(None);
    }
    Ok(Some(LiveChange {
        routes: new.routes,
        remove,
        add,
        mtu,
    }))
}

/// A token bucket: `rate` updates per second, bursts up to `rate`, so one Network change
/// never touches more than that many pods of the node in a second.
pub struct RateLimit {
    rate: f64,
    state: Mutex<(f64, tokio::time::Instant)>,
}

impl RateLimit {
    /// `rate` pods per second (at least one).
    pub fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        RateLimit {
            rate,
            state: Mutex::new((rate, tokio::time::Instant::now())),
        }
    }

    /// Waits for a token.
    pub async fn take(&self) {
        let mut s = self.state.lock().await;
        loop {
            let now = tokio::time::Instant::now();
            let refill = now.duration_since(s.1).as_secs_f64() * self.rate;
            s.0 = (s.0 + refill).min(self.rate);
            s.1 = now;
            if s.0 >= 1.0 {
                s.0 -= 1.0;
                return;
            }
            let wait = (1.0 - s.0) / self.rate;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}

impl<K: Kernel> PodNetworks<K> {
    /// Brings every attached device of `network` on this node to the Network as it is now,
    /// one pod per token of `limit`. Returns how many attachments were updated or refused.
    pub async fn update_network(&self, network: &Network, limit: &RateLimit) -> usize {
        let name = network.name_any();
        let generation = network.metadata.generation.unwrap_or_default();
        let Ok(snapshot) = self.claims.snapshot().await else {
            return 0;
        };
        let mut done = 0;
        for claim in snapshot.claims.values() {
            for (index, a) in claim.attachments.iter().enumerate() {
                if !a.attached
                    || a.netns.is_none()
                    || a.plan.network.as_deref() != Some(name.as_str())
                    || a.live.as_ref().is_some_and(|l| l.generation >= generation)
                {
                    continue;
                }
                let record = match live_change(claim, index, network) {
                    Ok(None) => continue,
                    Ok(Some(change)) => {
                        limit.take().await;
                        LiveUpdate {
                            generation,
                            summary: change.summary(&name, generation),
                            remove_routes: change.remove.clone(),
                            pending: true,
                            failed: None,
                        }
                        .with_plan(change)
                    }
                    Err(why) => (
                        LiveUpdate {
                            generation,
                            summary: String::new(),
                            remove_routes: Vec::new(),
                            pending: false,
                            failed: Some(format!(
                                "Network {name} generation {generation} cannot be applied: {why}"
                            )),
                        },
                        None,
                    ),
                };
                self.apply_live(&claim.uid, index, record).await;
                done += 1;
            }
        }
        done
    }

    /// Finishes the live updates a restart interrupted (recorded, kernel step pending).
    pub async fn replay_live_updates(&self) -> usize {
        let Ok(snapshot) = self.claims.snapshot().await else {
            return 0;
        };
        let mut done = 0;
        for claim in snapshot.claims.values() {
            for (index, a) in claim.attachments.iter().enumerate() {
                if a.live.as_ref().is_some_and(|l| l.pending) {
                    tracing::info!(claim = %claim.name, device = %a.plan.device,
                        "finishing a live update a restart interrupted");
                    self.kernel_step(&claim.uid, index).await;
                    done += 1;
                }
            }
        }
        done
    }

    /// Checkpoint first (the new plan and the pending record), then the kernel.
    async fn apply_live(&self, uid: &str, index: usize, record: (LiveUpdate, Option<PlanValues>)) {
        let (live, values) = record;
        let pending = live.pending;
        let written = self
            .claims
            .update(uid, move |c| {
                if let Some(a) = c.attachments.get_mut(index) {
                    if let Some((routes, mtu)) = values {
                        a.plan.routes = routes;
                        if mtu.is_some() {
                            a.plan.mtu = mtu;
                        }
                    }
                    a.live = Some(live);
                }
            })
            .await;
        match written {
            Ok(true) if pending => self.kernel_step(uid, index).await,
            Ok(true) => self.report(uid, index).await,
            Ok(false) => {}
            Err(e) => tracing::error!(claim = %uid, error = %e, "recording a live update failed"),
        }
    }

    /// Deletes the dropped routes, adds the plan's (present ones are fine), sets the MTU; then
    /// clears `pending` and records the kernel's answer.
    async fn kernel_step(&self, uid: &str, index: usize) {
        let Ok(Some(claim)) = self.claims.claim(uid).await else {
            return;
        };
        let Some(a) = claim.attachments.get(index) else {
            return;
        };
        let (Some(path), Some(live)) = (&a.netns, &a.live) else {
            return;
        };
        let plan = &a.plan;
        let outcome: crate::Result<()> = async {
            let Some(mut s) = self.kernel.open(&Ns::Pod(path.clone())).await? else {
                return Err(crate::Error::io(
                    format!("opening the network namespace {}", path.display()),
                    std::io::Error::other("the pod's network namespace is gone"),
                ));
            };
            if let Some(mtu) = plan.mtu {
                let change = LinkChange {
                    mtu: Some(mtu),
                    ..LinkChange::default()
                };
                // An overlay interface's host end first: a veth end smaller than its peer
                // drops the larger frames without a word.
                if let crate::netns::AttachMode::Overlay { host_veth, .. } = &plan.mode
                    && let Some(mut host) = self.kernel.open(&Ns::Host).await?
                {
                    host.set_link(host_veth, &change).await?;
                }
                s.set_link(&plan.pod_ifname, &change).await?;
            }
            s.del_routes(&plan.pod_ifname, &live.remove_routes).await?;
            s.add_routes(&plan.pod_ifname, &plan.routes).await
        }
        .await;
        let failed = outcome.err().map(|e| e.to_string());
        let _ = self
            .claims
            .update(uid, move |c| {
                if let Some(l) = c.attachments.get_mut(index).and_then(|a| a.live.as_mut()) {
                    l.pending = false;
                    l.remove_routes.clear();
                    l.failed = failed;
                }
            })
            .await;
        self.report(uid, index).await;
    }

    /// The claim condition for every device of the claim (a status write replaces this
    /// driver's entries whole) and an Event for the device just updated.
    async fn report(&self, uid: &str, index: usize) {
        let Ok(Some(claim)) = self.claims.claim(uid).await else {
            return;
        };
        let Some(live) = claim.attachments.get(index).and_then(|a| a.live.clone()) else {
            return;
        };
        let (reason, message) = match &live.failed {
            None => (EVENT_UPDATED, live.summary.clone()),
            Some(why) => (EVENT_FAILED, why.clone()),
        };
        tracing::info!(claim = %claim.name, pod = %claim.pod_name, reason, %message, "live update");
        if knic_proto::names::is_sandbox_claim_uid(&claim.uid) {
            return;
        }
        let sink = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let short_name = (claim.pod_name.rsplit_once('/')).map_or(claim.pod_name.as_str(), |p| p.1);
        sink.warn(Warning {
            claim: crate::claims::ClaimRef {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                uid: claim.uid.clone(),
            },
            pod: Some(PodRef {
                name: short_name.to_owned(),
                uid: claim.pod_uid.clone(),
            }),
            action: "UpdateNetwork",
            reason,
            message,
        });
        let entries = self.statuses(&claim).await;
        self.publish_status(claim, entries);
    }

    /// The claim's entries as attach wrote them, each with its live update's condition.
    async fn statuses(&self, claim: &PreparedClaim) -> Vec<DeviceStatus> {
        let mut session = match claim.attachments.iter().find_map(|a| a.netns.clone()) {
            Some(path) => self.kernel.open(&Ns::Pod(path)).await.ok().flatten(),
            None => None,
        };
        let mut out = Vec::new();
        for a in claim.attachments.iter().filter(|a| a.attached) {
            let mac = match session.as_mut() {
                Some(s) => s.find_link(&a.plan.pod_ifname).await.ok().flatten(),
                None => None,
            }
            .and_then(|l| l.mac)
            .or(a.plan.mac);
            out.push(DeviceStatus {
                pool: a.plan.pool.clone(),
                device: a.plan.device.clone(),
                ready: true,
                reason: "InterfaceConfigured".into(),
                message: format!("{} configured in pod {}", a.plan.pod_ifname, claim.pod_name),
                interface_name: Some(a.plan.pod_ifname.clone()),
                // With the lease's address: a live update must not drop it from the status.
                ips: a
                    .plan
                    .addresses
                    .iter()
                    .copied()
                    .chain(a.lease.as_ref().map(crate::dhcp::Lease::cidr))
                    .map(|c| c.to_string())
                    .collect(),
                hardware_address: mac.as_ref().map(netns::mac_text),
                data: attached_data(claim, &a.plan),
                updated: a.live.as_ref().map(Updated::of),
            });
        }
        out.extend(vfio_statuses(claim, &claim.pod_name));
        out
    }
}

/// The new plan values a change brings: routes and MTU.
type PlanValues = (Vec<Route>, Option<u32>);

impl LiveUpdate {
    fn with_plan(self, change: LiveChange) -> (LiveUpdate, Option<PlanValues>) {
        (self, Some((change.routes, change.mtu.map(|m| m.1))))
    }
}

/// The `NetworkUpdated` condition of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Updated {
    /// Applied.
    pub ok: bool,
    /// `Applied` or `UpdateFailed`.
    pub reason: String,
    /// The summary or the reason it failed.
    pub message: String,
}

impl Updated {
    fn of(live: &LiveUpdate) -> Updated {
        match &live.failed {
            None => Updated {
                ok: true,
                reason: APPLIED.into(),
                message: live.summary.clone(),
            },
            Some(why) => Updated {
                ok: false,
                reason: FAILED.into(),
                message: why.clone(),
            },
        }
    }
}

/// Runs [`PodNetworks::update_network`] for every Network whose generation changed, once the
/// Networks have been quiet for `debounce` (an `kubectl edit` saved twice is one update).
pub async fn follow<K: Kernel>(
    pods: Arc<PodNetworks<K>>,
    mut networks: tokio::sync::watch::Receiver<Arc<Vec<Network>>>,
    rate: u32,
    debounce: Duration,
) {
    let limit = RateLimit::new(rate);
    let replayed = pods.replay_live_updates().await;
    if replayed > 0 {
        tracing::info!(replayed, "finished interrupted live updates");
    }
    let mut seen: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    loop {
        if networks.changed().await.is_err() {
            return;
        }
        // Quiet period: wait until no change arrives for `debounce`, but never longer than
        // five of them, so a Network edited in a loop is still applied.
        let give_up = tokio::time::Instant::now() + debounce * 5;
        while tokio::time::Instant::now() < give_up
            && let Ok(Ok(())) = tokio::time::timeout(debounce, networks.changed()).await
        {}
        let current = networks.borrow_and_update().clone();
        for n in current.iter() {
            let generation = n.metadata.generation.unwrap_or_default();
            // The first sight of each Network compares too: a Network changed while the
            // driver was down is applied then (each plan says what the pod has).
            if seen.insert(n.name_any(), generation) != Some(generation) {
                pods.update_network(n, &limit).await;
            }
        }
    }
}
