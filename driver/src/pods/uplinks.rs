//! Bookkeeping of the shared host VLANs (see `crate::netns::uplink`): which are still in use is
//! read from the checkpoint, never counted separately, so the answer after a `kill -9` at any
//! step is the same as without it.

use std::collections::BTreeSet;

use crate::claims::checkpoint::Checkpoint;
use crate::error::Result;
use crate::netns::{Kernel, overlay, uplink};

/// The uplinks some recorded attachment may be using: every attachment with a restore record
/// (written before its uplink is ensured, cleared after its child is gone), except those of
/// the claim `except` (a claim being released).
pub fn in_use(checkpoint: &Checkpoint, except: Option<&str>) -> BTreeSet<String> {
    checkpoint
        .claims
        .values()
        .filter(|c| Some(c.uid.as_str()) != except)
        .flat_map(|c| &c.attachments)
        .filter(|a| a.restore.is_some())
        .filter_map(|a| a.plan.mode.shared_host_link().map(str::to_owned))
        .collect()
}

/// Deletes `name` from the host unless `checkpoint` (current, read under the caller's
/// serialisation) shows a user of it.
pub async fn release_if_unused<K: Kernel>(
    kernel: &K,
    checkpoint: &Checkpoint,
    except: Option<&str>,
    name: &str,
) -> Result<()> {
    if in_use(checkpoint, except).contains(name) {
        return Ok(());
    }
    crate::failpoint::hit("detach:before-uplink-release");
    release(kernel, name).await
}

/// A shared host VLAN, or an overlay segment named by its bridge.
async fn release<K: Kernel>(kernel: &K, name: &str) -> Result<()> {
    match overlay::segment_vni(name) {
        Some(vni) => overlay::release(kernel, vni).await,
        None => uplink::release(kernel, name).await,
    }
}

/// Deletes every uplink on the host that no recorded attachment uses: what a crash between a
/// pod's detach and its uplink's release leaves. Returns the names deleted.
pub async fn sweep<K: Kernel>(kernel: &K, checkpoint: &Checkpoint) -> Result<Vec<String>> {
    let used = in_use(checkpoint, None);
    let mut deleted = Vec::new();
    let mut present = uplink::present(kernel).await?;
    present.extend(overlay::present(kernel).await?);
    for name in present {
        if !used.contains(&name) {
            release(kernel, &name).await?;
            deleted.push(name);
        }
    }
    Ok(deleted)
}
