//! One sysfs directory opened once, its entries read relative to that descriptor.
//!
//! A device's attributes all sit in one directory whose path is eight or more components long;
//! reading each by path makes the kernel walk that path again for every file, and that walk was
//! most of discovery's kernel time. [`Sysfs::dir`] resolves the directory (by hand, clamped to
//! the root, as every path here is), opens it once, lists it through the same descriptor, and
//! then opens, `readlinkat`s and checks its entries by name. Every answer is the one
//! [`Sysfs`]'s path-based methods give for `dir/name`: whenever the fast way cannot be sure
//! (no memo, injected faults, an entry that is a link or of unknown type, a directory that
//! could not be opened), it asks them instead.
//!
//! A subdirectory the listing shows as a real directory is opened relative to the descriptor
//! ([`Dir::child`]): a PCI function's `net/`, and each netdev below it, cost the kernel one
//! component each instead of the whole path from the root.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

use super::memo::{Entry, Kind, Listing, Memo};
use super::{MAX_ATTRIBUTE_BYTES, Sysfs, parse_hex, text_of};
use crate::bounded::read_listed_regular_at;

/// The first buffer for a link's text: sysfs links (`../../../bus/pci/drivers/ice`) fit.
const LINK_BYTES: usize = 128;

/// An open directory of a [`Sysfs`] tree (see the module docs). Holds one descriptor until
/// dropped, so callers keep it for one device's reads, not for a whole pass.
pub struct Dir<'a> {
    sysfs: &'a Sysfs,
    /// Root-relative real path; `None` when the links on the way need too many hops (then
    /// nothing below it is readable).
    real: Option<PathBuf>,
    /// The descriptor and the directory's listing (read through it, or found in the memo);
    /// `None`: answer by path.
    open: Option<(OwnedFd, Arc<Listing>)>,
}

impl Sysfs {
    /// The directory at root-relative `rel`, opened for reading its entries by name (see
    /// [`Dir`]).
    pub fn dir(&self, rel: &Path) -> Dir<'_> {
        let real = self.try_resolve(rel);
        let open = match (&real, &self.memo) {
            (Some(real), Some(memo)) if self.faults.is_empty() => {
                open(rustix::fs::CWD, &self.root.join(real), real, memo)
            }
            _ => None,
        };
        Dir {
            sysfs: self,
            real,
            open,
        }
    }
}

/// Opens the directory at `path` (relative to `at`; root-relative `real`) and takes its
/// listing from `memo`, or lists it through the new descriptor and records it there. `None`
/// when it cannot be opened or could not be listed: reads then go by path and meet the same
/// failure.
fn open(
    at: BorrowedFd<'_>,
    path: &Path,
    real: &Path,
    memo: &Memo,
) -> Option<(OwnedFd, Arc<Listing>)> {
    // The path is resolved: a link in its last place now is not what the resolver saw.
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match memo.known(real) {
        Some(None) => None,
        Some(Some(listing)) => {
            let fd = rustix::fs::openat(at, path, flags | OFlags::PATH, Mode::empty()).ok()?;
            Some((fd, listing))
        }
        None => match rustix::fs::openat(at, path, flags | OFlags::RDONLY, Mode::empty()) {
            Ok(fd) => {
                let listing = memo.record(real, Some(Listing::from_fd(fd.as_fd())))?;
                Some((fd, listing))
            }
            Err(rustix::io::Errno::NOENT) => {
                memo.record(real, Some(Listing::missing()));
                None
            }
            // Left to the path-based reader, which lists it (or fails) the way it always has.
            Err(_) => None,
        },
    }
}

impl<'a> Dir<'a> {
    /// The subdirectory `name`, opened relative to this one's descriptor when the listing
    /// says it is a real directory: its real path is then this one's plus `name`, and the
    /// kernel looks up one component instead of the whole path. Anything else (a link, an
    /// unknown type, no descriptor) goes through [`Sysfs::dir`], which resolves it.
    pub fn child(&self, name: &str) -> Dir<'a> {
        if let (Some((fd, _)), Entry::Is(Kind::Dir), Some(real), Some(memo)) = (
            &self.open,
            self.entry(name),
            self.path(name),
            &self.sysfs.memo,
        ) {
            let open = open(fd.as_fd(), Path::new(name), &real, memo);
            return Dir {
                sysfs: self.sysfs,
                real: Some(real),
                open,
            };
        }
        match self.path(name) {
            Some(path) => self.sysfs.dir(&path),
            None => Dir {
                sysfs: self.sysfs,
                real: None,
                open: None,
            },
        }
    }

    /// [`Sysfs::try_resolve`] of `dir/name`, a link there read through the descriptor (so
    /// the kernel walks one component, not the whole path) into the memo the resolution uses.
    pub fn resolve(&self, name: &str) -> Option<PathBuf> {
        let path = self.path(name)?;
        if let Some((fd, _)) = &self.open {
            self.read_link(fd, name, &path);
        }
        self.sysfs.try_resolve(&path)
    }
}

impl Dir<'_> {
    /// The directory's root-relative real path, when it resolved.
    pub fn real(&self) -> Option<&Path> {
        self.real.as_deref()
    }

    /// `rel`'s entry `name` as a path, for the path-based fallbacks.
    fn path(&self, name: &str) -> Option<PathBuf> {
        Some(self.real.as_ref()?.join(name))
    }

    fn entry(&self, name: &str) -> Entry {
        match &self.open {
            Some((_, listing)) => listing.entry(OsStr::new(name)),
            None => Entry::Unknown,
        }
    }

    /// [`Sysfs::read`] of `dir/name`.
    pub fn read(&self, name: &str) -> Option<String> {
        // The path is built only when it is needed: a descriptor is open only for a resolved
        // directory, and most reads are the fast kind.
        match (&self.open, self.entry(name)) {
            (Some(_), Entry::Absent) => None,
            (Some((fd, _)), Entry::Is(Kind::File)) => {
                match read_listed_regular_at(fd.as_fd(), OsStr::new(name), MAX_ATTRIBUTE_BYTES) {
                    Ok(bytes) => text_of(bytes),
                    Err(err) => {
                        let path = self.path(name).unwrap_or_default();
                        tracing::trace!(%err, path = %path.display(), "sysfs read failed; unknown");
                        None
                    }
                }
            }
            _ => self.sysfs.read(&self.path(name)?),
        }
    }

    /// [`Sysfs::read_i64`] of `dir/name`.
    pub fn read_i64(&self, name: &str) -> Option<i64> {
        self.read(name)?.parse().ok()
    }

    /// [`Sysfs::read_hex`] of `dir/name`.
    pub fn read_hex(&self, name: &str) -> Option<u32> {
        parse_hex(&self.read(name)?)
    }

    /// The text of the link `dir/name` (`path`), read through the descriptor and remembered
    /// in the memo; `None` when it is not a link.
    fn read_link(&self, fd: &OwnedFd, name: &str, path: &Path) -> Option<PathBuf> {
        match self.entry(name) {
            Entry::Absent | Entry::Is(Kind::File | Kind::Dir | Kind::Other) => None,
            Entry::Is(Kind::Link) | Entry::Unknown => {
                let memo = self.sysfs.memo.as_ref()?;
                memo.read_link_with(path, || {
                    match rustix::fs::readlinkat(fd, name, Vec::with_capacity(LINK_BYTES)) {
                        Ok(text) => Some(PathBuf::from(OsString::from_vec(text.into_bytes()))),
                        Err(rustix::io::Errno::INTR) => {
                            std::fs::read_link(self.sysfs.root.join(path)).ok()
                        }
                        Err(_) => None,
                    }
                })
            }
        }
    }

    /// [`Sysfs::link_name`] of `dir/name`.
    pub fn link_name(&self, name: &str) -> Option<String> {
        let path = self.path(name)?;
        let Some((fd, _)) = &self.open else {
            return self.sysfs.link_name(&path);
        };
        let target = self.read_link(fd, name, &path)?;
        Some(target.file_name()?.to_str()?.to_owned())
    }

    /// [`Sysfs::link_target`] of `dir/name`.
    pub fn link_target(&self, name: &str) -> Option<PathBuf> {
        let path = self.path(name)?;
        if let Some((fd, _)) = &self.open {
            // Read through the descriptor into the memo, where the resolution finds it.
            self.read_link(fd, name, &path)?;
        }
        self.sysfs.link_target(&path)
    }

    /// [`Sysfs::exists`] of `dir/name`.
    pub fn exists(&self, name: &str) -> bool {
        match (&self.open, self.entry(name)) {
            (Some(_), Entry::Is(_)) => true,
            (Some(_), Entry::Absent) => false,
            _ => self.path(name).is_some_and(|p| self.sysfs.exists(&p)),
        }
    }

    /// [`Sysfs::is_dir`] of `dir/name`.
    pub fn is_dir(&self, name: &str) -> bool {
        match (&self.open, self.entry(name)) {
            (Some(_), Entry::Is(kind)) if kind != Kind::Link => kind == Kind::Dir,
            (Some(_), Entry::Absent) => false,
            _ => self.path(name).is_some_and(|p| self.sysfs.is_dir(&p)),
        }
    }

    /// [`Sysfs::list`] of the directory itself.
    pub fn names(&self) -> Vec<String> {
        self.names_with_prefix("")
    }

    /// [`Dir::names`] that start with `prefix`.
    pub fn names_with_prefix(&self, prefix: &str) -> Vec<String> {
        match (&self.open, &self.real) {
            (Some((_, listing)), _) => listing.names_with_prefix(prefix),
            (None, Some(real)) => self.sysfs.list_with_prefix(real, prefix),
            (None, None) => Vec::new(),
        }
    }

    /// [`Sysfs::list`] of `dir/name`.
    pub fn list(&self, name: &str) -> Vec<String> {
        self.path(name)
            .map(|p| self.sysfs.list(&p))
            .unwrap_or_default()
    }
}
