//! The one port through which knic writes to sysfs: provisioning ([`super::apply`]) and the
//! per-claim vfio-pci binding ([`super::vfio`]) both change the kernel's state only here.
//!
//! One port means one set of safety rules and one fixture: every write names a root-relative
//! path that is resolved with [`Sysfs::try_resolve`] (links clamped to the root, so a link in
//! a fixture tree or a hostile mount cannot send a write outside it) and lands through
//! [`crate::bounded::write_attribute`] (never creates a file, never follows a last link, one
//! `write(2)`), and tests swap in [`super::fixture::FixtureKernel`], which answers the same
//! writes the way the kernel would.

use std::io;
use std::path::Path;

use crate::inventory::Sysfs;
use crate::inventory::sysfs::MAX_LINK_HOPS;

/// Writes to sysfs attribute files, by root-relative path.
///
/// Errors stay `io::Error`s: the kernel answers an attribute write with an errno (EBUSY,
/// ERANGE, ENODEV) and each caller words it for its own report.
pub trait SysfsWrites: Send + Sync {
    /// Writes `value` to the attribute at `rel` (links resolved under the root).
    fn write(&self, sysfs: &Sysfs, rel: &Path, value: &str) -> io::Result<()>;
}

/// The real thing: opens the existing attribute file (never creates one, never follows a link
/// the resolver did not clamp) and writes the value in one `write(2)`, as sysfs requires.
#[derive(Debug, Clone, Copy, Default)]
pub struct LiveWrites;

impl SysfsWrites for LiveWrites {
    fn write(&self, sysfs: &Sysfs, rel: &Path, value: &str) -> io::Result<()> {
        crate::bounded::write_attribute(&resolved(sysfs, rel)?, value.as_bytes())
    }
}

/// The absolute path a write to `rel` lands on, or why there is none: a link chain too long
/// to resolve is never handed to the OS, which would follow it without the root clamp.
pub fn resolved(sysfs: &Sysfs, rel: &Path) -> io::Result<std::path::PathBuf> {
    let real = sysfs.try_resolve(rel).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "writing {}: its symlinks need more than {MAX_LINK_HOPS} hops; not written",
                sysfs.root().join(rel).display()
            ),
        )
    })?;
    Ok(sysfs.root().join(real))
}
