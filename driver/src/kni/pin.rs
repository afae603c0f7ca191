//! Sandbox network namespaces for KNI `CreateNetwork`/`DeleteNetwork`: a new namespace kept
//! alive by a bind mount of itself on a file (what `ip netns add` does), under one configured
//! directory only, so a caller can neither pin nor unmount anything elsewhere.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use tonic::Status;

/// Whether the file at `path` is a namespace (nsfs), i.e. a live pin.
pub fn is_pinned(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// The pin's path: `<prefix>/<id>`, where a requested prefix must be the configured one or a
/// directory below it.
pub fn path_for(configured: &Path, requested: &str, id: &str) -> Result<PathBuf, Status> {
    let prefix = if requested.is_empty() {
        configured.to_path_buf()
    } else {
        let requested = super::sandbox::check_path("netns_path_prefix", requested)?;
        if !requested.starts_with(configured) {
            return Err(Status::invalid_argument(format!(
                "netns_path_prefix: {} is not under {} (--kni-netns-dir), the one directory \
                 knic pins namespaces in",
                requested.display(),
                configured.display()
            )));
        }
        requested
    };
    Ok(prefix.join(id))
}

/// A path a DeleteNetwork may unpin: under the configured directory.
pub fn check_owned(configured: &Path, path: &str) -> Result<PathBuf, Status> {
    let path = super::sandbox::check_path("netns_path", path)?;
    if !path.starts_with(configured) || path == configured {
        return Err(Status::invalid_argument(format!(
            "netns_path: {} is not a namespace under {} (--kni-netns-dir); knic removes only \
             the namespaces it pins there",
            path.display(),
            configured.display()
        )));
    }
    Ok(path)
}

/// Creates a network namespace pinned at `path` (directories made `0755`); one already pinned
/// there is kept (a repeated CreateNetwork). A file that is there but not a namespace is
/// refused rather than mounted over.
pub fn create(path: &Path) -> std::io::Result<bool> {
    if is_pinned(path) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() && meta.size() == 0 => {}
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not an empty file or a pinned namespace; refusing to mount over it",
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)?;
        }
        Err(e) => return Err(e),
    }
    // Namespaces belong to threads: a thread of its own unshares and mounts, and ends.
    let pinned = std::thread::scope(|s| {
        s.spawn(|| -> nix::Result<()> {
            unshare(CloneFlags::CLONE_NEWNET)?;
            mount(
                Some("/proc/thread-self/ns/net"),
                path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
        })
        .join()
        .unwrap_or(Err(nix::errno::Errno::EIO))
    });
    if let Err(e) = pinned {
        let _ = std::fs::remove_file(path);
        return Err(e.into());
    }
    Ok(true)
}

/// Unpins and removes the namespace at `path`; `false` when nothing was there.
pub fn delete(path: &Path) -> std::io::Result<bool> {
    if !path.exists() {
        return Ok(false);
    }
    if is_pinned(path) {
        umount2(path, MntFlags::MNT_DETACH)?;
    }
    std::fs::remove_file(path)?;
    Ok(true)
}
