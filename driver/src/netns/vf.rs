//! SR-IOV VF settings as the PF holds them (`IFLA_VFINFO_LIST` / `IFLA_VF_*`): the state
//! type attach records and detach puts back, and the rtnetlink messages that read and set it.
//!
//! The messages are pure functions so every attribute is tested at the byte level: this
//! kernel has no SR-IOV, so nothing else can show that a request says what it should.

use knic_proto::netconfig::{VfLinkState, VfSettings, VfVlanProtocol};
use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    self, LinkAttribute, LinkExtentMask, LinkMessage, LinkVfInfo, VfInfo, VfInfoLinkState,
    VfInfoMac, VfInfoRate, VfInfoSpoofCheck, VfInfoTrust, VfInfoVlan, VfVlan, VfVlanInfo,
    VlanProtocol,
};
use serde::{Deserialize, Serialize};

/// Which VF of which PF gets which settings: decided at prepare (from the device's published
/// `pfName` / `vfIndex`) and checkpointed with the rest of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfPlan {
    /// The PF's netdev in the host namespace, through which the settings are made.
    pub pf: String,
    /// The VF's index on that PF (`ip link set <pf> vf <index>`).
    pub index: u32,
    /// What to set; never empty (an empty `vf` block plans no VF step).
    pub settings: VfSettings,
}

/// A VF's VLAN tag as the PF applies it: the kernel sets id, priority and ethertype together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfVlanTag {
    /// 0 is "no VLAN".
    pub id: u16,
    /// 802.1p priority.
    pub qos: u8,
    /// Tag ethertype.
    #[serde(default)]
    pub protocol: VfVlanProtocol,
}

/// Some or all of a VF's settings: what the PF reports (read), what attach asks for (only the
/// settings it changes), and what detach puts back (the previous values of exactly those).
/// `None` means "not part of this" — unchanged when set, unreported when read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfState {
    /// Administrative MAC (all zeros: none assigned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<[u8; 6]>,
    /// VLAN tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<VfVlanTag>,
    /// `(min, max)` transmit rates in Mbit/s: one kernel attribute carries both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<(u32, u32)>,
    /// Spoof checking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof_chk: Option<bool>,
    /// Trusted mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<bool>,
    /// Administrative link state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_state: Option<VfLinkState>,
}

impl VfState {
    /// Whether there is nothing to set.
    pub fn is_empty(&self) -> bool {
        *self == VfState::default()
    }
}

/// What to ask the PF for so the VF gets `settings`, given its `current` state. Settings the
/// kernel only takes together are completed from `current`: a VLAN id without a priority is
/// priority 0 and 802.1Q (as `ip link set … vf N vlan ID` means), and one rate keeps the
/// VF's other rate (0 when the PF did not report it: no guarantee, no cap).
pub fn request(settings: &VfSettings, current: &VfState) -> VfState {
    let rate = (settings.min_tx_rate.is_some() || settings.max_tx_rate.is_some()).then(|| {
        let (min, max) = current.rate.unwrap_or((0, 0));
        (
            settings.min_tx_rate.unwrap_or(min),
            settings.max_tx_rate.unwrap_or(max),
        )
    });
    VfState {
        mac: settings.mac,
        vlan: settings.vlan.map(|id| VfVlanTag {
            id,
            qos: settings.qos.unwrap_or(0),
            protocol: if id == 0 {
                VfVlanProtocol::Dot1Q
            } else {
                settings.vlan_protocol.unwrap_or_default()
            },
        }),
        rate,
        spoof_chk: settings.spoof_chk,
        trust: settings.trust,
        link_state: settings.link_state,
    }
}

/// The part of `current` that `request` changes: what detach must put back, recorded before
/// anything is set. Settings the PF did not report are left out (nothing to put back to).
pub fn previous(request: &VfState, current: &VfState) -> VfState {
    fn keep<T: Copy>(asked: &Option<T>, had: Option<T>) -> Option<T> {
        asked.and(had)
    }
    VfState {
        mac: keep(&request.mac, current.mac),
        vlan: keep(&request.vlan, current.vlan),
        rate: keep(&request.rate, current.rate),
        spoof_chk: keep(&request.spoof_chk, current.spoof_chk),
        trust: keep(&request.trust, current.trust),
        link_state: keep(&request.link_state, current.link_state),
    }
}

/// The part of `recorded` that `current` no longer matches: what detach must set, so it sets
/// nothing when the VF is already back (a repeated detach) and never touches a setting that
/// did not change, which a PF's driver may not even support (a request that failed halfway
/// may have set only some).
pub fn differences(recorded: &VfState, current: &VfState) -> VfState {
    fn differs<T: Copy + PartialEq>(recorded: Option<T>, current: Option<T>) -> Option<T> {
        recorded.filter(|r| current != Some(*r))
    }
    VfState {
        mac: differs(recorded.mac, current.mac),
        vlan: differs(recorded.vlan, current.vlan),
        rate: differs(recorded.rate, current.rate),
        spoof_chk: differs(recorded.spoof_chk, current.spoof_chk),
        trust: differs(recorded.trust, current.trust),
        link_state: differs(recorded.link_state, current.link_state),
    }
}

/// `state` one setting at a time, each with the claim field that asks for it, in the order the
/// kernel's `do_setvfinfo` applies them (MAC, VLAN, rates, spoof check, link state, trust).
///
/// knic sends them one request each: a PF's driver refuses settings it does not support or
/// values it does not take (igb: `linkState` EOPNOTSUPP, a `minTxRate` EINVAL, an 802.1ad
/// VLAN EPROTONOSUPPORT), and one request carrying several would fail with that errno alone,
/// after applying the ones before it, without saying which it refused.
pub fn settings(state: &VfState) -> Vec<(&'static str, VfState)> {
    let one = VfState::default;
    let mut out = Vec::new();
    if state.mac.is_some() {
        out.push((
            "vf.mac",
            VfState {
                mac: state.mac,
                ..one()
            },
        ));
    }
    if let Some(tag) = state.vlan {
        let field = match tag.protocol {
            VfVlanProtocol::Dot1Ad => "vf.vlanProtocol",
            VfVlanProtocol::Dot1Q if tag.qos != 0 => "vf.vlan/vf.qos",
            VfVlanProtocol::Dot1Q => "vf.vlan",
        };
        out.push((
            field,
            VfState {
                vlan: Some(tag),
                ..one()
            },
        ));
    }
    if let Some((min, _)) = state.rate {
        let field = if min == 0 {
            "vf.maxTxRate"
        } else {
            "vf.minTxRate/vf.maxTxRate"
        };
        out.push((
            field,
            VfState {
                rate: state.rate,
                ..one()
            },
        ));
    }
    if state.spoof_chk.is_some() {
        out.push((
            "vf.spoofChk",
            VfState {
                spoof_chk: state.spoof_chk,
                ..one()
            },
        ));
    }
    if state.link_state.is_some() {
        out.push((
            "vf.linkState",
            VfState {
                link_state: state.link_state,
                ..one()
            },
        ));
    }
    if state.trust.is_some() {
        out.push((
            "vf.trust",
            VfState {
                trust: state.trust,
                ..one()
            },
        ));
    }
    out
}

/// Why a PF's driver refused one setting, for the person reading the claim's status: the
/// errnos SR-IOV PF drivers answer `IFLA_VF_*` requests with.
pub fn refusal(field: &str, errno: i32) -> &'static str {
    use nix::libc::{EINVAL, EOPNOTSUPP, EPROTONOSUPPORT, ERANGE};
    match errno {
        EOPNOTSUPP => "the PF's driver does not support this setting",
        EPROTONOSUPPORT => "the PF's driver does not support this VLAN protocol",
        EINVAL if field.contains("Rate") => {
            "the PF's driver refused the rate (some support only a maximum, or none above \
             the link speed)"
        }
        EINVAL | ERANGE => "the PF's driver refused the value",
        _ => "the PF's driver refused it",
    }
}

/// `RTM_SETLINK` on the PF with one `IFLA_VFINFO_LIST` / `IFLA_VF_INFO` nest carrying an
/// attribute per setting in `state`, each tagged with VF `vf`. An 802.1ad tag goes as
/// `IFLA_VF_VLAN_LIST` (the only attribute with an ethertype); 802.1Q as plain
/// `IFLA_VF_VLAN`, which every kernel and driver with SR-IOV understands.
pub fn set_message(pf_index: u32, vf: u32, state: &VfState) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut infos = Vec::new();
    if let Some(mac) = state.mac {
        infos.push(VfInfo::Mac(VfInfoMac::new(vf, &mac)));
    }
    if let Some(tag) = state.vlan {
        let (id, qos) = (u32::from(tag.id), u32::from(tag.qos));
        infos.push(match tag.protocol {
            VfVlanProtocol::Dot1Q => VfInfo::Vlan(VfInfoVlan::new(vf, id, qos)),
            VfVlanProtocol::Dot1Ad => VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(
                vf,
                id,
                qos,
                VlanProtocol::Ieee8021Ad,
            ))]),
        });
    }
    if let Some((min, max)) = state.rate {
        infos.push(VfInfo::Rate(VfInfoRate::new(vf, min, max)));
    }
    if let Some(on) = state.spoof_chk {
        infos.push(VfInfo::SpoofCheck(VfInfoSpoofCheck::new(vf, on)));
    }
    if let Some(on) = state.trust {
        infos.push(VfInfo::Trust(VfInfoTrust::new(vf, on)));
    }
    if let Some(link_state) = state.link_state {
        infos.push(VfInfo::LinkState(VfInfoLinkState::new(
            vf,
            match link_state {
                VfLinkState::Auto => link::VfLinkState::Auto,
                VfLinkState::Enable => link::VfLinkState::Enable,
                VfLinkState::Disable => link::VfLinkState::Disable,
            },
        )));
    }
    let mut message = LinkMessage::default();
    message.header.index = pf_index;
    message
        .attributes
        .push(LinkAttribute::VfInfoList(vec![LinkVfInfo(infos)]));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::SetLink(message));
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    request
}

/// `RTM_GETLINK` for the PF asking for its VF table (`IFLA_EXT_MASK` = `RTEXT_FILTER_VF`),
/// which the kernel leaves out of link replies unless asked, without per-VF statistics
/// (`RTEXT_FILTER_SKIP_STATS`): with 256 VFs they would overflow one netlink reply.
pub fn get_message(pf_index: u32) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut message = LinkMessage::default();
    message.header.index = pf_index;
    message.attributes.push(LinkAttribute::ExtMask(vec![
        LinkExtentMask::Vf,
        LinkExtentMask::SkipStats,
    ]));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetLink(message));
    request.header.flags = NLM_F_REQUEST;
    request
}

/// VF `vf`'s state from a PF's link reply; `None` when the PF has no such VF (or the reply
/// has no VF table).
pub fn state_of(reply: &LinkMessage, vf: u32) -> Option<VfState> {
    let table = reply.attributes.iter().find_map(|a| match a {
        LinkAttribute::VfInfoList(list) => Some(list),
        _ => None,
    })?;
    let infos = table.iter().find(|info| {
        info.0
            .iter()
            .any(|i| matches!(i, VfInfo::Mac(m) if m.vf_id == vf))
    })?;
    let mut state = VfState::default();
    for info in &infos.0 {
        match info {
            VfInfo::Mac(m) => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(&m.mac[..6]);
                state.mac = Some(mac);
            }
            // The list, when present, also says the ethertype; it wins over the plain one.
            VfInfo::Vlan(v) if state.vlan.is_none() => {
                state.vlan = Some(tag(v.vlan_id, v.qos, VfVlanProtocol::Dot1Q));
            }
            VfInfo::VlanList(list) => {
                if let Some(VfVlan::Info(v)) = list.first() {
                    let protocol = match v.protocol {
                        VlanProtocol::Ieee8021Ad => VfVlanProtocol::Dot1Ad,
                        _ => VfVlanProtocol::Dot1Q,
                    };
                    state.vlan = Some(tag(v.vlan_id, v.qos, protocol));
                }
            }
            VfInfo::Rate(r) => state.rate = Some((r.min_tx_rate, r.max_tx_rate)),
            VfInfo::SpoofCheck(s) => state.spoof_chk = Some(s.enabled),
            VfInfo::Trust(t) => state.trust = Some(t.enabled),
            VfInfo::LinkState(l) => {
                state.link_state = match l.state {
                    link::VfLinkState::Auto => Some(VfLinkState::Auto),
                    link::VfLinkState::Enable => Some(VfLinkState::Enable),
                    link::VfLinkState::Disable => Some(VfLinkState::Disable),
                    // A state knic cannot name is one it cannot put back.
                    _ => None,
                }
            }
            _ => {}
        }
    }
    Some(state)
}

/// The kernel's 12-bit id and 3-bit priority, narrowed without panicking on a nonsense reply.
fn tag(id: u32, qos: u32, protocol: VfVlanProtocol) -> VfVlanTag {
    VfVlanTag {
        id: u16::try_from(id & 0x0fff).unwrap_or(0),
        qos: u8::try_from(qos & 0x7).unwrap_or(0),
        protocol,
    }
}

/// `ip link`-style text of a request, for the fake kernel's log and for error contexts.
pub fn describe(state: &VfState) -> String {
    let mut parts = Vec::new();
    if let Some(mac) = &state.mac {
        parts.push(format!("mac {}", super::mac_text(mac)));
    }
    if let Some(tag) = state.vlan {
        parts.push(format!(
            "vlan {} qos {} proto {}",
            tag.id,
            tag.qos,
            tag.protocol.as_str()
        ));
    }
    if let Some((min, max)) = state.rate {
        parts.push(format!("min_tx_rate {min} max_tx_rate {max}"));
    }
    let on = |b: bool| if b { "on" } else { "off" };
    if let Some(b) = state.spoof_chk {
        parts.push(format!("spoofchk {}", on(b)));
    }
    if let Some(b) = state.trust {
        parts.push(format!("trust {}", on(b)));
    }
    if let Some(s) = state.link_state {
        parts.push(format!("state {}", s.as_str()));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests;
