//! The node's SR-IOV policy: which PFs get how many VFs, bound to which driver.
//!
//! An admin writes it once for a fleet (the chart renders it from values into a ConfigMap), so
//! it selects PFs by what is stable across nodes: the interface name (a glob, since names like
//! `ens1f0np0` differ by slot), the PCI address, or the vendor:device id. A document is YAML or
//! JSON:
//!
//! ```yaml
//! pools:
//!   - name: fabric          # DNS label, for messages and logs
//!     pfNames: ["ens1f*"]   # any of the globs matches the PF's interface name
//!     pciIds: ["8086:1593"] # and (if given) the PF's vendor:device
//!     numVfs: 8
//!     vfDriver: vfio-pci    # or netdev (default): the VF's own kernel driver
//! ```
//!
//! Within one selector list any element matches; across the lists given all must match, so an
//! entry can say "the E810s named ens1f*". An entry without any selector would take every PF of
//! the node and is refused. Every rule names the entry and field it concerns, and a quoted value
//! is cut to [`MAX_ECHOED_BYTES`].

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use super::is_pci_address;
use crate::bounded::quote;
use crate::error::{Error, Result};
use crate::inventory::filter::{Glob, Invalid};

/// The largest policy file read: a fleet's policy is kilobytes; a wrong path (a log) is refused
/// at once instead of parsed.
pub const MAX_POLICY_BYTES: u64 = 256 * 1024;

/// How much of a value an error quotes.
pub const MAX_ECHOED_BYTES: usize = 128;

/// The most entries a policy may have: far above a node's PF count, and it bounds the work of
/// one reconcile.
pub const MAX_POOLS: usize = 256;

/// The kernel's `sriov_numvfs` is a u16; real devices offer at most a few hundred.
pub const MAX_NUM_VFS: u32 = 65_535;

/// What the kernel binds a VF to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum VfDriver {
    /// The VF's own network driver (iavf, mlx5_core, …): a netdev that moves into pods.
    #[default]
    Netdev,
    /// `vfio-pci`: no netdev; the VF is handed to DPDK or a VM through `/dev/vfio`.
    VfioPci,
}

impl VfDriver {
    /// The policy's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VfDriver::Netdev => "netdev",
            VfDriver::VfioPci => "vfio-pci",
        }
    }
}

/// One validated entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolEntry {
    /// The entry's name (or `pools[<i>]` when unnamed), for messages.
    pub name: String,
    /// Globs over the PF's interface name.
    pub pf_names: Vec<Glob>,
    /// Exact PCI addresses (`0000:3b:00.0`).
    pub pci_addresses: Vec<String>,
    /// `(vendor, device)` ids.
    pub pci_ids: Vec<(u16, u16)>,
    /// The VF count the PF should have.
    pub num_vfs: u32,
    /// The driver the VFs are bound to.
    pub vf_driver: VfDriver,
}

/// What an entry is matched against: the facts of one PF.
#[derive(Debug, Clone, Copy)]
pub struct PfSubject<'a> {
    /// The PF's interface names (none when it has no netdev).
    pub names: &'a [String],
    /// Its PCI address.
    pub pci_address: &'a str,
    /// Its vendor and device id.
    pub pci_id: Option<(u16, u16)>,
}

impl PoolEntry {
    /// Whether the PF described by `pf` is one this entry means.
    pub fn matches(&self, pf: &PfSubject<'_>) -> bool {
        (self.pf_names.is_empty()
            || pf
                .names
                .iter()
                .any(|n| self.pf_names.iter().any(|g| g.matches(n))))
            && (self.pci_addresses.is_empty()
                || self.pci_addresses.iter().any(|a| a == pf.pci_address))
            && (self.pci_ids.is_empty() || pf.pci_id.is_some_and(|id| self.pci_ids.contains(&id)))
    }
}

/// A validated policy; the default (no entries) provisions nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SriovPolicy {
    /// Entries in document order.
    pub pools: Vec<PoolEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(default)]
    pools: Vec<RawEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEntry {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    pf_names: Vec<String>,
    #[serde(default)]
    pci_addresses: Vec<String>,
    #[serde(default)]
    pci_ids: Vec<String>,
    num_vfs: Option<i64>,
    #[serde(default)]
    vf_driver: Option<String>,
}

impl SriovPolicy {
    /// Parses a policy document (YAML, or JSON when it starts with `{`); an empty document is
    /// the empty policy.
    pub fn parse(text: &str) -> Result<SriovPolicy> {
        SriovPolicy::parse_named(text, "sriov policy")
    }

    /// Reads and parses a policy file (a symlink to a regular file is fine: ConfigMap mounts
    /// are symlinks), at most [`MAX_POLICY_BYTES`].
    pub fn from_file(path: &Path) -> Result<SriovPolicy> {
        let text = crate::bounded::read_policy_text(path, MAX_POLICY_BYTES, "SR-IOV policy")?;
        SriovPolicy::parse_named(&text, &format!("sriov policy {}", path.display()))
    }

    fn parse_named(text: &str, what: &str) -> Result<SriovPolicy> {
        let doc: Document = match crate::bounded::parse_policy(text, 4 * MAX_ECHOED_BYTES) {
            Ok(Some(doc)) => doc,
            Ok(None) => return Ok(SriovPolicy::default()),
            Err(e) => return Err(invalid(what, &e)),
        };
        if doc.pools.len() > MAX_POOLS {
            return Err(setting(format!(
                "{what}: pools: {} entries, at most {MAX_POOLS}",
                doc.pools.len()
            )));
        }
        let mut names = BTreeSet::new();
        let mut pools = Vec::with_capacity(doc.pools.len());
        for (i, raw) in doc.pools.into_iter().enumerate() {
            let entry = entry(i, raw).map_err(|Invalid(why)| setting(format!("{what}: {why}")))?;
            if !names.insert(entry.name.clone()) {
                return Err(setting(format!(
                    "{what}: pools[{i}].name {:?}: another entry has this name; names must be unique",
                    entry.name
                )));
            }
            pools.push(entry);
        }
        Ok(SriovPolicy { pools })
    }

    /// Whether the policy provisions anything.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }
}

fn entry(i: usize, raw: RawEntry) -> std::result::Result<PoolEntry, Invalid> {
    let at = |field: &str| format!("pools[{i}].{field}");
    let name = match raw.name {
        Some(name) if knic_proto::names::is_dns_label(&name) => name,
        Some(name) => {
            return Err(Invalid(format!(
                "{} {}: must be a DNS label (lower-case letters, digits and '-', at most 63)",
                at("name"),
                quote(&name, MAX_ECHOED_BYTES)
            )));
        }
        None => format!("pools[{i}]"),
    };
    let mut pf_names = Vec::new();
    for (j, pattern) in raw.pf_names.iter().enumerate() {
        if pattern.is_empty() {
            return Err(Invalid(format!(
                "{}[{j}]: empty; a glob over interface names",
                at("pfNames")
            )));
        }
        pf_names.push(Glob::parse(pattern).map_err(|Invalid(why)| {
            Invalid(format!(
                "{}[{j}] {}: {why}",
                at("pfNames"),
                quote(pattern, MAX_ECHOED_BYTES)
            ))
        })?);
    }
    let mut pci_addresses = Vec::new();
    for (j, address) in raw.pci_addresses.iter().enumerate() {
        if !is_pci_address(address) {
            return Err(Invalid(format!(
                "{}[{j}] {}: must be a full PCI address DDDD:BB:DD.F in lower-case hex, e.g. 0000:3b:00.0",
                at("pciAddresses"),
                quote(address, MAX_ECHOED_BYTES)
            )));
        }
        pci_addresses.push(address.clone());
    }
    let mut pci_ids = Vec::new();
    for (j, id) in raw.pci_ids.iter().enumerate() {
        let parsed = id.split_once(':').and_then(|(v, d)| {
            let hex = |s: &str| {
                (s.len() == 4)
                    .then(|| u16::from_str_radix(s, 16).ok())
                    .flatten()
            };
            Some((hex(v)?, hex(d)?))
        });
        let Some(parsed) = parsed else {
            return Err(Invalid(format!(
                "{}[{j}] {}: must be VVVV:DDDD, 4 hex digits each (vendor:device, e.g. 8086:1593)",
                at("pciIds"),
                quote(id, MAX_ECHOED_BYTES)
            )));
        };
        pci_ids.push(parsed);
    }
    if pf_names.is_empty() && pci_addresses.is_empty() && pci_ids.is_empty() {
        return Err(Invalid(format!(
            "pools[{i}]: no selector; give pfNames, pciAddresses or pciIds (an entry for every PF is refused)"
        )));
    }
    let num_vfs = match raw.num_vfs {
        None => return Err(Invalid(format!("{}: required", at("numVfs")))),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_NUM_VFS)
            .ok_or_else(|| {
                Invalid(format!(
                    "{}: {n} is out of range; 0 to {MAX_NUM_VFS} (0 removes the PF's VFs)",
                    at("numVfs")
                ))
            })?,
    };
    let vf_driver = match raw.vf_driver.as_deref() {
        None | Some("netdev") => VfDriver::Netdev,
        Some("vfio-pci") => VfDriver::VfioPci,
        Some(other) => {
            return Err(Invalid(format!(
                "{} {}: must be netdev or vfio-pci",
                at("vfDriver"),
                quote(other, MAX_ECHOED_BYTES)
            )));
        }
    };
    Ok(PoolEntry {
        name,
        pf_names,
        pci_addresses,
        pci_ids,
        num_vfs,
        vf_driver,
    })
}

fn invalid(what: &str, error: &dyn std::fmt::Display) -> Error {
    setting(format!(
        "{what}: {}",
        crate::bounded::cap_text(&error.to_string(), 4 * MAX_ECHOED_BYTES)
    ))
}

fn setting(reason: String) -> Error {
    Error::Setting {
        setting: "--sriov-policy/KNIC_SRIOV_POLICY",
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        SriovPolicy::parse(text).unwrap_err().to_string()
    }

    const PREFIX: &str = "invalid setting --sriov-policy/KNIC_SRIOV_POLICY: sriov policy: ";

    #[test]
    fn sriov_policy_parses_yaml_and_json_alike() {
        let yaml = "pools:\n  - name: fabric\n    pfNames: [\"ens1f*\"]\n    pciIds: [\"8086:1593\"]\n    numVfs: 8\n    vfDriver: vfio-pci\n  - pciAddresses: [\"0000:3b:00.1\"]\n    numVfs: 0\n";
        let json = r#"{"pools":[{"name":"fabric","pfNames":["ens1f*"],"pciIds":["8086:1593"],"numVfs":8,"vfDriver":"vfio-pci"},{"pciAddresses":["0000:3b:00.1"],"numVfs":0}]}"#;
        let a = SriovPolicy::parse(yaml).unwrap();
        assert_eq!(a, SriovPolicy::parse(json).unwrap());
        assert_eq!(a.pools.len(), 2);
        assert_eq!(a.pools[0].name, "fabric");
        assert_eq!(a.pools[0].num_vfs, 8);
        assert_eq!(a.pools[0].vf_driver, VfDriver::VfioPci);
        assert_eq!(a.pools[0].pci_ids, vec![(0x8086, 0x1593)]);
        assert_eq!(a.pools[1].name, "pools[1]");
        assert_eq!(a.pools[1].vf_driver, VfDriver::Netdev);
        assert!(SriovPolicy::parse("  \n").unwrap().is_empty());
    }

    #[test]
    fn sriov_policy_entry_matches_all_given_selectors() {
        let p = SriovPolicy::parse(
            "pools: [{pfNames: [\"ens1f*\", \"eth9\"], pciIds: [\"8086:1593\"], numVfs: 2}]",
        )
        .unwrap();
        let entry = &p.pools[0];
        let names = vec!["ens1f0".to_owned()];
        let pf = |names, id| PfSubject {
            names,
            pci_address: "0000:3b:00.0",
            pci_id: id,
        };
        assert!(entry.matches(&pf(&names, Some((0x8086, 0x1593)))));
        assert!(!entry.matches(&pf(&names, Some((0x15b3, 0x1017)))));
        assert!(!entry.matches(&pf(&names, None)));
        assert!(!entry.matches(&pf(&[], Some((0x8086, 0x1593)))));
        let by_address =
            SriovPolicy::parse("pools: [{pciAddresses: [\"0000:3b:00.0\"], numVfs: 2}]").unwrap();
        assert!(by_address.pools[0].matches(&pf(&[], None)));
    }

    #[test]
    fn sriov_policy_refuses_each_bad_field_by_name() {
        let cases = [
            (
                "pools: [{numVfs: 2}]",
                "pools[0]: no selector; give pfNames, pciAddresses or pciIds (an entry for every PF is refused)",
            ),
            (
                "pools: [{pfNames: [ens1], numVfs: -1}]",
                "pools[0].numVfs: -1 is out of range; 0 to 65535 (0 removes the PF's VFs)",
            ),
            (
                "pools: [{pfNames: [ens1], numVfs: 70000}]",
                "pools[0].numVfs: 70000 is out of range; 0 to 65535 (0 removes the PF's VFs)",
            ),
            ("pools: [{pfNames: [ens1]}]", "pools[0].numVfs: required"),
            (
                "pools: [{pfNames: [ens1], numVfs: 1, vfDriver: igb_uio}]",
                "pools[0].vfDriver \"igb_uio\": must be netdev or vfio-pci",
            ),
            (
                "pools: [{pciAddresses: [\"3b:00.0\"], numVfs: 1}]",
                "pools[0].pciAddresses[0] \"3b:00.0\": must be a full PCI address DDDD:BB:DD.F in lower-case hex, e.g. 0000:3b:00.0",
            ),
            (
                "pools: [{pciIds: [\"8086-1593\"], numVfs: 1}]",
                "pools[0].pciIds[0] \"8086-1593\": must be VVVV:DDDD, 4 hex digits each (vendor:device, e.g. 8086:1593)",
            ),
            (
                "pools: [{pfNames: [\"\"], numVfs: 1}]",
                "pools[0].pfNames[0]: empty; a glob over interface names",
            ),
            (
                "pools: [{name: Fabric, pfNames: [a], numVfs: 1}]",
                "pools[0].name \"Fabric\": ",
            ),
            (
                "pools: [{name: a, pfNames: [a], numVfs: 1}, {name: a, pfNames: [b], numVfs: 1}]",
                "pools[1].name \"a\": another entry has this name; names must be unique",
            ),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(
                got.starts_with(&format!("{PREFIX}{want}")),
                "{text}\n got: {got}\nwant: {PREFIX}{want}"
            );
        }
        let unknown = err("pools: [{pfNames: [a], numVfs: 1, numvfs: 2}]");
        assert!(
            unknown.starts_with(PREFIX) && unknown.contains("unknown field `numvfs`"),
            "{unknown}"
        );
        let glob = err("pools: [{pfNames: [\"ens[1\"], numVfs: 1}]");
        assert!(
            glob.starts_with(&format!("{PREFIX}pools[0].pfNames[0] \"ens[1\": ")),
            "{glob}"
        );
        let many = format!(
            "pools: [{}]",
            vec!["{pfNames: [a], numVfs: 1}"; MAX_POOLS + 1].join(",")
        );
        assert_eq!(
            err(&many),
            format!("{PREFIX}pools: 257 entries, at most 256")
        );
    }

    #[test]
    fn sriov_policy_quotes_a_huge_value_bounded() {
        let long = "x".repeat(100_000);
        let got = err(&format!(
            "pools: [{{pfNames: [a], numVfs: 1, vfDriver: {long}}}]"
        ));
        assert!(got.len() < 400, "{} bytes", got.len());
    }

    #[test]
    fn sriov_policy_file_must_be_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("policy.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let got = SriovPolicy::from_file(&fifo).unwrap_err().to_string();
        assert!(
            got.starts_with(&format!("reading SR-IOV policy {}: ", fifo.display()))
                && got.contains("not a regular file"),
            "{got}"
        );
        let file = dir.path().join("ok.yaml");
        std::fs::write(&file, "pools: [{pfNames: [a], numVfs: 1}]").unwrap();
        assert_eq!(SriovPolicy::from_file(&file).unwrap().pools.len(), 1);
    }
}
