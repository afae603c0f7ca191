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
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::fs::{FileType, Mode, OFlags, RawDir};
use rustix::io::Errno;

/// The `getdents64` buffer: glibc's `opendir` size, so a sysfs device directory (some forty
/// entries, under 2 KiB) comes in one call plus the empty one that says "end".
const LIST_BUFFER_BYTES: usize = 32 * 1024;

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
    /// Room for a sysfs device directory (some forty names) from the start: growing both
    /// vectors step by step was a dozen reallocations per directory.
    fn for_a_device() -> Builder {
        Builder {
            names: Vec::with_capacity(1024),
            entries: Vec::with_capacity(64),
        }
    }

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
    /// Lists `dir` by path, as `fs::read_dir` would open it (final links followed), through
    /// [`Listing::from_fd`].
    fn read(dir: &Path) -> Option<Listing> {
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match rustix::fs::openat(rustix::fs::CWD, dir, flags, Mode::empty()) {
            Ok(fd) => Some(Listing::from_fd(fd.as_fd())),
            // A missing directory has no entries: the kernel says "not found" for every name
            // below it. (Below a file it says "not a directory", which a read reports as an
            // error: that case is left to the kernel.)
            Err(Errno::NOENT) => Some(Listing::missing()),
            Err(_) => None,
        }
    }

    /// The entries of the directory open as `fd`, by `getdents64` straight into a buffer on
    /// the stack: `opendir`/`readdir` would add an `fstat`, two `fcntl`s and (nix) an `lseek`
    /// per directory, and `fs::read_dir` an allocation per entry, for a thousand directories a
    /// pass. A read error ends the listing as incomplete, so it proves no name absent.
    pub(super) fn from_fd(fd: BorrowedFd<'_>) -> Listing {
        let mut buf = [MaybeUninit::<u8>::uninit(); LIST_BUFFER_BYTES];
        let mut raw = RawDir::new(fd, &mut buf);
        let mut complete = true;
        let mut entries = Builder::for_a_device();
        while let Some(entry) = raw.next() {
            // getdents keeps failing once it failed (and `next` would ask again): stop there,
            // as `fs::read_dir` does.
            let Ok(entry) = entry else {
                complete = false;
                break;
            };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Symlink => Some(Kind::Link),
                FileType::Directory => Some(Kind::Dir),
                FileType::RegularFile => Some(Kind::File),
                FileType::Unknown => None,
                _ => Some(Kind::Other),
            };
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

    /// The UTF-8 names that start with `prefix`, sorted, as
    /// [`Sysfs::list_with_prefix`](super::Sysfs::list_with_prefix) returns them; found without
    /// allocating the others, which callers looking for `virtfn*` or `upper_*` among forty
    /// names did per device.
    pub(super) fn names_with_prefix(&self, prefix: &str) -> Vec<String> {
        let prefix = prefix.as_bytes();
        // Sorted by name, so the matches are one run starting where the prefix would sort.
        let start = self.entries.partition_point(|e| self.name(e) < prefix);
        self.entries[start..]
            .iter()
            .take_while(|e| self.name(e).starts_with(prefix))
            .filter_map(|e| std::str::from_utf8(self.name(e)).ok().map(str::to_owned))
            .collect()
    }
}

/// The per-pass memo. Shared by the pass's threads, so every table sits behind a lock; each
/// lock is held only for a lookup or an insert, never across a system call.
#[derive(Debug, Default)]
pub(super) struct Memo {
    /// Listings by root-relative real directory; `None` when it could not be listed.
    dirs: Mutex<PathMap<Option<Arc<Listing>>>>,
    /// `readlink` results by root-relative path (`None`: not a link).
    links: Mutex<PathMap<Option<PathBuf>>>,
    /// Directories listed and links read from the kernel, so tests can hold the pass to one
    /// of each per path.
    #[cfg(test)]
    pub(super) asked: Mutex<(usize, usize)>,
}

/// The memo's tables, keyed by a path's bytes with [`FastHash`]: hashing a `Path` walks its
/// components, and a pass makes tens of thousands of lookups. The memo only ever stores real
/// paths, which are built component by component and so spelled one way; a lookup spelled
/// another way ("a//b") only misses, and the caller asks the kernel.
type PathMap<V> = HashMap<Box<[u8]>, V, BuildHasherDefault<FastHash>>;

fn key(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// FxHash (rustc's): a multiply and a rotate per eight bytes. Its keys are sysfs paths, which
/// only the kernel and root name, so there is no one to choose colliding keys.
#[derive(Default)]
struct FastHash(u64);

impl Hasher for FastHash {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        self.add(u64::from_le_bytes(word) ^ rest.len() as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl FastHash {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Memo {
    /// The listing of real directory `dir` (root-relative), read on first use.
    pub(super) fn listing(&self, root: &Path, dir: &Path) -> Option<Arc<Listing>> {
        if let Some(known) = lock(&self.dirs).get(key(dir)) {
            return known.clone();
        }
        // The parent's listing, when already read, may say there is no directory here: a
        // missing name lists as empty (as ENOENT would), a file or FIFO not at all (ENOTDIR);
        // asking the kernel would only repeat that.
        if let (Some(parent), Some(name)) = (dir.parent(), dir.file_name())
            && let Some(Some(up)) = lock(&self.dirs).get(key(parent))
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
            .entry(key(dir).into())
            .or_insert(listing)
            .clone()
    }

    /// The listing of `dir` if it was asked for already (`Some(None)`: it could not be listed).
    pub(super) fn known(&self, dir: &Path) -> Option<Option<Arc<Listing>>> {
        lock(&self.dirs).get(key(dir)).cloned()
    }

    /// Records the listing of `dir` read through an open descriptor (`None`: unlistable); the
    /// first one recorded wins, as with [`Memo::listing`].
    pub(super) fn record(&self, dir: &Path, listing: Option<Listing>) -> Option<Arc<Listing>> {
        #[cfg(test)]
        {
            lock(&self.asked).0 += 1;
        }
        lock(&self.dirs)
            .entry(key(dir).into())
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
        if let Some(known) = lock(&self.links).get(key(rel)) {
            return known.clone();
        }
        #[cfg(test)]
        {
            lock(&self.asked).1 += 1;
        }
        let target = read();
        lock(&self.links).insert(key(rel).into(), target.clone());
        target
    }

    /// The listing of `dir` if it was already read, with `dir` as it was keyed then.
    pub(super) fn listed(&self, dir: &Path) -> Option<(PathBuf, Arc<Listing>)> {
        let dirs = lock(&self.dirs);
        let (found, listing) = dirs.get_key_value(key(dir))?;
        let listing = listing.clone()?;
        Some((PathBuf::from(OsStr::from_bytes(found)), listing))
    }
}

#[cfg(test)]
mod tests;
