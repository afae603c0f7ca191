//! Detach: the device back on the host as it was, a child deleted, VF settings put back. After
//! a move back the device's state is known without reading it (the move itself named, sized
//! and addressed it, and closed it, flushing its addresses); only a device the kernel returned
//! by itself, with its pod namespace, is looked up and has its addresses read.

use super::{
    AttachPlan, Kernel, LinkChange, LinkState, Ns, Restore, Session, is_same_device, open, vf,
};
use crate::error::{Error, Result};

/// Puts the node back: the device returns to the host with its original name, MTU, MAC, admin
/// state and host addresses; a VLAN child created for the pod is deleted. Works when the pod
/// namespace is already gone (the kernel has then returned a physical device by itself, under
/// whatever name was free, or destroyed a virtual one). VF settings made through the PF are
/// put back last, once the device is home, and also when the device itself is gone (the PF
/// still holds them). Idempotent.
pub async fn detach<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    netns: Option<&Ns>,
    restore: &Restore,
) -> Result<()> {
    detach_device(kernel, plan, netns, restore).await?;
    // After the device left the pod, so the VRF it was in can be seen empty.
    super::routing::remove(kernel, plan, netns).await?;
    restore_ethtool(kernel, plan, restore).await?;
    restore_vf(kernel, plan, restore).await?;
    restore_vf_mac(kernel, plan, &restore.host).await
}

/// Puts back the ethtool values recorded in `restore` on the device, home under its name (a
/// repeated detach sends nothing: only values that differ are sent). A device gone (a virtual
/// one dies with its pod) or another device under its name is left alone.
pub(super) async fn restore_ethtool<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    restore: &Restore,
) -> Result<()> {
    let Some(previous) = restore.ethtool.as_ref().filter(|p| !p.is_empty()) else {
        return Ok(());
    };
    let original = &restore.host;
    let mut host = open(kernel, &Ns::Host).await?;
    let Some(link) = host.find_link(&original.name).await? else {
        tracing::warn!(device = %plan.device, ifname = %original.name,
            "the device no longer exists; its ethtool settings cannot be put back");
        return Ok(());
    };
    // By its hardware identity where it has one (as `is_recorded`), else by its index.
    if !is_recorded(&link, original) {
        tracing::warn!(device = %plan.device, ifname = %original.name,
            "another device carries the name; ethtool settings not put back");
        return Ok(());
    }
    // Best effort: the device is home and its record must go, or unprepare would retry for
    // ever over a setting the device now refuses (a feature it keeps, a fixed one).
    if let Err(e) = super::ethtool::apply(&mut host, &Ns::Host, &original.name, previous).await {
        tracing::warn!(device = %plan.device, ifname = %original.name, error = %e,
            "could not put the device's ethtool settings back; it is home with the pod's");
    }
    Ok(())
}

/// Whether the plan gave the VF an administrative MAC through its PF. The PF then enforces it:
/// while it is set, the VF's driver may not give its netdev another MAC (igb answers the VF's
/// request with a refusal, and the kernel's `ip link set … address` with EADDRNOTAVAIL,
/// unless the VF is trusted), so the netdev's own MAC goes back only after the PF's settings
/// ([`restore_vf_mac`]), never with the move home.
fn sets_vf_mac(plan: &AttachPlan) -> bool {
    plan.vf.as_ref().is_some_and(|vf| vf.settings.mac.is_some())
}

/// Puts the VF netdev's own MAC back once its PF no longer enforces the claim's (see
/// [`sets_vf_mac`]): on the device home under its name, when it differs. A MAC the PF still
/// refuses (it enforces one of its own from before the claim) is left as the PF has it, with
/// a warning: detach cannot change the PF's mind, and failing it would only be retried.
pub(super) async fn restore_vf_mac<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    original: &LinkState,
) -> Result<()> {
    let Some(mac) = original.mac.filter(|_| sets_vf_mac(plan)) else {
        return Ok(());
    };
    let mut host = open(kernel, &Ns::Host).await?;
    let Some(link) = host.find_link(&original.name).await? else {
        return Ok(());
    };
    let ours = original.pci_address.is_none() || link.pci_address == original.pci_address;
    if !ours || link.mac == Some(mac) {
        return Ok(());
    }
    let change = LinkChange {
        mac: Some(mac),
        ..LinkChange::default()
    };
    if let Err(e) = host.set_link(&original.name, &change).await {
        tracing::warn!(device = %plan.device, ifname = %original.name, error = %e,
            "the VF's own MAC could not be put back: its PF refuses it");
    }
    Ok(())
}

/// Puts back the VF settings recorded in `restore` that the VF no longer has (none, for a
/// repeated detach), unless the VF is gone with its PF (nothing left to put back).
pub(super) async fn restore_vf<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    restore: &Restore,
) -> Result<()> {
    let (Some(vf), Some(previous)) = (&plan.vf, &restore.vf) else {
        return Ok(());
    };
    if previous.is_empty() {
        return Ok(());
    }
    let mut host = open(kernel, &Ns::Host).await?;
    if host.find_link(&vf.pf).await?.is_none() {
        tracing::warn!(device = %plan.device, pf = %vf.pf,
            "the VF's PF no longer exists; its VF settings cannot be put back");
        return Ok(());
    }
    match host.vf_state(&vf.pf, vf.index).await? {
        None => {
            tracing::warn!(device = %plan.device, pf = %vf.pf, vf = vf.index,
                "the PF no longer has this VF; its settings cannot be put back");
            Ok(())
        }
        Some(current) => {
            let mut back = vf::differences(previous, &current);
            // A cleared assignment (see `capture`) is in place once the PF only reports the
            // MAC the VF registered for itself again: clearing it once more would drop the
            // VF's own filter.
            if back.mac == Some([0; 6]) && current.mac.is_some() && current.mac == restore.host.mac
            {
                back.mac = None;
            }
            if back.is_empty() {
                return Ok(());
            }
            host.set_vf(&vf.pf, vf.index, &back).await
        }
    }
}

async fn detach_device<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    netns: Option<&Ns>,
    restore: &Restore,
) -> Result<()> {
    let original = &restore.host;
    let back = super::link::restoring(back(original, plan), restore);
    if let Some(kind) = plan.mode.child_kind() {
        // The child dies with the pod namespace; otherwise delete it there. A VLAN child left
        // on the host by a crash of an older version (between create and move) goes too.
        if let Some(ns) = netns
            && let Some(mut pod) = kernel.open(ns).await?
            && pod.find_link(&plan.pod_ifname).await?.is_some_and(|l| {
                // An overlay veth is knic's only with the MAC it announced (every pod has
                // veths of its own).
                let overlay = matches!(plan.mode, super::AttachMode::Overlay { .. });
                l.kind.as_deref() == Some(kind) && (!overlay || l.mac == plan.mac)
            })
        {
            pod.del_link(&plan.pod_ifname).await?;
        }
        let mut host = open(kernel, &Ns::Host).await?;
        if host.find_link(&plan.vlan_temp_name()).await?.is_some() {
            host.del_link(&plan.vlan_temp_name()).await?;
        }
        // A veth dies with either end; a host end still there (its pod end was renamed or
        // deleted by someone) goes too, so the bridge can be released.
        if let super::AttachMode::Overlay { host_veth, .. } = &plan.mode
            && host
                .find_link(host_veth)
                .await?
                .is_some_and(|l| l.kind.as_deref() == Some("veth"))
        {
            host.del_link(host_veth).await?;
        }
        return Ok(());
    }

    // Still in the pod: move it back (addresses and routes go with the namespace change, and
    // the move closes the device: no link-down first).
    // Moved back, with its index on the host if the move kept it.
    let mut moved = None;
    if let Some(ns) = netns
        && let Some(mut pod) = kernel.open(ns).await?
    {
        match pod.find_link(&plan.pod_ifname).await? {
            Some(link) if is_same_device(&link, plan, restore) => {
                // The host gets its device without knic's limit. Not fatal: the kernel drops
                // a device's qdiscs when it changes namespace anyway.
                if plan.bandwidth.is_some()
                    && let Err(e) = pod.clear_egress_limit(&plan.pod_ifname).await
                {
                    tracing::warn!(device = %plan.device, error = %e, "removing the egress limit failed");
                }
                moved = Some(pod.move_link(&plan.pod_ifname, &Ns::Host, &back).await?);
                crate::failpoint::hit("detach:after-move");
            }
            _ if identifiable(original) => {
                // A move the kernel refused half-way (namespace changed, a later attribute
                // refused) whose undo a crash cut short: the device is in the pod under
                // another name. Without this it would come home unrestored when the pod's
                // namespace dies, its record long forgotten.
                if let Some(name) = super::attaching::landed(&mut pod, plan, restore).await? {
                    moved = Some(pod.move_link(&name, &Ns::Host, &back).await?);
                }
            }
            _ => {}
        }
    }

    if let Some(index) = moved {
        return settle_home(kernel, original, index).await;
    }

    let mut host = open(kernel, &Ns::Host).await?;
    let current = match host.find_link(&original.name).await? {
        Some(l) if l.index == original.index => Some(l),
        _ => {
            let links = host.links().await?;
            let mut found: Vec<LinkState> = links
                .into_iter()
                .filter(|l| is_recorded(l, original))
                .collect();
            // A PCI function with several netdevs: its permanent MACs tell them apart.
            if found.len() > 1 && original.permanent_mac.is_some() {
                found.retain(|l| l.permanent_mac == original.permanent_mac);
            }
            if found.len() > 1 {
                return Err(Error::kernel(
                    Ns::Host,
                    format!("restoring {}", original.name),
                    format!(
                        "{} host links match its recorded identity; not guessing which one \
                         to rename and reconfigure",
                        found.len()
                    ),
                ));
            }
            found.pop()
        }
    };
    let Some(current) = current else {
        tracing::warn!(device = %plan.device, ifname = %original.name,
            "the device no longer exists (a virtual device is destroyed with its pod's namespace)");
        return Ok(());
    };
    restore_returned(&mut host, original, current, &back).await
}

/// Whether a link can be told apart from the pod's own by more than its index or name.
pub(super) fn identifiable(original: &LinkState) -> bool {
    original.mac.is_some() || original.permanent_mac.is_some() || original.pci_address.is_some()
}

/// `link` is the device recorded as `original`. Recorded with a hardware identity (a PCI
/// function, else a permanent MAC: what no rename, move or MAC change alters; see
/// [`super::same_hardware`]), by it, not by index: its index may have changed (it had to take
/// another in the pod and kept that one on the way back), and then another device may hold its
/// old one. Without one, by index.
fn is_recorded(link: &LinkState, original: &LinkState) -> bool {
    let hardware = original.permanent_mac.is_some() || original.pci_address.is_some();
    link.kind == original.kind
        && if hardware {
            super::same_hardware(link, original)
        } else {
            link.index == original.index
        }
}

/// The move back: the device's original name, MTU and MAC (the MAC later, after the PF's
/// settings, for a VF whose PF enforces the claim's: see [`sets_vf_mac`]).
fn back(original: &LinkState, plan: &AttachPlan) -> LinkChange {
    LinkChange {
        name: Some(original.name.clone()),
        mtu: Some(original.mtu),
        mac: original.mac.filter(|_| !sets_vf_mac(plan)),
        up: None,
        ipv4_conf: Vec::new(),
        index: Some(original.index),
        sizes: Default::default(),
    }
}

/// After the move back the device is home under its name, MTU and MAC (the move set them or
/// failed), down, without addresses: its addresses and admin state go back (by `index`, when
/// the move kept it, without a lookup).
async fn settle_home<K: Kernel>(
    kernel: &K,
    original: &LinkState,
    index: Option<u32>,
) -> Result<()> {
    if original.addresses.is_empty() && !original.up {
        return Ok(());
    }
    let mut host = open(kernel, &Ns::Host).await?;
    if let Some(index) = index {
        host.remember(&original.name, index);
    }
    host.add_addresses(&original.name, &original.addresses)
        .await?;
    if original.up {
        set_up(&mut host, &original.name, true).await?;
    }
    Ok(())
}

/// Brings home a device a failed attach left in the pod as `name`, half-configured (the
/// kernel moved it, then refused an attribute of the same request): moved back under its
/// original name, MTU and MAC, its addresses, admin state and VF settings put back, as detach
/// does for a device under the pod's name. A pod namespace gone meanwhile has returned it.
pub(super) async fn bring_home<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    netns: &Ns,
    restore: &Restore,
    name: &str,
) -> Result<()> {
    let Some(mut pod) = kernel.open(netns).await? else {
        return detach(kernel, plan, None, restore).await;
    };
    let index = pod
        .move_link(
            name,
            &Ns::Host,
            &super::link::restoring(back(&restore.host, plan), restore),
        )
        .await?;
    drop(pod);
    settle_home(kernel, &restore.host, index).await?;
    restore_ethtool(kernel, plan, restore).await?;
    restore_vf(kernel, plan, restore).await?;
    restore_vf_mac(kernel, plan, &restore.host).await
}

/// A device the kernel returned by itself (its pod namespace died), possibly under another
/// name: renamed back (down, as a rename needs), its missing addresses added, its admin state
/// put back.
async fn restore_returned<S: Session>(
    host: &mut S,
    original: &LinkState,
    current: LinkState,
    back: &LinkChange,
) -> Result<()> {
    let mut up = current.up;
    if current.name != original.name
        || current.mtu != original.mtu
        || (original.mac.is_some() && current.mac != original.mac)
        || !back.sizes.is_empty()
    {
        set_up(host, &current.name, false).await?;
        host.set_link(&current.name, back).await?;
        up = false;
    }
    if !original.addresses.is_empty() {
        let present = host.addresses(current.index).await?;
        let missing: Vec<_> = original
            .addresses
            .iter()
            .filter(|a| !present.contains(a))
            .copied()
            .collect();
        host.add_addresses(&original.name, &missing).await?;
    }
    if up != original.up {
        set_up(host, &original.name, original.up).await?;
    }
    Ok(())
}

async fn set_up<S: Session>(host: &mut S, name: &str, up: bool) -> Result<()> {
    host.set_link(
        name,
        &LinkChange {
            up: Some(up),
            ..Default::default()
        },
    )
    .await
}
