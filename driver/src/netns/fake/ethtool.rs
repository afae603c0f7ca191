//! The fake kernel's ethtool: per device (by ifindex, which a move keeps here) its features
//! (changeable and active), ring sizes and channel counts with maxima, and coalescing, refusing
//! what the real kernel refuses (sizes above the maximum, parts the driver lacks, fixed
//! features ignored as the kernel ignores them).

use std::collections::{BTreeMap, BTreeSet};

use knic_proto::netconfig::{Channels, Coalesce, EthtoolSettings, Rings};

use super::super::ethtool::{
    DeviceFeatures, EthtoolState, channels_text, coalesce_text, describe, rings_text,
};
use super::{FakeKernel, FakeSession, Ns, find};
use crate::error::{Error, Result};

/// A device's ethtool model. A part that is `None` is one its driver does not support.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeEthtool {
    /// Features ethtool may change.
    pub changeable: BTreeSet<String>,
    /// Features on.
    pub active: BTreeSet<String>,
    /// Feature → the feature it needs on to be active (as rx-gro-hw needs rx-checksum).
    pub needs: BTreeMap<String, String>,
    /// (current, maxima).
    pub rings: Option<(Rings, Rings)>,
    /// (current, maxima).
    pub channels: Option<(Channels, Channels)>,
    /// Current coalescing (the parameters the driver supports are the `Some` ones).
    pub coalesce: Option<Coalesce>,
}

impl FakeEthtool {
    /// A veth as Linux 6.18 shows it: GRO off and changeable, TSO/GSO/checksums on and
    /// changeable, LRO and rx-vlan-filter fixed off; channels rx/tx 1 of 2; no rings or
    /// coalescing.
    pub fn veth() -> Self {
        let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        FakeEthtool {
            changeable: set(&[
                "rx-gro",
                "tx-generic-segmentation",
                "tx-tcp-segmentation",
                "tx-tcp6-segmentation",
                "tx-checksum-ip-generic",
                "rx-checksum",
                "tx-scatter-gather",
            ]),
            active: set(&[
                "tx-generic-segmentation",
                "tx-tcp-segmentation",
                "tx-tcp6-segmentation",
                "tx-checksum-ip-generic",
                "rx-checksum",
                "tx-scatter-gather",
                "highdma",
            ]),
            needs: BTreeMap::new(),
            rings: None,
            channels: Some((
                Channels {
                    rx: Some(1),
                    tx: Some(1),
                    ..Channels::default()
                },
                Channels {
                    rx: Some(2),
                    tx: Some(2),
                    ..Channels::default()
                },
            )),
            coalesce: None,
        }
    }

    /// A NIC like igb: rings 256 of 4096, combined channels 2 of 8, coalescing rx/tx usecs.
    pub fn nic() -> Self {
        FakeEthtool {
            rings: Some((
                Rings {
                    rx: Some(256),
                    tx: Some(256),
                    ..Rings::default()
                },
                Rings {
                    rx: Some(4096),
                    tx: Some(4096),
                    ..Rings::default()
                },
            )),
            channels: Some((
                Channels {
                    combined: Some(2),
                    other: Some(1),
                    ..Channels::default()
                },
                Channels {
                    combined: Some(8),
                    other: Some(1),
                    ..Channels::default()
                },
            )),
            coalesce: Some(Coalesce {
                rx_usecs: Some(3),
                tx_usecs: Some(3),
                ..Coalesce::default()
            }),
            ..FakeEthtool::veth()
        }
    }
}

impl FakeKernel {
    /// Gives the link `name` in `ns` an ethtool model.
    pub fn set_ethtool(&self, ns: &Ns, name: &str, model: FakeEthtool) {
        let mut s = self.lock();
        if let Some(index) = find(&mut s, ns, name).map(|l| l.index) {
            s.ethtool.insert(index, model);
        }
    }

    /// The ethtool model of the link `name` in `ns`.
    pub fn ethtool(&self, ns: &Ns, name: &str) -> Option<FakeEthtool> {
        let mut s = self.lock();
        let index = find(&mut s, ns, name).map(|l| l.index)?;
        s.ethtool.get(&index).cloned()
    }
}

/// The model of the link with `index`: its own, else a veth's for a virtual link (a child
/// knic creates starts as its kind does), else a device with fixed features only and no other
/// part.
fn model(s: &super::State, index: u32, virtual_link: bool) -> FakeEthtool {
    match s.ethtool.get(&index) {
        Some(m) => m.clone(),
        None if virtual_link => FakeEthtool::veth(),
        None => FakeEthtool::default(),
    }
}

fn unsupported(ns: &Ns, what: String, part: &str) -> Error {
    Error::kernel(
        ns,
        what,
        format!(
            "the device's driver does not support ethtool {part} (Operation not supported (os \
             error 95))"
        ),
    )
}

impl FakeSession {
    pub(super) fn ethtool_state_now(
        &mut self,
        name: &str,
        asked: &EthtoolSettings,
    ) -> Result<EthtoolState> {
        self.lookup(name);
        let ns = self.ns.clone();
        let mut s = self.record(format!("ethtool --show {name}"))?;
        let Some((index, virtual_link)) =
            find(&mut s, &ns, name).map(|l| (l.index, l.kind.is_some()))
        else {
            drop(s);
            return Err(self.missing(name));
        };
        let model = model(&s, index, virtual_link);
        drop(s);
        let mut state = EthtoolState::default();
        if !asked.features.is_empty() {
            self.sent(1);
            state.features = Some(DeviceFeatures {
                changeable: model.changeable.clone(),
                active: model.active.clone(),
            });
        }
        let what = |part: &str| format!("reading ethtool {part} of {name}");
        if asked.rings.is_some() {
            self.sent(1);
            let (now, _) = model
                .rings
                .ok_or_else(|| unsupported(&ns, what("rings"), "rings"))?;
            state.rings = Some(now);
        }
        if asked.channels.is_some() {
            self.sent(1);
            let (now, _) = model
                .channels
                .ok_or_else(|| unsupported(&ns, what("channels"), "channels"))?;
            state.channels = Some(now);
        }
        if asked.coalesce.is_some() {
            self.sent(1);
            state.coalesce = Some(
                model
                    .coalesce
                    .ok_or_else(|| unsupported(&ns, what("coalesce"), "coalesce"))?,
            );
        }
        Ok(state)
    }

    pub(super) fn set_ethtool_now(&mut self, name: &str, settings: &EthtoolSettings) -> Result<()> {
        self.lookup(name);
        let ns = self.ns.clone();
        let mut s = self.record(format!("ethtool --set {name} {}", describe(settings)))?;
        let Some((index, virtual_link)) =
            find(&mut s, &ns, name).map(|l| (l.index, l.kind.is_some()))
        else {
            drop(s);
            return Err(self.missing(name));
        };
        let mut model = model(&s, index, virtual_link);
        let context =
            |part: &str, values: String| format!("setting ethtool {part} of {name} ({values})");
        let above = |max: Option<u32>, v: Option<u32>| v.is_some_and(|v| v > max.unwrap_or(0));
        let mut requests = 0;
        // Part by part, as the real kernel takes one request per part: what came before a
        // refused part stays set.
        let mut parts = || -> Result<()> {
            if !settings.features.is_empty() {
                requests += 1;
                // Fixed ones are ignored, as the kernel ignores them (and says so in its reply).
                for (f, on) in &settings.features {
                    if !model.changeable.contains(f) {
                        continue;
                    }
                    let needed = model.needs.get(f).is_none_or(|n| model.active.contains(n));
                    if *on && needed {
                        model.active.insert(f.clone());
                    } else if !*on {
                        model.active.remove(f);
                    }
                }
            }
            if let Some(r) = settings.rings {
                requests += 1;
                let values = rings_text(&r).trim().to_owned();
                let Some((now, max)) = model.rings.as_mut() else {
                    return Err(unsupported(&ns, context("rings", values), "changing rings"));
                };
                if above(max.rx, r.rx)
                    || above(max.tx, r.tx)
                    || above(max.rx_mini, r.rx_mini)
                    || above(max.rx_jumbo, r.rx_jumbo)
                {
                    return Err(Error::kernel(
                        &ns,
                        context("rings", values),
                        format!(
                            "Invalid argument (os error 22): requested ring size exceeds maximum; \
                         the device's maxima:{}",
                            rings_text(max)
                        ),
                    ));
                }
                now.rx = r.rx.or(now.rx);
                now.tx = r.tx.or(now.tx);
                now.rx_mini = r.rx_mini.or(now.rx_mini);
                now.rx_jumbo = r.rx_jumbo.or(now.rx_jumbo);
            }
            if let Some(c) = settings.channels {
                requests += 1;
                let values = channels_text(&c).trim().to_owned();
                let Some((now, max)) = model.channels.as_mut() else {
                    return Err(unsupported(
                        &ns,
                        context("channels", values),
                        "changing channels",
                    ));
                };
                if above(max.rx, c.rx)
                    || above(max.tx, c.tx)
                    || above(max.other, c.other)
                    || above(max.combined, c.combined)
                {
                    return Err(Error::kernel(
                        &ns,
                        context("channels", values),
                        format!(
                            "Invalid argument (os error 22): requested channel count exceeds \
                         maximum; the device's maxima:{}",
                            channels_text(max)
                        ),
                    ));
                }
                now.rx = c.rx.or(now.rx);
                now.tx = c.tx.or(now.tx);
                now.other = c.other.or(now.other);
                now.combined = c.combined.or(now.combined);
            }
            if let Some(c) = settings.coalesce {
                requests += 1;
                let values = coalesce_text(&c).trim().to_owned();
                let Some(now) = model.coalesce.as_mut() else {
                    return Err(unsupported(
                        &ns,
                        context("coalesce", values),
                        "changing coalesce",
                    ));
                };
                now.rx_usecs = c.rx_usecs.or(now.rx_usecs);
                now.tx_usecs = c.tx_usecs.or(now.tx_usecs);
                now.rx_frames = c.rx_frames.or(now.rx_frames);
                now.tx_frames = c.tx_frames.or(now.tx_frames);
                now.adaptive_rx = c.adaptive_rx.or(now.adaptive_rx);
                now.adaptive_tx = c.adaptive_tx.or(now.adaptive_tx);
            }
            Ok(())
        };
        let result = parts();
        s.requests += requests;
        s.ethtool.insert(index, model);
        result
    }
}
