//! From a prepared claim to attach plans: a pure function, so every configuration rule is
//! tested without a kernel or an API, and the NRI hook only executes decisions made (and
//! checkpointed) at prepare time.

use std::collections::BTreeSet;

use knic_proto::netconfig::{self, ConfigErrors, FieldError, NetworkConfig};

use crate::checkpoint::PreparedClaim;
use crate::netns::{AttachMode, AttachPlan};

fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// Whether a config entry with `requests` applies to the allocation result `request`
/// (`req` or `req/sub`): empty means all; `req` covers its subrequests.
fn applies(requests: &[String], request: &str) -> bool {
    requests.is_empty()
        || requests
            .iter()
            .any(|r| r == request || r == base_request(request))
}

/// Computes one plan per device of `claim`. `taken` are the pod-side interface names already
/// planned for the same pod by other claims (the defaults `net1`, `net2`… skip them, and an
/// explicit name that collides is an error). Returns every problem found, each with its field
/// path.
pub fn plans(
    claim: &PreparedClaim,
    taken: &BTreeSet<String>,
) -> Result<Vec<AttachPlan>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut used = taken.clone();
    let mut out = Vec::new();
    let mut wanted = Vec::new();
    for device in &claim.devices {
        let mut layers: Vec<NetworkConfig> = Vec::new();
        for (i, config) in claim.configs.iter().enumerate() {
            if !applies(&config.requests, &device.request) {
                continue;
            }
            match netconfig::parse(&config.parameters, &format!("config[{i}].parameters")) {
                Ok(c) => layers.push(c),
                Err(e) => errors.extend(e.0),
            }
        }
        let merged = netconfig::merge(&layers);
        let valid = match netconfig::validate(&merged) {
            Ok(v) => v,
            Err(e) => {
                errors.extend(e.0.into_iter().map(|f| FieldError {
                    path: format!("request {}: {}", device.request, f.path),
                    message: f.message,
                }));
                continue;
            }
        };
        if let Some(network) = &valid.ipam_network {
            errors.push(FieldError {
                path: format!("request {}: ipam.network", device.request),
                message: format!(
                    "address management for network {network:?} is not available yet: give static addresses"
                ),
            });
            continue;
        }
        let host_ifname = device
            .published
            .as_ref()
            .and_then(|d| d.attributes.as_ref())
            .and_then(|a| a.get("ifName"))
            .and_then(|a| a.string.clone());
        let Some(host_ifname) = host_ifname else {
            errors.push(FieldError {
                path: format!("device {}/{}", device.pool, device.device),
                message:
                    "has no network interface on the host (bound to vfio-pci, or not discovered \
                          on this node): knic attaches netdevs"
                        .into(),
            });
            continue;
        };
        if let Some(name) = &valid.interface_name
            && !used.insert(name.clone())
        {
            errors.push(FieldError {
                path: format!("request {}: interface.name", device.request),
                message: format!("{name} is already used by another device of this pod"),
            });
            continue;
        }
        wanted.push((device, valid, host_ifname));
    }
    for (device, valid, host_ifname) in wanted {
        let pod_ifname = match valid.interface_name {
            Some(n) => n,
            None => {
                let n = (1..)
                    .map(|i| format!("net{i}"))
                    .find(|n| !used.contains(n))
                    .unwrap_or_default();
                used.insert(n.clone());
                n
            }
        };
        out.push(AttachPlan {
            pool: device.pool.clone(),
            device: device.device.clone(),
            request: device.request.clone(),
            host_ifname,
            mode: match valid.vlan {
                Some(id) => AttachMode::Vlan { id },
                None => AttachMode::Move,
            },
            pod_ifname,
            mtu: valid.mtu,
            mac: valid.hardware_address,
            addresses: valid.addresses,
            routes: valid.routes,
            sysctls: valid.sysctls,
        });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}
