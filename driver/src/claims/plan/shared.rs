//! Plans for shared parent ports: a device published `shareable` (see `crate::slices`) serves
//! many claims at once, so no claim may take it whole. Each pod gets a child of it — the kind
//! its config names, a bridge-mode macvlan when it names none — and a VLAN is a host-side VLAN
//! that all pods on that VLAN of that port share, with each pod's child on top (Linux allows
//! one VLAN per id on a port).

use knic_proto::netconfig::{ChildKind, DeviceMode, FieldError, ValidConfig};

use crate::claims::checkpoint::PreparedDevice;
use crate::netns::{AttachMode, Uplink};

/// The attribute that marks a shared parent port (or one of its child slots).
pub const SHAREABLE: &str = "shareable";

/// The child a pod gets on a shared port whose config names none: macvlan in bridge mode,
/// so pods on one port reach each other through it as they would through a switch.
pub fn default_child() -> ChildKind {
    ChildKind::Macvlan("bridge".into())
}

/// Whether the device was published as a shared parent port (or a child slot of one).
pub fn is_shared(device: &PreparedDevice) -> bool {
    device
        .published
        .as_ref()
        .and_then(|d| d.attributes.as_ref())
        .and_then(|a| a.get(SHAREABLE))
        .and_then(|a| a.bool)
        == Some(true)
}

/// What a config must not ask of a shared port, each naming the field: anything that would
/// take the port from the other pods or change it under them.
pub fn refusals(device: &PreparedDevice, valid: &ValidConfig) -> Vec<FieldError> {
    let at = |field: &str| format!("request {}: {field}", device.request);
    let shared = format!("device {}/{} is a shared port", device.pool, device.device);
    let mut out = Vec::new();
    if valid.device_mode == DeviceMode::VfioPci {
        out.push(FieldError::new(
            at("deviceMode"),
            format!(
                "{shared}: vfio-pci would take it from every pod using it (ask for a device \
                 that is not shared)"
            ),
        ));
    }
    if matches!(&valid.child, Some(ChildKind::Macvlan(mode)) if mode == "passthru") {
        out.push(FieldError::new(
            at("macvlan.mode"),
            format!(
                "{shared}: passthru gives one pod the whole port (use bridge, private or vepa)"
            ),
        ));
    }
    if valid.vf.is_some() {
        out.push(FieldError::new(
            at("vf"),
            format!("{shared}: VF settings would change it for every pod using it"),
        ));
    }
    out
}

/// How the device reaches the pod. On a port that is not shared: the device itself, a VLAN
/// child, or a macvlan/ipvlan child (on a host VLAN when the config also names a VLAN). On a
/// shared port always a child, on the shared host VLAN when a VLAN is asked for.
pub fn mode(valid: &ValidConfig, shared: bool, host_ifname: &str) -> AttachMode {
    let uplink = |id| Some(Uplink::new(host_ifname, id));
    match (valid.vlan, valid.child.clone(), shared) {
        (Some(id), None, false) => AttachMode::Vlan { id },
        (Some(id), child, _) => AttachMode::Child {
            child: child.unwrap_or_else(default_child),
            uplink: uplink(id),
        },
        (None, Some(child), _) => AttachMode::Child {
            child,
            uplink: None,
        },
        (None, None, true) => AttachMode::Child {
            child: default_child(),
            uplink: None,
        },
        (None, None, false) => AttachMode::Move,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn device(shareable: Option<bool>) -> PreparedDevice {
        let mut attributes = json!({"ifName": {"string": "ens1f0"}});
        if let Some(b) = shareable {
            attributes["shareable"] = json!({"bool": b});
        }
        PreparedDevice {
            request: "net".into(),
            pool: "node-a".into(),
            device: "ens1f0".into(),
            share_id: Some("8e2f1b7a-0c43-4c1e-9a55-2f1d1c0b7e11".into()),
            consumed: Default::default(),
            published: Some(
                serde_json::from_value(json!({"name": "ens1f0", "attributes": attributes}))
                    .expect("device"),
            ),
        }
    }

    fn valid(vlan: Option<u16>, child: Option<ChildKind>) -> ValidConfig {
        ValidConfig {
            vlan,
            child,
            ..ValidConfig::default()
        }
    }

    #[test]
    fn only_a_true_shareable_attribute_marks_a_shared_port() {
        assert!(is_shared(&device(Some(true))));
        assert!(!is_shared(&device(Some(false))));
        assert!(!is_shared(&device(None)));
    }

    #[test]
    fn a_shared_port_always_gives_a_child_and_a_vlan_is_a_shared_host_vlan() {
        let macvlan = ChildKind::Macvlan("bridge".into());
        let ipvlan = ChildKind::Ipvlan("l3".into());
        assert_eq!(
            mode(&valid(None, None), true, "ens1f0"),
            AttachMode::Child {
                child: macvlan.clone(),
                uplink: None
            }
        );
        assert_eq!(
            mode(&valid(Some(42), None), true, "ens1f0"),
            AttachMode::Child {
                child: macvlan.clone(),
                uplink: Some(Uplink::new("ens1f0", 42))
            }
        );
        assert_eq!(
            mode(&valid(Some(42), Some(ipvlan.clone())), true, "ens1f0"),
            AttachMode::Child {
                child: ipvlan.clone(),
                uplink: Some(Uplink::new("ens1f0", 42))
            }
        );
        // Not shared: as before, plus a child on a VLAN when both are asked for.
        assert_eq!(mode(&valid(None, None), false, "ens1f0"), AttachMode::Move);
        assert_eq!(
            mode(&valid(Some(7), None), false, "ens1f0"),
            AttachMode::Vlan { id: 7 }
        );
        assert_eq!(
            mode(&valid(Some(7), Some(ipvlan.clone())), false, "ens1f0"),
            AttachMode::Child {
                child: ipvlan,
                uplink: Some(Uplink::new("ens1f0", 7))
            }
        );
    }

    #[test]
    fn what_would_take_or_change_a_shared_port_is_refused_by_field() {
        let texts = |v: &ValidConfig| -> Vec<String> {
            refusals(&device(Some(true)), v)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let vfio = ValidConfig {
            device_mode: DeviceMode::VfioPci,
            ..ValidConfig::default()
        };
        assert_eq!(
            texts(&vfio),
            [
                "request net: deviceMode: device node-a/ens1f0 is a shared port: vfio-pci would \
              take it from every pod using it (ask for a device that is not shared)"
            ]
        );
        assert_eq!(
            texts(&valid(None, Some(ChildKind::Macvlan("passthru".into())))),
            [
                "request net: macvlan.mode: device node-a/ens1f0 is a shared port: passthru gives \
              one pod the whole port (use bridge, private or vepa)"
            ]
        );
        let vf = ValidConfig {
            vf: Some(knic_proto::netconfig::VfSettings::default()),
            ..ValidConfig::default()
        };
        assert_eq!(
            texts(&vf),
            [
                "request net: vf: device node-a/ens1f0 is a shared port: VF settings would change \
              it for every pod using it"
            ]
        );
        assert!(texts(&valid(Some(42), Some(ChildKind::Macvlan("vepa".into())))).is_empty());
    }
}
