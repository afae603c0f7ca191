//! The flags that say how devices are discovered and which are offered, shared by `run`,
//! `inventory` and `kni`.

use std::path::PathBuf;
use std::sync::Arc;

use knic_driver::inventory::Filter;
use knic_driver::sharing::{SharePolicy, Sharing};
use knic_driver::slices::rescan::Discovery;

/// How devices are discovered and which are offered; shared by `run` and `inventory`.
#[derive(Debug, clap::Args)]
pub(crate) struct DiscoveryArgs {
    /// Root under which sys/ (and proc/net/ for default routes) are read.
    #[arg(long, env = "KNIC_SYSFS_ROOT", default_value = "/")]
    pub(crate) sysfs_root: PathBuf,
    /// Comma-separated include entries (name=GLOB, pci=VVVV:DDDD, driver=GLOB, kind=KIND).
    #[arg(long, env = "KNIC_INCLUDE", default_value = "")]
    include: String,
    /// Comma-separated exclude entries; an exclude always wins.
    #[arg(long, env = "KNIC_EXCLUDE", default_value = "")]
    exclude: String,
    /// YAML or JSON file with `include:` and `exclude:` lists (the chart's ConfigMap).
    #[arg(long, env = "KNIC_FILTER_CONFIG")]
    filter_config: Option<PathBuf>,
    /// Add netlink facts (link kinds, masters, ethtool features, e-switch mode).
    #[arg(long, env = "KNIC_NETLINK", default_value_t = true, action = clap::ArgAction::Set)]
    netlink: bool,
    /// The node's share policy, YAML or JSON (`parents:` entries selecting ports by `names` or
    /// `pciAddresses`, each with `children` and optionally `bandwidth`, `defaultBandwidth`,
    /// `minBandwidth`, `bandwidthStep`): those ports are published as shareable only. Unset:
    /// nothing is shared.
    #[arg(long, env = "KNIC_SHARE_POLICY")]
    share_policy: Option<PathBuf>,
    /// This node's underlay address for overlay (VXLAN) Networks (the chart passes the node's
    /// status.hostIP): the node then offers the device `overlay`, whose claims get a veth on
    /// the node's bridge of their Network's VNI. Unset: no overlay networks on this node.
    #[arg(long, env = "KNIC_VTEP_ADDRESS")]
    vtep_address: Option<std::net::IpAddr>,
    /// Overlay interfaces the node offers (child slots of the `overlay` device).
    #[arg(long, env = "KNIC_OVERLAY_CHILDREN", default_value_t = 110,
          value_parser = clap::value_parser!(u32).range(1..=4094))]
    overlay_children: u32,
}

impl DiscoveryArgs {
    pub(crate) fn discovery(&self) -> anyhow::Result<Discovery> {
        let mut filter = match &self.filter_config {
            Some(path) => Filter::from_config_file(path)?,
            None => Filter::default(),
        };
        filter.extend(Filter::parse_lists(&self.include, &self.exclude)?);
        let policy = match &self.share_policy {
            Some(path) => {
                let policy = SharePolicy::from_file(path)?;
                tracing::info!(policy = %path.display(), parents = policy.parents.len(),
                    "share policy loaded");
                policy
            }
            None => SharePolicy::default(),
        };
        Ok(Discovery {
            root: self.sysfs_root.clone(),
            filter,
            netlink: self.netlink,
            provisioner: None,
            sharing: Arc::new(Sharing::new(policy)),
            overlay: self
                .vtep_address
                .map(|vtep| knic_driver::inventory::overlay::OverlayOffer {
                    vtep,
                    children: self.overlay_children,
                }),
        })
    }
}
