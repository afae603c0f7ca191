//! The driver's durable memory: which claims are prepared, for which pod, with which devices.
//!
//! Unprepare must work after the ResourceClaim is gone and after any crash, so everything needed
//! to undo a prepare lives here. The file is replaced atomically (temp file, fsync, rename, fsync
//! of the directory): after `kill -9` at any instant the file is either the old or the new
//! version, never a mix. Its envelope carries a format version and a CRC-32 of the body, so a
//! truncated or damaged file is recognised and reported instead of being read as "no claims".
//!
//! On-disk form (one JSON object):
//! `{"version":1,"crc32":"<8 hex digits of the CRC-32 of the exact data text>","data":{...}}`.
//!
//! A file that decodes is also checked for consistency, because a hand-edited or restored file
//! can carry a valid checksum and still mean something impossible; each broken rule is an
//! [`Error::CheckpointCorrupt`] naming it:
//! - every claim is keyed by its own uid (`claims.<key>.uid` equals `<key>`), since prepare and
//!   unprepare look claims up by the kubelet's uid;
//! - a device (`pool`/`device`) is in at most one claim, once, unless every entry holding it
//!   has a `shareId` (consumable capacity) and no share id repeats: two owners of one device
//!   would each move it, and unpreparing one would take it from the other.
//!
//! Bounds and access: the file must be a regular file (not a symlink, FIFO or device: a FIFO
//! there hung start-up) of at most [`MAX_FILE_BYTES`], and a save that would exceed that is
//! refused rather than written unreadable. The file is created `0600` and the directories the
//! store creates `0700`, set explicitly whatever the process umask: it names every pod's devices
//! and addresses and is only ever read by the driver (root).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::bounded::{Links, quote, read_regular};
use crate::error::{Error, Result};

/// File name of the checkpoint inside the plugin data directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";
/// The format this driver writes and reads. Bump it, and keep a reader for the old one, when the
/// data's meaning changes.
pub const FORMAT_VERSION: u32 = 1;
const TMP_PREFIX: &str = "checkpoint.json.tmp-";
/// The largest checkpoint read or written. A prepared claim takes a few KiB (devices as
/// published, plans, addresses), so this holds thousands of claims, far more than a node runs,
/// while a file that is not a checkpoint is refused before it is parsed into memory.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Permissions of the checkpoint file: it is read by the driver (root) only.
pub const FILE_MODE: u32 = 0o600;
/// Permissions of every directory the store creates.
pub const DIR_MODE: u32 = 0o700;
/// How much of a uid, pool or device name a corruption reason quotes.
const MAX_ECHOED_BYTES: usize = 256;

/// All prepared claims on this node, keyed by claim UID (the kubelet's key too).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Prepared claims by UID. A BTreeMap keeps the file byte-stable for the same content.
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// Whether two holders of one device conflict: only shares with distinct shareIDs (consumable
/// capacity) may hold a device together. Prepare's busy check and the load-time consistency
/// rule both ask this.
pub fn shares_clash(a: Option<&str>, b: Option<&str>) -> bool {
    a.is_none() || b.is_none() || a == b
}

/// One prepared claim: enough to answer a repeated prepare and to undo it without the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedClaim {
    /// ResourceClaim namespace.
    pub namespace: String,
    /// ResourceClaim name.
    pub name: String,
    /// ResourceClaim UID.
    pub uid: String,
    /// The pod the claim is reserved for; NRI events arrive keyed by pod UID.
    pub pod_uid: String,
    /// The pod's name, for log lines and events people can read.
    pub pod_name: String,
    /// This driver's devices in the allocation, in allocation order.
    pub devices: Vec<PreparedDevice>,
    /// This driver's opaque configuration entries, class entries first, then claim entries.
    pub configs: Vec<OpaqueConfig>,
    /// Unix seconds when the claim was first prepared.
    pub prepared_at: u64,
    /// One attach plan per device, with what detach must restore once attach has begun.
    #[serde(default)]
    pub attachments: Vec<Attachment>,
    /// Addresses allocated from IPAM networks for this claim (`NetworkAddress` objects), so
    /// unprepare releases them from the checkpoint alone, even after the claim and the Network
    /// are gone. Defaulted so checkpoints written before IPAM still load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<crate::claims::ipam::Allocation>,
    /// The claim's PCI functions: vfio-pci bindings (recorded before the bind, so unprepare
    /// gives a function back to its driver even after a crash mid-bind) and RDMA devices, for
    /// the CDI spec and the claim status. Defaulted so older checkpoints still load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<crate::claims::functions::PciFunction>,
    /// The claim's `knic.dev/network` label: Kubernetes copies it from the Network's generated
    /// template, so it names the Network the claim's devices belong to. `None` for a
    /// hand-written claim. Read by prepare's planning only, which records what it means in each
    /// plan (`network`, `fromTemplate`), so it is not checkpointed: `PreparedClaim` refuses
    /// unknown fields, and a field here would make every checkpoint unreadable to the driver
    /// version before it (a rollback).
    #[serde(skip)]
    pub network_label: Option<String>,
}

/// A device's attach plan and its progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Attachment {
    /// What to do, decided at prepare time.
    pub plan: crate::netns::AttachPlan,
    /// The host state recorded before attach began; present exactly while the device may be
    /// away from the host, so a restart knows what to put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<crate::netns::Restore>,
    /// The pod network namespace attach targeted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// Attach finished; false with `restore` set means it was cut short and must be resumed.
    #[serde(default)]
    pub attached: bool,
    /// The last live update of the device's Network (see [`crate::pods::update`]): pending
    /// while its kernel step may not have run, then its result for the claim condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<crate::pods::update::LiveUpdate>,
    /// The DHCP lease held for the pod's interface (`addressing: {mode: dhcp}`): recorded
    /// durably once granted, so a restarted driver renews it and a detach or an unprepare
    /// after a crash releases it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<crate::dhcp::Lease>,
}

impl Attachment {
    /// A device not yet attached: only its plan.
    pub fn planned(plan: crate::netns::AttachPlan) -> Self {
        Attachment {
            plan,
            restore: None,
            netns: None,
            attached: false,
            live: None,
            lease: None,
        }
    }
}

/// One allocated device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedDevice {
    /// The request as written in the allocation result (may be `request/subrequest`).
    pub request: String,
    /// Pool name (the node name for node-local devices).
    pub pool: String,
    /// Device name inside the pool.
    pub device: String,
    /// Consumable-capacity share, when the device is shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// What the allocation consumed of the device's capacities (`consumedCapacity`, as
    /// quantities), e.g. `bandwidth`: the share's egress limit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed: BTreeMap<String, String>,
    /// The device as it was published when the claim was prepared. A device given to a pod
    /// vanishes from the host's view, but it is still allocated: it stays published from this
    /// copy until it comes back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<k8s_openapi::api::resource::v1::Device>,
}

/// An opaque configuration entry for this driver, as captured in the allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpaqueConfig {
    /// `FromClass` or `FromClaim`.
    pub source: String,
    /// Requests it applies to; empty means all.
    #[serde(default)]
    pub requests: Vec<String>,
    /// The driver-defined parameters object.
    pub parameters: serde_json::Value,
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    version: u32,
    crc32: String,
    data: &'a serde_json::value::RawValue,
}

#[derive(Deserialize)]
struct EnvelopeIn<'a> {
    version: u32,
    crc32: String,
    #[serde(borrow)]
    data: &'a serde_json::value::RawValue,
}

/// Reads and atomically replaces the checkpoint file in one directory.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    path: PathBuf,
    /// [`MAX_FILE_BYTES`], smaller in tests so the limit is reached without writing 64 MiB.
    limit: u64,
}

impl CheckpointStore {
    /// A store for `<dir>/checkpoint.json`; nothing is touched until `load` or `save`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let path = dir.join(CHECKPOINT_FILE);
        CheckpointStore {
            dir,
            path,
            limit: MAX_FILE_BYTES,
        }
    }

    #[cfg(test)]
    pub(crate) fn with_limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// The checkpoint file, for messages and tests.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the checkpoint. A missing file is an empty checkpoint (first start); anything that
    /// cannot be fully verified is [`Error::CheckpointCorrupt`]; a path that is not a regular
    /// file or is over [`MAX_FILE_BYTES`] is an I/O error naming it. Temp files left by a crash
    /// in the middle of `save` are removed: the rename never happened, so they hold nothing
    /// that was ever acknowledged to the kubelet.
    pub fn load(&self) -> Result<Checkpoint> {
        self.remove_stale_temp_files();
        let text = match read_regular(&self.path, self.limit, Links::Refuse) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
            Err(e) => return Err(Error::io(format!("reading {}", self.path.display()), e)),
        };
        decode(&text).map_err(|Corrupt(reason)| Error::CheckpointCorrupt {
            path: self.path.clone(),
            reason,
        })
    }

    /// Replaces the checkpoint atomically and durably, as a `0600` file in directories created
    /// `0700`.
    pub fn save(&self, checkpoint: &Checkpoint) -> Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let bytes = encode(checkpoint)?;
        if bytes.len() as u64 > self.limit {
            return Err(Error::io(
                format!("writing {}", self.path.display()),
                std::io::Error::new(
                    std::io::ErrorKind::FileTooLarge,
                    format!(
                        "the checkpoint would be {} bytes, over the {}-byte limit it is read \
                         back with; nothing was written",
                        bytes.len(),
                        self.limit
                    ),
                ),
            ));
        }
        create_private_dirs(&self.dir)
            .map_err(|e| Error::io(format!("creating {}", self.dir.display()), e))?;
        let tmp = self.dir.join(format!(
            "{TMP_PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(FILE_MODE)
                .open(&tmp)?;
            // The umask may have taken bits away, never added them; set the mode exactly.
            file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
            file.write_all(&bytes)?;
            // Data must be on disk before the rename makes it visible.
            file.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            // The rename itself must be durable too.
            fs::File::open(&self.dir)?.sync_all()
        };
        let written = write();
        crate::metrics::metrics()
            .checkpoint_writes
            .inc([crate::metrics::result(&written)]);
        written.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(format!("writing {}", self.path.display()), e)
        })
    }

    fn remove_stale_temp_files(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Creates `dir` and its missing ancestors as [`DIR_MODE`], set explicitly after creation so the
/// umask cannot widen or narrow it. Directories that already exist are left as they are: they
/// may be shared (the kubelet's plugin directory) and are not the store's to change.
fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.as_os_str().is_empty() || fs::symlink_metadata(d).is_ok() {
            break;
        }
        missing.push(d);
        cur = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::DirBuilder::new().mode(DIR_MODE).create(d) {
            Ok(()) => fs::set_permissions(d, fs::Permissions::from_mode(DIR_MODE))?,
            // Another process made it meanwhile: not ours, left alone.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn encode(checkpoint: &Checkpoint) -> Result<Vec<u8>> {
    let data = serde_json::to_string(checkpoint)
        .map_err(|e| Error::io("encoding checkpoint", e.into()))?;
    let raw = serde_json::value::RawValue::from_string(data)
        .map_err(|e| Error::io("encoding checkpoint", e.into()))?;
    let envelope = EnvelopeOut {
        version: FORMAT_VERSION,
        crc32: format!("{:08x}", crc32(raw.get().as_bytes())),
        data: &raw,
    };
    let mut out =
        serde_json::to_vec(&envelope).map_err(|e| Error::io("encoding checkpoint", e.into()))?;
    out.push(b'\n');
    Ok(out)
}

/// serde's reason, which quotes the offending value whole: cut, so a damaged file of any size
/// gives an error of bounded size.
fn serde_reason(e: &serde_json::Error) -> String {
    crate::bounded::cap_text(&e.to_string(), 512).into_owned()
}

/// Why a checkpoint's bytes cannot be trusted; [`CheckpointStore::load`] adds the path.
struct Corrupt(String);

fn decode(bytes: &[u8]) -> std::result::Result<Checkpoint, Corrupt> {
    if bytes.is_empty() {
        return Err(Corrupt("the file is empty (0 bytes)".into()));
    }
    let envelope: EnvelopeIn<'_> = serde_json::from_slice(bytes).map_err(|e| {
        Corrupt(if e.is_eof() {
            format!(
                "the file is truncated ({} bytes, {})",
                bytes.len(),
                serde_reason(&e)
            )
        } else {
            format!("not a knic checkpoint envelope ({})", serde_reason(&e))
        })
    })?;
    if envelope.version != FORMAT_VERSION {
        return Err(Corrupt(format!(
            "format version {} is not supported (this driver reads version {FORMAT_VERSION})",
            envelope.version
        )));
    }
    let computed = format!("{:08x}", crc32(envelope.data.get().as_bytes()));
    if computed != envelope.crc32 {
        return Err(Corrupt(format!(
            "checksum mismatch (stored crc32 {}, computed {computed})",
            envelope.crc32
        )));
    }
    let checkpoint: Checkpoint = serde_json::from_str(envelope.data.get())
        .map_err(|e| Corrupt(format!("data does not decode ({})", serde_reason(&e))))?;
    check_consistency(&checkpoint)?;
    Ok(checkpoint)
}

/// The rules a decoded checkpoint must keep (the module documentation lists them), each
/// reported by name with the claims that break it.
fn check_consistency(checkpoint: &Checkpoint) -> std::result::Result<(), Corrupt> {
    let q = |s: &str| quote(s, MAX_ECHOED_BYTES);
    // (pool, device) → every (claim uid, share id) holding it.
    type Holders<'a> = Vec<(&'a str, Option<&'a str>)>;
    let mut holders: BTreeMap<(&str, &str), Holders<'_>> = BTreeMap::new();
    for (key, claim) in &checkpoint.claims {
        if *key != claim.uid {
            return Err(Corrupt(format!(
                "claim key {} differs from that claim's uid {} (rule: every claim is keyed by \
                 its own uid)",
                q(key),
                q(&claim.uid)
            )));
        }
        for device in &claim.devices {
            let entry = holders
                .entry((device.pool.as_str(), device.device.as_str()))
                .or_default();
            let share = device.share_id.as_deref();
            let clash = entry.iter().find(|(_, other)| shares_clash(share, *other));
            if let Some((other_uid, _)) = clash {
                let whom = if *other_uid == key.as_str() {
                    format!("twice in claim {}", q(key))
                } else {
                    format!("in claims {} and {}", q(other_uid), q(key))
                };
                return Err(Corrupt(format!(
                    "device {}/{} is {whom} (rule: a device belongs to one claim, once, unless \
                     every holder has a distinct shareId)",
                    q(&device.pool),
                    q(&device.device)
                )));
            }
            entry.push((key.as_str(), share));
        }
    }
    Ok(())
}

/// CRC-32 (IEEE 802.3, the zlib one), table built at compile time: a checksum catches damage
/// that still parses as JSON, which a parse error alone would miss.
fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !bytes.iter().fold(!0u32, |crc, &b| {
        TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        let mut cp = Checkpoint::default();
        cp.claims.insert(
            "uid-1".into(),
            PreparedClaim {
                network_label: None,
                namespace: "ns".into(),
                name: "claim".into(),
                uid: "uid-1".into(),
                pod_uid: "pod-1".into(),
                pod_name: "pod".into(),
                devices: vec![PreparedDevice {
                    request: "nic".into(),
                    pool: "node-a".into(),
                    device: "pci-0000-03-00-0".into(),
                    share_id: None,
                    consumed: Default::default(),
                    published: None,
                }],
                configs: vec![OpaqueConfig {
                    source: "FromClaim".into(),
                    requests: vec![],
                    parameters: serde_json::json!({"kind": "NetworkConfig"}),
                }],
                prepared_at: 1_700_000_000,
                attachments: vec![],
                allocations: vec![],
                functions: vec![],
            },
        );
        cp
    }

    #[test]
    fn crc32_matches_the_reference_value() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        assert_eq!(store.load().unwrap(), Checkpoint::default());
    }

    #[test]
    fn round_trip_and_no_temp_files_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        store.save(&sample()).unwrap();
        store.save(&sample()).unwrap();
        assert_eq!(store.load().unwrap(), sample());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![CHECKPOINT_FILE.to_string()]);
    }

    #[test]
    fn every_truncation_is_reported_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        store.save(&sample()).unwrap();
        let full = fs::read(store.path()).unwrap();
        // Every prefix short of the full JSON text must be rejected, never read as "no claims".
        for len in 0..full.len() - 1 {
            fs::write(store.path(), &full[..len]).unwrap();
            let err = store.load().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "checkpoint {} is corrupt: ",
                    store.path().display()
                )),
                "{len}: {err}"
            );
            if len == 0 {
                assert!(err.contains("the file is empty (0 bytes)"), "{err}");
            }
        }
        fs::write(store.path(), &full[..full.len() / 2]).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("the file is truncated"), "{err}");
    }

    #[test]
    fn flipped_byte_inside_data_fails_the_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        store.save(&sample()).unwrap();
        let text = fs::read_to_string(store.path()).unwrap();
        fs::write(store.path(), text.replace("node-a", "node-b")).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("checksum mismatch (stored crc32"), "{err}");
    }

    #[test]
    fn unknown_version_is_rejected_by_number() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        store.save(&sample()).unwrap();
        let text = fs::read_to_string(store.path()).unwrap();
        fs::write(
            store.path(),
            text.replacen("\"version\":1", "\"version\":7", 1),
        )
        .unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(
            err.contains("format version 7 is not supported (this driver reads version 1)"),
            "{err}"
        );
    }

    #[test]
    fn crash_leftover_temp_file_is_ignored_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        store.save(&sample()).unwrap();
        // A crash after writing the temp file but before the rename.
        let tmp = dir.path().join(format!("{TMP_PREFIX}999-0"));
        fs::write(&tmp, b"{\"version\":1,\"cr").unwrap();
        assert_eq!(store.load().unwrap(), sample());
        assert!(!tmp.exists());
    }
    /// Writes `checkpoint` with a valid envelope whatever its content, as a hand edit or a
    /// restore from elsewhere would.
    fn write_unchecked(store: &CheckpointStore, checkpoint: &Checkpoint) {
        fs::write(store.path(), encode(checkpoint).unwrap()).unwrap();
    }

    fn corrupt_reason(store: &CheckpointStore) -> String {
        let err = store.load().unwrap_err();
        assert!(matches!(err, Error::CheckpointCorrupt { .. }), "{err}");
        err.to_string()
    }

    #[test]
    fn a_key_that_is_not_the_claims_uid_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        let mut cp = sample();
        let claim = cp.claims.remove("uid-1").unwrap();
        cp.claims.insert("uid-2".into(), claim);
        write_unchecked(&store, &cp);
        let err = corrupt_reason(&store);
        assert!(
            err.contains(
                "claim key \"uid-2\" differs from that claim's uid \"uid-1\" (rule: every \
                 claim is keyed by its own uid)"
            ),
            "{err}"
        );
        // The echoed key is bounded however long it is.
        let mut cp = sample();
        let claim = cp.claims.remove("uid-1").unwrap();
        cp.claims.insert("k".repeat(100_000), claim);
        write_unchecked(&store, &cp);
        let err = corrupt_reason(&store);
        assert!(err.len() < 2048, "{} bytes", err.len());
        assert!(err.contains("(99744 more bytes cut) differs"), "{err}");
    }

    #[test]
    fn one_device_in_two_claims_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        let mut cp = sample();
        let mut second = cp.claims["uid-1"].clone();
        second.uid = "uid-2".into();
        second.devices[0].request = "other".into();
        cp.claims.insert("uid-2".into(), second);
        write_unchecked(&store, &cp);
        let err = corrupt_reason(&store);
        assert!(
            err.contains(
                "device \"node-a\"/\"pci-0000-03-00-0\" is in claims \"uid-1\" and \"uid-2\" \
                 (rule: a device belongs to one claim, once, unless every holder has a distinct \
                 shareId)"
            ),
            "{err}"
        );

        // Listed twice in one claim.
        let mut cp = sample();
        let claim = cp.claims.get_mut("uid-1").unwrap();
        let again = claim.devices[0].clone();
        claim.devices.push(again);
        write_unchecked(&store, &cp);
        let err = corrupt_reason(&store);
        assert!(
            err.contains("is twice in claim \"uid-1\" (rule: a device belongs"),
            "{err}"
        );

        // One shared and one exclusive holder, or a repeated share id, clash too.
        let mut cp = sample();
        let mut second = cp.claims["uid-1"].clone();
        second.uid = "uid-2".into();
        second.devices[0].share_id = Some("s1".into());
        cp.claims.insert("uid-2".into(), second.clone());
        write_unchecked(&store, &cp);
        assert!(corrupt_reason(&store).contains("is in claims \"uid-1\" and \"uid-2\""));
        cp.claims.get_mut("uid-1").unwrap().devices[0].share_id = Some("s1".into());
        write_unchecked(&store, &cp);
        assert!(corrupt_reason(&store).contains("is in claims \"uid-1\" and \"uid-2\""));

        // Distinct shares of one device (consumable capacity) and one device name in another
        // pool are fine.
        cp.claims.get_mut("uid-1").unwrap().devices[0].share_id = Some("s0".into());
        let mut third = cp.claims["uid-1"].clone();
        third.uid = "uid-3".into();
        third.devices[0].share_id = None;
        third.devices[0].pool = "node-b".into();
        cp.claims.insert("uid-3".into(), third);
        write_unchecked(&store, &cp);
        assert_eq!(store.load().unwrap(), cp);
    }

    #[test]
    fn a_checkpoint_path_that_is_not_a_bounded_regular_file_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        nix::unistd::mkfifo(store.path(), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let loader = store.clone();
        std::thread::spawn(move || {
            let _ = tx.send(loader.load().map_err(|e| e.to_string()));
        });
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("loading a FIFO checkpoint hung")
            .unwrap_err();
        assert_eq!(
            err,
            format!(
                "reading {}: not a regular file (it is a FIFO)",
                store.path().display()
            )
        );

        fs::remove_file(store.path()).unwrap();
        let file = fs::File::create(store.path()).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "reading {}: larger than the 67108864-byte limit for this file",
                store.path().display()
            )
        );

        fs::remove_file(store.path()).unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        CheckpointStore::new(dir.path()).save(&sample()).unwrap();
        fs::rename(store.path(), &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, store.path()).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "reading {}: not a regular file (it is a symlink)",
                store.path().display()
            )
        );
    }

    #[test]
    fn file_is_0600_and_created_directories_0700_whatever_the_umask() {
        use nix::sys::stat::{Mode, umask};
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        for (i, mask) in [0o000, 0o022, 0o077].into_iter().enumerate() {
            let base = dir.path().join(format!("run{i}"));
            let plugin = base.join("plugins/knic.dev");
            let store = CheckpointStore::new(&plugin);
            // The umask is process-wide: set it only around the save under test.
            let old = umask(Mode::from_bits_truncate(mask));
            let saved = store.save(&sample());
            umask(old);
            saved.unwrap();
            assert_eq!(mode(store.path()), 0o600, "file, umask {mask:o}");
            for d in [base.clone(), base.join("plugins"), plugin.clone()] {
                assert_eq!(mode(&d), 0o700, "{}, umask {mask:o}", d.display());
            }
            // A second save replaces the file; the mode stays.
            let old = umask(Mode::from_bits_truncate(mask));
            let saved = store.save(&sample());
            umask(old);
            saved.unwrap();
            assert_eq!(
                mode(store.path()),
                0o600,
                "file after replace, umask {mask:o}"
            );
        }
    }
    #[test]
    fn a_save_over_the_read_limit_is_refused_and_the_old_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path()).with_limit(4096);
        store.save(&sample()).unwrap();
        let mut big = sample();
        big.claims.get_mut("uid-1").unwrap().configs[0].parameters =
            serde_json::Value::String("x".repeat(4096));
        let err = store.save(&big).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "writing {}: the checkpoint would be ",
                store.path().display()
            )),
            "{err}"
        );
        assert!(
            err.ends_with(
                "bytes, over the 4096-byte limit it is read back with; nothing was written"
            ),
            "{err}"
        );
        assert_eq!(store.load().unwrap(), sample());
    }

    #[test]
    fn a_huge_undecodable_value_gives_a_bounded_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        let data = format!("{{\"claims\":\"{}\"}}", "x".repeat(100_000));
        let file = format!(
            "{{\"version\":1,\"crc32\":\"{:08x}\",\"data\":{data}}}",
            crc32(data.as_bytes())
        );
        fs::write(store.path(), file).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("data does not decode ("), "{err}");
        assert!(err.len() < 1500, "{} bytes", err.len());
    }
}
