//! IPAM without an apiserver, for standalone mode: the same `NetworkAddress` objects, kept as
//! files in one directory, one per address, named as the API names them. Creating the file
//! with `O_EXCL` is the same atomic step as the apiserver's create-by-name: exactly one create
//! of a name succeeds, so two attaches never get one address, and the allocation code of
//! [`crate::claims::ipam`] runs unchanged.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use knic_proto::network::{Network, NetworkAddress};

use super::catalog::Catalog;
use crate::BoxFuture;
use crate::claims::ipam::{AddressBook, ClaimState, Created, Requester};
use crate::error::{Error, Result};

/// The largest allocation file read: an object is a few hundred bytes.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// `NetworkAddress` objects as files in `dir`, the Networks from `catalog`.
pub struct FileAddressBook {
    dir: PathBuf,
    catalog: Arc<dyn Catalog>,
    counter: AtomicU64,
}

impl FileAddressBook {
    /// Keeps the allocations in `dir` (created `0700` when missing).
    pub fn new(dir: impl Into<PathBuf>, catalog: Arc<dyn Catalog>) -> Self {
        FileAddressBook {
            dir: dir.into(),
            catalog,
            counter: AtomicU64::new(0),
        }
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        // Names come from `ipam::allocation_name` (DNS subdomains); anything else is refused
        // rather than joined into a path.
        knic_proto::names::check_dns_subdomain(name)
            .map_err(|e| Error::Ipam(format!("allocation name {name:?}: {e}")))?;
        Ok(self.dir.join(format!("{name}.json")))
    }

    fn read(&self, path: &std::path::Path) -> Result<Option<NetworkAddress>> {
        match crate::bounded::read_regular(path, MAX_FILE_BYTES, crate::bounded::Links::Refuse) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::Ipam(format!("{}: not an allocation: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    fn uid(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        format!("file-{now:x}-{:x}-{n:x}", std::process::id())
    }
}

impl AddressBook for FileAddressBook {
    fn network<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Network>>> {
        Box::pin(async move {
            Ok(self
                .catalog
                .networks()
                .await?
                .into_iter()
                .find(|n| n.metadata.name.as_deref() == Some(name)))
        })
    }

    fn reads_pod_labels(&self) -> bool {
        false
    }

    fn pod_labels<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async { Ok(None) })
    }

    /// Standalone has no Namespace objects: every namespace exists and has no labels, so a
    /// Network offered by label selector is offered only where its selector is empty.
    fn namespace_labels<'a>(
        &'a self,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async { Ok(Some(BTreeMap::new())) })
    }

    fn list<'a>(&'a self, network: &'a str) -> BoxFuture<'a, Result<Vec<NetworkAddress>>> {
        Box::pin(async move {
            let entries = match std::fs::read_dir(&self.dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(Error::io(format!("listing {}", self.dir.display()), e)),
            };
            let mut out = Vec::new();
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                if let Some(address) = self.read(&path)?
                    && address.spec.network == network
                {
                    out.push(address);
                }
            }
            Ok(out)
        })
    }

    fn create<'a>(&'a self, address: &'a NetworkAddress) -> BoxFuture<'a, Result<Created>> {
        Box::pin(async move {
            let name = address.metadata.name.clone().unwrap_or_default();
            let path = self.path(&name)?;
            std::fs::create_dir_all(&self.dir)
                .map_err(|e| Error::io(format!("creating {}", self.dir.display()), e))?;
            let uid = self.uid();
            let mut stored = address.clone();
            stored.metadata.uid = Some(uid.clone());
            let bytes = serde_json::to_vec(&stored)
                .map_err(|e| Error::io("encoding an allocation", e.into()))?;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path);
            let mut file = match file {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Ok(Created::AlreadyExists);
                }
                Err(e) => return Err(Error::io(format!("creating {}", path.display()), e)),
            };
            file.write_all(&bytes)
                .and_then(|()| file.sync_all())
                .map_err(|e| {
                    let _ = std::fs::remove_file(&path);
                    Error::io(format!("writing {}", path.display()), e)
                })?;
            Ok(Created::Created(uid))
        })
    }

    fn delete<'a>(&'a self, name: &'a str, uid: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let path = self.path(name)?;
            match self.read(&path)? {
                Some(found) if found.metadata.uid.as_deref() == Some(uid) => {
                    std::fs::remove_file(&path)
                        .map_err(|e| Error::io(format!("removing {}", path.display()), e))
                }
                _ => Ok(()),
            }
        })
    }

    /// Standalone mode has no claims to look up: an allocation of another sandbox is taken
    /// as live (never taken over), the rule that cannot give one address to two pods.
    fn claim_state<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<ClaimState>> {
        Box::pin(async { Ok(ClaimState::Live) })
    }

    /// Sandboxes' addresses are released at detach, never held: nothing calls this here.
    fn hold<'a>(&'a self, name: &'a str, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            Err(Error::Ipam(format!(
                "allocation {name}: standalone mode holds no addresses"
            )))
        })
    }

    fn stable_in_use(&self, _: &Requester, message: String) {
        tracing::info!("{message}");
    }
}
