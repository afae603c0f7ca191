//! Reads and texts with an upper bound, for everything the driver takes from a path it does not
//! fully control or hands to a peer with a message limit.
//!
//! A plain `fs::read` of a path blocks forever when the path is a FIFO nobody writes to, and
//! reads without limit from a huge file or a character device; a plain error string can exceed
//! the 4 MiB a gRPC peer accepts. Both turned one bad input into a hung or failed driver, so
//! every such read and every per-claim error text goes through here.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::OFlag;

/// Whether the last component of a bounded read may be a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow a final symlink (admin-supplied files: ConfigMap mounts are symlinks).
    Follow,
    /// Refuse one: the caller resolved every link itself (sysfs) or owns the file (checkpoint),
    /// so a link there is not what it expects.
    Refuse,
}

/// A node policy file (SR-IOV pools, shared ports) as text: a regular file (a symlink to one
/// is fine: ConfigMap mounts are symlinks) of at most `limit` bytes, in UTF-8. `what` names it
/// in the error ("SR-IOV policy /etc/knic/sriov-policy.yaml").
pub fn read_policy_text(path: &Path, limit: u64, what: &str) -> crate::Result<String> {
    let context = || format!("reading {what} {}", path.display());
    let bytes =
        read_regular(path, limit, Links::Follow).map_err(|e| crate::Error::io(context(), e))?;
    String::from_utf8(bytes).map_err(|e| {
        crate::Error::io(
            context(),
            io::Error::new(io::ErrorKind::InvalidData, e.utf8_error()),
        )
    })
}

/// A policy document: JSON when it starts with `{`, YAML otherwise; `None` for an empty one
/// (the empty policy). The error is the parser's text, capped to `cap` bytes, for the caller
/// to name its setting.
pub fn parse_policy<T: serde::de::DeserializeOwned>(
    text: &str,
    cap: usize,
) -> std::result::Result<Option<T>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let parsed = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    };
    parsed.map(Some).map_err(|e| cap_text(&e, cap).into_owned())
}

/// Reads the whole regular file at `path`, refusing anything else and anything over `limit`
/// bytes.
///
/// The file type is checked before opening (opening a FIFO for reading waits for a writer; a
/// device may act on open) and again on the open descriptor, which is opened non-blocking so a
/// FIFO swapped in between cannot hang the read either. Errors are `io::Error`s whose text says
/// which rule was broken; callers add the path and what they were doing.
pub fn read_regular(path: &Path, limit: u64, links: Links) -> io::Result<Vec<u8>> {
    let meta = match links {
        Links::Follow => std::fs::metadata(path)?,
        Links::Refuse => std::fs::symlink_metadata(path)?,
    };
    if !meta.file_type().is_file() {
        return Err(not_regular(meta.file_type()));
    }
    if meta.len() > limit {
        return Err(too_large(limit));
    }
    let mut flags = OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    if links == Links::Refuse {
        flags |= OFlag::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(not_regular(meta.file_type()));
    }
    read_at_most(file, limit)
}

/// [`read_regular`] without following a final link, for a path the caller has just seen listed
/// as a regular file (`getdents` entry type): that listing is the check before opening, so it
/// is not made again. The descriptor is still opened non-blocking and checked, so a FIFO or
/// device swapped in since cannot hang or flood the read.
///
/// It reads until a short read: a regular file (sysfs attributes included) returns fewer bytes
/// than asked only at its end, which saves the extra `read(2)` that only says "end".
pub fn read_listed_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let flags = OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_NOFOLLOW;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)?;
    read_opened_regular(file, limit)
}

/// [`read_listed_regular`] of the entry `name` of the open directory `dir`, for discovery's
/// hot path: the kernel looks up one component instead of walking the whole path again (most
/// of what a sysfs read cost when a device's dozen attributes share a long directory path),
/// and the descriptor is not `fstat`ed: three system calls per attribute instead of four.
///
/// The listing that said "regular file" is the type check. What a swap since then could plant
/// is still contained: the open neither follows a link nor blocks, a FIFO reads as empty, a
/// directory fails with EISDIR, and no more than `limit` bytes are read from anything (one byte
/// more and it fails as too large).
pub fn read_listed_regular_at(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    limit: u64,
) -> io::Result<Vec<u8>> {
    let flags = OFlag::O_RDONLY
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir, name, flags, nix::sys::stat::Mode::empty())?;
    read_until_short(File::from(fd), limit)
}

/// The checks and the read after a listed regular file was opened non-blocking.
fn read_opened_regular(file: File, limit: u64) -> io::Result<Vec<u8>> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(not_regular(meta.file_type()));
    }
    if meta.len() > limit {
        return Err(too_large(limit));
    }
    read_until_short(file, limit)
}

/// Reads until a short read, failing past `limit` bytes. The first read goes to a small buffer
/// on the stack, copied out at its exact size: attributes are a few bytes, and zeroing a page
/// and growing a vector for each was a visible part of discovery's user time.
fn read_until_short(mut file: File, limit: u64) -> io::Result<Vec<u8>> {
    let mut first = [0u8; 256];
    let n = read_retrying(&mut file, &mut first)?;
    if n < first.len() {
        let bytes = first[..n].to_vec();
        if bytes.len() as u64 > limit {
            return Err(too_large(limit));
        }
        return Ok(bytes);
    }
    let mut bytes = first.to_vec();
    let mut chunk = [0u8; 4096];
    loop {
        if bytes.len() as u64 > limit {
            return Err(too_large(limit));
        }
        let n = read_retrying(&mut file, &mut chunk)?;
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() as u64 > limit {
            return Err(too_large(limit));
        }
        if n < chunk.len() {
            return Ok(bytes);
        }
    }
}

/// One `read(2)`, repeated when a signal interrupted it.
fn read_retrying(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match file.read(buf) {
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Reads at most `limit` bytes, failing when there is more: a silently truncated file would be
/// read as a different, valid-looking content.
fn read_at_most(file: File, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

fn too_large(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("larger than the {limit}-byte limit for this file"),
    )
}

fn not_regular(kind: std::fs::FileType) -> io::Error {
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symlink"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "of an unknown type"
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file (it is {what})"),
    )
}

/// The most a sysfs attribute takes in one `write(2)` (the kernel hands a store at most one
/// page); anything longer cannot be what the caller meant.
pub const MAX_ATTRIBUTE_WRITE: usize = 4096;

/// Writes `value` to the existing sysfs attribute `path` in one `write(2)`.
///
/// Attribute writes act on the kernel (unbind a driver, probe a device), so the target must be
/// exactly what the caller named: the file is never created (a typo or a missing driver must
/// fail, not leave a new file), the last component must not be a symlink, and it must be a
/// regular file (sysfs attributes are) checked before opening and again on the descriptor,
/// opened non-blocking so a FIFO cannot hang the write. The error text names the path and the
/// rule broken.
pub fn write_attribute(path: &Path, value: &[u8]) -> io::Result<()> {
    let refuse = |kind: io::ErrorKind, rule: String| {
        io::Error::new(kind, format!("writing {}: {rule}", path.display()))
    };
    if value.len() > MAX_ATTRIBUTE_WRITE {
        return Err(refuse(
            io::ErrorKind::InvalidInput,
            format!(
                "{} bytes is more than a sysfs attribute takes ({MAX_ATTRIBUTE_WRITE})",
                value.len()
            ),
        ));
    }
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| refuse(e.kind(), format!("the attribute must exist ({e})")))?;
    if !meta.file_type().is_file() {
        let rule = not_regular(meta.file_type()).to_string();
        return Err(refuse(io::ErrorKind::InvalidInput, rule));
    }
    let flags = OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_NOFOLLOW;
    let mut file = OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(flags.bits())
        .open(path)
        .map_err(|e| refuse(e.kind(), e.to_string()))?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        let rule = not_regular(meta.file_type()).to_string();
        return Err(refuse(io::ErrorKind::InvalidInput, rule));
    }
    let written = file
        .write(value)
        .map_err(|e| refuse(e.kind(), e.to_string()))?;
    if written != value.len() {
        return Err(refuse(
            io::ErrorKind::WriteZero,
            format!(
                "only {written} of {} bytes were taken in one write",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Cuts `text` to at most `max` bytes (marker included, for `max` ≥ 96) on a character boundary,
/// preferring the end of a whole problem (`"; "`, the separator of every multi-problem text in
/// knic), and says how much was cut, so a reader knows the list goes on.
pub fn cap_text(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    // The marker's words plus two numbers of at most 20 digits each.
    const MARKER_ROOM: usize = 96;
    let mut end = max.saturating_sub(MARKER_ROOM);
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    // Keep whole problems when a separator is in the last half of what is kept.
    if let Some(sep) = text[..end].rfind("; ")
        && sep >= end / 2
    {
        end = sep;
    }
    let rest = &text[end..];
    let more = rest.matches("; ").count();
    let problems = if more > 0 {
        format!("{more} more problems, ")
    } else {
        String::new()
    };
    Cow::Owned(format!(
        "{} … ({problems}{} more bytes cut)",
        &text[..end],
        rest.len()
    ))
}

/// An echoed value (an entry, a name, a key) quoted with `{:?}` and cut to `max` bytes, so an
/// error that repeats what it was given stays bounded however long the input was.
pub fn quote(value: &str, max: usize) -> String {
    if value.len() <= max {
        return format!("{value:?}");
    }
    let mut end = max;
    while end > 0 && !value.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{:?}… ({} more bytes cut)",
        &value[..end],
        value.len() - end
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_text_keeps_short_text_and_cuts_long_text_with_a_marker() {
        assert_eq!(cap_text("short", 100), "short");
        let long = vec!["problem number x"; 1000].join("; ");
        let cut = cap_text(&long, 1024);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with(" more bytes cut)"), "{cut}");
        assert!(cut.contains("more problems, "), "{cut}");
        // Whole problems only: the kept text ends with a complete problem.
        let kept = cut.split(" … (").next().unwrap();
        assert!(kept.ends_with("problem number x"), "{kept}");
        // Multi-byte characters are never split.
        let wide = "é".repeat(10_000);
        let cut = cap_text(&wide, 333);
        assert!(cut.len() <= 333 && cut.contains("more bytes cut"), "{cut}");
    }

    #[test]
    fn quote_bounds_echoed_values() {
        assert_eq!(quote("eth0", 10), "\"eth0\"");
        let q = quote(&"x".repeat(1000), 16);
        assert_eq!(q, format!("\"{}\"… (984 more bytes cut)", "x".repeat(16)));
    }

    #[test]
    fn read_regular_refuses_directories_and_oversized_files() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_regular(dir.path(), 10, Links::Follow).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file (it is a directory)");
        let file = dir.path().join("f");
        std::fs::write(&file, "0123456789").unwrap();
        assert_eq!(read_regular(&file, 10, Links::Follow).unwrap().len(), 10);
        let err = read_regular(&file, 9, Links::Follow).unwrap_err();
        assert_eq!(
            err.to_string(),
            "larger than the 9-byte limit for this file"
        );
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular(&link, 10, Links::Follow).unwrap().len(), 10);
        let err = read_regular(&link, 10, Links::Refuse).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file (it is a symlink)");
    }

    #[test]
    fn read_listed_regular_reads_whole_files_within_the_limit_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        // Longer than one read chunk, so the end is found across reads.
        let text = "0123456789".repeat(1000);
        std::fs::write(&file, &text).unwrap();
        assert_eq!(read_listed_regular(&file, 10_000).unwrap(), text.as_bytes());
        let err = read_listed_regular(&file, 9_999).unwrap_err();
        assert_eq!(
            err.to_string(),
            "larger than the 9999-byte limit for this file"
        );
        // Exactly one chunk long: the empty read after it ends the file.
        std::fs::write(&file, "x".repeat(4096)).unwrap();
        assert_eq!(read_listed_regular(&file, 4096).unwrap().len(), 4096);
        std::fs::write(&file, "").unwrap();
        assert!(read_listed_regular(&file, 10).unwrap().is_empty());
        // What was listed as a file may have been swapped since: never followed, never waited on.
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = read_listed_regular(&link, 10).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ELOOP), "{err}");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = read_listed_regular(&fifo, 10).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file (it is a FIFO)");
        let err = read_listed_regular(dir.path(), 10).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file (it is a directory)");
    }

    #[test]
    fn read_listed_regular_at_reads_entries_of_an_open_directory_within_the_limit_only() {
        use std::ffi::OsStr;
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().unwrap();
        let text = "0123456789".repeat(1000);
        std::fs::write(dir.path().join("f"), &text).unwrap();
        let open = File::open(dir.path()).unwrap();
        let fd = open.as_fd();
        let name = OsStr::new("f");
        assert_eq!(
            read_listed_regular_at(fd, name, 10_000).unwrap(),
            text.as_bytes()
        );
        let err = read_listed_regular_at(fd, name, 9_999).unwrap_err();
        assert_eq!(
            err.to_string(),
            "larger than the 9999-byte limit for this file"
        );
        let err = read_listed_regular_at(fd, OsStr::new("missing"), 10).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        // Swapped since the listing: never followed, never waited on, never read past the limit.
        std::os::unix::fs::symlink(dir.path().join("f"), dir.path().join("l")).unwrap();
        let err = read_listed_regular_at(fd, OsStr::new("l"), 10).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ELOOP), "{err}");
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(
            read_listed_regular_at(fd, OsStr::new("fifo"), 10)
                .unwrap()
                .is_empty()
        );
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let err = read_listed_regular_at(fd, OsStr::new("d"), 10).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::EISDIR), "{err}");
    }

    #[test]
    fn write_attribute_writes_existing_regular_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("unbind");
        std::fs::write(&file, "old content\n").unwrap();
        write_attribute(&file, b"0000:3b:00.2").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"0000:3b:00.2");

        let missing = dir.path().join("bind");
        let err = write_attribute(&missing, b"x").unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "writing {}: the attribute must exist (",
                missing.display()
            )),
            "{err}"
        );
        assert!(!missing.exists(), "never created");

        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = write_attribute(&fifo, b"x").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "writing {}: not a regular file (it is a FIFO)",
                fifo.display()
            )
        );

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = write_attribute(&link, b"x").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "writing {}: not a regular file (it is a symlink)",
                link.display()
            )
        );
        let err = write_attribute(dir.path(), b"x").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "writing {}: not a regular file (it is a directory)",
                dir.path().display()
            )
        );
        let err = write_attribute(&file, &[b'x'; MAX_ATTRIBUTE_WRITE + 1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "writing {}: 4097 bytes is more than a sysfs attribute takes (4096)",
                file.display()
            )
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"0000:3b:00.2");
    }
}
