//! Keeps every overlay segment on this node holding exactly the forwarding entries
//! [`super::fdb::desired`] computes: on each change of the announced endpoints, after pods
//! joined a segment, and every period (so an entry removed by hand, or a write that failed,
//! is put right). Level-based and stateless: the kernel holds what is, the cluster says what
//! should be, and nothing is kept in the checkpoint.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use knic_proto::network::Network;
use tokio::sync::{Notify, watch};

use super::fdb::{self, Endpoint};
use crate::error::Result;
use crate::netns::overlay::{self, segment_vni, vxlan_name};
use crate::netns::{Kernel, Ns, Session, open};

/// What one pass changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Segments present on the node.
    pub segments: usize,
    /// Entries added.
    pub added: usize,
    /// Entries removed.
    pub removed: usize,
    /// Segments whose entries could not be read or written (with the reason), retried next
    /// pass.
    pub failed: Vec<String>,
}

/// One pass: every segment present on the node gets its desired entries.
pub async fn sync_once<K: Kernel>(
    kernel: &K,
    local_vtep: IpAddr,
    endpoints: &[Endpoint],
) -> Result<Pass> {
    let vnis: BTreeSet<u32> = overlay::present(kernel)
        .await?
        .iter()
        .filter_map(|name| segment_vni(name))
        .collect();
    let want = fdb::desired(endpoints, local_vtep, &vnis);
    for warning in &want.warnings {
        tracing::warn!("{warning}");
    }
    let mut pass = Pass {
        segments: vnis.len(),
        ..Pass::default()
    };
    let mut host = open(kernel, &Ns::Host).await?;
    for (vni, entries) in &want.entries {
        let vxlan = vxlan_name(*vni);
        let outcome = async {
            let current = host.fdb(&vxlan).await?;
            let (remove, add) = fdb::diff(&current, entries);
            if !remove.is_empty() || !add.is_empty() {
                host.set_fdb(&vxlan, &add, &remove).await?;
                tracing::info!(
                    vni,
                    added = add.len(),
                    removed = remove.len(),
                    "overlay forwarding entries updated"
                );
            }
            Ok::<_, crate::Error>((add.len(), remove.len()))
        }
        .await;
        match outcome {
            Ok((added, removed)) => {
                pass.added += added;
                pass.removed += removed;
            }
            Err(e) => pass.failed.push(format!("VNI {vni}: {e}")),
        }
    }
    Ok(pass)
}

/// Runs passes until `endpoints`' sender is gone: after each change of the endpoints or of
/// the Networks, each notification of `joined`, and every `period`. Nothing is written before
/// both the announcements and the Networks have been listed once: a restarted driver must not
/// empty its segments' entries (and cut its pods off) while it does not know them yet.
pub async fn run<K: Kernel>(
    kernel: K,
    local_vtep: IpAddr,
    mut endpoints: watch::Receiver<Option<Arc<Vec<Endpoint>>>>,
    mut networks: watch::Receiver<Arc<Vec<Network>>>,
    joined: Arc<Notify>,
    period: Duration,
) {
    loop {
        let current = endpoints.borrow_and_update().clone();
        let known = networks.borrow_and_update().clone();
        if let Some(current) = current.filter(|_| !known.is_empty()) {
            let (admitted, warnings) = fdb::admitted(&current, &known);
            for warning in &warnings {
                tracing::warn!("{warning}");
            }
            match sync_once(&kernel, local_vtep, &admitted).await {
                Ok(pass) => {
                    for failure in &pass.failed {
                        tracing::warn!(failure = %failure, "overlay forwarding entries not synced; retried");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "overlay sync pass failed; retried"),
            }
        }
        tokio::select! {
            changed = endpoints.changed() => if changed.is_err() { return },
            changed = networks.changed() => if changed.is_err() { return },
            () = joined.notified() => {}
            () = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::fake::FakeKernel;
    use crate::netns::overlay::{FdbEntry, Segment};

    fn ep(name: &str, last: u8, vtep: &str) -> Endpoint {
        Endpoint {
            name: name.into(),
            network: "ovl".into(),
            vni: 4242,
            mac: [2, 0, 0, 0, 0, last],
            vtep: vtep.parse().unwrap(),
            since: i64::from(last),
            held: false,
        }
    }

    #[tokio::test]
    async fn a_pass_writes_only_the_difference_and_follows_pods_leaving() {
        let k = FakeKernel::new();
        k.add_link(&Ns::Host, "eth1", 1500, [2, 0, 0, 0, 0, 1], None, &[]);
        let local: IpAddr = "10.99.0.1".parse().unwrap();
        // No segment yet: nothing to do, however many endpoints are announced.
        let all = vec![
            ep("mine", 1, "10.99.0.1"),
            ep("b1", 2, "10.99.0.2"),
            ep("c1", 3, "10.99.0.3"),
        ];
        assert_eq!(sync_once(&k, local, &all).await.unwrap(), Pass::default());
        {
            let mut s = k.open(&Ns::Host).await.unwrap().unwrap();
            s.ensure_segment(&Segment::new(4242, 4789, local, "eth1", 1450))
                .await
                .unwrap();
        }
        let pass = sync_once(&k, local, &all).await.unwrap();
        assert_eq!((pass.segments, pass.added, pass.removed), (1, 4, 0));
        let mut s = k.open(&Ns::Host).await.unwrap().unwrap();
        let entry = |last: u8, dst: &str| FdbEntry {
            mac: [2, 0, 0, 0, 0, last],
            dst: dst.parse().unwrap(),
        };
        let flood = |dst: &str| FdbEntry {
            mac: [0; 6],
            dst: dst.parse().unwrap(),
        };
        assert_eq!(
            s.fdb("knx001092").await.unwrap(),
            vec![
                flood("10.99.0.2"),
                flood("10.99.0.3"),
                entry(2, "10.99.0.2"),
                entry(3, "10.99.0.3")
            ]
        );
        // At rest nothing is written.
        let writes = k.log().len();
        let pass = sync_once(&k, local, &all).await.unwrap();
        assert_eq!((pass.added, pass.removed), (0, 0));
        assert_eq!(k.log().len(), writes);
        // c's pod left: its node's flood entry and its MAC go.
        let pass = sync_once(&k, local, &all[..2]).await.unwrap();
        assert_eq!((pass.added, pass.removed), (0, 2));
        assert_eq!(
            s.fdb("knx001092").await.unwrap(),
            vec![flood("10.99.0.2"), entry(2, "10.99.0.2")]
        );
    }

    #[tokio::test]
    async fn a_failing_segment_is_reported_and_the_others_synced() {
        let k = FakeKernel::new();
        k.add_link(&Ns::Host, "eth1", 1500, [2, 0, 0, 0, 0, 1], None, &[]);
        let local: IpAddr = "10.99.0.1".parse().unwrap();
        {
            let mut s = k.open(&Ns::Host).await.unwrap().unwrap();
            for vni in [4242, 7] {
                s.ensure_segment(&Segment::new(vni, 4789, local, "eth1", 1450))
                    .await
                    .unwrap();
            }
        }
        k.fail_on("host: fdb knx001092", "No buffer space available");
        let mut other = ep("b7", 9, "10.99.0.2");
        other.vni = 7;
        let pass = sync_once(&k, local, &[ep("b1", 2, "10.99.0.2"), other])
            .await
            .unwrap();
        assert_eq!(pass.segments, 2);
        assert_eq!(pass.added, 2, "VNI 7 synced");
        assert_eq!(pass.failed.len(), 1);
        assert!(
            pass.failed[0].starts_with("VNI 4242: "),
            "{:?}",
            pass.failed
        );
        assert!(
            pass.failed[0].contains("No buffer space available"),
            "{:?}",
            pass.failed
        );
    }
}
