//! The netlink facts that sysfs does not carry, behind small traits so discovery stays a pure
//! function and every fact can be faked in tests.
//!
//! Each source answers `None` for "unknown"; discovery then simply leaves the attribute out.
//! Sysfs stays the primary source: netlink only adds to it, so a node where netlink is
//! unavailable (no CAP_NET_ADMIN, old kernel) still gets a correct, smaller inventory.

use std::collections::{BTreeMap, BTreeSet};

/// rtnetlink facts about one link (RTM_GETLINK), as far as discovery needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkInfo {
    /// `IFLA_INFO_KIND` (veth, bridge, macvlan, vxlan, bond, …): sysfs has no reliable kind.
    pub kind: Option<String>,
    /// `IFLA_MASTER`: the bond/bridge this link is enslaved to, by index.
    pub master_ifindex: Option<u32>,
    /// The master's name, when the implementation resolved the index.
    pub master: Option<String>,
    /// `IFLA_PROP_LIST`/`IFLA_ALT_IFNAME`: admins may filter by these names too.
    pub alt_names: Vec<String>,
    /// `IFLA_OPERSTATE` as the RFC 2863 word sysfs would show.
    pub oper_state: Option<String>,
    /// `IFLA_VFINFO_LIST` of a PF: the only place the MAC of a VF without a netdev is visible.
    pub vfs: Vec<VfInfo>,
}

/// One entry of a PF's `IFLA_VFINFO_LIST`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VfInfo {
    /// VF number (the N of `virtfnN`).
    pub index: u32,
    /// Admin-assigned MAC (`ip link set PF vf N mac …`); all zeros means unset.
    pub mac: Option<String>,
    /// Admin-assigned VLAN, 0 = none.
    pub vlan: Option<u16>,
}

/// Where rtnetlink facts come from: the real implementation talks to the kernel; tests use
/// [`FakeLinks`].
pub trait LinkSource {
    /// Facts about the link named `if_name` in the driver's network namespace; `None` when the
    /// link is unknown to netlink or netlink is unavailable.
    fn link(&self, if_name: &str) -> Option<LinkInfo>;
}

/// Where ethtool feature bits come from (ETHTOOL_MSG_FEATURES_GET).
pub trait EthtoolSource {
    /// Names (kernel spelling, e.g. `vlan-challenged`, `rx-vlan-filter`, `tx-vlan-hw-insert`,
    /// `rx-vlan-hw-parse`) of the features *active* on `if_name`; `None` when unknown.
    fn active_features(&self, if_name: &str) -> Option<BTreeSet<String>>;
}

/// The e-switch mode of a PF, which decides whether VFs come with representors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EswitchMode {
    /// Classic SR-IOV: VFs switch in hardware, no representors.
    Legacy,
    /// switchdev: every VF/SF has a representor netdev on the PF.
    Switchdev,
}

impl EswitchMode {
    /// The attribute value (and devlink's own spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            EswitchMode::Legacy => "legacy",
            EswitchMode::Switchdev => "switchdev",
        }
    }
}

/// Where e-switch modes come from (devlink DEVLINK_CMD_ESWITCH_GET).
pub trait DevlinkSource {
    /// The mode of the PF at PCI address `pf_bdf` (e.g. `0000:3b:00.0`); `None` when unknown
    /// (no permission, no devlink). Drivers without an e-switch should be reported as legacy by
    /// the implementation (ENODEV/EOPNOTSUPP).
    fn eswitch_mode(&self, pf_bdf: &str) -> Option<EswitchMode>;
}

/// Table-driven [`LinkSource`]; the empty one means "netlink knows nothing".
#[derive(Debug, Clone, Default)]
pub struct FakeLinks {
    /// Facts by interface name.
    pub links: BTreeMap<String, LinkInfo>,
}

impl FakeLinks {
    /// Adds the facts for `if_name`.
    pub fn with(mut self, if_name: &str, info: LinkInfo) -> Self {
        self.links.insert(if_name.to_owned(), info);
        self
    }
}

impl LinkSource for FakeLinks {
    fn link(&self, if_name: &str) -> Option<LinkInfo> {
        self.links.get(if_name).cloned()
    }
}

/// Table-driven [`EthtoolSource`].
#[derive(Debug, Clone, Default)]
pub struct FakeEthtool {
    /// Active feature names by interface name.
    pub active: BTreeMap<String, BTreeSet<String>>,
}

impl FakeEthtool {
    /// Records `features` as the active set of `if_name`.
    pub fn with(mut self, if_name: &str, features: &[&str]) -> Self {
        self.active.insert(
            if_name.to_owned(),
            features.iter().map(|f| (*f).to_owned()).collect(),
        );
        self
    }
}

impl EthtoolSource for FakeEthtool {
    fn active_features(&self, if_name: &str) -> Option<BTreeSet<String>> {
        self.active.get(if_name).cloned()
    }
}

/// Table-driven [`DevlinkSource`].
#[derive(Debug, Clone, Default)]
pub struct FakeDevlink {
    /// E-switch mode by PF PCI address.
    pub modes: BTreeMap<String, EswitchMode>,
}

impl FakeDevlink {
    /// Records the mode of the PF at `pf_bdf`.
    pub fn with(mut self, pf_bdf: &str, mode: EswitchMode) -> Self {
        self.modes.insert(pf_bdf.to_owned(), mode);
        self
    }
}

impl DevlinkSource for FakeDevlink {
    fn eswitch_mode(&self, pf_bdf: &str) -> Option<EswitchMode> {
        self.modes.get(pf_bdf).copied()
    }
}

/// The netlink sources discovery consults, bundled so the call site stays short and the real
/// implementations can be swapped in one place.
pub struct Sources {
    /// rtnetlink links.
    pub links: Box<dyn LinkSource + Send + Sync>,
    /// ethtool features.
    pub ethtool: Box<dyn EthtoolSource + Send + Sync>,
    /// devlink e-switch modes.
    pub devlink: Box<dyn DevlinkSource + Send + Sync>,
}

impl Sources {
    /// Sources that know nothing: discovery from sysfs alone, e.g. without CAP_NET_ADMIN.
    pub fn sysfs_only() -> Self {
        Sources {
            links: Box::new(FakeLinks::default()),
            ethtool: Box::new(FakeEthtool::default()),
            devlink: Box::new(FakeDevlink::default()),
        }
    }
}

impl Default for Sources {
    fn default() -> Self {
        Sources::sysfs_only()
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources").finish_non_exhaustive()
    }
}
