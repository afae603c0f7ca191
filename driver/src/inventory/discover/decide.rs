//! The per-device decision: offered, or excluded with the reason an admin reads.

use std::collections::{BTreeMap, BTreeSet};

use super::Candidate;
use crate::inventory::filter::{Filter, Subject};
use crate::inventory::{DeviceKind, ExcludedDevice, Inventory};

/// Applies the never-offer rules, the route closure and the filter.
pub(super) fn decide(
    candidates: Vec<Candidate>,
    route_reasons: &BTreeMap<String, String>,
    filter: &Filter,
) -> Inventory {
    let mut inventory = Inventory::default();
    let mut taken = BTreeSet::new();
    for candidate in candidates {
        let device = &candidate.device;
        let route = device.if_name.as_ref().and_then(|n| route_reasons.get(n));
        let mut names: Vec<&str> = device.if_name.iter().map(String::as_str).collect();
        names.extend(candidate.alt_names.iter().map(String::as_str));
        let subject = Subject {
            names,
            pci: candidate.pci_ids,
            driver: candidate.driver.as_deref(),
            kind: Some(device.kind),
        };
        let default_route = route.is_some() && candidate.never.is_none();
        let reason = if let Some(never) = candidate.never {
            Some(never)
        } else if let Some(route) = route {
            Some(route.clone())
        } else if let Some((i, rule)) = filter.excluded_by(&subject) {
            Some(format!("matches filter exclude[{i}] {:?}", rule.text()))
        } else if filter.has_include() {
            filter
                .included_by(&subject)
                .is_none()
                .then(|| "matches no filter include entry".to_owned())
        } else if device.kind == DeviceKind::Virtual {
            Some(
                "virtual interface: offered only when a filter include entry matches it".to_owned(),
            )
        } else {
            None
        };
        let reason = match reason {
            None if !taken.insert(device.name.clone()) => {
                tracing::warn!(name = %device.name, "duplicate device name; keeping the first");
                Some("duplicate device name".to_owned())
            }
            other => other,
        };
        match reason {
            Some(reason) => inventory.excluded.push(ExcludedDevice {
                device: candidate.device,
                default_route,
                reason,
            }),
            None => inventory.devices.push(candidate.device),
        }
    }
    inventory.devices.sort_by(|a, b| a.name.cmp(&b.name));
    inventory
        .excluded
        .sort_by(|a, b| a.device.name.cmp(&b.device.name));
    inventory
}
