//! Reading sysfs under a configurable root, the way captured trees and live kernels both allow.
//!
//! Every path handed to [`Sysfs`] is relative to the root (it starts with `sys/`). Symlinks are
//! resolved by hand with `read_link` plus lexical joins, clamped to the root: `canonicalize` would
//! fail on the dangling links of captured trees and would escape a test root through absolute
//! links. Every read that fails for any reason, or yields empty text, is "unknown" (`None`).
//!
//! Nothing here may let the OS follow a link the resolver did not: a chain longer than
//! [`MAX_LINK_HOPS`] is unreadable as a whole (handing its remainder to the OS would follow it
//! out of the root), and files are read with `O_NOFOLLOW`, only when regular and at most
//! [`MAX_ATTRIBUTE_BYTES`] long, so a FIFO or a huge file planted in a tree cannot hang or
//! flood discovery.

mod dir;
mod memo;

pub use dir::Dir;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::bounded::{Links, read_listed_regular, read_regular};
use crate::error::{Error, Result};
use memo::{Entry, Kind, Listing, Memo};

/// How many symlinks one resolution may follow before it is taken as a loop (the kernel's
/// `MAXSYMLINKS`); a path needing more is unreadable.
pub const MAX_LINK_HOPS: usize = 40;

/// The most bytes one attribute read takes. The kernel's text attributes are at most one page
/// (4 KiB, 64 KiB on 64K-page kernels); anything larger is not an attribute discovery knows.
pub const MAX_ATTRIBUTE_BYTES: u64 = 64 * 1024;

/// A sysfs tree below a root directory, with optional injected read faults.
///
/// The fault table exists because some sysfs files exist but fail `read(2)` (EINVAL for `speed`
/// of a down link, EOPNOTSUPP for `phys_port_name`), which a plain directory cannot reproduce:
/// tests register those paths here and discovery sees the same error a live kernel would give.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
    faults: BTreeMap<PathBuf, i32>,
    memo: Option<Arc<Memo>>,
}

impl Sysfs {
    /// A reader of the live system (`root` = "/") or of a materialised fixture.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs {
            root: root.into(),
            faults: BTreeMap::new(),
            memo: None,
        }
    }

    /// A reader of the same tree that remembers every listing, link and resolution it makes,
    /// for one discovery pass: a device's attributes share all their directories, so asking the
    /// kernel once per directory instead of once per component of every path is what keeps a
    /// pass over a thousand VFs in milliseconds. It answers exactly as this reader would at the
    /// moment each directory is first seen; a later change of the tree is not noticed, so each
    /// pass takes a fresh one.
    pub fn memoised(&self) -> Sysfs {
        Sysfs {
            memo: Some(Arc::new(Memo::default())),
            ..self.clone()
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
    /// so the caller still learns where it pointed. A path whose links run out of hops comes
    /// back as given: every reader resolves again and finds it unreadable (see
    /// [`Sysfs::try_resolve`]).
    pub fn resolve(&self, rel: &Path) -> PathBuf {
        self.try_resolve(rel).unwrap_or_else(|| rel.to_path_buf())
    }

    /// Like [`Sysfs::resolve`], but `None` when the links along `rel` need more than
    /// [`MAX_LINK_HOPS`] hops: the rest of such a chain is never handed to the OS, which would
    /// follow it without the root clamp.
    pub fn try_resolve(&self, rel: &Path) -> Option<PathBuf> {
        // In a directory already listed (so already resolved: only real directories are) only
        // the last component is new, and the listing says whether it is a link.
        let (mut here, mut pending, mut listing) = match &self.memo {
            Some(memo) => match (rel.parent(), rel.file_name()) {
                (Some(parent), Some(name)) => match memo.listed(parent) {
                    Some((dir, listing)) => match listing.entry(name) {
                        Entry::Is(Kind::Link) | Entry::Unknown => {
                            (dir, VecDeque::from([name.to_owned()]), Some(Some(listing)))
                        }
                        Entry::Is(_) | Entry::Absent => return Some(dir.join(name)),
                    },
                    None => (PathBuf::new(), components(rel).into(), None),
                },
                _ => (PathBuf::new(), components(rel).into(), None),
            },
            None => (PathBuf::new(), components(rel).into(), None),
        };
        // `here` grows and shrinks in place, and the listing of the directory it names is kept
        // for the next component: rebuilding the path and looking its parent up again for
        // every component was most of the user time of a pass's resolutions.
        let mut hops = 0;
        while let Some(part) = pending.pop_front() {
            if part == ".." {
                here.pop();
                listing = None;
                continue;
            }
            let target = self.read_link_in(&mut here, &mut listing, &part);
            listing = None;
            let Some(target) = target else {
                continue;
            };
            hops += 1;
            if hops > MAX_LINK_HOPS {
                tracing::debug!(
                    path = %self.root.join(&here).display(),
                    "symlink chain too long in sysfs; unreadable"
                );
                return None;
            }
            here.pop();
            if target.is_absolute() {
                here = PathBuf::new();
            }
            for part in components(&target).into_iter().rev() {
                pending.push_front(part);
            }
        }
        Some(here)
    }

    /// Steps from the real directory `here` (whose memo listing is `listing`, fetched on first
    /// use) into its entry `part`, and reads it as a link: `None` when it is not one. Answers
    /// as [`Sysfs::read_link_real_parent`] of the joined path does.
    fn read_link_in(
        &self,
        here: &mut PathBuf,
        listing: &mut Option<Option<Arc<Listing>>>,
        part: &OsStr,
    ) -> Option<PathBuf> {
        let Some(memo) = &self.memo else {
            here.push(part);
            return fs::read_link(self.root.join(here)).ok();
        };
        let entry = match listing.get_or_insert_with(|| memo.listing(&self.root, here)) {
            Some(listing) => listing.entry(part),
            None => Entry::Unknown,
        };
        here.push(part);
        match entry {
            Entry::Absent | Entry::Is(Kind::File | Kind::Dir | Kind::Other) => None,
            Entry::Is(Kind::Link) | Entry::Unknown => {
                memo.read_link_with(here, || fs::read_link(self.root.join(&*here)).ok())
            }
        }
    }

    /// `readlink` of root-relative `rel`, whose parent is already resolved; `None` when it is
    /// not a link (or not there).
    fn read_link_real_parent(&self, rel: &Path) -> Option<PathBuf> {
        match &self.memo {
            Some(memo) => memo.read_link(&self.root, rel),
            None => fs::read_link(self.root.join(rel)).ok(),
        }
    }

    /// What the memo's listing of real `rel`'s parent says about it ([`Entry::Unknown`]
    /// without a memo: ask the kernel).
    fn entry(&self, real: &Path) -> Entry {
        match &self.memo {
            Some(memo) => memo.entry(&self.root, real),
            None => Entry::Unknown,
        }
    }

    /// Where the symlink at `rel` points, resolved and root-relative; `None` when `rel` is not a
    /// symlink (after resolving its parents).
    pub fn link_target(&self, rel: &Path) -> Option<PathBuf> {
        let parent = self.try_resolve(rel.parent()?)?;
        let name = rel.file_name()?;
        let here = parent.join(name);
        self.read_link_real_parent(&here)?;
        self.try_resolve(&here)
    }

    /// The last component of the symlink text at `rel`: enough for `driver`, `subsystem` and
    /// `physfn`, whose targets may not exist in a captured tree.
    pub fn link_name(&self, rel: &Path) -> Option<String> {
        let parent = self.try_resolve(rel.parent()?)?;
        let target = self.read_link_real_parent(&parent.join(rel.file_name()?))?;
        let name = target.file_name()?.to_str()?;
        Some(name.to_owned())
    }

    /// The trimmed text of the file at `rel`; `None` for missing, unreadable (including injected
    /// faults, non-regular files, oversized files and over-long link chains), non-UTF-8 or
    /// empty files.
    pub fn read(&self, rel: &Path) -> Option<String> {
        match self.try_read(rel) {
            Ok(text) => text,
            Err(err) => {
                tracing::trace!(%err, "sysfs read failed; unknown");
                None
            }
        }
    }

    /// Like [`Sysfs::read`], but says why a file that exists could not be read: `Ok(None)` is
    /// a missing, empty or non-UTF-8 file, `Err` names the path and the rule (not a regular
    /// file, over [`MAX_ATTRIBUTE_BYTES`], link chain over [`MAX_LINK_HOPS`], an OS error).
    pub fn try_read(&self, rel: &Path) -> Result<Option<String>> {
        let Some(real) = self.try_resolve(rel) else {
            return Err(Error::io(
                format!("reading sysfs {}", self.root.join(rel).display()),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("symlink chain longer than {MAX_LINK_HOPS} hops; unreadable"),
                ),
            ));
        };
        let path = self.root.join(&real);
        let result = match (self.faults.get(&real), self.entry(&real)) {
            (Some(errno), _) => Err(io::Error::from_raw_os_error(*errno)),
            (None, Entry::Absent) => return Ok(None),
            // Listed as a regular file a moment ago: the check before opening is done.
            (None, Entry::Is(Kind::File)) => read_listed_regular(&path, MAX_ATTRIBUTE_BYTES),
            (None, _) => read_regular(&path, MAX_ATTRIBUTE_BYTES, Links::Refuse),
        };
        match result {
            Ok(bytes) => Ok(text_of(bytes)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(Error::io(format!("reading sysfs {}", path.display()), err)),
        }
    }

    /// A decimal attribute; `None` when unknown or not a number. `-1` is returned as is: only
    /// the caller knows whether it means "unknown" (`numa_node`, `speed`) or not.
    pub fn read_i64(&self, rel: &Path) -> Option<i64> {
        self.read(rel)?.parse().ok()
    }

    /// A `0x%x` attribute (vendor, device, class); the `0x` is optional, as in `sriov_vf_device`.
    pub fn read_hex(&self, rel: &Path) -> Option<u32> {
        parse_hex(&self.read(rel)?)
    }

    /// Sorted entry names of the directory at `rel` (after resolving it); empty when it is
    /// missing or unreadable.
    pub fn list(&self, rel: &Path) -> Vec<String> {
        self.list_with_prefix(rel, "")
    }

    /// The names of [`Sysfs::list`] that start with `prefix`.
    pub fn list_with_prefix(&self, rel: &Path, prefix: &str) -> Vec<String> {
        let Some(real) = self.try_resolve(rel) else {
            return Vec::new();
        };
        if let Some(memo) = &self.memo
            && let Some(listing) = memo.listing(&self.root, &real)
        {
            return listing.names_with_prefix(prefix);
        }
        let Ok(entries) = fs::read_dir(self.root.join(real)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with(prefix))
            .collect();
        names.sort();
        names
    }

    /// Whether `rel` resolves to an existing directory.
    pub fn is_dir(&self, rel: &Path) -> bool {
        let Some(real) = self.try_resolve(rel) else {
            return false;
        };
        match self.entry(&real) {
            Entry::Is(kind) => kind == Kind::Dir,
            Entry::Absent => false,
            Entry::Unknown => {
                fs::symlink_metadata(self.root.join(real)).is_ok_and(|meta| meta.is_dir())
            }
        }
    }

    /// Whether something (file, directory or symlink, even dangling) exists at `rel`.
    pub fn exists(&self, rel: &Path) -> bool {
        let Some(name) = rel.file_name() else {
            return self
                .try_resolve(rel)
                .is_some_and(|real| fs::symlink_metadata(self.root.join(real)).is_ok());
        };
        let Some(parent) = self.try_resolve(rel.parent().unwrap_or(Path::new(""))) else {
            return false;
        };
        let here = parent.join(name);
        match self.entry(&here) {
            Entry::Is(_) => true,
            Entry::Absent => false,
            Entry::Unknown => fs::symlink_metadata(self.root.join(here)).is_ok(),
        }
    }
}

/// An attribute's bytes as trimmed text; `None` when not UTF-8 or blank. Trimmed in place:
/// nearly every attribute ends in a newline, and a copy per read was a tenth of a pass's
/// allocations.
fn text_of(bytes: Vec<u8>) -> Option<String> {
    let mut text = String::from_utf8(bytes).ok()?;
    text.truncate(text.trim_end().len());
    let lead = text.len() - text.trim_start().len();
    text.drain(..lead);
    (!text.is_empty()).then_some(text)
}

/// A `0x%x` number, the `0x` optional.
fn parse_hex(text: &str) -> Option<u32> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u32::from_str_radix(digits, 16).ok()
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

    /// Runs `f` on another thread and fails the test if it does not return within seconds: a
    /// read that hangs must fail the test, not block the suite.
    fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("the read hung instead of failing")
    }

    #[test]
    fn inventory_sysfs_refuses_a_fifo_attribute_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("sys/class/net/eth0");
        fs::create_dir_all(&net).unwrap();
        nix::unistd::mkfifo(&net.join("speed"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let sysfs = Sysfs::new(dir.path());
        let (read, err) = within_seconds(move || {
            let rel = Path::new("sys/class/net/eth0/speed");
            (
                sysfs.read(rel),
                sysfs.try_read(rel).unwrap_err().to_string(),
            )
        });
        assert_eq!(read, None);
        assert_eq!(
            err,
            format!(
                "reading sysfs {}: not a regular file (it is a FIFO)",
                net.join("speed").display()
            )
        );
    }

    #[test]
    fn inventory_sysfs_refuses_an_oversized_attribute() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("sys/class/net/eth0");
        fs::create_dir_all(&net).unwrap();
        let limit = usize::try_from(MAX_ATTRIBUTE_BYTES).unwrap();
        fs::write(net.join("ifalias"), "a".repeat(limit + 1)).unwrap();
        fs::write(net.join("mtu"), format!("{}1500", " ".repeat(limit - 4))).unwrap();
        let sysfs = Sysfs::new(dir.path());
        let rel = Path::new("sys/class/net/eth0/ifalias");
        assert!(sysfs.read(rel).is_none());
        let err = sysfs.try_read(rel).unwrap_err().to_string();
        assert!(err.contains("larger than the 65536-byte limit"), "{err}");
        assert!(
            err.contains(&net.join("ifalias").display().to_string()),
            "{err}"
        );
        // Exactly at the limit is still read.
        assert_eq!(
            sysfs.read_i64(Path::new("sys/class/net/eth0/mtu")),
            Some(1500)
        );
    }

    #[test]
    fn inventory_sysfs_link_chain_over_the_hop_limit_never_leaves_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir_all(root.join("sys/class/net")).unwrap();
        fs::create_dir_all(outside.join("secrets")).unwrap();
        fs::write(outside.join("secret"), "outside the root\n").unwrap();
        fs::write(outside.join("secrets/key"), "k\n").unwrap();
        // Two chains of MAX_LINK_HOPS + 5 links whose last link points outside the root by
        // absolute path: the resolver would clamp it, the OS would not.
        for (prefix, target) in [
            ("f", outside.join("secret")),
            ("d", outside.join("secrets")),
        ] {
            let len = MAX_LINK_HOPS + 5;
            for i in 0..len {
                let next = if i + 1 == len {
                    target.clone()
                } else {
                    PathBuf::from(format!("{prefix}{}", i + 1))
                };
                symlink(next, root.join(format!("sys/class/net/{prefix}{i}"))).unwrap();
            }
        }
        let sysfs = Sysfs::new(&root);
        let file = Path::new("sys/class/net/f0");
        assert_eq!(sysfs.read(file), None);
        let err = sysfs.try_read(file).unwrap_err().to_string();
        assert!(
            err.contains("symlink chain longer than 40 hops; unreadable"),
            "{err}"
        );
        assert_eq!(sysfs.try_resolve(file), None);
        assert_eq!(sysfs.link_target(file), None);
        let dir_chain = Path::new("sys/class/net/d0");
        assert!(sysfs.list(dir_chain).is_empty());
        assert!(!sysfs.is_dir(dir_chain));
        assert_eq!(sysfs.read(&dir_chain.join("key")), None);
        assert!(!sysfs.exists(&dir_chain.join("key")));
        // A chain within the limit still resolves.
        assert_eq!(
            sysfs.try_resolve(Path::new("sys/class/net/f5")),
            Some(PathBuf::from(
                outside.join("secret").strip_prefix("/").unwrap()
            ))
        );
    }
}
