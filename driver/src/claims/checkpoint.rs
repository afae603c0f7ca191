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

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// File name of the checkpoint inside the plugin data directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";
/// The format this driver writes and reads. Bump it, and keep a reader for the old one, when the
/// data's meaning changes.
pub const FORMAT_VERSION: u32 = 1;
const TMP_PREFIX: &str = "checkpoint.json.tmp-";

/// All prepared claims on this node, keyed by claim UID (the kubelet's key too).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Prepared claims by UID. A BTreeMap keeps the file byte-stable for the same content.
    pub claims: BTreeMap<String, PreparedClaim>,
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
}

impl Attachment {
    /// A device not yet attached: only its plan.
    pub fn planned(plan: crate::netns::AttachPlan) -> Self {
        Attachment {
            plan,
            restore: None,
            netns: None,
            attached: false,
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
}

impl CheckpointStore {
    /// A store for `<dir>/checkpoint.json`; nothing is touched until `load` or `save`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let path = dir.join(CHECKPOINT_FILE);
        CheckpointStore { dir, path }
    }

    /// The checkpoint file, for messages and tests.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the checkpoint. A missing file is an empty checkpoint (first start); anything that
    /// cannot be fully verified is [`Error::CheckpointCorrupt`]. Temp files left by a crash in
    /// the middle of `save` are removed: the rename never happened, so they hold nothing that
    /// was ever acknowledged to the kubelet.
    pub fn load(&self) -> Result<Checkpoint> {
        self.remove_stale_temp_files();
        let text = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
            Err(e) => return Err(Error::io(format!("reading {}", self.path.display()), e)),
        };
        decode(&text).map_err(|Corrupt(reason)| Error::CheckpointCorrupt {
            path: self.path.clone(),
            reason,
        })
    }

    /// Replaces the checkpoint atomically and durably.
    pub fn save(&self, checkpoint: &Checkpoint) -> Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let bytes = encode(checkpoint)?;
        fs::create_dir_all(&self.dir)
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
                .open(&tmp)?;
            file.write_all(&bytes)?;
            // Data must be on disk before the rename makes it visible.
            file.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            // The rename itself must be durable too.
            fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| {
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

/// Why a checkpoint's bytes cannot be trusted; [`CheckpointStore::load`] adds the path.
struct Corrupt(String);

fn decode(bytes: &[u8]) -> std::result::Result<Checkpoint, Corrupt> {
    if bytes.is_empty() {
        return Err(Corrupt("the file is empty (0 bytes)".into()));
    }
    let envelope: EnvelopeIn<'_> = serde_json::from_slice(bytes).map_err(|e| {
        Corrupt(if e.is_eof() {
            format!("the file is truncated ({} bytes, {e})", bytes.len())
        } else {
            format!("not a knic checkpoint envelope ({e})")
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
    serde_json::from_str(envelope.data.get())
        .map_err(|e| Corrupt(format!("data does not decode ({e})")))
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
}
