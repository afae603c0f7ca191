//! `ethtool`: offload features, ring sizes, channels and interrupt coalescing of the pod's
//! interface, as `ethtool -K/-G/-L/-C` set them (the driver speaks ethtool netlink).
//!
//! Features are named as the kernel names them (`rx-gro`, `tx-tcp-segmentation`, the names
//! `ethtool -k` lists), or by one of ethtool's legacy aliases (`gro`, `tso`, `tx`…). An alias
//! of one kernel feature is that feature; an alias of a group (`tx`, `sg`, `tso`) stays a group
//! here, because which members a device can change is the device's: the driver sets every
//! member the device can change, as `ethtool -K` does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::FieldError;

/// Ring entries: above every NIC's maximum (virtio's queues stop at 32768); the device's own
/// maximum is checked by the kernel when the driver applies it.
pub const MAX_RING: u32 = 65536;
/// Channels (queues) of one kind: above what any NIC offers.
pub const MAX_CHANNELS: u32 = 4096;
/// Coalescing delays (µs) and frame counts: one second / a million frames, beyond any driver.
pub const MAX_COALESCE: u32 = 1_000_000;

/// The wire form of `ethtool`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EthtoolConfig {
    /// Feature name (kernel name or alias) → on/off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<BTreeMap<String, bool>>,
    /// Ring sizes (`ethtool -G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<Rings>,
    /// Channel counts (`ethtool -L`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Channels>,
    /// Interrupt coalescing (`ethtool -C`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce: Option<Coalesce>,
}

/// Ring sizes in entries; unset ones are left as the device has them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rings {
    /// `ETHTOOL_A_RINGS_RX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx: Option<u32>,
    /// `ETHTOOL_A_RINGS_TX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx: Option<u32>,
    /// `ETHTOOL_A_RINGS_RX_MINI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_mini: Option<u32>,
    /// `ETHTOOL_A_RINGS_RX_JUMBO`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_jumbo: Option<u32>,
}

/// Channel (queue) counts; unset ones are left as the device has them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Channels {
    /// RX-only channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx: Option<u32>,
    /// TX-only channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx: Option<u32>,
    /// Other channels (link interrupts, SR-IOV mailbox…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<u32>,
    /// Combined RX/TX channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combined: Option<u32>,
}

/// Interrupt coalescing; unset ones are left as the device has them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Coalesce {
    /// `rx-usecs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_usecs: Option<u32>,
    /// `tx-usecs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_usecs: Option<u32>,
    /// `rx-frames`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_frames: Option<u32>,
    /// `tx-frames`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_frames: Option<u32>,
    /// `adaptive-rx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_rx: Option<bool>,
    /// `adaptive-tx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_tx: Option<bool>,
}

/// Checked `ethtool` settings, also the form the driver records previous values in (only what
/// it changes). Feature keys are kernel names, or a group alias's long name
/// ([`GROUPS`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EthtoolSettings {
    /// Kernel feature name (or group) → on/off.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, bool>,
    /// Ring sizes to set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<Rings>,
    /// Channel counts to set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Channels>,
    /// Coalescing to set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce: Option<Coalesce>,
}

impl EthtoolSettings {
    /// Nothing to set.
    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
            && self.rings.is_none()
            && self.channels.is_none()
            && self.coalesce.is_none()
    }
}

/// Every feature name of Linux 6.18's `netdev_features_strings` (what `ethtool -k` reads from
/// the kernel): a name outside it is a typo here, not a feature of a newer kernel's device.
pub const KERNEL_FEATURES: &[&str] = &[
    "tx-scatter-gather",
    "tx-checksum-ipv4",
    "tx-checksum-ip-generic",
    "tx-checksum-ipv6",
    "highdma",
    "tx-scatter-gather-fraglist",
    "tx-vlan-hw-insert",
    "rx-vlan-hw-parse",
    "rx-vlan-filter",
    "vlan-challenged",
    "tx-generic-segmentation",
    "tx-lockless",
    "netns-local",
    "rx-gro",
    "rx-lro",
    "tx-tcp-segmentation",
    "tx-gso-robust",
    "tx-tcp-ecn-segmentation",
    "tx-tcp-mangleid-segmentation",
    "tx-tcp6-segmentation",
    "tx-tcp-accecn-segmentation",
    "tx-fcoe-segmentation",
    "tx-gre-segmentation",
    "tx-gre-csum-segmentation",
    "tx-ipxip4-segmentation",
    "tx-ipxip6-segmentation",
    "tx-udp_tnl-segmentation",
    "tx-udp_tnl-csum-segmentation",
    "tx-gso-partial",
    "tx-tunnel-remcsum-segmentation",
    "tx-sctp-segmentation",
    "tx-esp-segmentation",
    "tx-udp-segmentation",
    "tx-gso-list",
    "tx-checksum-fcoe-crc",
    "tx-checksum-sctp",
    "fcoe-mtu",
    "rx-ntuple-filter",
    "rx-hashing",
    "rx-checksum",
    "tx-nocache-copy",
    "loopback",
    "rx-fcs",
    "rx-all",
    "tx-vlan-stag-hw-insert",
    "rx-vlan-stag-hw-parse",
    "rx-vlan-stag-filter",
    "l2-fwd-offload",
    "hw-tc-offload",
    "esp-hw-offload",
    "esp-tx-csum-hw-offload",
    "rx-udp_tunnel-port-offload",
    "tls-hw-tx-offload",
    "tls-hw-rx-offload",
    "rx-gro-hw",
    "tls-hw-record",
    "rx-gro-list",
    "macsec-hw-offload",
    "rx-udp-gro-forwarding",
    "hsr-tag-ins-offload",
    "hsr-tag-rm-offload",
    "hsr-fwd-offload",
    "hsr-dup-offload",
];

/// ethtool's aliases of one kernel feature (short and long legacy names, `ethtool(8)` `-K`).
pub const ALIASES: &[(&str, &str, &str)] = &[
    ("rx", "rx-checksumming", "rx-checksum"),
    (
        "gso",
        "generic-segmentation-offload",
        "tx-generic-segmentation",
    ),
    ("gro", "generic-receive-offload", "rx-gro"),
    ("lro", "large-receive-offload", "rx-lro"),
    ("rxvlan", "rx-vlan-offload", "rx-vlan-hw-parse"),
    ("txvlan", "tx-vlan-offload", "tx-vlan-hw-insert"),
    ("ntuple", "ntuple-filters", "rx-ntuple-filter"),
    ("rxhash", "receive-hashing", "rx-hashing"),
];

/// ethtool's aliases of a group of kernel features (short name, long name = the key kept in
/// [`EthtoolSettings::features`], members): ethtool's patterns `tx-checksum-*`,
/// `tx-scatter-gather*` and `tx-tcp*-segmentation` over [`KERNEL_FEATURES`].
pub const GROUPS: &[(&str, &str, &[&str])] = &[
    (
        "tx",
        "tx-checksumming",
        &[
            "tx-checksum-ipv4",
            "tx-checksum-ip-generic",
            "tx-checksum-ipv6",
            "tx-checksum-fcoe-crc",
            "tx-checksum-sctp",
        ],
    ),
    (
        "sg",
        "scatter-gather",
        &["tx-scatter-gather", "tx-scatter-gather-fraglist"],
    ),
    (
        "tso",
        "tcp-segmentation-offload",
        &[
            "tx-tcp-segmentation",
            "tx-tcp-ecn-segmentation",
            "tx-tcp-mangleid-segmentation",
            "tx-tcp6-segmentation",
            "tx-tcp-accecn-segmentation",
        ],
    ),
];

/// The members of a group key (its long name), if it is one.
pub fn group_members(key: &str) -> Option<&'static [&'static str]> {
    GROUPS
        .iter()
        .find(|(_, long, _)| *long == key)
        .map(|(_, _, members)| *members)
}

/// What a configured name means: a kernel feature's name or a group's long name.
fn canonical(name: &str) -> Option<&'static str> {
    if let Some(known) = KERNEL_FEATURES.iter().find(|k| **k == name) {
        return Some(known);
    }
    if let Some((_, _, kernel)) = ALIASES.iter().find(|(s, l, _)| *s == name || *l == name) {
        return Some(kernel);
    }
    GROUPS
        .iter()
        .find(|(s, l, _)| *s == name || *l == name)
        .map(|(_, long, _)| *long)
}

impl EthtoolConfig {
    /// Later layers win: features key by key, every other field field by field.
    pub(super) fn merge_from(&mut self, layer: &EthtoolConfig) {
        if let Some(features) = &layer.features {
            let target = self.features.get_or_insert_with(BTreeMap::new);
            for (k, v) in features {
                target.insert(k.clone(), *v);
            }
        }
        fn fields<T: Copy>(target: &mut Option<T>, layer: Option<T>, merge: fn(&mut T, &T)) {
            if let Some(layer) = layer {
                match target {
                    Some(t) => merge(t, &layer),
                    None => *target = Some(layer),
                }
            }
        }
        fields(&mut self.rings, layer.rings, |t, l| {
            t.rx = l.rx.or(t.rx);
            t.tx = l.tx.or(t.tx);
            t.rx_mini = l.rx_mini.or(t.rx_mini);
            t.rx_jumbo = l.rx_jumbo.or(t.rx_jumbo);
        });
        fields(&mut self.channels, layer.channels, |t, l| {
            t.rx = l.rx.or(t.rx);
            t.tx = l.tx.or(t.tx);
            t.other = l.other.or(t.other);
            t.combined = l.combined.or(t.combined);
        });
        fields(&mut self.coalesce, layer.coalesce, |t, l| {
            t.rx_usecs = l.rx_usecs.or(t.rx_usecs);
            t.tx_usecs = l.tx_usecs.or(t.tx_usecs);
            t.rx_frames = l.rx_frames.or(t.rx_frames);
            t.tx_frames = l.tx_frames.or(t.tx_frames);
            t.adaptive_rx = l.adaptive_rx.or(t.adaptive_rx);
            t.adaptive_tx = l.adaptive_tx.or(t.adaptive_tx);
        });
    }
}

const ETHTOOL_FIELDS: &[&str] = &["features", "rings", "channels", "coalesce"];
const RINGS_FIELDS: &[&str] = &["rx", "tx", "rxMini", "rxJumbo"];
const CHANNELS_FIELDS: &[&str] = &["rx", "tx", "other", "combined"];
const COALESCE_FIELDS: &[&str] = &[
    "rxUsecs",
    "txUsecs",
    "rxFrames",
    "txFrames",
    "adaptiveRx",
    "adaptiveTx",
];

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// The parser's part for `ethtool` (same paths and texts as [`super::parse`]'s).
struct Shape<'e> {
    errors: &'e mut Vec<FieldError>,
}

impl Shape<'_> {
    fn object<'a>(
        &mut self,
        value: &'a Value,
        path: &str,
        known: &[&str],
    ) -> Option<&'a Map<String, Value>> {
        let Value::Object(map) = value else {
            self.errors.push(FieldError::new(
                path,
                format!("expected an object, got {}", describe(value)),
            ));
            return None;
        };
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.errors
                    .push(FieldError::new(format!("{path}.{key}"), "unknown field"));
            }
        }
        Some(map)
    }

    fn u32(&mut self, map: &Map<String, Value>, path: &str, name: &str) -> Option<u32> {
        let value = map.get(name).filter(|v| !v.is_null())?;
        let path = format!("{path}.{name}");
        match value {
            Value::Number(n) if !n.is_f64() => match n.as_u64().map(u32::try_from) {
                Some(Ok(v)) => Some(v),
                _ => {
                    self.errors.push(FieldError::new(
                        path,
                        format!("must be between 0 and {}, got {n}", u32::MAX),
                    ));
                    None
                }
            },
            other => {
                self.errors.push(FieldError::new(
                    path,
                    format!("expected an integer, got {}", describe(other)),
                ));
                None
            }
        }
    }

    fn boolean(&mut self, value: &Value, path: String) -> Option<bool> {
        match value {
            Value::Bool(b) => Some(*b),
            other => {
                self.errors.push(FieldError::new(
                    path,
                    format!(
                        "expected a boolean (true or false), got {}",
                        describe(other)
                    ),
                ));
                None
            }
        }
    }

    fn flag(&mut self, map: &Map<String, Value>, path: &str, name: &str) -> Option<bool> {
        let value = map.get(name).filter(|v| !v.is_null())?;
        self.boolean(value, format!("{path}.{name}"))
    }
}

/// Parses `ethtool` at `path`, pushing structural problems onto `errors`.
pub(super) fn parse_ethtool(
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<EthtoolConfig> {
    let mut p = Shape { errors };
    let map = p.object(value, path, ETHTOOL_FIELDS)?;
    let mut out = EthtoolConfig::default();
    if let Some(v) = map.get("features").filter(|v| !v.is_null()) {
        let path = format!("{path}.features");
        if let Value::Object(features) = v {
            let mut parsed = BTreeMap::new();
            for (name, on) in features {
                if let Some(on) = p.boolean(on, format!("{path}[{name:?}]")) {
                    parsed.insert(name.clone(), on);
                }
            }
            out.features = Some(parsed);
        } else {
            p.errors.push(FieldError::new(
                path,
                format!(
                    "expected a map of feature names to true/false, got {}",
                    describe(v)
                ),
            ));
        }
    }
    if let Some(v) = map.get("rings").filter(|v| !v.is_null()) {
        let path = format!("{path}.rings");
        if let Some(m) = p.object(v, &path, RINGS_FIELDS) {
            out.rings = Some(Rings {
                rx: p.u32(m, &path, "rx"),
                tx: p.u32(m, &path, "tx"),
                rx_mini: p.u32(m, &path, "rxMini"),
                rx_jumbo: p.u32(m, &path, "rxJumbo"),
            });
        }
    }
    if let Some(v) = map.get("channels").filter(|v| !v.is_null()) {
        let path = format!("{path}.channels");
        if let Some(m) = p.object(v, &path, CHANNELS_FIELDS) {
            out.channels = Some(Channels {
                rx: p.u32(m, &path, "rx"),
                tx: p.u32(m, &path, "tx"),
                other: p.u32(m, &path, "other"),
                combined: p.u32(m, &path, "combined"),
            });
        }
    }
    if let Some(v) = map.get("coalesce").filter(|v| !v.is_null()) {
        let path = format!("{path}.coalesce");
        if let Some(m) = p.object(v, &path, COALESCE_FIELDS) {
            out.coalesce = Some(Coalesce {
                rx_usecs: p.u32(m, &path, "rxUsecs"),
                tx_usecs: p.u32(m, &path, "txUsecs"),
                rx_frames: p.u32(m, &path, "rxFrames"),
                tx_frames: p.u32(m, &path, "txFrames"),
                adaptive_rx: p.flag(m, &path, "adaptiveRx"),
                adaptive_tx: p.flag(m, &path, "adaptiveTx"),
            });
        }
    }
    Some(out)
}

/// Checks `ethtool` (paths `ethtool.<field>`); `None` when nothing is asked for.
pub(super) fn validate_ethtool(
    config: &EthtoolConfig,
    errors: &mut Vec<FieldError>,
) -> Option<EthtoolSettings> {
    let mut out = EthtoolSettings::default();
    // Which configured name claimed each kernel feature (through a group too), so two names
    // for one feature with different values are refused rather than resolved by map order.
    let mut claimed: BTreeMap<&str, (&str, bool)> = BTreeMap::new();
    for (name, on) in config.features.iter().flatten() {
        let path = format!("ethtool.features[{name:?}]");
        let shape_ok = !name.is_empty()
            && name.len() < 32
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !shape_ok {
            errors.push(FieldError::new(
                path,
                "a feature name is 1-31 lowercase letters, digits, '-' or '_', as `ethtool -k` \
                 prints it (e.g. rx-gro, tx-tcp-segmentation)",
            ));
            continue;
        }
        let Some(key) = canonical(name) else {
            errors.push(FieldError::new(
                path,
                "unknown feature; use a kernel name as `ethtool -k` prints it (e.g. rx-gro, \
                 rx-gro-hw, tx-tcp-segmentation, rx-checksum, rx-vlan-filter) or an alias \
                 (rx, tx, sg, tso, gso, gro, lro, rxvlan, txvlan, ntuple, rxhash)",
            ));
            continue;
        };
        let members: Vec<&str> = match group_members(key) {
            Some(members) => members.to_vec(),
            None => vec![key],
        };
        let mut clash = false;
        for member in members {
            match claimed.get(member) {
                Some((other, value)) if *value != *on => {
                    errors.push(FieldError::new(
                        path.clone(),
                        format!(
                            "contradicts {other:?}: both set the kernel feature {member}, one on \
                             and one off"
                        ),
                    ));
                    clash = true;
                    break;
                }
                _ => {
                    claimed.insert(member, (name, *on));
                }
            }
        }
        if !clash {
            out.features.insert(key.to_owned(), *on);
        }
    }
    let range = |errors: &mut Vec<FieldError>, path: &str, v: Option<u32>, lo: u32, hi: u32| {
        if let Some(v) = v
            && !(lo..=hi).contains(&v)
        {
            errors.push(FieldError::new(
                path,
                format!("must be between {lo} and {hi}, got {v}"),
            ));
        }
    };
    if let Some(r) = config.rings.filter(|r| *r != Rings::default()) {
        let before = errors.len();
        for (field, v) in [
            ("rx", r.rx),
            ("tx", r.tx),
            ("rxMini", r.rx_mini),
            ("rxJumbo", r.rx_jumbo),
        ] {
            range(errors, &format!("ethtool.rings.{field}"), v, 1, MAX_RING);
        }
        if errors.len() == before {
            out.rings = Some(r);
        }
    }
    if let Some(c) = config.channels.filter(|c| *c != Channels::default()) {
        let before = errors.len();
        for (field, v) in [
            ("rx", c.rx),
            ("tx", c.tx),
            ("other", c.other),
            ("combined", c.combined),
        ] {
            range(
                errors,
                &format!("ethtool.channels.{field}"),
                v,
                0,
                MAX_CHANNELS,
            );
        }
        let zero = |v: Option<u32>| v == Some(0);
        if [c.rx, c.tx, c.other, c.combined]
            .iter()
            .all(|v| v.is_none_or(|v| v == 0))
        {
            errors.push(FieldError::new(
                "ethtool.channels",
                "every count given is 0; a device needs at least one RX and one TX channel",
            ));
        } else if zero(c.combined) && (zero(c.rx) || zero(c.tx)) {
            let which = if zero(c.rx) { "RX" } else { "TX" };
            errors.push(FieldError::new(
                "ethtool.channels",
                format!(
                    "combined 0 with {} 0 leaves no {which} channel",
                    which.to_lowercase()
                ),
            ));
        }
        if errors.len() == before {
            out.channels = Some(c);
        }
    }
    if let Some(c) = config.coalesce.filter(|c| *c != Coalesce::default()) {
        let before = errors.len();
        for (field, v) in [
            ("rxUsecs", c.rx_usecs),
            ("txUsecs", c.tx_usecs),
            ("rxFrames", c.rx_frames),
            ("txFrames", c.tx_frames),
        ] {
            range(
                errors,
                &format!("ethtool.coalesce.{field}"),
                v,
                0,
                MAX_COALESCE,
            );
        }
        if errors.len() == before {
            out.coalesce = Some(c);
        }
    }
    (!out.is_empty()).then_some(out)
}
