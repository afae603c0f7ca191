//! Address allocation for claims whose config says `ipam: {network: NAME}`.
//!
//! **Decision: the driver allocates, at prepare time.** The node is the party that knows the
//! claim, its pod and its devices when an address is needed, so allocating here costs no extra
//! round trip through the controller, keeps prepare working while the controller is down or
//! being upgraded, and puts the address into the attach plan (and the checkpoint) before the
//! pod's sandbox exists. The controller's part is bookkeeping that may lag: it garbage-collects
//! allocations whose claim is gone and reports free/total in the Network's status.
//!
//! **Uniqueness comes from the apiserver, never from this process.** Every allocation is a
//! cluster-scoped `NetworkAddress` object named `allocation_name(network, ip)`, one name per
//! address. Creating that object is the atomic step: exactly one create of a name succeeds, on
//! whatever node it runs, so an address can never be handed out twice. A create answered with
//! `409 AlreadyExists` means someone else holds the address; the allocator marks it taken and
//! proposes the next candidate. Nothing shared is ever read, modified and written back.
//!
//! Candidates come from `knic_proto::ipam`, the same arithmetic the controller counts
//! with: one LIST of the network's allocations (label `knic.dev/network=NAME`) seeds a local
//! "taken" set, and probing starts at a per-claim hint (a hash of the claim UID, so concurrent
//! allocators rarely collide) or, with `stableAddresses`, at the offset of the pod's identity,
//! so a returning pod gets its former address when it is still free.
//!
//! **Idempotent.** If the LIST shows an allocation that already belongs to this claim (by UID),
//! it is reused instead of creating a second one: that is what a re-prepare after a crash
//! between the create and the checkpoint write finds. Allocations are recorded in the
//! checkpoint (name and object UID), so unprepare releases them from the checkpoint alone;
//! release deletes by name with a UID precondition, so it can never delete an allocation that
//! was collected and re-created for another claim meanwhile.
//!
//! **Holds.** With `stableAddresses.gracePeriodSeconds`, unprepare marks an identity's
//! allocation held (metadata only) instead of deleting it ([`release_or_hold`]), and the next
//! claim of that identity deletes it (uid precondition) and creates it again for itself, only
//! when no pod can be using it (`take_over`); the controller ends holds (`controller/src/gc.rs`).
//!
//! The API is reached only through [`AddressBook`], so the rules run in unit tests against an
//! in-memory book (which can also simulate a racing node) and in production against the
//! apiserver ([`crate::api::KubeAddressBook`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use knic_proto::ipam::{Pool, allocation_name, parse_allocation_name, stable_offset};
use knic_proto::netconfig::{Cidr, RouteConfig};
use knic_proto::network::stable::{kubevirt_vm, not_a_launcher};
use knic_proto::network::{
    CONDITION_INVALID, ClaimRef, NETWORK_LABEL, Network, NetworkAddress, NetworkAddressSpec,
    OVERLAY_LABEL, OverlayEndpoint, StableBy, Subnet,
};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use crate::BoxFuture;

mod stable;
pub use stable::{TAKEOVER_LABEL, held_since_now, hold_patch, release_or_hold};
use stable::{is_held, is_reservation, take_over};

/// What a create of an allocation object came back with.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The object is ours; the UID the apiserver gave it (the release's precondition).
    Created(String),
    /// `409 AlreadyExists`: the address belongs to someone else.
    AlreadyExists,
}

/// What became of the claim an identity's earlier allocation names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    /// No claim of that name and uid: the allocation is the identity's to take over.
    Gone,
    /// The claim exists with a `deletionTimestamp`: its unprepare has yet to run.
    Deleting,
    /// The claim exists: another live pod has this identity (two pods with one label value).
    Live,
}

/// The API calls IPAM needs; a trait so allocation rules are tested without an apiserver.
pub trait AddressBook: Send + Sync + 'static {
    /// The Network, or `None` when it does not exist.
    fn network<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Network>>>;
    /// Whether pods may be read ([`AddressBook::pod_labels`]): off unless the operator
    /// granted it (`--pod-label-reads`), because RBAC cannot grant a pod's labels alone, only
    /// every pod's whole object, cluster-wide, to every node.
    fn reads_pod_labels(&self) -> bool;
    /// A pod's labels (only needed for `stableAddresses.by: label`, and only called when
    /// [`AddressBook::reads_pod_labels`]), `None` when it is gone.
    fn pod_labels<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>>;
    /// A namespace's labels (only needed when the Network selects namespaces by label), `None`
    /// when the namespace does not exist.
    fn namespace_labels<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>>;
    /// Every allocation object of `network` (label `knic.dev/network=NETWORK`).
    fn list<'a>(&'a self, network: &'a str) -> BoxFuture<'a, Result<Vec<NetworkAddress>>>;
    /// Creates an allocation object; `AlreadyExists` is an answer, not an error.
    fn create<'a>(&'a self, address: &'a NetworkAddress) -> BoxFuture<'a, Result<Created>>;
    /// Deletes the allocation object `name` if its UID is still `uid`. An object that is gone,
    /// or that now has another UID (collected and re-created for someone else), is success:
    /// either way our allocation no longer exists.
    fn delete<'a>(&'a self, name: &'a str, uid: &'a str) -> BoxFuture<'a, Result<()>>;
    /// Whether the claim `namespace/name` with `uid` still exists (a claim of that name with
    /// another uid is another claim: `Gone`).
    fn claim_state<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<ClaimState>>;
    /// Marks the allocation object `name` (if its UID is still `uid`) held since `since`
    /// (RFC 3339) by patching its metadata only; gone or re-created is success.
    fn hold<'a>(&'a self, name: &'a str, uid: &'a str, since: &'a str)
    -> BoxFuture<'a, Result<()>>;
    /// Reports that a stable address is in use by another live pod of the same identity, so
    /// this claim gets another address (an Event on the claim; best effort, never blocks).
    fn stable_in_use(&self, who: &Requester, message: String);
}

/// One address this driver holds for a claim, as the checkpoint records it: enough to release
/// it without the Network or the claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allocation {
    /// The Network's name.
    pub network: String,
    /// The `NetworkAddress` object's name.
    pub name: String,
    /// The object's UID, the precondition of the release.
    pub uid: String,
    /// The address in interface form (with the subnet's prefix length).
    pub address: Cidr,
    /// The stable identity the object carries, if any: unprepare then holds the address
    /// instead of deleting it when the Network has a grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// Who asks for an address: the claim (the allocation's owner), its pod (the stable identity)
/// and the node (recorded on the object so a node's allocations can be found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    /// Claim namespace, also the pod's.
    pub namespace: String,
    /// Claim name.
    pub claim: String,
    /// Claim UID: the owner key of an allocation.
    pub uid: String,
    /// The pod the claim is reserved for.
    pub pod: String,
    /// This node.
    pub node: String,
    /// This node's tunnel endpoint, when the interface is on the node's overlay device: an
    /// overlay Network's allocation then announces where the interface is.
    pub vtep: Option<IpAddr>,
}

/// What an overlay interface is, decided with its address: the Network's segment and the MAC
/// announced to the other nodes (the plan gives the interface exactly this MAC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayFacts {
    /// The Network's VNI.
    pub vni: u32,
    /// Its UDP port.
    pub port: u16,
    /// The interface's MAC.
    pub mac: [u8; 6],
}

/// What one interface got from a Network: one address per family the Network has subnets for,
/// and the routes of the subnets they came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addressing {
    /// The allocations, IPv4 first.
    pub allocations: Vec<Allocation>,
    /// The subnets' routes, a route without a gateway using its subnet's gateway as next hop
    /// (the Network's contract: the gateway is "the next hop pods use for routes").
    pub routes: Vec<RouteConfig>,
    /// Set for an overlay Network (`spec.vxlan`).
    pub overlay: Option<OverlayFacts>,
}

impl Addressing {
    /// The addresses in interface form, for the attach plan.
    pub fn addresses(&self) -> Vec<Cidr> {
        self.allocations.iter().map(|a| a.address).collect()
    }
}

/// Why `network` must not give a claim in `namespace` an address, or `None` when it may.
/// `labels` are the namespace's labels, needed only when the Network selects by label.
///
/// The controller generates templates only in selected namespaces, but anyone may write a claim
/// with `ipam: {network: NAME}` by hand: this is where the Network's `spec.namespaces` is
/// enforced. A Network being deleted or marked `Invalid` (for its current spec) hands out
/// nothing, so a broken or withdrawn network cannot keep growing.
pub fn refusal(
    network: &Network,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    let name = network.metadata.name.as_deref().unwrap_or_default();
    if network.metadata.deletion_timestamp.is_some() {
        return Some(format!(
            "Network {name:?} is being deleted; it allocates no new addresses"
        ));
    }
    if network.condition_is_true(CONDITION_INVALID) {
        let message = network
            .condition(CONDITION_INVALID)
            .map(|c| c.message.as_str())
            .unwrap_or_default();
        return Some(format!(
            "Network {name:?} is Invalid, so it allocates no addresses: {message}"
        ));
    }
    let namespaces = &network.spec.namespaces;
    if namespaces.selects(namespace, labels.unwrap_or(&BTreeMap::new())) {
        return None;
    }
    Some(match &namespaces.selector {
        Some(selector) => {
            let wanted: Vec<String> = selector
                .match_labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let why = if labels.is_none() {
                "the namespace does not exist"
            } else {
                "its labels do not match"
            };
            format!(
                "Network {name:?} is not offered to namespace {namespace:?} ({why}: \
                 spec.namespaces.selector.matchLabels is {{{}}})",
                wanted.join(", ")
            )
        }
        None => format!(
            "Network {name:?} is not offered to namespace {namespace:?} (spec.namespaces.names \
             is [{}])",
            namespaces.names.join(", ")
        ),
    })
}

/// Why a claim of Network `network`, whose addresses are stable by pod label `label`, cannot
/// be prepared by a driver that does not read pods: the label is needed at prepare, before the
/// pod's sandbox exists (so NRI cannot tell it yet), and reading it means the grant the text
/// spells out.
pub fn pod_label_reads_off(network: &str, label: &str) -> String {
    format!(
        "Network {network:?} has spec.stableAddresses.by: label (label {label:?}), which needs \
         the pod's labels when the claim is prepared, and this driver reads no pods \
         (--pod-label-reads/KNIC_POD_LABEL_READS is false, the chart's default). Either use \
         spec.stableAddresses.by: podName (no pod read: the pod's name comes from the claim's \
         reservedFor), or install the chart with driver.podLabelReads: true, which grants every \
         node's driver get on every pod in every namespace: the whole object, spec and literal \
         env values included, not only its labels"
    )
}

/// Allocates (or finds again) the addresses of interface number `interface` of `who`'s claim
/// from Network `network_name`. `skip` names allocation objects already given to other
/// interfaces of the same claim in this prepare, so reuse never hands one address to two
/// interfaces. See the module documentation for the algorithm and why it is safe.
///
/// On error nothing this call created is left behind (best effort: a failed delete is logged
/// and left to the controller's collection once the claim is gone).
pub async fn allocate(
    book: &dyn AddressBook,
    network_name: &str,
    who: &Requester,
    interface: u32,
    skip: &BTreeSet<String>,
) -> Result<Addressing> {
    let mut created = Vec::new();
    let mut reservations = Vec::new();
    let outcome = allocate_inner(
        book,
        network_name,
        who,
        interface,
        skip,
        &mut created,
        &mut reservations,
    )
    .await;
    // A takeover's reservations only bridge its delete and create: gone either way.
    if let Err(e) = release(book, &reservations).await {
        tracing::warn!(network = %network_name, error = %e,
            "could not delete a takeover reservation; the controller collects it with its claim");
    }
    if outcome.is_err() {
        crate::metrics::metrics()
            .ipam_allocations
            .inc([crate::metrics::ERROR]);
    }
    if outcome.is_err()
        && !created.is_empty()
        && let Err(e) = release(book, &created).await
    {
        tracing::warn!(network = %network_name, error = %e,
            "could not release addresses of a failed allocation; the controller collects them");
    }
    outcome
}

async fn allocate_inner(
    book: &dyn AddressBook,
    network_name: &str,
    who: &Requester,
    interface: u32,
    skip: &BTreeSet<String>,
    created: &mut Vec<Allocation>,
    reservations: &mut Vec<Allocation>,
) -> Result<Addressing> {
    let network = book
        .network(network_name)
        .await?
        .ok_or_else(|| Error::Ipam(format!("Network {network_name:?} does not exist")))?;
    let labels = match &network.spec.namespaces.selector {
        Some(_) => book.namespace_labels(&who.namespace).await?,
        None => None,
    };
    if let Some(why) = refusal(&network, &who.namespace, labels.as_ref()) {
        return Err(Error::Ipam(why));
    }
    let spec = &network.spec;
    if spec.ipam.subnets.is_empty() {
        return Err(Error::Ipam(format!(
            "Network {network_name:?} has static addressing (spec.ipam.static): give the \
             addresses in the claim's config instead of ipam"
        )));
    }
    let mut pools: Vec<(&Subnet, Pool)> = Vec::with_capacity(spec.ipam.subnets.len());
    for (i, subnet) in spec.ipam.subnets.iter().enumerate() {
        let pool = subnet.pool().map_err(|e| {
            Error::Ipam(format!(
                "Network {network_name:?} spec.ipam.subnets[{i}]: {e} (see the Network's \
                 Invalid condition)"
            ))
        })?;
        pools.push((subnet, pool));
    }

    let identity = match &spec.stable_addresses {
        None => None,
        Some(stable) => {
            if stable.by == StableBy::KubevirtVm && kubevirt_vm(&who.pod).is_none() {
                return Err(Error::Ipam(not_a_launcher(network_name, &who.pod)));
            }
            let labels = match stable.by {
                StableBy::Label if !book.reads_pod_labels() => {
                    return Err(Error::Ipam(pod_label_reads_off(
                        network_name,
                        stable.label.as_deref().unwrap_or_default(),
                    )));
                }
                StableBy::Label => book
                    .pod_labels(&who.namespace, &who.pod)
                    .await?
                    .unwrap_or_default(),
                // The name is the claim's `reservedFor`: no pod read.
                StableBy::PodName | StableBy::KubevirtVm => BTreeMap::new(),
            };
            stable.identity(&who.namespace, &who.pod, &labels, interface)
        }
    };
    // Without an identity the claim UID spreads racing allocators over the subnet; later
    // interfaces of one claim hash differently so they do not all start at one address.
    let hint_key = match &identity {
        Some(id) => id.clone(),
        None if interface == 0 => who.uid.clone(),
        None => format!("{}#{interface}", who.uid),
    };

    let overlay = match (&spec.vxlan, who.vtep) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(Error::Ipam(format!(
                "Network {network_name:?} is an overlay (spec.vxlan): its pods need the node's \
                 overlay device (class overlay.knic.dev), which this device is not"
            )));
        }
        (Some(vxlan), Some(vtep)) => Some((vxlan.clone(), vtep)),
    };

    let existing = book.list(network_name).await?;
    let mut taken: BTreeSet<IpAddr> = BTreeSet::new();
    let mut mine: Vec<Allocation> = Vec::new();
    let mut returning: Vec<(&NetworkAddress, IpAddr)> = Vec::new();
    for object in &existing {
        let name = object.metadata.name.clone().unwrap_or_default();
        let ip = match parse_allocation_name(&name) {
            Some((net, ip)) if net == network_name => ip,
            // Not an allocation of this network by name: the spec's address still counts.
            _ => match object.spec.address.parse::<Cidr>() {
                Ok(cidr) => cidr.addr,
                Err(_) => continue,
            },
        };
        if is_reservation(object) {
            // Our own, left by a crash mid-takeover: not in the way of this prepare.
            if object.spec.claim.uid == who.uid && object.spec.node.as_deref() == Some(&who.node) {
                if let Ok(address) = object.spec.address.parse::<Cidr>() {
                    reservations.push(Allocation {
                        network: network_name.to_owned(),
                        name,
                        uid: object.metadata.uid.clone().unwrap_or_default(),
                        address,
                        identity: None,
                    });
                }
            } else {
                taken.insert(ip);
            }
            continue;
        }
        taken.insert(ip);
        let held = is_held(object);
        if identity.is_some()
            && object.spec.identity == identity
            && (object.spec.claim.uid != who.uid || held)
        {
            returning.push((object, ip));
            continue;
        }
        // Only this node's own allocations are reused: the chart's admission policy lets a
        // node release only objects naming it in spec.node, so one made by another node (which
        // no correct node does for a claim allocated here) could never be released from here.
        if object.spec.claim.uid == who.uid
            && object.spec.node.as_deref() == Some(who.node.as_str())
            && !skip.contains(&name)
        {
            let Ok(address) = object.spec.address.parse::<Cidr>() else {
                continue;
            };
            mine.push(Allocation {
                network: network_name.to_owned(),
                name,
                uid: object.metadata.uid.clone().unwrap_or_default(),
                address,
                identity: object.spec.identity.clone(),
            });
        }
    }
    // The identity's earlier addresses: freed for this claim when their claim is gone.
    let mut preferred: Vec<IpAddr> = Vec::new();
    if mine.is_empty() {
        for &(object, ip) in &returning {
            if take_over(book, network_name, who, object, ip, reservations).await? {
                taken.remove(&ip);
                preferred.push(ip);
            }
        }
    }

    // The MAC follows the identity, so its other nodes' entries and its peers' ARP caches
    // stay right when it returns; but while another pod still has the identity's address (two
    // live pods with one identity, a migration, a lost node not yet marked held), that pod
    // keeps announcing the identity's MAC too, and this interface gets its claim's own.
    let mac_key = if returning.is_empty() || !preferred.is_empty() {
        hint_key.clone()
    } else if interface == 0 {
        who.uid.clone()
    } else {
        format!("{}#{interface}", who.uid)
    };
    let overlay = overlay.map(|(vxlan, vtep)| {
        let facts = OverlayFacts {
            vni: vxlan.vni,
            port: vxlan.port(),
            mac: knic_proto::ipam::overlay_mac(network_name, &mac_key),
        };
        (facts, vtep)
    });

    let mut out = Addressing::default();
    for v4 in [true, false] {
        let family: Vec<&(&Subnet, Pool)> = pools
            .iter()
            .filter(|(_, p)| p.subnet().is_ipv4() == v4)
            .collect();
        if family.is_empty() {
            continue;
        }
        // A crash between create and checkpoint left this claim an address: take it again.
        let reused = mine.iter().find_map(|a| {
            family
                .iter()
                .find(|(_, p)| p.subnet().contains(a.address.addr))
                .map(|(s, _)| (a.clone(), *s))
        });
        let (allocation, subnet) = match reused {
            Some(found) => {
                tracing::info!(network = %network_name, address = %found.0.address,
                    claim = %who.claim, "reusing this claim's existing allocation");
                found
            }
            None => {
                let probe = Probe {
                    identity: identity.as_deref(),
                    hint_key: &hint_key,
                    preferred: &preferred,
                    overlay: overlay.as_ref(),
                };
                claim_one(book, network_name, who, &probe, &family, &mut taken).await?
            }
        };
        if !mine.iter().any(|m| m.name == allocation.name) {
            created.push(allocation.clone());
        }
        out.routes.extend(subnet.routes.iter().map(|r| RouteConfig {
            gateway: r.gateway.clone().or_else(|| subnet.gateway.clone()),
            ..r.clone()
        }));
        out.allocations.push(allocation);
    }
    out.overlay = overlay.map(|(facts, _)| facts);
    Ok(out)
}

/// Where [`claim_one`] starts probing: the identity's former addresses first, then the
/// offset of `hint_key`.
struct Probe<'a> {
    /// The stable identity recorded on the object.
    identity: Option<&'a str>,
    /// The identity, or the claim uid: the start of the probe.
    hint_key: &'a str,
    /// Addresses taken over for this identity, tried before any other.
    preferred: &'a [IpAddr],
    /// For an overlay Network: what the object announces, and this node's tunnel endpoint.
    overlay: Option<&'a (OverlayFacts, IpAddr)>,
}

/// Proposes and creates addresses of one family until a create succeeds, moving to the next
/// subnet of the family when one is exhausted; fails with the exhaustion text when all are.
async fn claim_one<'s>(
    book: &dyn AddressBook,
    network_name: &str,
    who: &Requester,
    probe: &Probe<'_>,
    family: &[&'s (&'s Subnet, Pool)],
    taken: &mut BTreeSet<IpAddr>,
) -> Result<(Allocation, &'s Subnet)> {
    let Probe {
        identity,
        hint_key,
        preferred,
        overlay,
    } = *probe;
    let mut exhausted = Vec::new();
    for (subnet, pool) in family.iter().map(|e| (e.0, &e.1)) {
        let hint = stable_offset(network_name, hint_key, pool);
        loop {
            // The identity's own former address first, even if the subnet's rules moved its
            // offset (it was allocated when another address sat there).
            let again = preferred
                .iter()
                .find(|ip| pool.contains_usable(**ip) && !taken.contains(ip));
            let ip = match again {
                Some(ip) => Ok(*ip),
                None => {
                    knic_proto::ipam::allocate(network_name, pool, |ip| taken.contains(&ip), hint)
                }
            };
            let ip = match ip {
                Ok(ip) => ip,
                Err(e) => {
                    exhausted.push(e.to_string());
                    break;
                }
            };
            let prefixed = Cidr::new(ip, pool.subnet().prefix_len)
                .map_err(|e| Error::Ipam(format!("{ip}: {e}")))?;
            let name = allocation_name(network_name, ip);
            let mut object = NetworkAddress::new(
                &name,
                NetworkAddressSpec {
                    network: network_name.to_owned(),
                    address: prefixed.to_string(),
                    claim: ClaimRef {
                        namespace: who.namespace.clone(),
                        name: who.claim.clone(),
                        uid: who.uid.clone(),
                    },
                    identity: identity.map(str::to_owned),
                    node: Some(who.node.clone()),
                    overlay: overlay.map(|(facts, vtep)| OverlayEndpoint {
                        vni: facts.vni,
                        mac: crate::netns::mac_text(&facts.mac),
                        vtep: vtep.to_string(),
                    }),
                },
            );
            let mut labels = BTreeMap::from([(NETWORK_LABEL.to_owned(), network_name.to_owned())]);
            if overlay.is_some() {
                labels.insert(OVERLAY_LABEL.to_owned(), "true".to_owned());
            }
            object.metadata.labels = Some(labels);
            match book.create(&object).await? {
                Created::Created(uid) => {
                    tracing::info!(network = %network_name, address = %prefixed,
                        claim = %who.claim, "address allocated");
                    crate::metrics::metrics()
                        .ipam_allocations
                        .inc([crate::metrics::SUCCESS]);
                    return Ok((
                        Allocation {
                            network: network_name.to_owned(),
                            name,
                            uid,
                            address: prefixed,
                            identity: identity.map(str::to_owned),
                        },
                        subnet,
                    ));
                }
                Created::AlreadyExists => {
                    tracing::debug!(network = %network_name, address = %ip,
                        "address taken by another allocator meanwhile; trying the next");
                    taken.insert(ip);
                }
            }
        }
    }
    crate::metrics::metrics().ipam_exhausted.inc([]);
    Err(Error::Ipam(exhausted.join("; ")))
}

/// Releases allocations by deleting their objects (UID precondition; gone is success). Tries
/// every one and returns the first error, so one failing delete does not leak the others.
pub async fn release(book: &dyn AddressBook, allocations: &[Allocation]) -> Result<()> {
    let mut first_error = None;
    for a in allocations {
        let deleted = book.delete(&a.name, &a.uid).await;
        crate::metrics::metrics()
            .ipam_releases
            .inc([crate::metrics::result(&deleted)]);
        match deleted {
            Ok(()) => {
                tracing::info!(network = %a.network, address = %a.address, "address released")
            }
            Err(e) => {
                tracing::warn!(network = %a.network, address = %a.address, error = %e,
                    "address release failed");
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// An in-memory [`AddressBook`] with the apiserver's create-by-name semantics, for tests.
#[cfg(test)]
pub(crate) mod memory;

#[cfg(test)]
#[path = "ipam/overlay_tests.rs"]
mod overlay_tests;
#[cfg(test)]
mod stable_tests;
#[cfg(test)]
mod tests;
