//! Stable addresses with a grace period: unprepare holds an identity's allocation instead of
//! deleting it, and the identity's next claim takes it over (deletes and creates it again for
//! itself) only when no pod can be using it, behind a reservation that keeps the address taken
//! meanwhile. The rules are in the module documentation of [`super`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use knic_proto::network::stable::{HELD_LABEL, HELD_SINCE_ANNOTATION};
use knic_proto::network::{ClaimRef, NETWORK_LABEL, NetworkAddress, NetworkAddressSpec};

use super::{AddressBook, Allocation, ClaimState, Created, Requester, release};
use crate::error::{Error, Result};

/// Decides about an earlier allocation of this claim's identity (`object`, address `ip`) made
/// for another claim: `true` when it was deleted so this claim may create it again.
///
/// The rule that keeps two live pods from one address: only an allocation no pod uses is
/// taken over: one marked held (its claim was unprepared, so its pod stopped, even if the
/// claim object lingers), or one whose claim is gone. A claim being deleted but not yet
/// unprepared may still have a running pod, so the prepare is refused and the kubelet's retry
/// comes back after the unprepare; a live claim (two pods sharing a label value) keeps its
/// address and this claim gets another. Another node's allocation is taken over only once it
/// is held: the admission policy lets a node delete another node's allocation only then, and
/// until then (its node lost, the controller not yet past it) the address counts as taken.
/// This claim's own held allocation (a shared claim prepared again) is re-created unheld.
pub(super) async fn take_over(
    book: &dyn AddressBook,
    network_name: &str,
    who: &Requester,
    object: &NetworkAddress,
    ip: IpAddr,
    reservations: &mut Vec<Allocation>,
) -> Result<bool> {
    let owner = &object.spec.claim;
    let identity = object.spec.identity.as_deref().unwrap_or_default();
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let uid = object.metadata.uid.as_deref().unwrap_or_default();
    if is_held(object) {
        // Held: its claim was unprepared (or vanished and the controller marked it), so no pod
        // uses it, whatever became of the claim since.
        if !reserve(book, network_name, who, object, reservations).await? {
            return Ok(false);
        }
        book.delete(name, uid).await?;
        tracing::info!(claim = %who.claim, address = %ip, %identity,
            "taking over the identity's held address");
        return Ok(true);
    }
    match book
        .claim_state(&owner.namespace, &owner.name, &owner.uid)
        .await?
    {
        ClaimState::Deleting => Err(Error::Ipam(format!(
            "address {ip} of identity {identity} is still held by claim {}/{}, which is being \
             deleted; retrying",
            owner.namespace, owner.name
        ))),
        ClaimState::Live => {
            let message = format!(
                "address {ip} of identity {identity} is in use by claim {}/{}, which is live \
                 (two pods with one identity); this claim gets another address",
                owner.namespace, owner.name
            );
            tracing::warn!(claim = %who.claim, "{message}");
            book.stable_in_use(who, message);
            Ok(false)
        }
        ClaimState::Gone => {
            if object.spec.node.as_deref() != Some(who.node.as_str()) {
                tracing::info!(claim = %who.claim, address = %ip, %identity,
                    node = object.spec.node.as_deref().unwrap_or_default(),
                    "the identity's former address is another node's, not yet held; taking another");
                return Ok(false);
            }
            if !reserve(book, network_name, who, object, reservations).await? {
                return Ok(false);
            }
            book.delete(name, uid).await?;
            tracing::info!(claim = %who.claim, address = %ip, %identity,
                "taking over the identity's address, whose claim is gone");
            Ok(true)
        }
    }
}

/// Unprepare's release: an allocation with a stable identity on a Network with a grace period
/// is held (marked, not deleted) so its identity can take it over; every other one is
/// deleted. A Network that is gone holds nothing, nor does a KNI sandbox (`claim_uid`
/// `kni.…`): its addresses are its driver's alone, which the controller never collects.
pub async fn release_or_hold(
    book: &dyn AddressBook,
    claim_uid: &str,
    allocations: &[Allocation],
) -> Result<()> {
    if knic_proto::names::is_sandbox_claim_uid(claim_uid) {
        return release(book, allocations).await;
    }
    let mut graces: BTreeMap<&str, u64> = BTreeMap::new();
    let mut to_release = Vec::new();
    let since = held_since_now();
    let mut first_error = None;
    for a in allocations {
        if a.identity.is_none() {
            to_release.push(a.clone());
            continue;
        }
        let grace = match graces.get(a.network.as_str()) {
            Some(g) => *g,
            None => {
                let g = book
                    .network(&a.network)
                    .await?
                    .filter(|n| n.metadata.deletion_timestamp.is_none())
                    .and_then(|n| n.spec.stable_addresses)
                    .map_or(0, |s| s.grace());
                graces.insert(&a.network, g);
                g
            }
        };
        if grace == 0 {
            to_release.push(a.clone());
            continue;
        }
        match book.hold(&a.name, &a.uid, &since).await {
            Ok(()) => tracing::info!(network = %a.network, address = %a.address,
                identity = a.identity.as_deref().unwrap_or_default(), grace,
                "address held for its identity"),
            Err(e) => {
                tracing::warn!(network = %a.network, address = %a.address, error = %e,
                    "holding an address failed");
                first_error.get_or_insert(e);
            }
        }
    }
    let released = release(book, &to_release).await;
    match first_error {
        Some(e) => Err(e),
        None => released,
    }
}

/// Label of a takeover's reservation object (see [`reserve`]).
pub const TAKEOVER_LABEL: &str = "knic.dev/takeover";

/// Creates the reservation that keeps `object`'s address taken between a takeover's delete
/// and create: an object of another name (`takeover-<name>`) with the same address, which
/// every allocator listing the Network counts as taken (an object's address counts whatever
/// its name), while no allocator counts it as an allocation. An allocator that listed before
/// it saw the held object; one that lists after sees it until the new allocation exists.
/// `false` when another claim of the identity is taking the address over right now.
async fn reserve(
    book: &dyn AddressBook,
    network_name: &str,
    who: &Requester,
    object: &NetworkAddress,
    reservations: &mut Vec<Allocation>,
) -> Result<bool> {
    let name = format!(
        "takeover-{}",
        object.metadata.name.as_deref().unwrap_or_default()
    );
    let mut reservation = NetworkAddress::new(
        &name,
        NetworkAddressSpec {
            network: network_name.to_owned(),
            address: object.spec.address.clone(),
            claim: ClaimRef {
                namespace: who.namespace.clone(),
                name: who.claim.clone(),
                uid: who.uid.clone(),
            },
            identity: None,
            node: Some(who.node.clone()),
            // A reservation announces no interface: no node forwards to it.
            overlay: None,
        },
    );
    reservation.metadata.labels = Some(BTreeMap::from([
        (NETWORK_LABEL.to_owned(), network_name.to_owned()),
        (TAKEOVER_LABEL.to_owned(), "true".to_owned()),
    ]));
    match book.create(&reservation).await? {
        Created::Created(uid) => {
            reservations.push(Allocation {
                network: network_name.to_owned(),
                name,
                uid,
                address: object
                    .spec
                    .address
                    .parse()
                    .map_err(|e| Error::Ipam(format!("{}: {e}", object.spec.address)))?,
                identity: None,
            });
            Ok(true)
        }
        Created::AlreadyExists => Ok(false),
    }
}

/// Whether an object is a takeover's reservation, not an allocation.
pub(super) fn is_reservation(object: &NetworkAddress) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(TAKEOVER_LABEL))
        .is_some_and(|v| v == "true")
}

/// Whether an allocation object is marked held.
pub(super) fn is_held(object: &NetworkAddress) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HELD_LABEL))
        .is_some_and(|v| v == "true")
}

/// Now in RFC 3339 to the second, the form of [`HELD_SINCE_ANNOTATION`].
pub fn held_since_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// The metadata patch that marks an allocation held; the uid makes it apply only to that
/// object (a re-created one of the same name is refused).
pub fn hold_patch(uid: &str, since: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {
        "uid": uid,
        "labels": {HELD_LABEL: "true"},
        "annotations": {HELD_SINCE_ANNOTATION: since},
    }})
}
