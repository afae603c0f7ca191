//! Materialises the text fixtures of `driver/tests/fixtures/sysfs/` (format: that directory's
//! README) into a real directory tree, so discovery runs against them exactly as against a live
//! `/sys`. Public rather than test-only so other crates' tests and a CLI `--root` demo can use
//! the same captures.
//!
//! `!ERR <ERRNO>` lines cannot be a property of a plain file: the file is created empty and its
//! errno is returned in the fault table for [`Sysfs::with_faults`](super::Sysfs::with_faults).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::sources::FakeEthtool;
use crate::error::{Error, Result};

/// Writes the fixture `text` below `root` and returns its fault table (root-relative path →
/// errno). Paths must be relative and stay inside `root`: a line whose path goes through a
/// symlink an earlier line made (or, for a file, is one) is refused, because writing through it
/// would land wherever the link points, outside `root` for a generated or hostile fixture.
pub fn materialise(text: &str, root: &Path) -> Result<BTreeMap<PathBuf, i32>> {
    let mut faults = BTreeMap::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let n = index + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (path, rest) = match line.split_once(' ') {
            Some((path, rest)) => (path, rest),
            None => (line, ""),
        };
        let rel = checked_path(path, n)?;
        no_links_on_the_way(root, &rel, n)?;
        let target = root.join(&rel);
        if let Some(link) = rest.strip_prefix("-> ") {
            make_parent(&target, n)?;
            symlink(link, &target).map_err(|e| io_err(n, &target, e))?;
        } else if let Some(value) = rest.strip_prefix('=') {
            let value = value.strip_prefix(' ').unwrap_or(value);
            make_parent(&target, n)?;
            let content = if value == "<<EOF" {
                let mut body = String::new();
                loop {
                    let Some((_, next)) = lines.next() else {
                        return Err(bad(n, "heredoc without closing EOF"));
                    };
                    if next == "EOF" {
                        break;
                    }
                    body.push_str(next);
                    body.push('\n');
                }
                body
            } else if let Some(errno) = value.strip_prefix("!ERR ") {
                let errno = errno_number(errno.trim())
                    .ok_or_else(|| bad(n, &format!("unknown errno {errno:?}")))?;
                faults.insert(rel.clone(), errno);
                String::new()
            } else {
                format!("{value}\n")
            };
            fs::write(&target, content).map_err(|e| io_err(n, &target, e))?;
        } else if rest.is_empty() && path.ends_with('/') {
            fs::create_dir_all(&target).map_err(|e| io_err(n, &target, e))?;
        } else {
            return Err(bad(
                n,
                "expected `path/`, `path = value` or `path -> target`",
            ));
        }
    }
    Ok(faults)
}

/// Reads the `ethtool-features.real.txt` capture (`ifname feature changeable=B active=B
/// never_change=B` lines) into a fake ethtool source holding the active bits.
pub fn ethtool_capture(text: &str) -> FakeEthtool {
    let mut fake = FakeEthtool::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(if_name), Some(feature)) = (words.next(), words.next()) else {
            continue;
        };
        if if_name.starts_with('#') {
            continue;
        }
        let entry = fake.active.entry(if_name.to_owned()).or_default();
        if words.any(|w| w == "active=1") {
            entry.insert(feature.to_owned());
        }
    }
    fake
}

/// The errno names fixtures use.
pub fn errno_number(name: &str) -> Option<i32> {
    Some(match name {
        "EPERM" => 1,
        "ENOENT" => 2,
        "EIO" => 5,
        "EAGAIN" => 11,
        "EACCES" => 13,
        "EBUSY" => 16,
        "ENODEV" => 19,
        "EINVAL" => 22,
        "ENODATA" => 61,
        "EOPNOTSUPP" => 95,
        _ => return None,
    })
}

fn checked_path(path: &str, n: usize) -> Result<PathBuf> {
    let rel = PathBuf::from(path.trim_end_matches('/'));
    let inside = rel
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if path.is_empty() || !inside {
        return Err(bad(
            n,
            &format!("path {path:?} must be relative, without `..`"),
        ));
    }
    Ok(rel)
}

/// Refuses `rel` if any existing component of it below `root` (the last one included: a file
/// write follows a link there too) is a symlink.
fn no_links_on_the_way(root: &Path, rel: &Path, n: usize) -> Result<()> {
    let mut at = root.to_path_buf();
    for component in rel.components() {
        at.push(component);
        match fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let shown = at.strip_prefix(root).unwrap_or(&at);
                return Err(bad(
                    n,
                    &format!(
                        "path {:?} goes through the symlink {:?}; fixtures write only below \
                         their root",
                        rel.display().to_string(),
                        shown.display().to_string()
                    ),
                ));
            }
            Ok(_) => {}
            // Nothing exists from here down, so nothing further can be a link.
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

fn make_parent(target: &Path, n: usize) -> Result<()> {
    match target.parent() {
        Some(parent) => fs::create_dir_all(parent).map_err(|e| io_err(n, parent, e)),
        None => Ok(()),
    }
}

fn bad(n: usize, what: &str) -> Error {
    Error::io(
        format!("fixture line {n}"),
        io::Error::new(io::ErrorKind::InvalidData, what.to_owned()),
    )
}

fn io_err(n: usize, path: &Path, e: io::Error) -> Error {
    Error::io(format!("fixture line {n}: {}", path.display()), e)
}

/// A synthetic, kernel-consistent fixture of `pfs` E810-like SR-IOV PFs with `vfs` VFs each
/// (every VF with a netdev), in the fixture text format. For scaling tests and the inventory
/// benchmark, where real hardware of that size is not at hand. VF routing IDs follow the
/// kernel rule (PF RID + offset 8 + n), spilling into the next bus like real ARI devices.
pub fn synthetic_sriov(pfs: usize, vfs: usize) -> String {
    synthetic_sriov_with(pfs, vfs, true)
}

/// [`synthetic_sriov`], with or without each PCI function's `uevent` (Linux always writes
/// one; without, discovery reads the identity files one by one, and must decide the same).
pub fn synthetic_sriov_with(pfs: usize, vfs: usize, uevent: bool) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let mut ifindex = 10;
    for p in 0..pfs {
        let bus = 0x10 + 4 * p;
        let root = format!("pci0000:{bus:02x}");
        let pf = format!("0000:{bus:02x}:00.0");
        let pf_dir = format!("sys/devices/{root}/{pf}");
        let pf_if = format!("ens{p}f0");
        let _ = writeln!(
            t,
            "sys/bus/pci/devices/{pf} -> ../../../devices/{root}/{pf}"
        );
        for (k, v) in [
            ("class", "0x020000"),
            ("vendor", "0x8086"),
            ("device", "0x159b"),
            ("subsystem_vendor", "0x8086"),
            ("subsystem_device", "0x0003"),
            ("numa_node", "0"),
            ("sriov_offset", "8"),
            ("sriov_stride", "1"),
            ("sriov_vf_device", "1889"),
        ] {
            let _ = writeln!(t, "{pf_dir}/{k} = {v}");
        }
        let _ = writeln!(t, "{pf_dir}/sriov_totalvfs = {}", vfs.max(1));
        let _ = writeln!(t, "{pf_dir}/sriov_numvfs = {vfs}");
        let _ = writeln!(t, "{pf_dir}/driver -> ../../../bus/pci/drivers/ice");
        if uevent {
            pci_uevent(&mut t, &pf_dir, &pf, "ice", 0x159b, 0x0003);
        }
        netdev(
            &mut t,
            &root,
            &pf,
            &pf_if,
            ifindex,
            &format!("02:00:00:{p:02x}:ff:ff"),
        );
        ifindex += 1;
        for n in 0..vfs {
            let rid = (bus << 8) + 8 + n;
            let vf = format!(
                "0000:{:02x}:{:02x}.{}",
                rid >> 8,
                (rid & 0xff) >> 3,
                rid & 7
            );
            let vf_dir = format!("sys/devices/{root}/{vf}");
            let _ = writeln!(
                t,
                "sys/bus/pci/devices/{vf} -> ../../../devices/{root}/{vf}"
            );
            let _ = writeln!(t, "{pf_dir}/virtfn{n} -> ../{vf}");
            for (k, v) in [
                ("class", "0x020000"),
                ("vendor", "0x8086"),
                ("device", "0x1889"),
                ("subsystem_vendor", "0x8086"),
                ("subsystem_device", "0x0000"),
                ("numa_node", "0"),
            ] {
                let _ = writeln!(t, "{vf_dir}/{k} = {v}");
            }
            let _ = writeln!(t, "{vf_dir}/physfn -> ../{pf}");
            let _ = writeln!(t, "{vf_dir}/driver -> ../../../bus/pci/drivers/iavf");
            if uevent {
                pci_uevent(&mut t, &vf_dir, &vf, "iavf", 0x1889, 0x0000);
            }
            let mac = format!("02:{p:02x}:00:{:02x}:{:02x}:01", n >> 8, n & 0xff);
            netdev(&mut t, &root, &vf, &format!("{pf_if}v{n}"), ifindex, &mac);
            ifindex += 1;
        }
    }
    t
}

/// An Intel network function's `uevent`, as `pci_uevent` writes it after the driver's line.
fn pci_uevent(t: &mut String, dir: &str, bdf: &str, driver: &str, device: u16, sub_device: u16) {
    use std::fmt::Write as _;
    let _ = writeln!(
        t,
        "{dir}/uevent = <<EOF\nDRIVER={driver}\nPCI_CLASS=20000\nPCI_ID=8086:{device:04X}\n\
         PCI_SUBSYS_ID=8086:{sub_device:04X}\nPCI_SLOT_NAME={bdf}\n\
         MODALIAS=pci:v00008086d0000{device:04X}sv00008086sd0000{sub_device:04X}bc02sc00i00\nEOF"
    );
}

fn netdev(t: &mut String, root: &str, bdf: &str, name: &str, ifindex: usize, mac: &str) {
    use std::fmt::Write as _;
    let dir = format!("sys/devices/{root}/{bdf}/net/{name}");
    let _ = writeln!(
        t,
        "sys/class/net/{name} -> ../../devices/{root}/{bdf}/net/{name}"
    );
    let _ = writeln!(t, "{dir}/device -> ../..");
    for (k, v) in [
        ("address", mac),
        ("mtu", "1500"),
        ("operstate", "up"),
        ("speed", "25000"),
        ("type", "1"),
        ("addr_assign_type", "0"),
    ] {
        let _ = writeln!(t, "{dir}/{k} = {v}");
    }
    let _ = writeln!(t, "{dir}/ifindex = {ifindex}");
    let _ = writeln!(t, "{dir}/iflink = {ifindex}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_fixture_loader() {
        let dir = tempfile::tempdir().unwrap();
        let text = "\
# header
sys/class/net/
sys/class/net/lo -> ../../devices/virtual/net/lo
sys/devices/virtual/net/lo/mtu = 65536
sys/devices/virtual/net/lo/ifalias = 
sys/devices/virtual/net/lo/speed = !ERR EINVAL
sys/devices/virtual/net/lo/uevent = <<EOF
INTERFACE=lo
IFINDEX=1
EOF
";
        let faults = materialise(text, dir.path()).unwrap();
        assert_eq!(
            faults,
            BTreeMap::from([(PathBuf::from("sys/devices/virtual/net/lo/speed"), 22)])
        );
        let lo = dir.path().join("sys/devices/virtual/net/lo");
        assert_eq!(fs::read_to_string(lo.join("mtu")).unwrap(), "65536\n");
        assert_eq!(fs::read_to_string(lo.join("ifalias")).unwrap(), "\n");
        assert_eq!(fs::read_to_string(lo.join("speed")).unwrap(), "");
        assert_eq!(
            fs::read_to_string(lo.join("uevent")).unwrap(),
            "INTERFACE=lo\nIFINDEX=1\n"
        );
        assert_eq!(
            fs::read_link(dir.path().join("sys/class/net/lo")).unwrap(),
            PathBuf::from("../../devices/virtual/net/lo")
        );

        for (bad_text, want) in [
            (
                "sys/a = !ERR EWHAT\n",
                "fixture line 1: unknown errno \"EWHAT\"",
            ),
            (
                "sys/a = <<EOF\nx\n",
                "fixture line 1: heredoc without closing EOF",
            ),
            (
                "sys/../a = 1\n",
                "fixture line 1: path \"sys/../a\" must be relative",
            ),
            (
                "/sys/a = 1\n",
                "fixture line 1: path \"/sys/a\" must be relative",
            ),
            ("sys/a ~ 1\n", "fixture line 1: expected `path/`"),
        ] {
            let got = materialise(bad_text, dir.path()).unwrap_err().to_string();
            assert!(got.starts_with(want), "got {got:?}, want {want:?}");
        }
    }

    /// A generated fixture (the fuzz tests write random ones as root) could name a symlink and
    /// then a file below it or the link itself; both would write outside the root.
    #[test]
    fn inventory_fixture_never_writes_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("victim"), "kept\n").unwrap();
        for (text, want) in [
            (
                "sys/a -> ../../outside\nsys/a/f = 1\n",
                "fixture line 2: path \"sys/a/f\" goes through the symlink \"sys/a\"",
            ),
            (
                "sys/v -> ../../outside/victim\nsys/v = overwritten\n",
                "fixture line 2: path \"sys/v\" goes through the symlink \"sys/v\"",
            ),
            (
                "sys/d -> ../../outside\nsys/d/sub/\n",
                "fixture line 2: path \"sys/d/sub\" goes through the symlink \"sys/d\"",
            ),
        ] {
            let _ = fs::remove_dir_all(&root);
            let got = materialise(text, &root).unwrap_err().to_string();
            assert!(got.starts_with(want), "got {got:?}, want {want:?}");
        }
        let mut left: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, vec![std::ffi::OsString::from("victim")]);
        assert_eq!(
            fs::read_to_string(outside.join("victim")).unwrap(),
            "kept\n"
        );
    }

    #[test]
    fn inventory_fixture_ethtool_capture() {
        let fake = ethtool_capture(
            "# c\n## h\nlo vlan-challenged changeable=0 active=1 never_change=1\n\
             lo rx-vlan-filter changeable=0 active=0 never_change=0\n\
             eth0 vlan-challenged changeable=0 active=0 never_change=1\n",
        );
        assert_eq!(
            fake.active["lo"].iter().collect::<Vec<_>>(),
            vec!["vlan-challenged"]
        );
        assert!(fake.active["eth0"].is_empty());
        assert_eq!(fake.active.len(), 2);
    }

    #[test]
    fn synthetic_tree_discovers_as_pfs_and_vfs() {
        let dir = tempfile::tempdir().unwrap();
        materialise(&synthetic_sriov(2, 9), dir.path()).unwrap();
        let inv = crate::inventory::discover(
            dir.path(),
            &crate::inventory::Sources::sysfs_only(),
            &Default::default(),
            &Default::default(),
        );
        assert_eq!(inv.devices.len(), 20);
        let pf = inv.device("pci-0000-10-00-0").unwrap();
        assert_eq!(pf.kind, crate::inventory::DeviceKind::Pf);
        // VF 8: RID 0x1000 + 8 + 8 = 0x1010 -> 10:02.0 (devfn 16).
        let vf = inv.device("pci-0000-10-02-0").unwrap();
        assert_eq!(vf.kind, crate::inventory::DeviceKind::Vf);
        assert_eq!(
            vf.attr("vfIndex"),
            Some(&crate::inventory::AttrValue::Int(8))
        );
        assert_eq!(vf.attr("pfName").and_then(|v| v.as_str()), Some("ens0f0"));
    }
}
