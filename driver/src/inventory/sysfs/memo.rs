//! What one discovery pass has already learnt about the tree, so no path is asked of the kernel
//! twice.
//!
//! Resolving a path by hand costs one `readlink` per component, and a device's dozen attributes
//! share every component but the last: without a memo, a VF cost hundreds of system calls.
//! A pass therefore lists each directory it touches once (the entry types of `getdents` say
//! which names are links, files, directories or absent), reads only the links it must and only
//! once, and remembers which paths are already resolved. Everything it answers is what the
//! uncached reader would have answered against the same tree; it is only ever attached to one
//! pass ([`Sysfs::memoised`](super::Sysfs::memoised)), because a live tree changes between
//! passes.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The type of a directory entry, as `getdents` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    Dir,
    Link,
    /// A FIFO, socket or device: never read here, but it exists.
    Other,
}

/// What a listing says about one name in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    /// Listed with this type.
    Is(Kind),
    /// Not in a complete listing: the name does not exist.
    Absent,
    /// The directory could not be listed in full (or the type is unknown): ask the kernel.
    Unknown,
}

/// One directory's entries, sorted by name. The names share one buffer: a pass keeps a
/// listing of every directory it met, some thousands of directories of some forty entries, and
/// one allocation per name was most of the memo's allocations and memory.
#[derive(Debug)]
pub(super) struct Listing {
    /// Every name, back to back.
    names: Box<[u8]>,
    /// `(start, end)` of each name in `names`, and its type; sorted by name.
    entries: Box<[(u32, u32, Option<Kind>)]>,
    /// Whether every entry was read; an incomplete listing cannot prove a name absent.
    complete: bool,
}

/// Collects a listing's entries in the order the kernel gives them.
#[derive(Default)]
struct Builder {
    names: Vec<u8>,
    entries: Vec<(u32, u32, Option<Kind>)>,
}

impl Builder {
    fn push(&mut self, name: &[u8], kind: Option<Kind>) {
        // Names are at most 255 bytes; a buffer past 4 GiB is not a directory listing.
        let (Ok(start), Ok(end)) = (
            u32::try_from(self.names.len()),
            u32::try_from(self.names.len() + name.len()),
        ) else {
            return;
        };
        self.names.extend_from_slice(name);
        self.entries.push((start, end, kind));
    }

    fn finish(self, complete: bool) -> Listing {
        let Builder { names, mut entries } = self;
        let name = |e: &(u32, u32, Option<Kind>)| &names[e.0 as usize..e.1 as usize];
        entries.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        Listing {
            names: names.into_boxed_slice(),
            entries: entries.into_boxed_slice(),
            complete,
        }
    }
}

impl Listing {
    fn read(dir: &Path) -> Option<Listing> {
        let iter = match fs::read_dir(dir) {
            Ok(iter) => iter,
            // A missing directory has no entries: the kernel says "not found" for every name
            // below it. (Below a file it says "not a directory", which a read reports as an
            // error: that case is left to the kernel.)
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Some(Listing::missing()),
            Err(_) => return None,
        };
        let mut complete = true;
        let mut entries = Builder::default();
        for entry in iter {
            let Ok(entry) = entry else {
                complete = false;
                continue;
            };
            let kind = entry.file_type().ok().map(|t| {
                if t.is_symlink() {
                    Kind::Link
                } else if t.is_dir() {
                    Kind::Dir
                } else if t.is_file() {
                    Kind::File
                } else {
                    Kind::Other
                }
            });
            entries.push(entry.file_name().as_bytes(), kind);
        }
        Some(entries.finish(complete))
    }

    /// The entries of a directory already open (see [`Sysfs::dir`](super::Sysfs::dir)), so
    /// the descriptor that lists it also serves its reads.
    pub(super) fn from_dir(dir: &mut nix::dir::Dir) -> Listing {
        use nix::dir::Type;
        let mut complete = true;
        let mut entries = Builder::default();
        for entry in dir.iter() {
            // readdir keeps failing once it failed: stop there, as `fs::read_dir` does.
            let Ok(entry) = entry else {
                complete = false;
                break;
            };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = entry.file_type().map(|t| match t {
                Type::Symlink => Kind::Link,
                Type::Directory => Kind::Dir,
                Type::File => Kind::File,
                _ => Kind::Other,
            });
            entries.push(name, kind);
        }
        entries.finish(complete)
    }

    /// The listing of a directory that does not exist: every name in it is absent.
    pub(super) fn missing() -> Listing {
        Builder::default().finish(true)
    }

    fn name(&self, entry: &(u32, u32, Option<Kind>)) -> &[u8] {
        &self.names[entry.0 as usize..entry.1 as usize]
    }

    pub(super) fn entry(&self, name: &OsStr) -> Entry {
        let name = name.as_bytes();
        match self.entries.binary_search_by(|e| self.name(e).cmp(name)) {
            Ok(i) => self.entries[i].2.map_or(Entry::Unknown, Entry::Is),
            Err(_) if self.complete => Entry::Absent,
            Err(_) => Entry::Unknown,
        }
    }

    /// The UTF-8 names, sorted, as [`Sysfs::list`](super::Sysfs::list) returns them.
    pub(super) fn names(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(|e| std::str::from_utf8(self.name(e)).ok().map(str::to_owned))
            .collect()
    }
}

/// The per-pass memo. Shared by the pass's threads, so every table sits behind a lock; each
/// lock is held only for a lookup or an insert, never across a system call.
#[derive(Debug, Default)]
pub(super) struct Memo {
    /// Listings by root-relative real directory; `None` when it could not be listed.
    dirs: Mutex<HashMap<PathBuf, Option<Arc<Listing>>>>,
    /// `readlink` results by root-relative path (`None`: not a link).
    links: Mutex<HashMap<PathBuf, Option<PathBuf>>>,
    /// Directories listed and links read from the kernel, so tests can hold the pass to one
    /// of each per path.
    #[cfg(test)]
    pub(super) asked: Mutex<(usize, usize)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Memo {
    /// The listing of real directory `dir` (root-relative), read on first use.
    pub(super) fn listing(&self, root: &Path, dir: &Path) -> Option<Arc<Listing>> {
        if let Some(known) = lock(&self.dirs).get(dir) {
            return known.clone();
        }
        // The parent's listing, when already read, may say there is no directory here: a
        // missing name lists as empty (as ENOENT would), a file or FIFO not at all (ENOTDIR);
        // asking the kernel would only repeat that.
        if let (Some(parent), Some(name)) = (dir.parent(), dir.file_name())
            && let Some(Some(up)) = lock(&self.dirs).get(parent)
        {
            match up.entry(name) {
                Entry::Absent => return Some(Arc::new(Listing::missing())),
                Entry::Is(Kind::File | Kind::Other) => return None,
                Entry::Is(Kind::Dir | Kind::Link) | Entry::Unknown => {}
            }
        }
        #[cfg(test)]
        {
            lock(&self.asked).0 += 1;
        }
        let listing = Listing::read(&root.join(dir)).map(Arc::new);
        lock(&self.dirs)
            .entry(dir.to_path_buf())
            .or_insert(listing)
            .clone()
    }

    /// The listing of `dir` if it was asked for already (`Some(None)`: it could not be listed).
    pub(super) fn known(&self, dir: &Path) -> Option<Option<Arc<Listing>>> {
        lock(&self.dirs).get(dir).cloned()
    }

    /// Records the listing of `dir` read through an open descriptor (`None`: unlistable); the
    /// first one recorded wins, as with [`Memo::listing`].
    pub(super) fn record(&self, dir: &Path, listing: Option<Listing>) -> Option<Arc<Listing>> {
        #[cfg(test)]
        {
            lock(&self.asked).0 += 1;
        }
        lock(&self.dirs)
            .entry(dir.to_path_buf())
            .or_insert(listing.map(Arc::new))
            .clone()
    }

    /// What the listing of `rel`'s (real) parent says about `rel`.
    pub(super) fn entry(&self, root: &Path, rel: &Path) -> Entry {
        let (Some(dir), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Entry::Unknown;
        };
        match self.listing(root, dir) {
            Some(listing) => listing.entry(name),
            None => Entry::Unknown,
        }
    }

    /// `readlink` of root-relative `rel`, whose parent is real; `None` when it is not a link.
    pub(super) fn read_link(&self, root: &Path, rel: &Path) -> Option<PathBuf> {
        match self.entry(root, rel) {
            Entry::Absent | Entry::Is(Kind::File | Kind::Dir | Kind::Other) => return None,
            Entry::Is(Kind::Link) | Entry::Unknown => {}
        }
        self.read_link_with(rel, || fs::read_link(root.join(rel)).ok())
    }

    /// The remembered `readlink` of `rel`, or `read`'s answer remembered: the caller has
    /// already checked the listing and may read through a directory descriptor.
    pub(super) fn read_link_with(
        &self,
        rel: &Path,
        read: impl FnOnce() -> Option<PathBuf>,
    ) -> Option<PathBuf> {
        if let Some(known) = lock(&self.links).get(rel) {
            return known.clone();
        }
        #[cfg(test)]
        {
            lock(&self.asked).1 += 1;
        }
        let target = read();
        lock(&self.links).insert(rel.to_path_buf(), target.clone());
        target
    }

    /// The listing of `dir` if it was already read, with `dir` as it was keyed then.
    pub(super) fn listed(&self, dir: &Path) -> Option<(PathBuf, Arc<Listing>)> {
        let dirs = lock(&self.dirs);
        let (key, listing) = dirs.get_key_value(dir)?;
        Some((key.clone(), listing.clone()?))
    }
}

#[cfg(test)]
mod tests;
