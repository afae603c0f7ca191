//! Device taints: what keeps the scheduler away from a device that cannot work right now.
//!
//! A device whose link is down (administratively up, no carrier), whose PCI function has no
//! kernel driver bound, or that vanished from the node while no prepared claim holds it is
//! published with a `NoSchedule` taint (DRADeviceTaints, beta in 1.36) whose value is the
//! short reason, and loses it when it recovers. Software links (veth, macvlan…) are never
//! tainted: their state is configuration. Without taints the scheduler would keep handing out such a device and the pod
//! would fail at prepare time. The kubelet health stream reports the same devices unhealthy
//! with [`message`], so a pod's status and the slice agree.
//!
//! The decision is pure: [`apply`] recomputes the causes from the attributes on every scan
//! (so a copy taken at prepare time carries no stale taint), and [`Gone`] remembers what was
//! published to notice a device that disappeared. `timeAdded` is left for the apiserver to set;
//! [`crate::slices::plan`] carries the stored times over so they stay those of the first
//! publish.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::resource::v1::{Device, DeviceTaint};

/// The link's operational state is not up; the value is the state.
pub const KEY_LINK_DOWN: &str = "knic.dev/link-down";
/// The PCI function has no kernel driver bound.
pub const KEY_DRIVER_UNBOUND: &str = "knic.dev/driver-unbound";
/// The device vanished from the node while no prepared claim held it.
pub const KEY_GONE: &str = "knic.dev/gone";
/// The only effect knic sets: new allocations stop, pods already running keep the device.
pub const EFFECT: &str = "NoSchedule";
/// Value of [`KEY_DRIVER_UNBOUND`].
pub const VALUE_UNBOUND: &str = "no-driver";
/// Value of [`KEY_GONE`].
pub const VALUE_GONE: &str = "vanished";
/// The lowest per-device taint cap of the apiserver versions knic supports (4 in 1.34, 16 from
/// 1.35 on); knic sets at most three.
pub const MAX_TAINTS_PER_DEVICE: usize = 4;
/// How long a vanished device stays published (tainted) before it is dropped: long enough for
/// a driver reload or a link flap to come back under the same name, short enough that VFs
/// removed on purpose do not linger.
pub const GONE_GRACE: Duration = Duration::from_secs(600);

/// Link states that mean the device cannot pass traffic (`unknown` is left out at discovery,
/// `dormant` and `testing` are not failures).
const DOWN_STATES: [&str; 3] = ["down", "lowerlayerdown", "notpresent"];
/// Kinds whose devices are PCI functions, which need a kernel driver to be usable.
const PCI_KINDS: [&str; 3] = ["nic", "pf", "vf"];

fn taint(key: &str, value: &str) -> DeviceTaint {
    DeviceTaint {
        key: key.to_owned(),
        value: Some(value.to_owned()),
        effect: EFFECT.to_owned(),
        time_added: None,
    }
}

fn string_attr<'a>(device: &'a Device, key: &str) -> Option<&'a str> {
    device
        .attributes
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.string.as_deref())
}

/// Whether `taint` is one knic sets (others, e.g. from an admin's tooling, are never touched).
pub fn is_knic_taint(taint: &DeviceTaint) -> bool {
    [KEY_LINK_DOWN, KEY_DRIVER_UNBOUND, KEY_GONE].contains(&taint.key.as_str())
}

/// Whether `device` is a software link (veth, macvlan, bridge…): its state is configuration,
/// not health, and one that is deleted is gone for good, so it is never tainted.
fn is_virtual(device: &Device) -> bool {
    string_attr(device, "kind") == Some("virtual")
}

/// Whether the interface is administratively down: nobody set it up (knic does, in the pod),
/// so its `down` says nothing about the link.
pub fn is_admin_down(device: &Device) -> bool {
    device
        .attributes
        .as_ref()
        .and_then(|a| a.get("adminDown"))
        .and_then(|v| v.bool)
        == Some(true)
}

/// The taints `device`'s own attributes call for, in key order.
pub fn causes(device: &Device) -> Vec<DeviceTaint> {
    let mut out = Vec::new();
    if is_virtual(device) {
        return out;
    }
    if let Some(state) = string_attr(device, "state").filter(|s| DOWN_STATES.contains(s))
        && !is_admin_down(device)
    {
        out.push(taint(KEY_LINK_DOWN, state));
    }
    let is_pci = string_attr(device, "kind").is_some_and(|k| PCI_KINDS.contains(&k))
        && string_attr(device, "pciAddress").is_some();
    if is_pci && string_attr(device, "driver").is_none() {
        out.push(taint(KEY_DRIVER_UNBOUND, VALUE_UNBOUND));
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

fn set_knic_taints(device: &mut Device, ours: Vec<DeviceTaint>) {
    let mut taints: Vec<DeviceTaint> = device
        .taints
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !is_knic_taint(t))
        .collect();
    taints.extend(ours);
    taints.truncate(MAX_TAINTS_PER_DEVICE);
    device.taints = (!taints.is_empty()).then_some(taints);
}

/// Sets every device's knic taints from its attributes, replacing whatever knic taints it
/// carried (a device retained from the checkpoint carries those of prepare time).
pub fn apply(devices: &mut [Device]) {
    for device in devices {
        let ours = causes(device);
        set_knic_taints(device, ours);
    }
}

/// Why `device` is unhealthy, if a knic taint says so: the text the health stream reports.
pub fn message(device: &Device) -> Option<String> {
    let taint = device.taints.iter().flatten().find(|t| is_knic_taint(t))?;
    let value = taint.value.as_deref().unwrap_or_default();
    Some(match taint.key.as_str() {
        KEY_LINK_DOWN => format!("link is {value}"),
        KEY_DRIVER_UNBOUND => "no kernel driver is bound to the PCI function".to_owned(),
        _ => "the device vanished from the node".to_owned(),
    })
}

/// What [`Gone`] remembers of one published device.
#[derive(Debug, Clone)]
struct Seen {
    /// The last published copy.
    last: Device,
    /// Whether a prepared claim held it then.
    held: bool,
    /// When it went missing (`None` while present).
    since: Option<SystemTime>,
}

/// Memory of what was published, to keep a vanished device published (tainted) for a while.
#[derive(Debug, Clone, Default)]
pub struct Gone {
    seen: BTreeMap<String, Seen>,
}

impl Gone {
    /// Forgets the VFs of the PFs at `pf_addresses`, whose VF count the SR-IOV policy just
    /// changed: VFs removed on purpose are withdrawn, not published as vanished.
    pub fn forget(&mut self, pf_addresses: &[String]) {
        self.seen.retain(|_, seen| {
            string_attr(&seen.last, "pfPciAddress")
                .is_none_or(|pf| !pf_addresses.iter().any(|a| a == pf))
        });
    }

    /// Adds the vanished devices to `devices` (the node's devices as discovered now, the
    /// `held` ones that prepared claims hold included, knic taints applied) with a [`KEY_GONE`]
    /// taint, for `grace` after they went missing at the latest; keeps the result in name
    /// order. A device that was held when it went missing vanished with its pod while
    /// allocated, and a software link was deleted: both are withdrawn at once. A vanished device keeps its last attributes but
    /// consumes no counters: its PF budget may be gone with it, and a pool naming a counter set
    /// nobody publishes is refused whole.
    pub fn update(
        &mut self,
        devices: &mut Vec<Device>,
        held: &[Device],
        now: SystemTime,
        grace: Duration,
    ) {
        let present: BTreeMap<String, Device> = devices
            .iter()
            .map(|d| (d.name.clone(), d.clone()))
            .collect();
        let mut added = false;
        self.seen.retain(|name, Seen { last, held, since }| {
            if present.contains_key(name) {
                return true;
            }
            if *held || is_virtual(last) {
                return false;
            }
            let since = *since.get_or_insert(now);
            let expired = now.duration_since(since).is_ok_and(|held| held >= grace);
            if expired {
                tracing::info!(device = %name, "vanished device dropped from the pool");
                return false;
            }
            let mut copy = last.clone();
            copy.consumes_counters = None;
            set_knic_taints(&mut copy, vec![taint(KEY_GONE, VALUE_GONE)]);
            devices.push(copy);
            added = true;
            true
        });
        for (name, last) in present {
            let held = held.iter().any(|d| d.name == name);
            self.seen.insert(
                name,
                Seen {
                    last,
                    held,
                    since: None,
                },
            );
        }
        if added {
            devices.sort_by(|a, b| a.name.cmp(&b.name));
        }
    }
}

#[cfg(test)]
#[path = "taints_tests.rs"]
mod tests;
