//! The node's share policy: which parent ports many pods share, with how many child slots and
//! how much bandwidth.
//!
//! Sharing is the admin's decision, never a default: a shared parent can no longer be allocated
//! whole, and its children compete for its link. A document is YAML or JSON:
//!
//! ```yaml
//! parents:
//!   - names: ["ens1f*"]          # globs over interface names
//!     pciAddresses: ["0000:3b:00.0"]  # and (if given) the PCI address
//!     children: 32               # child slots: children at once (1 to 4096)
//!     bandwidth: "25G"           # total bit/s; default: the link speed
//!     defaultBandwidth: "100M"   # what a claim that asks for none consumes; default: min
//!     minBandwidth: "10M"        # the smallest share; default 1M
//!     bandwidthStep: "10M"       # shares are min plus a multiple of this; default: any
//! ```
//!
//! Within one selector list any element matches; across the lists given all must match. The
//! first entry that matches a device decides. Rates are quantities in bit/s (see
//! [`super::quantity`]). Every rule names the entry and field it concerns, and a quoted value is
//! cut to [`MAX_ECHOED_BYTES`].

use std::path::Path;

use serde::Deserialize;

use super::quantity::{canonical, parse_bits};
use crate::bounded::quote;
use crate::error::{Error, Result};
use crate::inventory::filter::{Glob, Invalid};
use crate::sriov::is_pci_address;

/// The largest policy file read, as for the SR-IOV policy.
pub const MAX_POLICY_BYTES: u64 = 256 * 1024;
/// How much of a value an error quotes.
pub const MAX_ECHOED_BYTES: usize = 128;
/// The most entries a policy may have: far above a node's port count.
pub const MAX_PARENTS: usize = 256;
/// The most child slots of one parent: the fallback publishes one device per slot, and 4096
/// is already 32 full slices.
pub const MAX_CHILDREN: u32 = 4096;
/// The smallest share when the entry names none: 1 Mbit/s.
pub const DEFAULT_MIN_BANDWIDTH: u64 = 1_000_000;

const SETTING: &str = "--share-policy/KNIC_SHARE_POLICY";

/// One validated entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentEntry {
    /// `parents[<i>]`, for messages.
    pub name: String,
    /// Globs over the interface name.
    pub names: Vec<Glob>,
    /// Exact PCI addresses.
    pub pci_addresses: Vec<String>,
    /// Child slots.
    pub children: u32,
    /// The total bit/s; `None`: the link speed.
    pub bandwidth: Option<u64>,
    /// What a claim without a bandwidth request consumes; `None`: [`ParentEntry::min_bandwidth`].
    pub default_bandwidth: Option<u64>,
    /// The smallest share.
    pub min_bandwidth: u64,
    /// The granularity of shares above the minimum; `None`: any amount.
    pub bandwidth_step: Option<u64>,
}

/// The bandwidth request policy of one parent, checked against its total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandwidthPolicy {
    /// The total bit/s (the capacity's value).
    pub total: u64,
    /// `requestPolicy.default`.
    pub default: u64,
    /// `requestPolicy.validRange.min`.
    pub min: u64,
    /// `requestPolicy.validRange.step`.
    pub step: Option<u64>,
}

impl ParentEntry {
    /// Whether the device with interface name `if_name` and PCI address `pci` is one this entry
    /// means.
    pub fn matches(&self, if_name: &str, pci: Option<&str>) -> bool {
        (self.names.is_empty() || self.names.iter().any(|g| g.matches(if_name)))
            && (self.pci_addresses.is_empty()
                || pci.is_some_and(|p| self.pci_addresses.iter().any(|a| a == p)))
    }

    /// The bandwidth policy for a parent whose total is `total` bit/s, or why the entry's rates
    /// do not fit it: the apiserver refuses a range whose minimum or first step exceeds the
    /// capacity, and a default off the range's steps.
    pub(crate) fn bandwidth_policy(
        &self,
        total: u64,
    ) -> std::result::Result<BandwidthPolicy, Invalid> {
        let at = |field: &str| format!("{}.{field}", self.name);
        let min = self.min_bandwidth;
        let default = self.default_bandwidth.unwrap_or(min);
        let q = canonical;
        if default < min {
            return Err(Invalid(format!(
                "{} {}: less than minBandwidth {}",
                at("defaultBandwidth"),
                q(default),
                q(min)
            )));
        }
        if let Some(step) = self.bandwidth_step
            && !(default - min).is_multiple_of(step)
        {
            return Err(Invalid(format!(
                "{} {}: not minBandwidth {} plus a multiple of bandwidthStep {}",
                at("defaultBandwidth"),
                q(default),
                q(min),
                q(step)
            )));
        }
        if min > total {
            return Err(Invalid(format!(
                "{} {}: more than the bandwidth {}",
                at("minBandwidth"),
                q(min),
                q(total)
            )));
        }
        if default > total {
            return Err(Invalid(format!(
                "{} {}: more than the bandwidth {}",
                at("defaultBandwidth"),
                q(default),
                q(total)
            )));
        }
        if let Some(step) = self.bandwidth_step
            && min.saturating_add(step) > total
        {
            return Err(Invalid(format!(
                "{} {}: minBandwidth plus one step ({}) is more than the bandwidth {}",
                at("bandwidthStep"),
                q(step),
                q(min.saturating_add(step)),
                q(total)
            )));
        }
        Ok(BandwidthPolicy {
            total,
            default,
            min,
            step: self.bandwidth_step,
        })
    }
}

/// A validated policy; the default (no entries) shares nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharePolicy {
    /// Entries in document order.
    pub parents: Vec<ParentEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(default)]
    parents: Vec<RawEntry>,
}

/// A rate as written: YAML and JSON authors write `25G` or a plain number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRate {
    Number(i64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEntry {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    pci_addresses: Vec<String>,
    children: Option<i64>,
    bandwidth: Option<RawRate>,
    default_bandwidth: Option<RawRate>,
    min_bandwidth: Option<RawRate>,
    bandwidth_step: Option<RawRate>,
}

impl SharePolicy {
    /// Parses a policy document (YAML, or JSON when it starts with `{`); an empty document is
    /// the empty policy.
    pub fn parse(text: &str) -> Result<SharePolicy> {
        SharePolicy::parse_named(text, "share policy")
    }

    /// Reads and parses a policy file (a symlink to a regular file is fine: ConfigMap mounts
    /// are symlinks), at most [`MAX_POLICY_BYTES`].
    pub fn from_file(path: &Path) -> Result<SharePolicy> {
        let text = crate::bounded::read_policy_text(path, MAX_POLICY_BYTES, "share policy")?;
        SharePolicy::parse_named(&text, &format!("share policy {}", path.display()))
    }

    fn parse_named(text: &str, what: &str) -> Result<SharePolicy> {
        let doc: Document = match crate::bounded::parse_policy(text, 4 * MAX_ECHOED_BYTES) {
            Ok(Some(doc)) => doc,
            Ok(None) => return Ok(SharePolicy::default()),
            Err(e) => return Err(invalid(what, &e)),
        };
        if doc.parents.len() > MAX_PARENTS {
            return Err(setting(format!(
                "{what}: parents: {} entries, at most {MAX_PARENTS}",
                doc.parents.len()
            )));
        }
        let parents = doc
            .parents
            .into_iter()
            .enumerate()
            .map(|(i, raw)| entry(i, raw))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|Invalid(why)| setting(format!("{what}: {why}")))?;
        Ok(SharePolicy { parents })
    }

    /// Whether the policy shares anything.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// The first entry meaning the device with interface name `if_name` and PCI address `pci`.
    pub fn entry_for(&self, if_name: &str, pci: Option<&str>) -> Option<&ParentEntry> {
        self.parents.iter().find(|e| e.matches(if_name, pci))
    }
}

fn rate(field: &str, raw: Option<RawRate>) -> std::result::Result<Option<u64>, Invalid> {
    let text = match raw {
        None => return Ok(None),
        Some(RawRate::Number(n)) => n.to_string(),
        Some(RawRate::Text(t)) => t,
    };
    parse_bits(&text).map(Some).map_err(|Invalid(why)| {
        Invalid(format!("{field} {}: {why}", quote(&text, MAX_ECHOED_BYTES)))
    })
}

fn entry(i: usize, raw: RawEntry) -> std::result::Result<ParentEntry, Invalid> {
    let name = format!("parents[{i}]");
    let at = |field: &str| format!("{name}.{field}");
    let mut names = Vec::new();
    for (j, pattern) in raw.names.iter().enumerate() {
        if pattern.is_empty() {
            return Err(Invalid(format!(
                "{}[{j}]: empty; a glob over interface names",
                at("names")
            )));
        }
        names.push(Glob::parse(pattern).map_err(|Invalid(why)| {
            Invalid(format!(
                "{}[{j}] {}: {why}",
                at("names"),
                quote(pattern, MAX_ECHOED_BYTES)
            ))
        })?);
    }
    for (j, address) in raw.pci_addresses.iter().enumerate() {
        if !is_pci_address(address) {
            return Err(Invalid(format!(
                "{}[{j}] {}: must be a full PCI address DDDD:BB:DD.F in lower-case hex, e.g. 0000:3b:00.0",
                at("pciAddresses"),
                quote(address, MAX_ECHOED_BYTES)
            )));
        }
    }
    if names.is_empty() && raw.pci_addresses.is_empty() {
        return Err(Invalid(format!(
            "{name}: no selector; give names or pciAddresses (an entry for every interface is refused)"
        )));
    }
    let children = match raw.children {
        None => return Err(Invalid(format!("{}: required", at("children")))),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_CHILDREN).contains(n))
            .ok_or_else(|| {
                Invalid(format!(
                    "{}: {n} is out of range; 1 to {MAX_CHILDREN} (children on the parent at once)",
                    at("children")
                ))
            })?,
    };
    let entry = ParentEntry {
        bandwidth: rate(&at("bandwidth"), raw.bandwidth)?,
        default_bandwidth: rate(&at("defaultBandwidth"), raw.default_bandwidth)?,
        min_bandwidth: rate(&at("minBandwidth"), raw.min_bandwidth)?
            .unwrap_or(DEFAULT_MIN_BANDWIDTH),
        bandwidth_step: rate(&at("bandwidthStep"), raw.bandwidth_step)?,
        name,
        names,
        pci_addresses: raw.pci_addresses,
        children,
    };
    // The rules that do not depend on the link are checked now; with a fixed total, all are.
    entry.bandwidth_policy(entry.bandwidth.unwrap_or(super::quantity::MAX_BITS))?;
    Ok(entry)
}

fn invalid(what: &str, error: &dyn std::fmt::Display) -> Error {
    setting(format!(
        "{what}: {}",
        crate::bounded::cap_text(&error.to_string(), 4 * MAX_ECHOED_BYTES)
    ))
}

fn setting(reason: String) -> Error {
    Error::Setting {
        setting: SETTING,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        SharePolicy::parse(text).unwrap_err().to_string()
    }

    const PREFIX: &str = "invalid setting --share-policy/KNIC_SHARE_POLICY: share policy: ";

    #[test]
    fn share_policy_parses_yaml_and_json_alike() {
        let yaml = "parents:\n  - names: [\"ens1f*\"]\n    children: 32\n    bandwidth: 25G\n    defaultBandwidth: 100M\n    minBandwidth: 10M\n    bandwidthStep: 10M\n  - pciAddresses: [\"0000:3b:00.1\"]\n    children: 4\n";
        let json = r#"{"parents":[{"names":["ens1f*"],"children":32,"bandwidth":"25G","defaultBandwidth":"100M","minBandwidth":10000000,"bandwidthStep":"10M"},{"pciAddresses":["0000:3b:00.1"],"children":4}]}"#;
        let a = SharePolicy::parse(yaml).unwrap();
        assert_eq!(a, SharePolicy::parse(json).unwrap());
        let e = &a.parents[0];
        assert_eq!(
            (e.children, e.bandwidth, e.default_bandwidth),
            (32, Some(25_000_000_000), Some(100_000_000))
        );
        assert_eq!(
            (e.min_bandwidth, e.bandwidth_step),
            (10_000_000, Some(10_000_000))
        );
        let b = &a.parents[1];
        assert_eq!(b.name, "parents[1]");
        assert_eq!((b.bandwidth, b.default_bandwidth), (None, None));
        assert_eq!((b.min_bandwidth, b.bandwidth_step), (1_000_000, None));
        assert!(SharePolicy::parse(" \n").unwrap().is_empty());
    }

    #[test]
    fn share_policy_entry_matches_all_given_selectors_first_entry_wins() {
        let p = SharePolicy::parse(
            "parents: [{names: [\"ens1f*\"], pciAddresses: [\"0000:3b:00.0\"], children: 2}, {names: [\"ens*\"], children: 8}]",
        )
        .unwrap();
        let first = p.entry_for("ens1f0", Some("0000:3b:00.0")).unwrap();
        assert_eq!(first.children, 2);
        assert_eq!(
            p.entry_for("ens1f0", Some("0000:3b:00.1"))
                .unwrap()
                .children,
            8
        );
        assert_eq!(p.entry_for("ens1f0", None).unwrap().children, 8);
        assert!(p.entry_for("eth0", Some("0000:3b:00.0")).is_none());
        assert!(!first.matches("ens1f0", None));
    }

    #[test]
    fn share_policy_bandwidth_policy_against_the_link_speed() {
        let p = SharePolicy::parse(
            "parents: [{names: [a], children: 2, defaultBandwidth: 100M, minBandwidth: 10M, bandwidthStep: 10M}]",
        )
        .unwrap();
        let e = &p.parents[0];
        assert_eq!(
            e.bandwidth_policy(25_000_000_000).unwrap(),
            BandwidthPolicy {
                total: 25_000_000_000,
                default: 100_000_000,
                min: 10_000_000,
                step: Some(10_000_000)
            }
        );
        let why = |total| e.bandwidth_policy(total).unwrap_err().0;
        assert_eq!(
            why(5_000_000),
            "parents[0].minBandwidth 10M: more than the bandwidth 5M"
        );
        assert_eq!(
            why(50_000_000),
            "parents[0].defaultBandwidth 100M: more than the bandwidth 50M"
        );
        let no_default = SharePolicy::parse(
            "parents: [{names: [a], children: 2, minBandwidth: 10M, bandwidthStep: 10M}]",
        )
        .unwrap();
        assert_eq!(
            no_default.parents[0]
                .bandwidth_policy(15_000_000)
                .unwrap_err()
                .0,
            "parents[0].bandwidthStep 10M: minBandwidth plus one step (20M) is more than the bandwidth 15M"
        );
        let defaults = SharePolicy::parse("parents: [{names: [a], children: 2}]").unwrap();
        assert_eq!(
            defaults.parents[0]
                .bandwidth_policy(10_000_000_000)
                .unwrap(),
            BandwidthPolicy {
                total: 10_000_000_000,
                default: 1_000_000,
                min: 1_000_000,
                step: None
            }
        );
    }

    #[test]
    fn share_policy_refuses_each_bad_field_by_name() {
        let cases = [
            (
                "parents: [{children: 2}]",
                "parents[0]: no selector; give names or pciAddresses (an entry for every interface is refused)",
            ),
            ("parents: [{names: [a]}]", "parents[0].children: required"),
            (
                "parents: [{names: [a], children: 0}]",
                "parents[0].children: 0 is out of range; 1 to 4096 (children on the parent at once)",
            ),
            (
                "parents: [{names: [a], children: 4097}]",
                "parents[0].children: 4097 is out of range; 1 to 4096 (children on the parent at once)",
            ),
            (
                "parents: [{names: [\"\"], children: 1}]",
                "parents[0].names[0]: empty; a glob over interface names",
            ),
            (
                "parents: [{pciAddresses: [\"3b:00.0\"], children: 1}]",
                "parents[0].pciAddresses[0] \"3b:00.0\": must be a full PCI address DDDD:BB:DD.F in lower-case hex, e.g. 0000:3b:00.0",
            ),
            (
                "parents: [{names: [a], children: 1, bandwidth: 25Gb}]",
                "parents[0].bandwidth \"25Gb\": \"25Gb\" is not a quantity; expected digits with an optional suffix (k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei), e.g. \"2G\" or \"500Mi\"",
            ),
            (
                "parents: [{names: [a], children: 1, bandwidth: 0}]",
                "parents[0].bandwidth \"0\": must be greater than zero",
            ),
            (
                "parents: [{names: [a], children: 1, minBandwidth: \"0.5\"}]",
                "parents[0].minBandwidth \"0.5\": \"0.5\" is not a whole number; give a value without a fraction of the unit (e.g. \"1500k\" rather than \"1.5000001M\")",
            ),
            (
                "parents: [{names: [a], children: 1, bandwidthStep: -10}]",
                "parents[0].bandwidthStep \"-10\": \"-10\" is negative; it must be positive",
            ),
            (
                "parents: [{names: [a], children: 1, defaultBandwidth: 10E}]",
                "parents[0].defaultBandwidth \"10E\": more than 9223372036854775807 bit/s",
            ),
            (
                "parents: [{names: [a], children: 1, defaultBandwidth: 5M, minBandwidth: 10M}]",
                "parents[0].defaultBandwidth 5M: less than minBandwidth 10M",
            ),
            (
                "parents: [{names: [a], children: 1, defaultBandwidth: 15M, minBandwidth: 10M, bandwidthStep: 10M}]",
                "parents[0].defaultBandwidth 15M: not minBandwidth 10M plus a multiple of bandwidthStep 10M",
            ),
            (
                "parents: [{names: [a], children: 1, bandwidth: 1G, minBandwidth: 2G}]",
                "parents[0].minBandwidth 2G: more than the bandwidth 1G",
            ),
            (
                "parents: [{names: [a], children: 1, bandwidth: 1G, defaultBandwidth: 2G}]",
                "parents[0].defaultBandwidth 2G: more than the bandwidth 1G",
            ),
            (
                "parents: [{names: [a], children: 1, bandwidth: 1G, minBandwidth: 900M, bandwidthStep: 200M}]",
                "parents[0].bandwidthStep 200M: minBandwidth plus one step (1100M) is more than the bandwidth 1G",
            ),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(
                got.starts_with(&format!("{PREFIX}{want}")),
                "{text}\n got: {got}\nwant: {PREFIX}{want}"
            );
        }
        let unknown = err("parents: [{names: [a], children: 1, child: 2}]");
        assert!(
            unknown.starts_with(PREFIX) && unknown.contains("unknown field `child`"),
            "{unknown}"
        );
        let glob = err("parents: [{names: [\"ens[1\"], children: 1}]");
        assert!(
            glob.starts_with(&format!("{PREFIX}parents[0].names[0] \"ens[1\": ")),
            "{glob}"
        );
        let many = format!(
            "parents: [{}]",
            vec!["{names: [a], children: 1}"; MAX_PARENTS + 1].join(",")
        );
        assert_eq!(
            err(&many),
            format!("{PREFIX}parents: 257 entries, at most 256")
        );
        let long = "x".repeat(100_000);
        let got = err(&format!(
            "parents: [{{names: [a], children: 1, bandwidth: {long}}}]"
        ));
        assert!(got.len() < 400, "{} bytes", got.len());
    }

    /// Every prefix of a full document, and every one-byte change of it to a character the
    /// grammar cares about, parses or fails with the setting's error: never a panic.
    #[test]
    fn share_policy_never_panics_on_cut_or_changed_input() {
        let full = "parents:\n- names: [\"ens1f*\"]\n  pciAddresses: [\"0000:3b:00.0\"]\n  children: 32\n  bandwidth: 25G\n  defaultBandwidth: 100M\n  minBandwidth: 10M\n  bandwidthStep: 10M\n";
        assert_eq!(SharePolicy::parse(full).unwrap().parents.len(), 1);
        let mut refused = 0;
        let mut check = |text: &str| {
            if let Err(e) = SharePolicy::parse(text) {
                refused += 1;
                assert!(e.to_string().starts_with(PREFIX), "{text:?}: {e}");
            }
        };
        for end in 0..=full.len() {
            check(&full[..end]);
        }
        for at in 0..full.len() {
            for c in ['0', '-', ':', '[', '{', '"', ' ', '\n', 'G', 'x'] {
                let mut text = full.to_owned();
                text.replace_range(at..at + 1, &c.to_string());
                check(&text);
            }
        }
        assert!(refused > 100, "{refused}");
    }

    #[test]
    fn share_policy_file_must_be_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("policy.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let got = SharePolicy::from_file(&fifo).unwrap_err().to_string();
        assert!(
            got.starts_with(&format!("reading share policy {}: ", fifo.display()))
                && got.contains("not a regular file"),
            "{got}"
        );
        let file = dir.path().join("ok.yaml");
        std::fs::write(&file, "parents: [{names: [a], children: 1}]").unwrap();
        assert_eq!(SharePolicy::from_file(&file).unwrap().parents.len(), 1);
    }
}
