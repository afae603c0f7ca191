//! The device-dependent half of `vf` settings: the config layer checked what a value may be;
//! only the allocated device says whether it is a VF at all, through which PF its settings
//! are made, and how fast its link is.

use knic_proto::netconfig::{FieldError, VfSettings};

use crate::claims::checkpoint::PreparedDevice;
use crate::netns::VfPlan;

/// The plan's VF step for `device`, or every reason it cannot have one.
pub(super) fn vf_plan(
    device: &PreparedDevice,
    settings: &VfSettings,
) -> Result<VfPlan, Vec<FieldError>> {
    let name = format!("{}/{}", device.pool, device.device);
    let attributes = device
        .published
        .as_ref()
        .and_then(|d| d.attributes.as_ref());
    let attribute = |key: &str| attributes.and_then(|a| a.get(key));
    let text = |key: &str| attribute(key).and_then(|a| a.string.clone());
    let int = |key: &str| attribute(key).and_then(|a| a.int);

    let kind = text("kind");
    if kind.as_deref() != Some("vf") {
        let is = match &kind {
            Some(kind) => format!("is of kind {kind:?}"),
            None => "has no kind attribute".to_owned(),
        };
        return Err(vec![FieldError::new(
            format!("request {}: vf", device.request),
            format!(
                "device {name} {is}, not \"vf\": vf settings are made through an SR-IOV PF, so \
                 they apply only to VFs"
            ),
        )]);
    }

    let pf = text("pfName");
    let index = int("vfIndex").and_then(|i| u32::try_from(i).ok());
    let (Some(pf), Some(index)) = (pf.clone(), index) else {
        let missing = match (pf, index) {
            (None, None) => "no pfName or vfIndex attribute",
            (None, Some(_)) => "no pfName attribute",
            _ => "no usable vfIndex attribute",
        };
        return Err(vec![FieldError::new(
            format!("device {name}"),
            format!(
                "is a VF whose PF is unknown ({missing} was discovered), so its vf settings \
                 cannot be made through the PF"
            ),
        )]);
    };

    // The limit is the PF's link speed, which discovery publishes on the VF as `speed` (a
    // VF's netdev reports its PF's). Without it — a VF bound to vfio-pci, or a link that is
    // down and reports no speed — the rates are not checked here; the PF's driver refuses an
    // impossible rate at attach, and attach then undoes what it did.
    let mut errors = Vec::new();
    if let Some(speed) = int("speed").filter(|s| *s > 0) {
        for (field, rate) in [
            ("minTxRate", settings.min_tx_rate),
            ("maxTxRate", settings.max_tx_rate),
        ] {
            if let Some(rate) = rate
                && i64::from(rate) > speed
            {
                errors.push(FieldError::new(
                    format!("request {}: vf.{field}", device.request),
                    format!(
                        "{rate} Mbit/s is above the link speed of device {name} ({speed} Mbit/s)"
                    ),
                ));
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(VfPlan {
        pf,
        index,
        settings: settings.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use knic_proto::netconfig::VfVlanProtocol;
    use serde_json::{Value, json};

    use super::super::tests::{claim, config, device};
    use super::super::{IpamAddresses, configure, plans};
    use super::*;
    use crate::claims::checkpoint::PreparedClaim;
    use crate::netns::AttachPlan;

    /// A device published with `attributes` (and an `ifName`, which every plan needs).
    fn published(attributes: Value) -> PreparedDevice {
        let mut d = device("nic", "vf3", None);
        let mut attributes = attributes;
        attributes["ifName"] = json!({"string": "ens1f0v3"});
        d.published = Some(
            serde_json::from_value(json!({"name": "vf3", "attributes": attributes}))
                .expect("device"),
        );
        d
    }

    fn vf_attributes() -> Value {
        json!({
            "kind": {"string": "vf"},
            "pfName": {"string": "ens1f0"},
            "vfIndex": {"int": 3},
            "speed": {"int": 25000}
        })
    }

    fn with_vf(device: PreparedDevice, vf: Value) -> PreparedClaim {
        claim(
            vec![device],
            vec![config("FromClaim", &[], json!({ "vf": vf }))],
        )
    }

    fn plan_of(c: &PreparedClaim) -> Result<Vec<AttachPlan>, String> {
        plans(c, &configure(c), &BTreeSet::new(), &IpamAddresses::new()).map_err(|e| e.to_string())
    }

    #[test]
    fn class_and_claim_settings_go_into_the_plan_through_the_pf() {
        let c = claim(
            vec![published(vf_attributes())],
            vec![
                config(
                    "FromClass",
                    &[],
                    json!({"vf": {"vlan": 100, "qos": 2, "vlanProtocol": "802.1ad", "spoofChk": true}}),
                ),
                config(
                    "FromClaim",
                    &[],
                    json!({"vf": {"mac": "02:00:00:00:00:33", "maxTxRate": 25000, "trust": true}}),
                ),
            ],
        );
        let p = plan_of(&c).expect("plans");
        assert_eq!(
            p[0].vf,
            Some(VfPlan {
                pf: "ens1f0".into(),
                index: 3,
                settings: VfSettings {
                    mac: Some([2, 0, 0, 0, 0, 0x33]),
                    vlan: Some(100),
                    qos: Some(2),
                    vlan_protocol: Some(VfVlanProtocol::Dot1Ad),
                    spoof_chk: Some(true),
                    trust: Some(true),
                    max_tx_rate: Some(25000),
                    ..VfSettings::default()
                },
            })
        );
        assert_eq!(
            p[0].mac,
            Some([2, 0, 0, 0, 0, 0x33]),
            "the netdev gets the MAC the PF enforces"
        );
    }

    #[test]
    fn without_vf_settings_the_plan_has_no_vf_step() {
        let p = plan_of(&claim(vec![published(vf_attributes())], vec![])).expect("plans");
        assert_eq!((p[0].vf.as_ref(), p[0].mac), (None, None));
        // An empty block asks for nothing, so it is no error on a device that is not a VF.
        let nic = published(json!({"kind": {"string": "nic"}}));
        let p = plan_of(&with_vf(nic, json!({}))).expect("plans");
        assert_eq!(p[0].vf, None);
    }

    #[test]
    fn settings_on_a_device_that_is_not_a_vf_are_refused() {
        let pf = published(json!({"kind": {"string": "pf"}, "pfName": {"string": "x"}}));
        assert_eq!(
            plan_of(&with_vf(pf, json!({"trust": true}))).unwrap_err(),
            "request nic: vf: device node-a/vf3 is of kind \"pf\", not \"vf\": vf settings are \
             made through an SR-IOV PF, so they apply only to VFs"
        );
        let unknown = published(json!({}));
        assert_eq!(
            plan_of(&with_vf(unknown, json!({"vlan": 5}))).unwrap_err(),
            "request nic: vf: device node-a/vf3 has no kind attribute, not \"vf\": vf settings \
             are made through an SR-IOV PF, so they apply only to VFs"
        );
    }

    #[test]
    fn a_vf_whose_pf_is_unknown_is_refused() {
        let cases = [
            ("pfName", "no pfName attribute"),
            ("vfIndex", "no usable vfIndex attribute"),
        ];
        for (removed, missing) in cases {
            let mut attributes = vf_attributes();
            attributes.as_object_mut().expect("object").remove(removed);
            assert_eq!(
                plan_of(&with_vf(published(attributes), json!({"trust": false}))).unwrap_err(),
                format!(
                    "device node-a/vf3: is a VF whose PF is unknown ({missing} was discovered), \
                     so its vf settings cannot be made through the PF"
                )
            );
        }
        let bare = published(json!({"kind": {"string": "vf"}, "vfIndex": {"int": -1}}));
        assert_eq!(
            plan_of(&with_vf(bare, json!({"trust": false}))).unwrap_err(),
            "device node-a/vf3: is a VF whose PF is unknown (no pfName or vfIndex attribute was \
             discovered), so its vf settings cannot be made through the PF"
        );
    }

    #[test]
    fn rates_above_the_link_speed_are_refused_with_both_numbers() {
        let mut attributes = vf_attributes();
        attributes["speed"] = json!({"int": 10000});
        let c = with_vf(
            published(attributes),
            json!({"minTxRate": 20000, "maxTxRate": 40000}),
        );
        assert_eq!(
            plan_of(&c).unwrap_err(),
            "request nic: vf.minTxRate: 20000 Mbit/s is above the link speed of device \
             node-a/vf3 (10000 Mbit/s); request nic: vf.maxTxRate: 40000 Mbit/s is above the \
             link speed of device node-a/vf3 (10000 Mbit/s)"
        );
        // Exactly the link speed fits.
        let mut attributes = vf_attributes();
        attributes["speed"] = json!({"int": 10000});
        let c = with_vf(published(attributes), json!({"maxTxRate": 10000}));
        assert!(plan_of(&c).is_ok());
    }

    #[test]
    fn without_a_known_speed_rates_are_left_to_the_pf() {
        let mut attributes = vf_attributes();
        attributes.as_object_mut().expect("object").remove("speed");
        let c = with_vf(published(attributes), json!({"maxTxRate": 400000}));
        let p = plan_of(&c).expect("plans");
        assert_eq!(
            p[0].vf.as_ref().and_then(|v| v.settings.max_tx_rate),
            Some(400000)
        );
    }
}
