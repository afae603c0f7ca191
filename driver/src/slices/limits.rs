//! The apiserver's per-device limits, applied to every device right before it is laid out into
//! slices: one device whose facts break a limit would get its whole slice refused, and with it
//! up to 127 other devices of the node (other drivers lost whole slices to one 67-byte PCI
//! name). So a fact that does not fit is shortened or left out, by rule and with a log line,
//! and the slice always goes through.
//!
//! The rules, checked against a real apiserver by the `real/oversized_facts_keep_the_slice`
//! twin (e2e/tests/slices.rs):
//! * a string or version value is at most 64 bytes (Go's `len`, so bytes, not characters): a
//!   descriptive name from `pci.ids` ([`DESCRIPTIVE`]) is cut at a character boundary and ends
//!   in `…`, so `startsWith` selectors still match it; any other value is an identifier, which
//!   a cut would turn into a different identifier, so it is left out;
//! * attributes and capacities together are at most 32: attributes are left out in
//!   [`DROP_ORDER`] (descriptions first), then by name from the end, [`IDENTITIES`] last.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::Device;

use super::{MAX_ATTRIBUTE_STRING, MAX_ATTRIBUTES_PER_DEVICE};

/// Values that describe rather than identify: shortened instead of dropped.
pub const DESCRIPTIVE: &[&str] = &["vendorName", "deviceName"];

/// The order attributes go in when a device has too many: first what only describes, last what
/// selectors and the driver itself rely on (`kind`, addresses, names).
pub const DROP_ORDER: &[&str] = &[
    "deviceName",
    "vendorName",
    "pciSubsystem",
    "state",
    "adminDown",
    "speed",
    "linkKind",
    "eswitchMode",
    "numaNode",
    "rdmaDevice",
    "sriovNumVfs",
    "sriovTotalVfs",
];

/// Kept to the last: what selectors, the controller and prepare identify a device by.
pub const IDENTITIES: &[&str] = &[
    "kind",
    "ifName",
    "mac",
    "pciAddress",
    "resource.kubernetes.io/pciBusID",
    "pfName",
    "pfPciAddress",
    "vfIndex",
    "sriovPool",
    "shareable",
    "parent",
    "childSlot",
];

/// `value` cut to at most [`MAX_ATTRIBUTE_STRING`] bytes at a character boundary, ending in
/// `…` when it was cut.
pub fn shorten(value: &str) -> String {
    if value.len() <= MAX_ATTRIBUTE_STRING {
        return value.to_owned();
    }
    let mut end = MAX_ATTRIBUTE_STRING - '…'.len_utf8();
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", value[..end].trim_end())
}

/// Makes one device fit the limits; returns what was changed, one line each, for the log.
pub fn fit(device: &mut Device) -> Vec<String> {
    let mut changes = Vec::new();
    let Some(attributes) = device.attributes.as_mut() else {
        return changes;
    };
    let keys: Vec<String> = attributes.keys().cloned().collect();
    for key in keys {
        let Some(attr) = attributes.get_mut(&key) else {
            continue;
        };
        for (is_string, value) in [(true, &mut attr.string), (false, &mut attr.version)] {
            let Some(v) = value.as_mut() else { continue };
            if v.len() <= MAX_ATTRIBUTE_STRING {
                continue;
            }
            let name = key.rsplit('/').next().unwrap_or(&key);
            if is_string && DESCRIPTIVE.contains(&name) {
                let short = shorten(v);
                changes.push(format!(
                    "attribute {key} is {} bytes (the apiserver allows {MAX_ATTRIBUTE_STRING}); \
                     shortened to {short:?}",
                    v.len()
                ));
                *v = short;
            } else {
                changes.push(format!(
                    "attribute {key} is {} bytes (the apiserver allows {MAX_ATTRIBUTE_STRING}); \
                     left out (an identifier cut short would name something else)",
                    v.len()
                ));
                *value = None;
            }
        }
    }
    attributes.retain(|_, a| {
        a.string.is_some() || a.version.is_some() || a.int.is_some() || a.bool.is_some()
    });
    let capacities = device.capacity.as_ref().map_or(0, BTreeMap::len);
    let room = MAX_ATTRIBUTES_PER_DEVICE.saturating_sub(capacities);
    let mut order = DROP_ORDER.iter();
    while attributes.len() > room {
        let key = order
            .by_ref()
            .find_map(|name| attributes.keys().find(|k| *k == name).cloned())
            .or_else(|| {
                attributes
                    .keys()
                    .rev()
                    .find(|k| !IDENTITIES.contains(&k.as_str()))
                    .cloned()
            })
            .or_else(|| attributes.keys().next_back().cloned());
        let Some(key) = key else { break };
        attributes.remove(&key);
        changes.push(format!(
            "attribute {key} left out: the apiserver allows {MAX_ATTRIBUTES_PER_DEVICE} \
             attributes and capacities per device"
        ));
    }
    if attributes.is_empty() {
        device.attributes = None;
    }
    changes
}

/// [`fit`] for every device, logging each change with the device's name.
pub fn fit_all(devices: &mut [Device]) {
    for device in devices {
        for change in fit(device) {
            tracing::warn!(device = %device.name, "{change}");
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn string(s: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(s.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_long_description_is_shortened_at_a_character_boundary_and_an_identifier_dropped() {
        // 71 bytes, 64 characters: the limit is bytes (Go's len), so this does not fit.
        let name = "Ethernet Controller E810-C für QSFP — 100 GbE Dual-Port, Ünïcödé";
        assert_eq!((name.len(), name.chars().count()), (71, 64));
        let pci = format!("0000:3b:00.0{}", "-".repeat(60));
        let mut device = Device {
            name: "pf".into(),
            attributes: Some(BTreeMap::from([
                ("deviceName".to_owned(), string(name)),
                ("pciAddress".to_owned(), string(&pci)),
                ("kind".to_owned(), string("pf")),
                (
                    "fw".to_owned(),
                    DeviceAttribute {
                        version: Some(format!("1.2.3-{}", "x".repeat(60))),
                        ..Default::default()
                    },
                ),
            ])),
            ..Default::default()
        };
        let changes = fit(&mut device);
        let attrs = device.attributes.as_ref().expect("attributes");
        let short = attrs["deviceName"].string.as_deref().expect("kept");
        assert_eq!(
            short,
            "Ethernet Controller E810-C für QSFP — 100 GbE Dual-Port,…"
        );
        assert!(short.len() <= 64, "{}", short.len());
        assert!(!attrs.contains_key("pciAddress") && !attrs.contains_key("fw"));
        assert_eq!(attrs["kind"].string.as_deref(), Some("pf"));
        assert_eq!(
            changes,
            vec![
                "attribute deviceName is 71 bytes (the apiserver allows 64); shortened to \
                 \"Ethernet Controller E810-C für QSFP — 100 GbE Dual-Port,…\""
                    .to_owned(),
                "attribute fw is 66 bytes (the apiserver allows 64); left out (an identifier \
                 cut short would name something else)"
                    .to_owned(),
                "attribute pciAddress is 72 bytes (the apiserver allows 64); left out (an \
                 identifier cut short would name something else)"
                    .to_owned(),
            ]
        );
        // Idempotent: a second pass changes nothing.
        assert!(fit(&mut device).is_empty());
    }

    #[test]
    fn too_many_entries_lose_descriptions_first_and_capacities_count() {
        let mut attributes: BTreeMap<String, DeviceAttribute> = (0..28)
            .map(|i| (format!("zz{i:02}"), string("x")))
            .collect();
        for key in ["deviceName", "vendorName", "kind", "ifName"] {
            attributes.insert(key.into(), string("v"));
        }
        let mut device = Device {
            name: "d".into(),
            attributes: Some(attributes),
            capacity: Some(BTreeMap::from([(
                "bandwidth".to_owned(),
                DeviceCapacity {
                    value: Quantity("10G".into()),
                    ..Default::default()
                },
            )])),
            ..Default::default()
        };
        let changes = fit(&mut device);
        let attrs = device.attributes.as_ref().expect("attributes");
        assert_eq!(attrs.len(), 31, "32 minus the capacity");
        assert!(!attrs.contains_key("deviceName") && attrs.contains_key("vendorName"));
        assert!(attrs.contains_key("kind") && attrs.contains_key("ifName"));
        assert_eq!(
            changes,
            vec![
                "attribute deviceName left out: the apiserver allows 32 attributes and \
                 capacities per device"
                    .to_owned()
            ]
        );
    }
}
