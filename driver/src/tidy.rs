//! What a graceful stop leaves on the node.
//!
//! A stop is either a restart (an upgrade, a rollout, a node drain's eviction) or the end
//! (`helm uninstall`); the driver cannot tell them apart. What a prepared claim needs must
//! survive either, or the next driver could not unprepare it: the checkpoint, the claim's CDI
//! spec and the hook binary the spec runs. What nothing needs is removed, so an uninstall
//! leaves the node as it was: with no claim prepared the checkpoint says nothing a missing
//! file does not (a missing file is read as the empty checkpoint), and the hook binary is
//! named by no spec. The sockets are the kubelet server's to remove
//! ([`crate::kubelet::serve`]); the plugin directory itself stays, because in the DaemonSet it
//! is a host directory mounted there (the kubelet made it and cannot remove a mount point).

use crate::cdi::CdiSpecs;
use crate::claims::{ClaimStore, Retired};
use crate::error::Result;

/// What [`on_stop`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tidied {
    /// Claims are prepared: the checkpoint, their CDI specs and the hook binary were kept for
    /// the next start.
    KeptForClaims(usize),
    /// Nothing was prepared: the checkpoint file is gone, and the hook binary too unless the
    /// knic CDI specs named here (stale ones: no claim is prepared) are still in the runtime's
    /// directory.
    Removed {
        /// The specs that kept the hook binary; empty when it was removed.
        hook_kept_by: Vec<String>,
    },
}

/// Removes, at a graceful stop, what no prepared claim needs (see the module doc). Runs after
/// every server and task that changes claims has stopped; the store's lock is held throughout,
/// so even a late change cannot interleave. `cdi` is `None` where no hook was installed.
pub async fn on_stop(claims: &ClaimStore, cdi: Option<&CdiSpecs>) -> Result<Tidied> {
    let retired = claims
        .retire_if_empty(|| match cdi {
            Some(cdi) => cdi.remove_unused_hook(),
            None => Ok(Vec::new()),
        })
        .await?;
    Ok(match retired {
        Retired::Kept { claims } => Tidied::KeptForClaims(claims),
        Retired::Removed(hook_kept_by) => Tidied::Removed { hook_kept_by },
    })
}

/// Logs what [`on_stop`] did, for the operator who wonders what an uninstall left.
pub fn report(outcome: &Result<Tidied>) {
    match outcome {
        Ok(Tidied::KeptForClaims(claims)) => tracing::info!(
            claims,
            "claims are still prepared: the checkpoint, their CDI specs and the CDI hook stay \
             for the next start"
        ),
        Ok(Tidied::Removed { hook_kept_by }) if hook_kept_by.is_empty() => {
            tracing::info!("nothing prepared: removed the empty checkpoint and the CDI hook")
        }
        Ok(Tidied::Removed { hook_kept_by }) => tracing::warn!(
            specs = ?hook_kept_by,
            "nothing prepared: removed the empty checkpoint; the CDI hook stays because knic \
             CDI specs no claim owns are still in the runtime's CDI directory"
        ),
        Err(e) => tracing::warn!(error = %e,
            "could not tidy the plugin directory; the checkpoint and the CDI hook stay"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::claims::checkpoint::{Checkpoint, CheckpointStore, PreparedClaim};

    /// A node's directories as the DaemonSet sees them: the plugin directory with the hook in
    /// bin/, and the runtime's CDI directory holding another vendor's spec.
    struct Node {
        _dir: tempfile::TempDir,
        plugin: std::path::PathBuf,
        cdi: CdiSpecs,
        other_spec: std::path::PathBuf,
    }

    fn node() -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let plugin = dir.path().join("plugins/knic.dev");
        let hook = plugin.join("bin/knic-driver");
        crate::cdi::install_hook(&hook).expect("hook");
        let cdi_dir = dir.path().join("cdi");
        std::fs::create_dir(&cdi_dir).expect("cdi dir");
        let other_spec = cdi_dir.join("vendor.com-gpu.json");
        std::fs::write(&other_spec, "{}").expect("other spec");
        Node {
            cdi: CdiSpecs::new(&cdi_dir, &hook),
            plugin,
            other_spec,
            _dir: dir,
        }
    }

    fn claim(uid: &str) -> PreparedClaim {
        PreparedClaim {
            network_label: None,
            namespace: "ns".into(),
            name: "c".into(),
            uid: uid.into(),
            pod_uid: "pod".into(),
            pod_name: "pod".into(),
            devices: vec![],
            configs: vec![],
            prepared_at: 0,
            attachments: vec![crate::claims::checkpoint::Attachment::planned(
                crate::netns::fake::plan("dev-0", "eth0", "net1", &[]),
            )],
            allocations: vec![],
            functions: vec![],
        }
    }

    /// A store whose checkpoint file holds `claims` (written, as after an unprepare left it
    /// empty, even when there are none).
    fn store(plugin: &Path, claims: &[PreparedClaim]) -> ClaimStore {
        let mut checkpoint = Checkpoint::default();
        for c in claims {
            checkpoint.claims.insert(c.uid.clone(), c.clone());
        }
        let file = CheckpointStore::new(plugin);
        file.save(&checkpoint).expect("save");
        ClaimStore::open(file)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[tokio::test]
    async fn nothing_prepared_removes_the_checkpoint_and_the_hook() {
        let node = node();
        let claims = store(&node.plugin, &[]);
        assert_eq!(names(&node.plugin), ["bin", "checkpoint.json"]);
        let tidied = on_stop(&claims, Some(&node.cdi)).await.expect("tidy");
        assert_eq!(
            tidied,
            Tidied::Removed {
                hook_kept_by: vec![]
            }
        );
        // The directory stays (a mount point in the DaemonSet), empty.
        assert!(node.plugin.is_dir());
        assert_eq!(names(&node.plugin), Vec::<String>::new());
        // Another vendor's spec is not knic's to remove.
        assert!(node.other_spec.exists());
        // The next start reads no file as no claims.
        let next = ClaimStore::open(CheckpointStore::new(&node.plugin));
        assert!(next.snapshot().await.expect("load").claims.is_empty());
        // A second stop finds nothing to remove and is fine.
        let again = on_stop(&next, Some(&node.cdi)).await.expect("tidy again");
        assert_eq!(
            again,
            Tidied::Removed {
                hook_kept_by: vec![]
            }
        );
    }

    #[tokio::test]
    async fn a_prepared_claim_keeps_everything_for_the_next_start() {
        let node = node();
        let claims = store(&node.plugin, &[claim("u1")]);
        node.cdi.write(&claim("u1"), None).expect("spec");
        let before = std::fs::read(node.plugin.join("checkpoint.json")).expect("checkpoint");
        let tidied = on_stop(&claims, Some(&node.cdi)).await.expect("tidy");
        assert_eq!(tidied, Tidied::KeptForClaims(1));
        assert_eq!(names(&node.plugin), ["bin", "checkpoint.json"]);
        assert!(node.cdi.hook().is_file());
        assert!(node.cdi.path("u1").exists());
        assert_eq!(
            std::fs::read(node.plugin.join("checkpoint.json")).expect("checkpoint"),
            before,
            "the checkpoint must be left byte for byte"
        );
        // A restart (or an upgrade) finds the claim and can unprepare it.
        let next = ClaimStore::open(CheckpointStore::new(&node.plugin));
        let snapshot = next.snapshot().await.expect("load");
        assert_eq!(snapshot.claims.keys().collect::<Vec<_>>(), ["u1"]);
    }

    #[tokio::test]
    async fn a_stale_knic_spec_keeps_the_hook_but_not_the_empty_checkpoint() {
        let node = node();
        let claims = store(&node.plugin, &[]);
        // A spec no prepared claim owns (a crash between its write and the checkpoint's):
        // a runtime may still create a container from it, which runs the hook.
        node.cdi.write(&claim("stale"), None).expect("spec");
        let tidied = on_stop(&claims, Some(&node.cdi)).await.expect("tidy");
        assert_eq!(
            tidied,
            Tidied::Removed {
                hook_kept_by: vec!["knic.dev-stale.json".into()]
            }
        );
        assert_eq!(names(&node.plugin), ["bin"]);
        assert!(node.cdi.hook().is_file());
    }

    #[tokio::test]
    async fn an_unreadable_checkpoint_removes_nothing() {
        let node = node();
        let path = node.plugin.join("checkpoint.json");
        std::fs::write(&path, b"{\"version\":1,").expect("truncated checkpoint");
        let claims = ClaimStore::open(CheckpointStore::new(&node.plugin));
        let err = on_stop(&claims, Some(&node.cdi))
            .await
            .expect_err("a checkpoint that cannot be read may hold claims");
        assert!(
            err.to_string().contains("the file is truncated"),
            "the error names why: {err}"
        );
        assert_eq!(
            std::fs::read(&path).expect("kept"),
            b"{\"version\":1,",
            "the unreadable file is left for the operator"
        );
        assert!(node.cdi.hook().is_file());
    }

    #[tokio::test]
    async fn without_a_hook_only_the_checkpoint_goes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = store(dir.path(), &[]);
        let tidied = on_stop(&claims, None).await.expect("tidy");
        assert_eq!(
            tidied,
            Tidied::Removed {
                hook_kept_by: vec![]
            }
        );
        assert_eq!(names(dir.path()), Vec::<String>::new());
    }
}
