//! Reading sysfs under a configurable root, the way captured trees and live kernels both allow.
//!
//! Every path handed to [`Sysfs`] is relative to the root (it starts with `sys/`). Symlinks are
//! resolved by hand with `read_link` plus lexical joins, clamped to the root: `canonicalize` would
//! fail on the dangling links of captured trees and would escape a test root through absolute
//! links. Every read that fails for any reason, or yields empty text, is "unknown" (`None`).

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

/// How many symlinks one resolution may follow before it is taken as a loop (the kernel's
/// `MAXSYMLINKS`).
const MAX_LINK_HOPS: usize = 40;

/// A sysfs tree below a root directory, with optional injected read faults.
///
/// The fault table exists because some sysfs files exist but fail `read(2)` (EINVAL for `speed`
/// of a down link, EOPNOTSUPP for `phys_port_name`), which a plain directory cannot reproduce:
/// tests register those paths here and discovery sees the same error a live kernel would give.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
    faults: BTreeMap<PathBuf, i32>,
}

impl Sysfs {
    /// A reader of the live system (`root` = "/") or of a materialised fixture.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs {
            root: root.into(),
            faults: BTreeMap::new(),
        }
    }

    /// Makes reads of the file at root-relative `path` (as resolved, e.g.
    /// `sys/devices/virtual/net/lo/speed`) fail with `errno`, as the kernel does for some
    /// attributes; fixtures record these as `!ERR` lines.
    pub fn with_fault(mut self, path: impl Into<PathBuf>, errno: i32) -> Self {
        self.faults.insert(path.into(), errno);
        self
    }

    /// Adds a whole table of faults (see [`Sysfs::with_fault`]).
    pub fn with_faults(mut self, faults: impl IntoIterator<Item = (PathBuf, i32)>) -> Self {
        self.faults.extend(faults);
        self
    }

    /// The root every `sys/...` path is joined to; the PCI ID database is looked up below it too.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves every symlink along root-relative `rel`, lexically and clamped to the root, and
    /// returns the root-relative real path. A dangling link is followed as far as its text goes,
    /// so the caller still learns where it pointed.
    pub fn resolve(&self, rel: &Path) -> PathBuf {
        let mut done: Vec<OsString> = Vec::new();
        let mut pending: VecDeque<OsString> = components(rel).into();
        let mut hops = 0;
        while let Some(part) = pending.pop_front() {
            if part == ".." {
                done.pop();
                continue;
            }
            done.push(part);
            let here = self.root.join(join_parts(&done));
            let Ok(target) = fs::read_link(&here) else {
                continue;
            };
            hops += 1;
            if hops > MAX_LINK_HOPS {
                tracing::debug!(path = %here.display(), "symlink loop in sysfs; giving up");
                break;
            }
            done.pop();
            if target.is_absolute() {
                done.clear();
            }
            for part in components(&target).into_iter().rev() {
                pending.push_front(part);
            }
        }
        join_parts(&done)
    }

    /// Where the symlink at `rel` points, resolved and root-relative; `None` when `rel` is not a
    /// symlink (after resolving its parents).
    pub fn link_target(&self, rel: &Path) -> Option<PathBuf> {
        let parent = self.resolve(rel.parent()?);
        let name = rel.file_name()?;
        let here = parent.join(name);
        fs::read_link(self.root.join(&here)).ok()?;
        Some(self.resolve(&here))
    }

    /// The last component of the symlink text at `rel`: enough for `driver`, `subsystem` and
    /// `physfn`, whose targets may not exist in a captured tree.
    pub fn link_name(&self, rel: &Path) -> Option<String> {
        let parent = self.resolve(rel.parent()?);
        let target = fs::read_link(self.root.join(parent).join(rel.file_name()?)).ok()?;
        let name = target.file_name()?.to_str()?;
        Some(name.to_owned())
    }

    /// The trimmed text of the file at `rel`; `None` for missing, unreadable (including injected
    /// faults), non-UTF-8 or empty files.
    pub fn read(&self, rel: &Path) -> Option<String> {
        let real = self.resolve(rel);
        let result = match self.faults.get(&real) {
            Some(errno) => Err(io::Error::from_raw_os_error(*errno)),
            None => fs::read(self.root.join(&real)),
        };
        match result {
            Ok(bytes) => {
                let text = String::from_utf8(bytes).ok()?;
                let text = text.trim();
                (!text.is_empty()).then(|| text.to_owned())
            }
            Err(err) => {
                if err.kind() != io::ErrorKind::NotFound {
                    tracing::trace!(path = %real.display(), %err, "sysfs read failed; unknown");
                }
                None
            }
        }
    }

    /// A decimal attribute; `None` when unknown or not a number. `-1` is returned as is: only
    /// the caller knows whether it means "unknown" (`numa_node`, `speed`) or not.
    pub fn read_i64(&self, rel: &Path) -> Option<i64> {
        self.read(rel)?.parse().ok()
    }

    /// A `0x%x` attribute (vendor, device, class); the `0x` is optional, as in `sriov_vf_device`.
    pub fn read_hex(&self, rel: &Path) -> Option<u32> {
        let text = self.read(rel)?;
        let digits = text
            .strip_prefix("0x")
            .or_else(|| text.strip_prefix("0X"))
            .unwrap_or(&text);
        u32::from_str_radix(digits, 16).ok()
    }

    /// Sorted entry names of the directory at `rel` (after resolving it); empty when it is
    /// missing or unreadable.
    pub fn list(&self, rel: &Path) -> Vec<String> {
        let real = self.root.join(self.resolve(rel));
        let Ok(entries) = fs::read_dir(&real) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// Whether `rel` resolves to an existing directory.
    pub fn is_dir(&self, rel: &Path) -> bool {
        self.root.join(self.resolve(rel)).is_dir()
    }

    /// Whether something (file, directory or symlink, even dangling) exists at `rel`.
    pub fn exists(&self, rel: &Path) -> bool {
        let Some(name) = rel.file_name() else {
            return self.root.join(self.resolve(rel)).exists();
        };
        let parent = self.resolve(rel.parent().unwrap_or(Path::new("")));
        fs::symlink_metadata(self.root.join(parent).join(name)).is_ok()
    }
}

/// The normal components of `path` as owned strings, dropping `/` and `.` so that absolute
/// link targets land below the root.
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

fn join_parts(parts: &[OsString]) -> PathBuf {
    parts.iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn inventory_sysfs_resolves_links_clamped_to_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("sys/devices/pci0000:00/0000:00:03.0/net/eth0")).unwrap();
        fs::create_dir_all(root.join("sys/class/net")).unwrap();
        symlink(
            "../../devices/pci0000:00/0000:00:03.0/net/eth0",
            root.join("sys/class/net/eth0"),
        )
        .unwrap();
        symlink(
            "../..",
            root.join("sys/devices/pci0000:00/0000:00:03.0/net/eth0/device"),
        )
        .unwrap();
        // Too many "..": clamped at the root instead of escaping it.
        symlink(
            "../../../../../../../../bus/pci/drivers/ice",
            root.join("sys/devices/pci0000:00/0000:00:03.0/driver"),
        )
        .unwrap();
        // Absolute targets are taken relative to the root.
        symlink("/sys/class/net/eth0", root.join("sys/abs")).unwrap();
        fs::write(
            root.join("sys/devices/pci0000:00/0000:00:03.0/vendor"),
            "0x1af4\n",
        )
        .unwrap();
        fs::write(root.join("sys/devices/pci0000:00/0000:00:03.0/empty"), "\n").unwrap();
        fs::write(
            root.join("sys/devices/pci0000:00/0000:00:03.0/numa_node"),
            "-1\n",
        )
        .unwrap();

        let sysfs = Sysfs::new(root);
        assert_eq!(
            sysfs.resolve(Path::new("sys/class/net/eth0/device")),
            PathBuf::from("sys/devices/pci0000:00/0000:00:03.0")
        );
        assert_eq!(
            sysfs.link_target(Path::new("sys/devices/pci0000:00/0000:00:03.0/driver")),
            Some(PathBuf::from("bus/pci/drivers/ice"))
        );
        assert_eq!(
            sysfs.link_name(Path::new("sys/class/net/eth0/device/driver")),
            Some("ice".to_owned())
        );
        assert_eq!(
            sysfs.resolve(Path::new("sys/abs")),
            PathBuf::from("sys/devices/pci0000:00/0000:00:03.0/net/eth0")
        );
        assert_eq!(
            sysfs.read_hex(Path::new("sys/class/net/eth0/device/vendor")),
            Some(0x1af4)
        );
        assert_eq!(
            sysfs.read(Path::new("sys/class/net/eth0/device/empty")),
            None
        );
        assert_eq!(
            sysfs.read(Path::new("sys/class/net/eth0/device/missing")),
            None
        );
        assert_eq!(
            sysfs.read_i64(Path::new("sys/class/net/eth0/device/numa_node")),
            Some(-1)
        );
        assert!(sysfs.exists(Path::new("sys/devices/pci0000:00/0000:00:03.0/driver")));
        assert!(!sysfs.is_dir(Path::new("sys/devices/pci0000:00/0000:00:03.0/driver")));
        assert_eq!(
            sysfs.list(Path::new("sys/class/net")),
            vec!["eth0".to_owned()]
        );
        assert!(sysfs.list(Path::new("sys/nope")).is_empty());

        let faulty = Sysfs::new(root).with_fault("sys/devices/pci0000:00/0000:00:03.0/vendor", 22);
        assert_eq!(
            faulty.read(Path::new("sys/class/net/eth0/device/vendor")),
            None
        );
    }

    #[test]
    fn inventory_sysfs_survives_symlink_loops() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("sys")).unwrap();
        symlink("b", dir.path().join("sys/a")).unwrap();
        symlink("a", dir.path().join("sys/b")).unwrap();
        let sysfs = Sysfs::new(dir.path());
        assert_eq!(sysfs.read(Path::new("sys/a")), None);
    }
}
