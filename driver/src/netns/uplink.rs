//! The host-side VLAN that pods share: Linux allows one VLAN child per id on a port, so when
//! several pods on a node want VLAN 42 of one port, knic creates that VLAN once on the host
//! (the "uplink") and gives each pod a macvlan or ipvlan on top of it.
//!
//! Who still needs an uplink is not kept in a counter of its own (a counter and the records it
//! counts could disagree after a crash): an uplink is in use exactly while some checkpointed
//! attachment whose plan names it has its restore record, which attach writes before the
//! uplink is ensured and detach clears only after the pod's child is gone. The pod layer
//! (`crate::pods`) serialises "record and ensure" against "count and delete", and sweeps
//! uplinks nobody records (a crash between a detach and its release) at start-up.

use serde::{Deserialize, Serialize};

use super::{Kernel, LinkChange, NewChild, Ns, Session, open};
use crate::error::{Error, Result};

/// The prefix of every uplink's name: only links with it (and of kind `vlan`) are ever
/// considered knic's by the sweep.
pub const PREFIX: &str = "knv";

/// A host-side VLAN of the plan's device that the pod's child sits on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Uplink {
    /// VLAN id.
    pub vlan: u16,
    /// Its name on the host (see [`Uplink::name_for`]).
    pub name: String,
}

impl Uplink {
    /// The uplink for VLAN `vlan` of the host interface `parent`.
    pub fn new(parent: &str, vlan: u16) -> Uplink {
        Uplink {
            vlan,
            name: Uplink::name_for(parent, vlan),
        }
    }

    /// `knv` + 6 hex digits of a hash of the parent's name + `.` + id: at most 14 bytes (the
    /// kernel allows 15), the same for every pod asking for that VLAN of that port, and
    /// recognisable as knic's.
    pub fn name_for(parent: &str, vlan: u16) -> String {
        let hash = parent.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{PREFIX}{:06x}.{vlan}", hash & 0xff_ffff)
    }
}

/// Whether `name` has the shape of an uplink's name (the sweep's guard, with the link kind).
pub fn is_uplink_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return false;
    };
    let Some((hash, id)) = rest.split_once('.') else {
        return false;
    };
    hash.len() == 6
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
        && !id.is_empty()
        && id.len() <= 4
        && id.bytes().all(|b| b.is_ascii_digit())
}

/// Makes sure the uplink exists on the host, as a VLAN, up: created when missing (another
/// pod's attach may have created it already), brought up when it is down. A link of that name
/// that is not a VLAN is refused rather than used.
pub async fn ensure<S: Session>(host: &mut S, parent: &str, uplink: &Uplink) -> Result<()> {
    match host.find_link(&uplink.name).await? {
        Some(link) if link.kind.as_deref() == Some("vlan") => {
            if !link.up {
                host.set_link(
                    &uplink.name,
                    &LinkChange {
                        up: Some(true),
                        ..Default::default()
                    },
                )
                .await?;
            }
            Ok(())
        }
        Some(other) => Err(Error::kernel(
            Ns::Host,
            format!(
                "creating VLAN {} of {parent} as {}",
                uplink.vlan, uplink.name
            ),
            format!(
                "a {} link of that name already exists and is not knic's VLAN",
                other.kind.as_deref().unwrap_or("physical")
            ),
        )),
        None => {
            host.add_child(
                parent,
                NewChild::Vlan(uplink.vlan),
                &Ns::Host,
                &LinkChange {
                    name: Some(uplink.name.clone()),
                    up: Some(true),
                    ..Default::default()
                },
            )
            .await
        }
    }
}

/// Deletes the uplink `name` from the host if it is there and is a VLAN; the caller has
/// established that no recorded attachment uses it. Its children (none, by then) would go
/// with it.
pub async fn release<K: Kernel>(kernel: &K, name: &str) -> Result<()> {
    let mut host = open(kernel, &Ns::Host).await?;
    if host
        .find_link(name)
        .await?
        .is_some_and(|l| l.kind.as_deref() == Some("vlan"))
    {
        host.del_link(name).await?;
        tracing::info!(uplink = %name, "host VLAN no pod uses any more deleted");
    }
    Ok(())
}

/// The uplinks present on the host (by name and kind), for the start-up sweep.
pub async fn present<K: Kernel>(kernel: &K) -> Result<Vec<String>> {
    let mut host = open(kernel, &Ns::Host).await?;
    Ok(host
        .links()
        .await?
        .into_iter()
        .filter(|l| l.kind.as_deref() == Some("vlan") && is_uplink_name(&l.name))
        .map(|l| l.name)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_stable_and_recognised() {
        let a = Uplink::name_for("ens1f0", 4094);
        assert_eq!(a, Uplink::name_for("ens1f0", 4094));
        assert_ne!(a, Uplink::name_for("ens1f1", 4094));
        assert!(a.len() <= 15, "{a}");
        assert!(a.starts_with("knv") && a.ends_with(".4094"), "{a}");
        assert!(is_uplink_name(&a));
        for foreign in [
            "eth0.42",
            "knv.42",
            "knvzzzzzz.1",
            "knv123456.",
            "knv123456.12345",
            "knv1234567.1",
        ] {
            assert!(!is_uplink_name(foreign), "{foreign}");
        }
    }
}
