//! What prepare answers the kubelet, and the allocation results it refuses to act on: pure
//! functions of a prepared claim.

use std::collections::HashMap;

use super::checkpoint::PreparedClaim;
use super::{ClaimRef, PreparedAnswer};
use crate::cdi::CdiSpecs;
use crate::error::{Error, Result};

/// The kubelet's answer for a prepared claim: one entry per device, base request names only.
pub fn answer(claim: &PreparedClaim) -> Vec<PreparedAnswer> {
    claim
        .devices
        .iter()
        .map(|d| PreparedAnswer {
            request_names: vec![d.request.split('/').next().unwrap_or_default().to_string()],
            pool: d.pool.clone(),
            device: d.device.clone(),
            share_id: d.share_id.clone(),
            cdi_device_ids: Vec::new(),
        })
        .collect()
}

/// [`answer`] with each attached device's CDI device ID, and each vfio-pci function's; the
/// first device of each request in `metadata` also names the request's metadata mount, so
/// exactly the containers that use the request get its file.
pub(crate) fn answer_with_cdi(claim: &PreparedClaim, metadata: &[String]) -> Vec<PreparedAnswer> {
    let mut answers = answer(claim);
    let mut named: Vec<&str> = Vec::new();
    for a in &mut answers {
        if let Some(index) = claim
            .attachments
            .iter()
            .position(|at| at.plan.device == a.device)
        {
            a.cdi_device_ids = vec![CdiSpecs::device_id(&claim.uid, index)];
        } else if let Some(index) = claim
            .functions
            .iter()
            .position(|f| f.vfio.is_some() && f.device == a.device)
        {
            a.cdi_device_ids = vec![CdiSpecs::vfio_device_id(&claim.uid, index)];
        }
        let request = a
            .request_names
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        if metadata.iter().any(|m| m == request) && !named.contains(&request) {
            named.push(request);
            a.cdi_device_ids
                .push(CdiSpecs::metadata_device_id(&claim.uid, request));
        }
    }
    answers
}

/// Refuses allocation results this node must not act on: a pool that is not this node's (the
/// claim was allocated elsewhere; acting on it would give this node's device of the same name
/// to a pod that runs on another node), a device listed twice, or a device this node does not
/// publish. `published` says whether the devices' published forms were looked up.
pub(super) fn check_results(
    wanted: &ClaimRef,
    prepared: &PreparedClaim,
    pool: Option<&str>,
    published: bool,
) -> Result<()> {
    let refuse = |reason: String| Error::Claim {
        namespace: wanted.namespace.clone(),
        name: wanted.name.clone(),
        reason,
    };
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for d in &prepared.devices {
        if let Some(pool) = pool
            && d.pool != pool
        {
            return Err(refuse(format!(
                "request {}: device {}/{} is in pool {:?}, not this node's pool {pool:?}: the \
                 claim was allocated for another node",
                d.request, d.pool, d.device, d.pool
            )));
        }
        if let Some(first) = seen.insert(&d.device, &d.request) {
            return Err(refuse(format!(
                "device {} is allocated twice (requests {first} and {}); a device serves one \
                 request",
                d.device, d.request
            )));
        }
        if published && d.published.is_none() {
            return Err(refuse(format!(
                "request {}: device {}/{} is not published by this node",
                d.request, d.pool, d.device
            )));
        }
    }
    Ok(())
}
