//! `vf`: what an SR-IOV VF looks like to the wire, as set through its PF (`ip link set <pf> vf
//! <n> …`, rtnetlink `IFLA_VF_*`).
//!
//! These settings live on the PF, outside the pod, so a pod cannot change them: they are how
//! an operator pins a VF's MAC and VLAN, keeps it from spoofing, or caps its bandwidth. The
//! rules here are the device-independent ones; whether the device *is* a VF, and how fast its
//! link is, is only known at prepare time (the driver's plan checks those).

use serde::{Deserialize, Serialize};

use super::FieldError;
use super::validate::{check_mac, format_mac};

/// The rule for `vf.vlan`, shared by the parser (values outside `u16`) and the validator so
/// both say the same thing. 0 is accepted: it is the kernel's own "no VLAN" (the VF sends
/// untagged frames), and it is how a claim turns off a VLAN its DeviceClass set, since a
/// layer cannot unset a lower layer's value.
pub(super) const VF_VLAN_RULE: &str = "must be between 1 and 4094, or 0 for no VLAN";

/// The highest 802.1p priority: the PCP field is three bits.
const MAX_QOS: u8 = 7;

/// The wire form of `vf`; every field optional so a DeviceClass can fix the VLAN while each
/// claim picks a MAC. Enumerations stay strings here so the validator reports a bad value
/// with the accepted ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VfConfig {
    /// The VF's administrative MAC, which the PF enforces (with `spoofChk`) and the VF's
    /// driver adopts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// VLAN the PF tags the VF's traffic with (transparent to the pod); 0 means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// 802.1p priority of that VLAN tag, 0-7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    /// `802.1Q` (default) or `802.1ad` (QinQ outer tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_protocol: Option<String>,
    /// Whether the PF drops frames whose source MAC is not the VF's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof_chk: Option<bool>,
    /// Whether the VF may change its own MAC, enter promiscuous mode and the like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<bool>,
    /// Guaranteed transmit rate in Mbit/s (`IFLA_VF_RATE` min); 0 means no guarantee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tx_rate: Option<u32>,
    /// Transmit rate cap in Mbit/s (`IFLA_VF_RATE` max); 0 means no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tx_rate: Option<u32>,
    /// `auto` (follow the PF's link), `enable` or `disable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_state: Option<String>,
}

impl VfConfig {
    /// Later layers win field by field, as for `interface`.
    pub(super) fn merge_from(&mut self, layer: &VfConfig) {
        fn take<T: Clone>(target: &mut Option<T>, value: &Option<T>) {
            if value.is_some() {
                target.clone_from(value);
            }
        }
        take(&mut self.mac, &layer.mac);
        take(&mut self.vlan, &layer.vlan);
        take(&mut self.qos, &layer.qos);
        take(&mut self.vlan_protocol, &layer.vlan_protocol);
        take(&mut self.spoof_chk, &layer.spoof_chk);
        take(&mut self.trust, &layer.trust);
        take(&mut self.min_tx_rate, &layer.min_tx_rate);
        take(&mut self.max_tx_rate, &layer.max_tx_rate);
        take(&mut self.link_state, &layer.link_state);
    }
}

/// The ethertype of a VF's VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum VfVlanProtocol {
    /// Customer tag (`ETH_P_8021Q`), what "a VLAN" usually means.
    #[default]
    #[serde(rename = "802.1Q")]
    Dot1Q,
    /// Service tag (`ETH_P_8021AD`), for QinQ: the pod's own 802.1Q tags ride inside it.
    #[serde(rename = "802.1ad")]
    Dot1Ad,
}

impl VfVlanProtocol {
    /// The spelling the config uses.
    pub fn as_str(self) -> &'static str {
        match self {
            VfVlanProtocol::Dot1Q => "802.1Q",
            VfVlanProtocol::Dot1Ad => "802.1ad",
        }
    }
}

/// A VF's administrative link state (`IFLA_VF_LINK_STATE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VfLinkState {
    /// Follows the PF's physical link.
    Auto,
    /// Up regardless of the PF's link (VF-to-VF traffic on one NIC still flows).
    Enable,
    /// Down regardless.
    Disable,
}

impl VfLinkState {
    /// The spelling the config uses.
    pub fn as_str(self) -> &'static str {
        match self {
            VfLinkState::Auto => "auto",
            VfLinkState::Enable => "enable",
            VfLinkState::Disable => "disable",
        }
    }
}

/// Checked VF settings; `None` leaves that setting as the VF has it. Stored in the checkpoint
/// inside the attach plan, so it is serde-stable and readable (MAC as text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfSettings {
    /// Unicast, non-zero MAC.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::validate::mac_serde"
    )]
    pub mac: Option<[u8; 6]>,
    /// 0 (no VLAN) or 1..=4094.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// 0..=7; non-zero only with a VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    /// 802.1ad only with a VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_protocol: Option<VfVlanProtocol>,
    /// Spoof checking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof_chk: Option<bool>,
    /// Trusted mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<bool>,
    /// Mbit/s; at most `max_tx_rate` unless that is 0 (no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tx_rate: Option<u32>,
    /// Mbit/s; 0 means no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tx_rate: Option<u32>,
    /// Administrative link state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_state: Option<VfLinkState>,
}

impl VfSettings {
    /// Whether nothing is asked for (an empty `vf: {}` block), so the driver need not touch
    /// the PF at all, and a non-VF device with an empty block is not refused.
    pub fn is_empty(&self) -> bool {
        *self == VfSettings::default()
    }
}

/// Checks `vf` (paths `vf.<field>`) against the device-independent rules, pushing every
/// problem onto `errors`. `hardware_address` is the config's valid `interface.hardwareAddress`:
/// the pod sees that one, so a different `vf.mac` would be silently overridden. Returns `None`
/// when nothing is asked for.
pub(super) fn validate_vf(
    vf: &VfConfig,
    hardware_address: Option<[u8; 6]>,
    errors: &mut Vec<FieldError>,
) -> Option<VfSettings> {
    let mut out = VfSettings::default();
    let mut error = |path: &str, message: String| errors.push(FieldError::new(path, message));

    if let Some(text) = &vf.mac {
        match check_mac(text) {
            Ok(mac) => {
                if let Some(wanted) = hardware_address
                    && wanted != mac
                {
                    error(
                        "vf.mac",
                        format!(
                            "{} differs from interface.hardwareAddress {}; the pod would see one \
                             and the PF enforce the other (set one, or both the same)",
                            format_mac(&mac),
                            format_mac(&wanted)
                        ),
                    );
                } else {
                    out.mac = Some(mac);
                }
            }
            Err(e) => error("vf.mac", e.to_string()),
        }
    }

    let mut tagged = false;
    if let Some(vlan) = vf.vlan {
        if vlan <= 4094 {
            out.vlan = Some(vlan);
            tagged = vlan != 0;
        } else {
            error("vf.vlan", format!("{VF_VLAN_RULE}, got {vlan}"));
        }
    }
    // Why a priority or an ethertype cannot be set: distinguishes "forgot vf.vlan" from
    // "vf.vlan: 0 turned the VLAN off" (possibly in another layer).
    let untagged = || match vf.vlan {
        Some(0) => "vf.vlan is 0 (no VLAN)",
        _ => "set vf.vlan (1-4094)",
    };
    if let Some(qos) = vf.qos {
        if qos > MAX_QOS {
            error(
                "vf.qos",
                format!("must be between 0 and {MAX_QOS}, got {qos}"),
            );
        } else if qos != 0 && !tagged && vf.vlan.is_none_or(|v| v <= 4094) {
            error(
                "vf.qos",
                format!("{qos} is a VLAN priority and needs a VLAN; {}", untagged()),
            );
        } else {
            out.qos = Some(qos);
        }
    }
    if let Some(text) = &vf.vlan_protocol {
        let protocol = match text.as_str() {
            "802.1Q" => Some(VfVlanProtocol::Dot1Q),
            "802.1ad" => Some(VfVlanProtocol::Dot1Ad),
            _ => {
                error(
                    "vf.vlanProtocol",
                    format!("must be \"802.1Q\" or \"802.1ad\", got {text:?}"),
                );
                None
            }
        };
        match protocol {
            Some(VfVlanProtocol::Dot1Ad) if !tagged && vf.vlan.is_none_or(|v| v <= 4094) => {
                error(
                    "vf.vlanProtocol",
                    format!(
                        "\"802.1ad\" is a VLAN tag type and needs a VLAN; {}",
                        untagged()
                    ),
                );
            }
            other => out.vlan_protocol = other,
        }
    }

    out.spoof_chk = vf.spoof_chk;
    out.trust = vf.trust;

    out.min_tx_rate = vf.min_tx_rate;
    out.max_tx_rate = vf.max_tx_rate;
    if let (Some(min), Some(max)) = (vf.min_tx_rate, vf.max_tx_rate)
        && max != 0
        && min > max
    {
        error(
            "vf.minTxRate",
            format!(
                "{min} Mbit/s is above vf.maxTxRate {max} Mbit/s; the guaranteed rate must not \
                 exceed the cap (a maxTxRate of 0 means no cap)"
            ),
        );
        out.min_tx_rate = None;
    }

    if let Some(text) = &vf.link_state {
        match text.as_str() {
            "auto" => out.link_state = Some(VfLinkState::Auto),
            "enable" => out.link_state = Some(VfLinkState::Enable),
            "disable" => out.link_state = Some(VfLinkState::Disable),
            _ => error(
                "vf.linkState",
                format!("must be \"auto\", \"enable\" or \"disable\", got {text:?}"),
            ),
        }
    }

    (!out.is_empty()).then_some(out)
}
