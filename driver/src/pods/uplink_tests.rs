// Several pods on one VLAN of one shared port: one host VLAN for all of them, each pod's
// macvlan on top, the last pod out deletes it, and a crash at any step neither leaks it nor
// deletes it under a pod (the fake kernel deletes a link's children with it, as Linux does).

use std::path::PathBuf;
use std::sync::Arc;

use knic_proto::netconfig::ChildKind;

use super::*;
use crate::claims::checkpoint::{Attachment, CheckpointStore};
use crate::netns::fake::{FakeKernel, plan};
use crate::netns::{AttachMode, LinkState, Uplink};

const PARENT: &str = "ens1f0";

fn ns_of(pod: &str) -> Ns {
    Ns::Pod(PathBuf::from(format!("/var/run/netns/{pod}")))
}

fn uplink() -> Uplink {
    Uplink::new(PARENT, 42)
}

fn sandbox(pod: &str) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{pod}"),
        name: pod.into(),
        uid: format!("uid-{pod}"),
        namespace: "ns".into(),
        netns: Some(PathBuf::from(format!("/var/run/netns/{pod}"))),
        ips: vec![],
    }
}

fn claim(pod: &str) -> PreparedClaim {
    let mut p = plan(
        &format!("{PARENT}-{pod}"),
        PARENT,
        "net1",
        &["192.0.2.10/24"],
    );
    p.mode = AttachMode::Child {
        child: ChildKind::Macvlan("bridge".into()),
        uplink: Some(uplink()),
    };
    PreparedClaim {
        network_label: None,
        namespace: "ns".into(),
        name: format!("claim-{pod}"),
        uid: format!("claim-uid-{pod}"),
        pod_uid: format!("uid-{pod}"),
        pod_name: pod.into(),
        devices: vec![],
        configs: vec![],
        prepared_at: 0,
        attachments: vec![Attachment::planned(p)],
        allocations: vec![],
        functions: vec![],
    }
}

struct Node {
    kernel: FakeKernel,
    claims: Arc<ClaimStore>,
    pods: Arc<PodNetworks<FakeKernel>>,
    dir: tempfile::TempDir,
}

impl Node {
    async fn new(pods: &[&str]) -> Node {
        let kernel = FakeKernel::new();
        kernel.add_link(&Ns::Host, PARENT, 9000, [0xaa, 0, 0, 0, 0, 1], None, &[]);
        for pod in pods {
            kernel.add_namespace(&ns_of(pod));
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
        {
            let mut locked = claims.lock().await;
            let mut next = locked.checkpoint().expect("checkpoint").clone();
            for pod in pods {
                let c = claim(pod);
                next.claims.insert(c.uid.clone(), c);
            }
            locked.save(next, true).await.expect("save");
        }
        let pods = PodNetworks::new(kernel.clone(), claims.clone(), Arc::new(LogStatus));
        Node {
            kernel,
            claims,
            pods,
            dir,
        }
    }

    /// The driver after a `kill -9`: same kernel, same checkpoint file, nothing in memory.
    fn restart(&mut self) {
        self.claims = Arc::new(ClaimStore::open(CheckpointStore::new(self.dir.path())));
        self.pods = PodNetworks::new(
            self.kernel.clone(),
            self.claims.clone(),
            Arc::new(LogStatus),
        );
    }

    fn has_uplink(&self) -> bool {
        self.kernel
            .links(&Ns::Host)
            .iter()
            .any(|l| l.name == uplink().name && l.kind.as_deref() == Some("vlan") && l.up)
    }

    fn child_of(&self, pod: &str) -> Option<LinkState> {
        self.kernel
            .links(&ns_of(pod))
            .into_iter()
            .find(|l| l.name == "net1")
    }

    fn vlans_created(&self) -> usize {
        self.kernel
            .log()
            .iter()
            .filter(|l| l.starts_with("host: link add link ens1f0 type vlan id 42"))
            .count()
    }

    /// Marks the pod's attachment as attach records it before any kernel change.
    async fn record_only(&self, pod: &str) {
        let path = PathBuf::from(format!("/var/run/netns/{pod}"));
        let restore = netns::capture(&self.kernel, &claim(pod).attachments[0].plan)
            .await
            .expect("capture");
        self.claims
            .update(&format!("claim-uid-{pod}"), move |c| {
                c.attachments[0].restore = Some(restore);
                c.attachments[0].netns = Some(path);
            })
            .await
            .expect("record");
    }

    /// Clears the pod's record as detach does after the child is gone, without the release
    /// that follows it (a crash in between).
    async fn forget_only(&self, pod: &str) {
        self.claims
            .update(&format!("claim-uid-{pod}"), |c| {
                c.attachments[0].restore = None;
                c.attachments[0].netns = None;
                c.attachments[0].attached = false;
            })
            .await
            .expect("forget");
    }
}

#[tokio::test]
async fn two_pods_share_one_host_vlan_and_the_last_out_deletes_it() {
    let node = Node::new(&["a", "b"]).await;
    node.pods.run_pod_sandbox(sandbox("a")).await.expect("a");
    assert!(node.has_uplink());
    node.pods.run_pod_sandbox(sandbox("b")).await.expect("b");
    assert_eq!(node.vlans_created(), 1, "{:#?}", node.kernel.log());
    for pod in ["a", "b"] {
        let child = node.child_of(pod).expect("child in the pod");
        assert_eq!(child.kind.as_deref(), Some("macvlan"));
        assert!(child.up);
    }
    let log = node.kernel.log();
    assert!(
        log.iter().any(|l| l.starts_with(&format!(
            "host: link add link {} type macvlan mode bridge netns /var/run/netns/a",
            uplink().name
        ))),
        "the child sits on the host VLAN: {log:#?}"
    );

    node.pods
        .stop_pod_sandbox(sandbox("a"))
        .await
        .expect("stop a");
    assert!(node.child_of("a").is_none());
    assert!(node.has_uplink(), "b still uses it");
    assert!(
        node.child_of("b").is_some(),
        "b's child survived a's detach"
    );

    node.pods
        .stop_pod_sandbox(sandbox("b"))
        .await
        .expect("stop b");
    assert!(!node.has_uplink(), "the last pod out deletes it");
    let host: Vec<String> = node
        .kernel
        .links(&Ns::Host)
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(host, [PARENT], "the host is as it was");
}

#[tokio::test]
async fn pods_attached_at_once_get_one_host_vlan() {
    let node = Node::new(&["a", "b", "c", "d"]).await;
    let (a, b, c, d) = tokio::join!(
        node.pods.run_pod_sandbox(sandbox("a")),
        node.pods.run_pod_sandbox(sandbox("b")),
        node.pods.run_pod_sandbox(sandbox("c")),
        node.pods.run_pod_sandbox(sandbox("d")),
    );
    for r in [a, b, c, d] {
        r.expect("attach");
    }
    assert_eq!(node.vlans_created(), 1);
    let (a, b) = tokio::join!(
        node.pods.stop_pod_sandbox(sandbox("a")),
        node.pods.stop_pod_sandbox(sandbox("b")),
    );
    a.expect("stop a");
    b.expect("stop b");
    assert!(node.has_uplink());
    assert!(node.child_of("c").is_some() && node.child_of("d").is_some());
    let (c, d) = tokio::join!(
        node.pods.stop_pod_sandbox(sandbox("c")),
        node.pods.stop_pod_sandbox(sandbox("d")),
    );
    c.expect("stop c");
    d.expect("stop d");
    assert!(!node.has_uplink());
}

#[tokio::test]
async fn a_crash_between_a_detach_and_its_release_is_swept_at_restart() {
    // Only pod: the VLAN is left behind by the crash and swept.
    let mut node = Node::new(&["a"]).await;
    node.pods.run_pod_sandbox(sandbox("a")).await.expect("a");
    node.kernel.delete_namespace(&ns_of("a"));
    node.forget_only("a").await;
    node.restart();
    assert!(node.has_uplink(), "left by the crash");
    node.pods.synchronize(vec![]).await;
    assert!(!node.has_uplink(), "swept: nothing records it");

    // With another pod still on it: the sweep keeps it.
    let mut node = Node::new(&["a", "b"]).await;
    node.pods.run_pod_sandbox(sandbox("a")).await.expect("a");
    node.pods.run_pod_sandbox(sandbox("b")).await.expect("b");
    node.kernel.delete_namespace(&ns_of("a"));
    node.forget_only("a").await;
    node.restart();
    node.pods.synchronize(vec![sandbox("b")]).await;
    assert!(node.has_uplink(), "b is recorded on it");
    assert!(node.child_of("b").is_some());
}

#[tokio::test]
async fn a_crash_after_the_record_resumes_or_cleans_up() {
    // Recorded, nothing made yet, pod still running: the restart makes VLAN and child.
    let mut node = Node::new(&["a"]).await;
    node.record_only("a").await;
    node.restart();
    node.pods.synchronize(vec![sandbox("a")]).await;
    assert!(node.has_uplink());
    assert!(node.child_of("a").is_some());

    // Recorded, VLAN made, then the pod went away meanwhile: the restart deletes the VLAN.
    let mut node = Node::new(&["a"]).await;
    node.record_only("a").await;
    {
        let mut host = node.kernel.open(&Ns::Host).await.unwrap().unwrap();
        netns::uplink::ensure(&mut host, PARENT, &uplink())
            .await
            .expect("ensure");
    }
    node.kernel.delete_namespace(&ns_of("a"));
    node.restart();
    node.pods.synchronize(vec![]).await;
    assert!(!node.has_uplink(), "no pod uses it");
    let records = node.claims.claim("claim-uid-a").await.unwrap().unwrap();
    assert!(records.attachments[0].restore.is_none());
}

#[tokio::test]
async fn unprepare_releases_the_vlan_only_when_no_other_claim_holds_it() {
    let node = Node::new(&["a", "b"]).await;
    node.pods.run_pod_sandbox(sandbox("a")).await.expect("a");
    node.pods.run_pod_sandbox(sandbox("b")).await.expect("b");
    let now = node.claims.snapshot().await.expect("snapshot");
    let a = now.claims["claim-uid-a"].clone();
    node.pods.release(&a, &now).await.expect("release a");
    assert!(node.has_uplink(), "b holds it");
    assert!(node.child_of("b").is_some());
    // Unprepare forgets a; then b is released the same way.
    let mut later = now.clone();
    later.claims.remove("claim-uid-a");
    let b = later.claims["claim-uid-b"].clone();
    node.pods.release(&b, &later).await.expect("release b");
    assert!(!node.has_uplink());
}

#[tokio::test]
async fn a_failed_first_attach_takes_its_vlan_with_it_but_never_anothers() {
    let node = Node::new(&["a", "b"]).await;
    node.kernel.fail_on(
        "/var/run/netns/a: addr add 192.0.2.10/24",
        "Cannot assign requested address",
    );
    let err = node
        .pods
        .run_pod_sandbox(sandbox("a"))
        .await
        .expect_err("fails");
    assert!(err.to_string().contains("Cannot assign"), "{err}");
    assert!(!node.has_uplink(), "made for a, gone with a");
    assert!(node.child_of("a").is_none());

    node.pods.run_pod_sandbox(sandbox("b")).await.expect("b");
    node.kernel.fail_on(
        "/var/run/netns/a: addr add 192.0.2.10/24",
        "Cannot assign requested address",
    );
    node.pods
        .run_pod_sandbox(sandbox("a"))
        .await
        .expect_err("fails again");
    assert!(node.has_uplink(), "b's VLAN stays");
    assert!(node.child_of("b").is_some());
}

#[tokio::test]
async fn a_link_of_that_name_that_is_not_a_vlan_is_refused_not_used() {
    let node = Node::new(&["a"]).await;
    node.kernel.add_link(
        &Ns::Host,
        &uplink().name,
        1500,
        [0xaa, 0, 0, 0, 0, 9],
        Some("bridge"),
        &[],
    );
    let err = node
        .pods
        .run_pod_sandbox(sandbox("a"))
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("a bridge link of that name already exists and is not knic's VLAN"),
        "{err}"
    );
    node.pods.synchronize(vec![]).await;
    assert!(
        node.kernel
            .links(&Ns::Host)
            .iter()
            .any(|l| l.name == uplink().name),
        "someone else's link is never swept"
    );
}
