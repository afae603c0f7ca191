// Durable checkpoint writes per pod: one before an attach's first kernel change, one per
// detach, none for a repeated hook; and what a crash between the write and the in-memory
// "attached" mark leaves (recovery checks the kernel instead of trusting the mark).

use std::path::PathBuf;
use std::sync::Arc;

use knic_proto::netconfig::Cidr;
use tokio::sync::oneshot;

use super::*;
use crate::claims::checkpoint::{Attachment, CheckpointStore};
use crate::netns::fake::{FakeKernel, plan};

const POD_UID: &str = "pod-uid";

fn netns_path() -> PathBuf {
    PathBuf::from("/var/run/netns/cni-1")
}

fn pod_ns() -> Ns {
    Ns::Pod(netns_path())
}

fn sandbox() -> PodSandbox {
    PodSandbox {
        id: "sandbox".into(),
        name: "pod".into(),
        uid: POD_UID.into(),
        namespace: "ns".into(),
        netns: Some(netns_path()),
        ips: vec![],
    }
}

struct Setup {
    kernel: FakeKernel,
    claims: Arc<ClaimStore>,
    pods: Arc<PodNetworks<FakeKernel>>,
    dir: tempfile::TempDir,
}

/// `devices` host devices prepared for one pod in one claim.
async fn setup(devices: u8) -> Setup {
    let kernel = FakeKernel::new();
    let host: Cidr = "198.51.100.5/24".parse().expect("cidr");
    let mut plans = Vec::new();
    for d in 0..devices {
        let name = format!("ens1f0v{d}");
        kernel.add_link(
            &Ns::Host,
            &name,
            1500,
            [0xaa, 0, 0, 0, 0, d + 1],
            None,
            &[host],
        );
        let address = format!("192.0.2.{}/24", 10 + d);
        plans.push(plan(
            &format!("dev-{d}"),
            &name,
            &format!("net{}", d + 1),
            &[address.as_str()],
        ));
    }
    kernel.add_namespace(&pod_ns());
    let dir = tempfile::tempdir().expect("tempdir");
    let claims = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
    let claim = PreparedClaim {
        network_label: None,
        namespace: "ns".into(),
        name: "c".into(),
        uid: "claim-uid".into(),
        pod_uid: POD_UID.into(),
        pod_name: "pod".into(),
        devices: vec![],
        configs: vec![],
        prepared_at: 0,
        attachments: plans.into_iter().map(Attachment::planned).collect(),
        allocations: vec![],
        functions: vec![],
    };
    {
        let mut locked = claims.lock().await;
        let mut next = locked.checkpoint().expect("checkpoint").clone();
        next.claims.insert(claim.uid.clone(), claim);
        locked.save(next, true).await.expect("save");
    }
    let pods = PodNetworks::new(kernel.clone(), claims.clone(), Arc::new(LogStatus));
    Setup {
        kernel,
        claims,
        pods,
        dir,
    }
}

/// The attachments as the checkpoint FILE has them (what a restarted driver would read).
fn on_disk(dir: &Path) -> Vec<Attachment> {
    let checkpoint = CheckpointStore::new(dir).load().expect("load");
    checkpoint.claims["claim-uid"].attachments.clone()
}

fn names(kernel: &FakeKernel, ns: &Ns) -> Vec<String> {
    let mut names: Vec<String> = kernel.links(ns).into_iter().map(|l| l.name).collect();
    names.sort();
    names
}

#[tokio::test]
async fn one_durable_write_per_attach_and_per_detach_whatever_the_device_count() {
    for devices in [1, 3] {
        let s = setup(devices).await;
        let before = s.claims.writes();
        s.pods.run_pod_sandbox(sandbox()).await.expect("attach");
        assert_eq!(s.kernel.links(&pod_ns()).len(), usize::from(devices));
        assert_eq!(s.claims.writes() - before, 1, "{devices} device(s): attach");

        // Every device's restore record is on disk; the "attached" marks are not (yet).
        let disk = on_disk(s.dir.path());
        assert!(
            disk.iter()
                .all(|a| a.restore.is_some() && a.netns == Some(netns_path()) && !a.attached),
            "{disk:?}"
        );
        let memory = s
            .claims
            .claim("claim-uid")
            .await
            .expect("store")
            .expect("claim");
        assert!(memory.attachments.iter().all(|a| a.attached));

        // A repeated hook changes nothing and writes nothing.
        s.pods.run_pod_sandbox(sandbox()).await.expect("repeat");
        assert_eq!(s.claims.writes() - before, 1, "{devices} device(s): repeat");

        s.pods.stop_pod_sandbox(sandbox()).await.expect("detach");
        assert_eq!(s.claims.writes() - before, 2, "{devices} device(s): detach");
        assert_eq!(s.kernel.links(&Ns::Host).len(), usize::from(devices));
        assert!(
            on_disk(s.dir.path())
                .iter()
                .all(|a| a.restore.is_none() && a.netns.is_none() && !a.attached)
        );
    }
}

#[tokio::test]
async fn the_attached_marks_ride_along_with_the_next_durable_write() {
    let s = setup(2).await;
    s.pods.run_pod_sandbox(sandbox()).await.expect("attach");
    assert!(on_disk(s.dir.path()).iter().all(|a| !a.attached));
    // Any later durable change of the store carries the noted marks to disk.
    s.claims
        .update("claim-uid", |c| c.prepared_at = 7)
        .await
        .expect("update");
    assert!(on_disk(s.dir.path()).iter().all(|a| a.attached));
}

#[tokio::test]
async fn a_crash_after_the_checkpoint_write_loses_only_marks_that_recovery_rebuilds() {
    let s = setup(3).await;
    s.pods.run_pod_sandbox(sandbox()).await.expect("attach");
    let moves = s.kernel.log().len();
    // kill -9 now: a new driver reads the file (recorded, unmarked) and the same kernel.
    let claims = Arc::new(ClaimStore::open(CheckpointStore::new(s.dir.path())));
    let pods = PodNetworks::new(s.kernel.clone(), claims.clone(), Arc::new(LogStatus));
    pods.synchronize(vec![sandbox()]).await;
    assert_eq!(names(&s.kernel, &pod_ns()), ["net1", "net2", "net3"]);
    let log = s.kernel.log();
    assert!(
        !log[moves..].iter().any(|l| l.contains(" netns ")),
        "the devices were in the pod already; nothing may move them again: {:?}",
        &log[moves..]
    );
    let now = claims
        .claim("claim-uid")
        .await
        .expect("store")
        .expect("claim");
    assert!(
        now.attachments
            .iter()
            .all(|a| a.attached && a.restore.is_some())
    );
    // And the pod's stop still puts every device back exactly.
    pods.stop_pod_sandbox(sandbox()).await.expect("detach");
    assert_eq!(
        names(&s.kernel, &Ns::Host),
        ["ens1f0v0", "ens1f0v1", "ens1f0v2"]
    );
}

#[tokio::test]
async fn a_crash_between_the_record_and_the_first_move_is_finished_by_recovery() {
    let s = setup(3).await;
    // What the one write before any kernel change leaves: every device recorded, none moved.
    let plans = on_disk(s.dir.path());
    let mut record: Vec<crate::claims::Change> = Vec::new();
    for (i, a) in plans.iter().enumerate() {
        let restore = netns::capture(&s.kernel, &a.plan).await.expect("capture");
        let change = move |c: &mut PreparedClaim| {
            c.attachments[i].restore = Some(restore);
            c.attachments[i].netns = Some(netns_path());
        };
        record.push(("claim-uid".into(), Box::new(change)));
    }
    s.claims.update_each(record).await.expect("record");
    let claims = Arc::new(ClaimStore::open(CheckpointStore::new(s.dir.path())));
    let pods = PodNetworks::new(s.kernel.clone(), claims.clone(), Arc::new(LogStatus));
    pods.synchronize(vec![sandbox()]).await;
    assert_eq!(names(&s.kernel, &pod_ns()), ["net1", "net2", "net3"]);
    assert!(names(&s.kernel, &Ns::Host).is_empty());
    // Gone instead: every recorded device is put back.
    pods.synchronize(vec![]).await;
    assert_eq!(
        names(&s.kernel, &Ns::Host),
        ["ens1f0v0", "ens1f0v1", "ens1f0v2"]
    );
    assert!(
        on_disk(s.dir.path())
            .iter()
            .all(|a| a.restore.is_none() && !a.attached)
    );
}

/// A kernel whose first session waits for the test: the attach has read the pod's claims and
/// not yet recorded them.
struct Gated {
    inner: FakeKernel,
    gate: std::sync::Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

impl Kernel for Gated {
    type Session = crate::netns::fake::FakeSession;

    async fn open(&self, ns: &Ns) -> Result<Option<Self::Session>> {
        let gate = self.gate.lock().expect("gate").take();
        if let Some((opened, release)) = gate {
            let _ = opened.send(());
            let _ = release.await;
        }
        self.inner.open(ns).await
    }
}

#[tokio::test]
async fn an_attach_whose_claim_is_unprepared_meanwhile_fails_and_moves_nothing() {
    let s = setup(2).await;
    let (opened_tx, opened) = oneshot::channel();
    let (release, release_rx) = oneshot::channel();
    let kernel = Gated {
        inner: s.kernel.clone(),
        gate: std::sync::Mutex::new(Some((opened_tx, release_rx))),
    };
    let pods = PodNetworks::new(kernel, s.claims.clone(), Arc::new(LogStatus));
    let attach = tokio::spawn(async move { pods.run_pod_sandbox(sandbox()).await });
    opened.await.expect("the attach reads the host");
    // The kubelet unprepares the claim meanwhile.
    {
        let mut locked = s.claims.lock().await;
        let mut next = locked.checkpoint().expect("checkpoint").clone();
        next.claims.remove("claim-uid");
        locked.save(next, true).await.expect("save");
    }
    release.send(()).expect("release");
    let err = attach
        .await
        .expect("task")
        .expect_err("nothing records the claim's devices")
        .to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/c: it was unprepared while its pod was being attached; none of the \
         pod's devices was moved"
    );
    assert_eq!(names(&s.kernel, &Ns::Host), ["ens1f0v0", "ens1f0v1"]);
    assert!(names(&s.kernel, &pod_ns()).is_empty());
}
