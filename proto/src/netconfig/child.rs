//! Child interfaces on top of the allocated device: a macvlan or ipvlan created directly in the
//! pod's namespace, so many pods can share one port (an 802.1Q child is `vlan`; with `vlan` and
//! a macvlan or ipvlan together the pod's child sits on a host-side VLAN of the device, which
//! is how several pods share one VLAN of one port). The mode strings stay strings in
//! [`NetworkConfig`] so a wrong value is reported with the accepted ones; [`check`] turns them
//! into a [`ChildKind`].

use serde::{Deserialize, Serialize};

use super::{FieldError, NetworkConfig};

/// `macvlan: {mode}`: a MAC-addressed child of the device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MacvlanConfig {
    /// `bridge` (default: children talk to each other through the device), `private`, `vepa`
    /// or `passthru`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// `ipvlan: {mode}`: a child sharing the device's MAC (for ports that accept one MAC only, as
/// many RDMA and cloud NICs do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpvlanConfig {
    /// `l2` (default), `l3` or `l3s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// The macvlan modes, as `ip link` spells them.
pub const MACVLAN_MODES: &[&str] = &["bridge", "private", "vepa", "passthru"];
/// The ipvlan modes, as `ip link` spells them.
pub const IPVLAN_MODES: &[&str] = &["l2", "l3", "l3s"];

/// A checked child kind with its mode (an index into [`MACVLAN_MODES`] / [`IPVLAN_MODES`]
/// spelled out, so the checkpoint stays readable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "mode")]
pub enum ChildKind {
    /// macvlan in `bridge`, `private`, `vepa` or `passthru` mode.
    Macvlan(String),
    /// ipvlan in `l2`, `l3` or `l3s` mode.
    Ipvlan(String),
}

/// The child kind a merged config asks for, and one error per rule broken: a mode outside the
/// kind's list, or both `macvlan` and `ipvlan` (the pod's interface is one child). `vlan` may
/// come with either: the child then sits on the device's VLAN.
pub fn check(config: &NetworkConfig) -> (Option<ChildKind>, Vec<FieldError>) {
    let mut errors = Vec::new();
    if config.macvlan.is_some() && config.ipvlan.is_some() {
        errors.push(FieldError::new(
            "ipvlan",
            "cannot be set together with macvlan: the pod's interface is one child of the \
             device (macvlan or ipvlan, optionally on a vlan)",
        ));
    }
    let mode = |field: &str, given: Option<&String>, allowed: &[&str], errors: &mut Vec<_>| {
        let mode = given.map_or(allowed[0], String::as_str);
        if allowed.contains(&mode) {
            Some(mode.to_owned())
        } else {
            errors.push(FieldError::new(
                format!("{field}.mode"),
                format!("must be one of {}, got {mode:?}", allowed.join(", ")),
            ));
            None
        }
    };
    if config.ipvlan.is_some()
        && config
            .interface
            .as_ref()
            .is_some_and(|i| i.hardware_address.is_some())
    {
        errors.push(FieldError::new(
            "interface.hardwareAddress",
            "cannot be set with ipvlan: ipvlan children share the device's MAC (use macvlan \
             for a MAC of the pod's own)",
        ));
    }
    let kind = if let Some(m) = &config.macvlan {
        mode("macvlan", m.mode.as_ref(), MACVLAN_MODES, &mut errors).map(ChildKind::Macvlan)
    } else if let Some(i) = &config.ipvlan {
        mode("ipvlan", i.mode.as_ref(), IPVLAN_MODES, &mut errors).map(ChildKind::Ipvlan)
    } else {
        None
    };
    (kind, errors)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::netconfig::{API_VERSION, KIND, merge, parse, validate};

    fn config(fields: Value) -> NetworkConfig {
        let mut wire = json!({"apiVersion": API_VERSION, "kind": KIND});
        wire.as_object_mut()
            .expect("object")
            .extend(fields.as_object().expect("object").clone());
        parse(&wire, "").expect("parses")
    }

    fn child(fields: Value) -> Option<ChildKind> {
        validate(&config(fields)).expect("valid").child
    }

    fn refused(fields: Value) -> String {
        validate(&config(fields))
            .expect_err("must be refused")
            .to_string()
    }

    #[test]
    fn modes_default_and_are_checked_against_the_kernels_list() {
        assert_eq!(child(json!({})), None);
        assert_eq!(
            child(json!({"macvlan": {}})),
            Some(ChildKind::Macvlan("bridge".into()))
        );
        assert_eq!(
            child(json!({"macvlan": {"mode": "passthru"}})),
            Some(ChildKind::Macvlan("passthru".into()))
        );
        assert_eq!(
            child(json!({"ipvlan": {}})),
            Some(ChildKind::Ipvlan("l2".into()))
        );
        assert_eq!(
            child(json!({"ipvlan": {"mode": "l3s"}})),
            Some(ChildKind::Ipvlan("l3s".into()))
        );
        assert_eq!(
            refused(json!({"macvlan": {"mode": "l2"}})),
            "macvlan.mode: must be one of bridge, private, vepa, passthru, got \"l2\""
        );
        assert_eq!(
            refused(json!({"ipvlan": {"mode": "bridge"}})),
            "ipvlan.mode: must be one of l2, l3, l3s, got \"bridge\""
        );
    }

    #[test]
    fn one_child_kind_at_most_and_a_vlan_under_it() {
        assert_eq!(
            refused(json!({"macvlan": {}, "ipvlan": {"mode": "l3"}})),
            "ipvlan: cannot be set together with macvlan: the pod's interface is one child of \
             the device (macvlan or ipvlan, optionally on a vlan)"
        );
        let on_vlan = validate(&config(json!({"vlan": {"id": 10}, "macvlan": {}})))
            .expect("a macvlan on a VLAN is valid");
        assert_eq!(on_vlan.vlan, Some(10));
        assert_eq!(on_vlan.child, Some(ChildKind::Macvlan("bridge".into())));
    }

    #[test]
    fn the_wire_shape_is_checked_with_paths() {
        let wire = json!({"apiVersion": API_VERSION, "kind": KIND,
            "macvlan": {"mode": 3, "flags": 1}});
        let err = parse(&wire, "p").expect_err("bad shape").to_string();
        assert!(err.contains("p.macvlan.flags: unknown field"), "{err}");
        assert!(err.contains("p.macvlan.mode"), "{err}");
    }

    #[test]
    fn a_claim_overrides_the_class_child_and_vfio_refuses_one() {
        let class = config(json!({"macvlan": {"mode": "private"}}));
        let claim = config(json!({"macvlan": {"mode": "vepa"}}));
        let merged = merge(&[class, claim]);
        assert_eq!(
            validate(&merged).expect("valid").child,
            Some(ChildKind::Macvlan("vepa".into()))
        );
        assert_eq!(
            refused(json!({"ipvlan": {}, "interface": {"hardwareAddress": "02:00:00:00:00:01"}})),
            "interface.hardwareAddress: cannot be set with ipvlan: ipvlan children share the \
             device's MAC (use macvlan for a MAC of the pod's own)"
        );
        let err = refused(json!({"deviceMode": "vfio-pci", "ipvlan": {}}));
        assert!(
            err.starts_with("ipvlan: cannot be set with deviceMode"),
            "{err}"
        );
    }
}
