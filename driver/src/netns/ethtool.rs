//! ethtool settings of the pod's interface (features, rings, channels, coalescing), written
//! once against [`Session::ethtool_state`] / [`Session::set_ethtool`]: what to send is decided
//! here from what the device reports, so the real kernel and the fake refuse alike.
//!
//! Only what differs from the device's current state is sent, and only that is recorded for
//! detach ([`previous`]): a moved device gets back exactly the values knic changed. A feature
//! the device cannot change is refused naming the device and the feature, before anything is
//! sent; an alias of a group (`tx`, `sg`, `tso`) changes the members the device can change, as
//! `ethtool -K` does, and is refused only when it can change none that differ.

use std::collections::{BTreeMap, BTreeSet};

use knic_proto::netconfig::{Channels, Coalesce, EthtoolSettings, Rings, group_members};
use serde::{Deserialize, Serialize};

use super::{Ns, Session};
use crate::error::{Error, Result};

/// A device's features as the kernel reports them (`ETHTOOL_MSG_FEATURES_GET`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFeatures {
    /// Features the device lets ethtool change (`hw` without `nochange`).
    pub changeable: BTreeSet<String>,
    /// Features on now (`active`).
    pub active: BTreeSet<String>,
}

/// What a device reports for the parts of a request (each `None` when not asked for).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EthtoolState {
    /// Features, when the request has any.
    pub features: Option<DeviceFeatures>,
    /// Current ring sizes, when asked.
    pub rings: Option<Rings>,
    /// Current channel counts, when asked.
    pub channels: Option<Channels>,
    /// Current coalescing, when asked.
    pub coalesce: Option<Coalesce>,
}

/// `on`/`off`.
fn onoff(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// The kernel features a request names: a group's members, or the feature itself.
fn members(key: &str) -> Vec<&str> {
    match group_members(key) {
        Some(members) => members.to_vec(),
        None => vec![key],
    }
}

/// The kernel feature → value changes `asked` needs on a device in `state`; refused (with
/// the reason) when it asks a fixed feature to change.
fn feature_changes(
    asked: &BTreeMap<String, bool>,
    state: &DeviceFeatures,
) -> std::result::Result<BTreeMap<String, bool>, String> {
    let mut out = BTreeMap::new();
    let mut fixed = Vec::new();
    for (key, on) in asked {
        let differ: Vec<&str> = members(key)
            .into_iter()
            .filter(|m| state.active.contains(*m) != *on)
            .collect();
        let settable: Vec<&str> = differ
            .iter()
            .copied()
            .filter(|m| state.changeable.contains(*m))
            .collect();
        if group_members(key).is_some() {
            if !differ.is_empty() && settable.is_empty() {
                fixed.push(format!(
                    "{key} ({}) cannot be turned {}: the device has {} fixed {}",
                    members(key).join(", "),
                    onoff(*on),
                    differ.join(", "),
                    onoff(!*on)
                ));
            }
        } else if !differ.is_empty() && settable.is_empty() {
            fixed.push(format!(
                "{key} cannot be turned {}: the device has it fixed {}",
                onoff(*on),
                onoff(!*on)
            ));
        }
        for m in settable {
            out.insert(m.to_owned(), *on);
        }
    }
    if fixed.is_empty() {
        Ok(out)
    } else {
        Err(fixed.join("; "))
    }
}

/// `asked`'s fields whose value differs from `current`'s.
fn differing<T: PartialEq + Copy>(asked: Option<T>, current: Option<T>) -> Option<T> {
    asked.filter(|a| current != Some(*a))
}

fn rings_changes(asked: &Rings, now: &Rings) -> Rings {
    Rings {
        rx: differing(asked.rx, now.rx),
        tx: differing(asked.tx, now.tx),
        rx_mini: differing(asked.rx_mini, now.rx_mini),
        rx_jumbo: differing(asked.rx_jumbo, now.rx_jumbo),
    }
}

fn channels_changes(asked: &Channels, now: &Channels) -> Channels {
    Channels {
        rx: differing(asked.rx, now.rx),
        tx: differing(asked.tx, now.tx),
        other: differing(asked.other, now.other),
        combined: differing(asked.combined, now.combined),
    }
}

fn coalesce_changes(asked: &Coalesce, now: &Coalesce) -> Coalesce {
    Coalesce {
        rx_usecs: differing(asked.rx_usecs, now.rx_usecs),
        tx_usecs: differing(asked.tx_usecs, now.tx_usecs),
        rx_frames: differing(asked.rx_frames, now.rx_frames),
        tx_frames: differing(asked.tx_frames, now.tx_frames),
        adaptive_rx: differing(asked.adaptive_rx, now.adaptive_rx),
        adaptive_tx: differing(asked.adaptive_tx, now.adaptive_tx),
    }
}

/// What must be sent for `asked` on a device in `state`: kernel feature names only, and only
/// values that differ.
pub fn changes(
    ns: &Ns,
    name: &str,
    asked: &EthtoolSettings,
    state: &EthtoolState,
) -> Result<EthtoolSettings> {
    let mut out = EthtoolSettings::default();
    if !asked.features.is_empty() {
        let features = state.features.clone().unwrap_or_default();
        out.features = feature_changes(&asked.features, &features).map_err(|reason| {
            Error::kernel(ns, format!("setting ethtool features of {name}"), reason)
        })?;
    }
    let now_rings = state.rings.unwrap_or_default();
    out.rings = asked
        .rings
        .map(|r| rings_changes(&r, &now_rings))
        .filter(|r| *r != Rings::default());
    let now_channels = state.channels.unwrap_or_default();
    out.channels = asked
        .channels
        .map(|c| channels_changes(&c, &now_channels))
        .filter(|c| *c != Channels::default());
    let now_coalesce = state.coalesce.unwrap_or_default();
    out.coalesce = asked
        .coalesce
        .map(|c| coalesce_changes(&c, &now_coalesce))
        .filter(|c| *c != Coalesce::default());
    Ok(out)
}

/// The previous values of exactly what `changes` will change: recorded before the change and
/// sent back on detach.
pub fn previous(changes: &EthtoolSettings, state: &EthtoolState) -> EthtoolSettings {
    let features = state.features.clone().unwrap_or_default();
    let was = |now: Option<u32>, asked: Option<u32>| asked.and(now);
    let was_flag = |now: Option<bool>, asked: Option<bool>| asked.and(now);
    EthtoolSettings {
        features: changes
            .features
            .keys()
            .map(|k| (k.clone(), features.active.contains(k)))
            .collect(),
        rings: changes.rings.map(|r| {
            let now = state.rings.unwrap_or_default();
            Rings {
                rx: was(now.rx, r.rx),
                tx: was(now.tx, r.tx),
                rx_mini: was(now.rx_mini, r.rx_mini),
                rx_jumbo: was(now.rx_jumbo, r.rx_jumbo),
            }
        }),
        channels: changes.channels.map(|c| {
            let now = state.channels.unwrap_or_default();
            Channels {
                rx: was(now.rx, c.rx),
                tx: was(now.tx, c.tx),
                other: was(now.other, c.other),
                combined: was(now.combined, c.combined),
            }
        }),
        coalesce: changes.coalesce.map(|c| {
            let now = state.coalesce.unwrap_or_default();
            Coalesce {
                rx_usecs: was(now.rx_usecs, c.rx_usecs),
                tx_usecs: was(now.tx_usecs, c.tx_usecs),
                rx_frames: was(now.rx_frames, c.rx_frames),
                tx_frames: was(now.tx_frames, c.tx_frames),
                adaptive_rx: was_flag(now.adaptive_rx, c.adaptive_rx),
                adaptive_tx: was_flag(now.adaptive_tx, c.adaptive_tx),
            }
        }),
    }
}

/// Reads `name`'s state and returns the previous values of what `asked` would change (the
/// caller checkpoints them before [`apply`]). Refuses, before anything changes, a fixed
/// feature and a device that cannot report a group asked for.
pub async fn record<S: Session>(
    session: &mut S,
    ns: &Ns,
    name: &str,
    asked: &EthtoolSettings,
) -> Result<EthtoolSettings> {
    let state = session.ethtool_state(name, asked).await?;
    let changes = changes(ns, name, asked, &state)?;
    Ok(previous(&changes, &state))
}

/// Sets `asked` on `name` (only what differs), then checks the features came out as asked: a
/// feature the kernel accepted but keeps otherwise (it depends on another) is an error naming
/// it.
pub async fn apply<S: Session>(
    session: &mut S,
    ns: &Ns,
    name: &str,
    asked: &EthtoolSettings,
) -> Result<()> {
    let state = session.ethtool_state(name, asked).await?;
    let changes = changes(ns, name, asked, &state)?;
    if changes.is_empty() {
        return Ok(());
    }
    session.set_ethtool(name, &changes).await?;
    // What was changed, for the operator (the checkpoint holds the plan and the previous values).
    tracing::info!(ifname = name, namespace = %ns, changed = %describe(&changes), "ethtool settings applied");
    if changes.features.is_empty() {
        return Ok(());
    }
    let only_features = EthtoolSettings {
        features: changes.features.clone(),
        ..EthtoolSettings::default()
    };
    let after = session.ethtool_state(name, &only_features).await?;
    let active = after.features.unwrap_or_default().active;
    let kept: Vec<String> = changes
        .features
        .iter()
        .filter(|(k, on)| active.contains(k.as_str()) != **on)
        .map(|(k, on)| format!("{k} stays {} (asked {})", onoff(!*on), onoff(*on)))
        .collect();
    if kept.is_empty() {
        Ok(())
    } else {
        Err(Error::kernel(
            ns,
            format!("setting ethtool features of {name}"),
            format!(
                "the kernel took the request but {}: it depends on another feature or on the \
                 device's state",
                kept.join(", ")
            ),
        ))
    }
}

/// A readable summary of settings, for error contexts and logs (`rings rx 512 tx 512`).
pub fn describe(s: &EthtoolSettings) -> String {
    let mut parts = Vec::new();
    if !s.features.is_empty() {
        parts.push(format!(
            "features {}",
            s.features
                .iter()
                .map(|(k, v)| format!("{k} {}", onoff(*v)))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    if let Some(r) = &s.rings {
        parts.push(format!("rings{}", rings_text(r)));
    }
    if let Some(c) = &s.channels {
        parts.push(format!("channels{}", channels_text(c)));
    }
    if let Some(c) = &s.coalesce {
        parts.push(format!("coalesce{}", coalesce_text(c)));
    }
    parts.join(", ")
}

fn fields_text(fields: &[(&str, Option<String>)]) -> String {
    fields
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!(" {k} {v}")))
        .collect()
}

/// ` rx 512 tx 512`.
pub fn rings_text(r: &Rings) -> String {
    fields_text(&[
        ("rx", r.rx.map(|v| v.to_string())),
        ("rx-mini", r.rx_mini.map(|v| v.to_string())),
        ("rx-jumbo", r.rx_jumbo.map(|v| v.to_string())),
        ("tx", r.tx.map(|v| v.to_string())),
    ])
}

/// ` rx 1 tx 1 combined 2`.
pub fn channels_text(c: &Channels) -> String {
    fields_text(&[
        ("rx", c.rx.map(|v| v.to_string())),
        ("tx", c.tx.map(|v| v.to_string())),
        ("other", c.other.map(|v| v.to_string())),
        ("combined", c.combined.map(|v| v.to_string())),
    ])
}

/// ` rx-usecs 8 adaptive-rx on`.
pub fn coalesce_text(c: &Coalesce) -> String {
    fields_text(&[
        ("adaptive-rx", c.adaptive_rx.map(|v| onoff(v).to_owned())),
        ("adaptive-tx", c.adaptive_tx.map(|v| onoff(v).to_owned())),
        ("rx-usecs", c.rx_usecs.map(|v| v.to_string())),
        ("rx-frames", c.rx_frames.map(|v| v.to_string())),
        ("tx-usecs", c.tx_usecs.map(|v| v.to_string())),
        ("tx-frames", c.tx_frames.map(|v| v.to_string())),
    ])
}
