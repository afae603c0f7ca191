//! `deviceMode`: whether a device reaches the pod as a kernel netdev or as a raw PCI function
//! bound to `vfio-pci` (for DPDK and KubeVirt), and which settings each mode can honour.
//!
//! A vfio-pci device has no netdev anywhere once it is bound, so every setting that configures
//! a netdev would be silently ignored; it is refused instead, with the field and the rule.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{FieldError, NetworkConfig, VfConfig};

/// The wire field's name, used in every error about it.
pub const FIELD: &str = "deviceMode";

/// How a device is handed to the pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceMode {
    /// The device's netdev is moved into the pod's network namespace and configured there.
    #[default]
    #[serde(rename = "netdev")]
    Netdev,
    /// The PCI function is unbound from its driver and bound to `vfio-pci`; the pod gets the
    /// VFIO group's character devices and the PCI address, no netdev.
    #[serde(rename = "vfio-pci")]
    VfioPci,
}

impl DeviceMode {
    /// Every accepted spelling, in the order error texts list them.
    pub const ALLOWED: [&'static str; 2] = ["netdev", "vfio-pci"];

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceMode::Netdev => "netdev",
            DeviceMode::VfioPci => "vfio-pci",
        }
    }

    /// Whether this is the default (`netdev`), so the checkpoint and status omit it.
    pub fn is_netdev(&self) -> bool {
        *self == DeviceMode::Netdev
    }

    /// Parses the wire spelling; the error says which values are accepted.
    pub fn parse(text: &str) -> Result<Self, FieldError> {
        match text {
            "netdev" => Ok(DeviceMode::Netdev),
            "vfio-pci" => Ok(DeviceMode::VfioPci),
            other => Err(FieldError::new(
                FIELD,
                format!(
                    "must be one of {}, got {other:?}",
                    DeviceMode::ALLOWED
                        .iter()
                        .map(|a| format!("{a:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }
}

impl fmt::Display for DeviceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mode a (merged) config asks for, plus one error per setting the mode cannot honour.
///
/// With `vfio-pci` there is no netdev in the pod (nor on the host once bound), so
/// `interface` (name, MTU, MAC), `addresses`, `ipam`, `routes`, `sysctls`, `vlan`, the child
/// kinds and `bandwidth` are refused rather than ignored. An unknown mode is reported and treated as `netdev` so the
/// other rules still run.
pub fn check(config: &NetworkConfig) -> (DeviceMode, Vec<FieldError>) {
    let mut errors = Vec::new();
    let mode = match config.device_mode.as_deref() {
        None => DeviceMode::Netdev,
        Some(text) => match DeviceMode::parse(text) {
            Ok(mode) => mode,
            Err(e) => {
                errors.push(e);
                DeviceMode::Netdev
            }
        },
    };
    if mode == DeviceMode::VfioPci {
        let rule = |field: &str| {
            FieldError::new(
                field,
                format!(
                    "cannot be set with {FIELD}: \"vfio-pci\": the device is bound to vfio-pci \
                     and has no network interface to configure"
                ),
            )
        };
        let interface = config.interface.clone().unwrap_or_default();
        for (set, field) in [
            (interface.name.is_some(), "interface.name"),
            (interface.mtu.is_some(), "interface.mtu"),
            (
                interface.hardware_address.is_some(),
                "interface.hardwareAddress",
            ),
            (
                config.addresses.as_ref().is_some_and(|a| !a.is_empty()),
                "addresses",
            ),
            (config.ipam.is_some(), "ipam"),
            (
                config.routes.as_ref().is_some_and(|r| !r.is_empty()),
                "routes",
            ),
            (
                config.sysctls.as_ref().is_some_and(|s| !s.is_empty()),
                "sysctls",
            ),
            (config.vlan.is_some(), "vlan"),
            (config.macvlan.is_some(), "macvlan"),
            (config.ipvlan.is_some(), "ipvlan"),
            (config.bandwidth.is_some(), "bandwidth"),
            (config.ethtool.is_some(), "ethtool"),
        ] {
            if set {
                errors.push(rule(field));
            }
        }
        if config
            .vf
            .as_ref()
            .is_some_and(|vf| *vf != VfConfig::default())
        {
            // Refused rather than silently dropped: knic applies VF settings as the VF's
            // netdev moves into the pod, and a vfio-pci function never does.
            errors.push(FieldError::new(
                "vf",
                format!(
                    "cannot be set with {FIELD}: \"vfio-pci\" (yet): knic applies VF settings \
                     when the VF's netdev moves into the pod, which a vfio-pci function does not; \
                     set them on the PF (ip link set PF vf N ...) or use netdev mode"
                ),
            ));
        }
    }
    (mode, errors)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::netconfig::{API_VERSION, KIND, ValidConfig, merge, parse, validate};

    fn config(fields: Value) -> NetworkConfig {
        let mut wire = json!({"apiVersion": API_VERSION, "kind": KIND});
        wire.as_object_mut()
            .expect("object")
            .extend(fields.as_object().expect("object").clone());
        parse(&wire, "").expect("parses")
    }

    fn errors(fields: Value) -> String {
        validate(&config(fields))
            .expect_err("must be refused")
            .to_string()
    }

    #[test]
    fn the_default_is_netdev_and_vfio_pci_is_accepted() {
        assert_eq!(
            validate(&config(json!({}))).expect("valid").device_mode,
            DeviceMode::Netdev
        );
        let valid: ValidConfig =
            validate(&config(json!({"deviceMode": "vfio-pci"}))).expect("valid");
        assert_eq!(valid.device_mode, DeviceMode::VfioPci);
        // The checkpoint form names the mode only when it is not the default.
        assert_eq!(
            serde_json::to_value(&valid).expect("json"),
            json!({"deviceMode": "vfio-pci"})
        );
        assert_eq!(
            serde_json::to_value(ValidConfig::default()).expect("json"),
            json!({})
        );
        // Emptying lists is not configuring a netdev: allowed, so a claim can clear a class.
        validate(&config(
            json!({"deviceMode": "vfio-pci", "addresses": [], "routes": []}),
        ))
        .expect("empty lists are fine");
    }

    #[test]
    fn an_unknown_mode_names_the_field_and_the_allowed_values() {
        assert_eq!(
            errors(json!({"deviceMode": "vfio"})),
            "deviceMode: must be one of \"netdev\", \"vfio-pci\", got \"vfio\""
        );
        let err = parse(
            &json!({"apiVersion": API_VERSION, "kind": KIND, "deviceMode": 1}),
            "config[0].parameters",
        )
        .expect_err("not a string");
        assert_eq!(
            err.to_string(),
            "config[0].parameters.deviceMode: expected a string, got number 1"
        );
    }

    #[test]
    fn vfio_pci_refuses_every_netdev_setting_by_field() {
        let text = errors(json!({
            "deviceMode": "vfio-pci",
            "interface": {"name": "net1", "mtu": 9000, "hardwareAddress": "02:00:00:00:00:01"},
            "addresses": ["192.0.2.10/24"],
            "routes": [{"destination": "198.51.100.0/24"}],
            "vlan": {"id": 100},
            "sysctls": {"ipv4.rp_filter": "1"},
        }));
        let rule = "cannot be set with deviceMode: \"vfio-pci\": the device is bound to vfio-pci \
                    and has no network interface to configure";
        let expected: Vec<String> = [
            "interface.name",
            "interface.mtu",
            "interface.hardwareAddress",
            "addresses",
            "routes",
            "sysctls",
            "vlan",
        ]
        .iter()
        .map(|f| format!("{f}: {rule}"))
        .collect();
        assert_eq!(text, expected.join("; "));
        assert_eq!(
            errors(json!({"deviceMode": "vfio-pci", "ipam": {"network": "pods"}})),
            format!("ipam: {rule}")
        );
        // VF settings are refused, not silently dropped; an empty block asks for nothing.
        assert_eq!(
            errors(json!({"deviceMode": "vfio-pci", "vf": {"vlan": 100}})),
            "vf: cannot be set with deviceMode: \"vfio-pci\" (yet): knic applies VF settings \
             when the VF's netdev moves into the pod, which a vfio-pci function does not; set \
             them on the PF (ip link set PF vf N ...) or use netdev mode"
        );
        assert!(validate(&config(json!({"deviceMode": "vfio-pci", "vf": {}}))).is_ok());
    }

    #[test]
    fn the_mode_merges_like_the_other_scalars() {
        let class = config(json!({"deviceMode": "vfio-pci"}));
        let claim = config(json!({}));
        assert_eq!(
            merge(&[class.clone(), claim]).device_mode.as_deref(),
            Some("vfio-pci")
        );
        let back = config(json!({"deviceMode": "netdev"}));
        assert_eq!(merge(&[class, back]).device_mode.as_deref(), Some("netdev"));
    }
}
