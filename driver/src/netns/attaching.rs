//! Attach: the device (or a child of it) into the pod, configured, and every step undone when
//! one fails. Requests are kept to what the plan cannot know: one index lookup per name per
//! session, addresses and routes pipelined, no read-back of what the plan just set, no
//! explicit link-down before a move (the move closes the device itself).

use super::{
    AttachMode, AttachPlan, Kernel, LinkChange, LinkState, Ns, Restore, Session, Tbf, detach,
    is_same_device, open, sysctl, uplink, vf,
};
use crate::error::{Error, Result};

/// Steps attach performed, undone in reverse on failure.
#[derive(Debug)]
enum Done {
    SetVf,
    CreatedChild,
    Moved,
    /// The move request failed after the kernel had moved the device: it is in the pod under
    /// this name, half-configured.
    Landed(String),
}

/// Attaches per `plan` into the pod namespace `netns`. Idempotent: when the pod already has the
/// interface (a repeated hook) nothing is done, unless `resume` says an earlier attach was cut
/// short (a crash after the move): then the in-pod configuration is applied again (every step
/// tolerates what is already there). On failure every step taken is
/// undone, so the device is back on the host as [`super::capture`] saw it. Returns the
/// interface as the pod sees it (its MAC goes into the claim status).
pub async fn attach<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    netns: &Ns,
    restore: &Restore,
    resume: bool,
) -> Result<LinkState> {
    let mut pod = open(kernel, netns).await?;
    let mut host = open(kernel, &Ns::Host).await?;
    // The pod's name must be free: a move onto a taken name still moves the device and only
    // then fails the rename (EEXIST), leaving it in the pod under its host name. Checked
    // beside the host lookup the move needs (the session keeps its index); each is one request
    // on its namespace's socket, answered inside the `sendmsg`.
    let (existing, on_host) = match plan.mode {
        AttachMode::Move => {
            let (in_pod, on_host) = futures::join!(
                pod.find_link(&plan.pod_ifname),
                host.find_link(&plan.host_ifname)
            );
            (in_pod?, on_host?)
        }
        AttachMode::Vlan { .. } | AttachMode::Child { .. } | AttachMode::Overlay { .. } => {
            (pod.find_link(&plan.pod_ifname).await?, None)
        }
    };
    if let Some(mut existing) = existing {
        // Same device already there (repeat) → no-op; anything else is a name clash.
        let ours = match plan.mode {
            AttachMode::Move => is_same_device(&existing, plan, restore),
            // Every pod has veths (the cluster's eth0): knic's carries the MAC it announced.
            AttachMode::Overlay { .. } => {
                existing.kind.as_deref() == Some("veth") && existing.mac == plan.mac
            }
            AttachMode::Vlan { .. } | AttachMode::Child { .. } => {
                existing.kind.as_deref() == plan.mode.child_kind()
            }
        };
        if ours && resume {
            // Every sysctl as a file: the cut-short attach may not have set any.
            configure_in_pod(plan, &plan.sysctls, netns, &mut pod, None).await?;
            return pod.link(&plan.pod_ifname).await?.ok_or_else(|| {
                Error::kernel(
                    netns,
                    format!("resuming {}", plan.pod_ifname),
                    "the interface vanished from the pod",
                )
            });
        }
        if ours {
            existing.addresses = pod.addresses(existing.index).await?;
            return Ok(existing);
        }
        return Err(Error::kernel(
            netns,
            format!("attaching {}/{}", plan.pool, plan.device),
            format!(
                "interface {} already exists in the pod; choose another name (interface.name)",
                plan.pod_ifname
            ),
        ));
    }
    // The name is the host admin's to change: what carries it now must still be the prepared
    // device (capture checked it, maybe long before a repeated attach), or it stays put.
    if let (Some(identity), Some(link)) = (&plan.identity, &on_host)
        && let Some(found) = identity.mismatch(link)
    {
        return Err(Error::DeviceMismatch {
            device: format!("{}/{}", plan.pool, plan.device),
            ifname: plan.host_ifname.clone(),
            prepared: identity.to_string(),
            found,
        });
    }
    let mut done = Vec::new();
    let result = attach_steps(
        plan, netns, restore, on_host, &mut host, &mut pod, &mut done,
    )
    .await;
    match result {
        Ok(link) => Ok(link),
        Err(e) => {
            tracing::warn!(device = %plan.device, error = %e, steps = done.len(), "attach failed; undoing");
            drop(pod);
            drop(host);
            if let Err(undo) = undo(kernel, plan, netns, restore, done).await {
                tracing::error!(device = %plan.device, error = %undo, "undoing a failed attach failed");
            }
            Err(e)
        }
    }
}

async fn attach_steps<S: Session>(
    plan: &AttachPlan,
    netns: &Ns,
    restore: &Restore,
    on_host: Option<LinkState>,
    host: &mut S,
    pod: &mut S,
    done: &mut Vec<Done>,
) -> Result<LinkState> {
    let mut into_pod = LinkChange {
        name: Some(plan.pod_ifname.clone()),
        mtu: plan.mtu,
        // A MAC the PF assigns reaches the netdev after the move (see `adopt_vf_mac`).
        mac: plan.mac.filter(|_| vf_mac(plan).is_none()),
        up: None,
        ipv4_conf: Vec::new(),
        index: None,
        sizes: plan.link.sizes,
    };
    // A move carries the IPv4 devconf sysctls; a creation refuses them (EAFNOSUPPORT on 6.1
    // and 6.18), so a child gets them all as files. So does a move to an MTU too small for
    // IPv4 (plan validation refuses one; older checkpoints may hold it): the kernel drops the
    // device's in_device at that MTU change, after the move and before the sysctls, so the
    // request would fail with EAFNOSUPPORT (undone, see [`landed`]) where the file writes
    // name the sysctl that cannot be set.
    let files = match plan.mode.child_kind() {
        None if plan.mtu.is_none_or(|m| m >= sysctl::MIN_IPV4_MTU) => {
            let split = sysctl::split(&plan.sysctls);
            into_pod.ipv4_conf = split.ipv4_conf;
            split.files
        }
        _ => plan.sysctls.clone(),
    };
    // Through the PF while the VF is still on the host, so the pod never sees it
    // unconfigured (a VF driver may reset on a MAC or trust change).
    if let Some(vf) = &plan.vf {
        let Some(previous) = &restore.vf else {
            return Err(Error::kernel(
                Ns::Host,
                format!("setting VF {} of {}", vf.index, vf.pf),
                "its previous state was not recorded, so it could not be put back; \
                 refusing to change it",
            ));
        };
        let wanted = vf::request(&vf.settings, previous);
        // Recorded before the call: the kernel applies the settings one by one and stops
        // at the first the PF's driver refuses, so a failed call may have made some.
        done.push(Done::SetVf);
        host.set_vf(&vf.pf, vf.index, &wanted).await?;
        crate::failpoint::hit("attach:after-set-vf");
    }
    if let AttachMode::Overlay { segment, host_veth } = &plan.mode {
        // The segment first if this is its first pod on the node (the caller has recorded the
        // attachment, so a crash from here on cannot leak it), then the veth: its pod end
        // created in the pod, its host end on the bridge, in one request.
        host.ensure_segment(segment).await?;
        crate::failpoint::hit("attach:after-segment");
        let mtu = plan.mtu.unwrap_or(segment.mtu);
        host.add_veth(host_veth, &segment.bridge, netns, mtu, &into_pod)
            .await?;
        done.push(Done::CreatedChild);
        return configure_in_pod(plan, &files, netns, pod, None).await;
    }
    match plan.mode.new_child() {
        None => {
            // One RTM_NEWLINK: namespace, final name, MTU, MAC and IPv4 sysctls together.
            let index = match host.move_link(&plan.host_ifname, netns, &into_pod).await {
                Ok(index) => index,
                Err(e) => {
                    match landed(pod, plan, restore).await {
                        Ok(Some(name)) => done.push(Done::Landed(name)),
                        Ok(None) => {}
                        Err(read) => {
                            tracing::error!(device = %plan.device, error = %read,
                                "a move into the pod failed and the pod's links cannot be \
                                 read; the device may be left there");
                        }
                    }
                    return Err(e);
                }
            };
            done.push(Done::Moved);
            crate::failpoint::hit("attach:after-move");
            // Kept across the move: the device is as the host lookup saw it, renamed, sized
            // and addressed by the move, closed, without addresses (the move flushed them).
            if let (Some(index), Some(link)) = (index, on_host) {
                pod.remember(&plan.pod_ifname, index);
                let moved = LinkState {
                    index,
                    name: plan.pod_ifname.clone(),
                    mtu: plan.mtu.unwrap_or(link.mtu),
                    mac: into_pod.mac.or(link.mac),
                    up: false,
                    addresses: Vec::new(),
                    ..link
                };
                let link = configure_in_pod(plan, &files, netns, pod, Some(moved)).await?;
                return adopt_vf_mac(plan, netns, host, pod, link).await;
            }
        }
        Some(child) => {
            // On a shared host VLAN, made first if this is its first pod (the caller has
            // recorded the attachment, so a crash from here on cannot leak it).
            let parent = match plan.mode.uplink() {
                Some(up) => {
                    uplink::ensure(host, &plan.host_ifname, up).await?;
                    crate::failpoint::hit("attach:after-uplink");
                    up.name.as_str()
                }
                None => plan.host_ifname.as_str(),
            };
            // Created in the pod, its parent named from the host, in one request. Without the
            // GSO/GRO sizes: see `link::size_child`.
            let created = LinkChange {
                sizes: Default::default(),
                ..into_pod.clone()
            };
            host.add_child(parent, child, netns, &created).await?;
            done.push(Done::CreatedChild);
        }
    }
    let link = configure_in_pod(plan, &files, netns, pod, None).await?;
    adopt_vf_mac(plan, netns, host, pod, link).await
}

/// The MAC the plan assigns the VF through its PF, if it does.
fn vf_mac(plan: &AttachPlan) -> Option<[u8; 6]> {
    plan.vf.as_ref().and_then(|vf| vf.settings.mac)
}

/// The netdev of a VF whose MAC the plan assigned through the PF, once open in the pod. The
/// move carried no MAC: a PF enforcing one it assigned refuses the VF any MAC request, even
/// for that very MAC (igb NACKs it: EADDRNOTAVAIL), and many VF drivers take the assigned MAC
/// on their own when they reset. igbvf resets only when its PF resets or its driver reloads,
/// so its netdev keeps its old MAC, which the PF then filters out: knic asks for the assigned
/// one from the VF, and when the PF refuses, asks again with the VF trusted for that one
/// request (igb lets a trusted VF choose its MAC; no container runs in the pod yet, so nothing
/// else can use the window), then puts trust back as it was.
async fn adopt_vf_mac<S: Session>(
    plan: &AttachPlan,
    netns: &Ns,
    host: &mut S,
    pod: &mut S,
    mut link: LinkState,
) -> Result<LinkState> {
    let (Some(mac), Some(vf), AttachMode::Move) = (vf_mac(plan), &plan.vf, &plan.mode) else {
        return Ok(link);
    };
    let now = pod.find_link(&plan.pod_ifname).await?.ok_or_else(|| {
        Error::kernel(
            netns,
            format!("attaching {}", plan.pod_ifname),
            "the interface vanished from the pod",
        )
    })?;
    let change = LinkChange {
        mac: Some(mac),
        ..LinkChange::default()
    };
    if now.mac != Some(mac) {
        let refused = match pod.set_link(&plan.pod_ifname, &change).await {
            Ok(()) => None,
            Err(e) if e.errno() == Some(nix::libc::EADDRNOTAVAIL) => Some(e),
            Err(e) => return Err(e),
        };
        if let Some(refused) = refused {
            let trust = host
                .vf_state(&vf.pf, vf.index)
                .await?
                .and_then(|state| state.trust);
            if trust == Some(true) {
                return Err(refused);
            }
            let trusted = |on: bool| vf::VfState {
                trust: Some(on),
                ..vf::VfState::default()
            };
            host.set_vf(&vf.pf, vf.index, &trusted(true))
                .await
                .map_err(|e| {
                    Error::kernel(
                        netns,
                        format!(
                            "giving {} its MAC {}",
                            plan.pod_ifname,
                            super::mac_text(&mac)
                        ),
                        format!(
                            "the PF assigned it, the VF's driver did not take it, the PF refuses \
                             the VF's own request ({refused}), and trusting the VF for that \
                             request failed: {e}"
                        ),
                    )
                })?;
            let asked = pod.set_link(&plan.pod_ifname, &change).await;
            let back = host
                .set_vf(&vf.pf, vf.index, &trusted(trust.unwrap_or(false)))
                .await;
            asked?;
            back?;
        }
    }
    link.mac = Some(mac);
    link.permanent_mac = now.permanent_mac;
    Ok(link)
}

/// Inside the pod: the sysctls in `files` first (arp/ra settings must hold before the link is
/// up; IPv4 ones a move carried are already set), then the ethtool settings, then
/// addresses, then static neighbors, then the egress limit (so the first packet meets it),
/// then up, then routes (a
/// route needs its link up). Each step accepts what is already in place, so it can be
/// repeated after a crash. Returns the link as it now is: `known` (what a move that kept the
/// device's index left), else read once before the changes (the lookup the later requests
/// need anyway), with what they changed filled in (after a move the device has exactly the
/// plan's global addresses: the kernel flushed the others).
async fn configure_in_pod<S: Session>(
    plan: &AttachPlan,
    files: &std::collections::BTreeMap<String, String>,
    netns: &Ns,
    pod: &mut S,
    known: Option<LinkState>,
) -> Result<LinkState> {
    let vanished = |what: String| Error::kernel(netns, what, "the interface vanished from the pod");
    if !files.is_empty() {
        pod.set_sysctls(&plan.pod_ifname, files).await?;
    }
    // While the link is down: a NIC resets its queues on a ring or channel change.
    if let Some(asked) = &plan.ethtool {
        super::ethtool::apply(pod, netns, &plan.pod_ifname, asked).await?;
        crate::failpoint::hit("attach:after-ethtool");
    }
    let mut link = match known {
        Some(link) => link,
        None => pod
            .find_link(&plan.pod_ifname)
            .await?
            .ok_or_else(|| vanished(format!("attaching {}", plan.pod_ifname)))?,
    };
    super::link::size_child(plan, pod).await?;
    // Into its VRF before it has addresses and is up, so its connected routes are made in the
    // VRF's table (enslaving an up device cycles it).
    super::routing::join_vrf(plan, netns, pod).await?;
    pod.add_addresses(&plan.pod_ifname, &plan.addresses).await?;
    if !plan.link.neighbors.is_empty() {
        pod.set_neighbors(&plan.pod_ifname, &plan.link.neighbors)
            .await?;
    }
    if let Some(bandwidth) = &plan.bandwidth {
        let tbf = Tbf::for_link(bandwidth, link.mtu, netns, &plan.pod_ifname)?;
        pod.set_egress_limit(&plan.pod_ifname, &tbf).await?;
    }
    pod.set_link(
        &plan.pod_ifname,
        &LinkChange {
            up: Some(true),
            ..Default::default()
        },
    )
    .await?;
    pod.add_routes(&plan.pod_ifname, &plan.routes).await?;
    super::routing::add_rules(plan, pod).await?;
    link.up = true;
    link.addresses = plan.addresses.clone();
    Ok(link)
}

async fn undo<K: Kernel>(
    kernel: &K,
    plan: &AttachPlan,
    netns: &Ns,
    restore: &Restore,
    done: Vec<Done>,
) -> Result<()> {
    for step in done.into_iter().rev() {
        match step {
            // Detach also puts the VF settings back.
            Done::Moved => return detach(kernel, plan, Some(netns), restore).await,
            Done::Landed(name) => {
                return super::detaching::bring_home(kernel, plan, netns, restore, &name).await;
            }
            Done::CreatedChild => {
                if let Some(mut pod) = kernel.open(netns).await? {
                    pod.del_link(&plan.pod_ifname).await?;
                }
            }
            Done::SetVf => super::detaching::restore_vf(kernel, plan, restore).await?,
        }
    }
    // Rules and a VRF of a created child (a moved device's detach above took them back).
    super::routing::remove(kernel, plan, Some(netns)).await
}

/// Where a failed move left the device, if in the pod. The kernel (do_setlink) changes the
/// namespace first and only then applies MAC, MTU, name and IPv4 sysctls there, so one it
/// refuses (an MTU the device cannot take, a MAC it cannot carry) fails the request with the
/// device already in the pod, under its host name (or the pod's, when the host name was
/// taken there). Found by its index (kept across a move unless taken in the pod) or either
/// name, and by a MAC it can have (its own, or the plan's if the kernel got that far): one
/// dump, only on this failure path.
pub(super) async fn landed<S: Session>(
    pod: &mut S,
    plan: &AttachPlan,
    restore: &Restore,
) -> Result<Option<String>> {
    let original = &restore.host;
    // With nothing that identifies the device (no MAC, no permanent MAC, no PCI function), an
    // index or a name alone could be another link of the pod's (tunl0, sit0 have small
    // indexes): better to report the device possibly left there than to move the wrong one.
    if !super::detaching::identifiable(original) {
        tracing::error!(device = %plan.device,
            "the device has no MAC or PCI function to find it by in the pod; it may be left there");
        return Ok(None);
    }
    // An unreadable pod is an error, not "not there": detach must not forget a device it
    // could not look for.
    let links = pod.links().await?;
    Ok(links
        .into_iter()
        .find(|l| {
            (l.index == original.index || l.name == plan.host_ifname || l.name == plan.pod_ifname)
                && (l.mac == original.mac || (plan.mac.is_some() && l.mac == plan.mac))
                && super::same_hardware(l, original)
        })
        .map(|l| l.name))
}
