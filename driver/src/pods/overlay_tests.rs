// Several pods of one overlay Network on one node: one segment (bridge + VXLAN device) for all
// of them, each pod's veth on the bridge, the last pod out deletes the segment, and a crash
// between a detach and its release neither leaks it nor deletes it under a pod.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::claims::checkpoint::{Attachment, CheckpointStore};
use crate::netns::AttachMode;
use crate::netns::fake::{FakeKernel, plan};
use crate::netns::overlay::Segment;

const UNDERLAY: &str = "eth1";

fn ns_of(pod: &str) -> Ns {
    Ns::Pod(PathBuf::from(format!("/var/run/netns/{pod}")))
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

fn claim(pod: &str, index: u8) -> PreparedClaim {
    let mut p = plan(
        "overlay",
        UNDERLAY,
        "net1",
        &[&format!("10.42.0.{index}/24")],
    );
    p.mtu = None;
    p.mac = Some([2, 0x4b, 0, 0, 0, index]);
    p.mode = AttachMode::Overlay {
        segment: Segment::new(4242, 4789, "10.99.0.1".parse().unwrap(), UNDERLAY, 1450),
        host_veth: format!("knh-{pod}"),
    };
    PreparedClaim {
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
        network_label: None,
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
        kernel.add_link(&Ns::Host, UNDERLAY, 1500, [0xaa, 0, 0, 0, 0, 1], None, &[]);
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
        {
            let mut locked = claims.lock().await;
            let mut next = locked.checkpoint().expect("checkpoint").clone();
            for (i, pod) in pods.iter().enumerate() {
                kernel.add_namespace(&ns_of(pod));
                let c = claim(pod, i as u8 + 1);
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

    fn restart(&mut self) {
        self.claims = Arc::new(ClaimStore::open(CheckpointStore::new(self.dir.path())));
        self.pods = PodNetworks::new(
            self.kernel.clone(),
            self.claims.clone(),
            Arc::new(LogStatus),
        );
    }

    /// Host links other than the underlay, as `name kind`.
    fn host_extras(&self) -> Vec<String> {
        self.kernel
            .links(&Ns::Host)
            .into_iter()
            .filter(|l| l.name != UNDERLAY)
            .map(|l| format!("{} {}", l.name, l.kind.unwrap_or_default()))
            .collect()
    }

    fn has_segment(&self) -> bool {
        let extras = self.host_extras();
        extras.contains(&"knb001092 bridge".to_string())
            && extras.contains(&"knx001092 vxlan".to_string())
    }

    fn segments_created(&self) -> usize {
        self.kernel
            .log()
            .iter()
            .filter(|l| l.starts_with("host: segment 4242 port 4789 local 10.99.0.1 mtu 1450"))
            .count()
    }
}

#[tokio::test]
async fn pods_share_one_segment_and_the_last_out_deletes_it() {
    let node = Node::new(&["a", "b", "c"]).await;
    let (a, b) = tokio::join!(
        node.pods.run_pod_sandbox(sandbox("a")),
        node.pods.run_pod_sandbox(sandbox("b")),
    );
    a.expect("a");
    b.expect("b");
    node.pods.run_pod_sandbox(sandbox("c")).await.expect("c");
    // Ensured per pod (each call finds knic's own links), made once.
    assert!(node.has_segment(), "{:?}", node.host_extras());
    assert_eq!(node.segments_created(), 3, "{:#?}", node.kernel.log());
    for (i, pod) in ["a", "b", "c"].iter().enumerate() {
        let net1 = node
            .kernel
            .links(&ns_of(pod))
            .into_iter()
            .find(|l| l.name == "net1")
            .expect("veth end in the pod");
        assert_eq!(net1.kind.as_deref(), Some("veth"));
        assert_eq!(net1.mtu, 1450, "the segment's MTU when the plan sets none");
        assert_eq!(net1.mac, Some([2, 0x4b, 0, 0, 0, i as u8 + 1]));
        assert!(net1.up);
        assert!(
            net1.addresses
                .contains(&format!("10.42.0.{}/24", i + 1).parse().unwrap())
        );
    }
    assert!(
        node.kernel.log().iter().any(|l| l.starts_with(
            "host: link add knh-a master knb001092 type veth peer netns /var/run/netns/a"
        )),
        "{:#?}",
        node.kernel.log()
    );

    node.pods
        .stop_pod_sandbox(sandbox("a"))
        .await
        .expect("stop a");
    assert!(node.has_segment(), "b and c still use it");
    assert!(!node.host_extras().iter().any(|l| l.starts_with("knh-a ")));
    let (b, c) = tokio::join!(
        node.pods.stop_pod_sandbox(sandbox("b")),
        node.pods.stop_pod_sandbox(sandbox("c")),
    );
    b.expect("stop b");
    c.expect("stop c");
    assert!(
        node.host_extras().is_empty(),
        "the host is as it was: {:?}",
        node.host_extras()
    );
}

#[tokio::test]
async fn a_segment_nobody_records_is_swept_and_one_in_use_is_kept() {
    let mut node = Node::new(&["a", "b"]).await;
    node.pods.run_pod_sandbox(sandbox("a")).await.expect("a");
    node.pods.run_pod_sandbox(sandbox("b")).await.expect("b");
    // a's pod is gone and its record forgotten, but a crash came before the release check.
    node.kernel.delete_namespace(&ns_of("a"));
    node.claims
        .update("claim-uid-a", |c| {
            c.attachments[0].restore = None;
            c.attachments[0].netns = None;
            c.attachments[0].attached = false;
        })
        .await
        .expect("forget");
    node.restart();
    node.pods.synchronize(vec![sandbox("b")]).await;
    assert!(node.has_segment(), "b is recorded on it");
    // Then b goes the same way: the sweep deletes the segment (and the veth died with b).
    node.kernel.delete_namespace(&ns_of("b"));
    node.claims
        .update("claim-uid-b", |c| {
            c.attachments[0].restore = None;
            c.attachments[0].netns = None;
            c.attachments[0].attached = false;
        })
        .await
        .expect("forget");
    node.restart();
    node.pods.synchronize(vec![]).await;
    assert!(node.host_extras().is_empty(), "{:?}", node.host_extras());
}

#[tokio::test]
async fn the_sweep_leaves_bridges_and_vxlans_that_are_not_knics_shape() {
    let node = Node::new(&[]).await;
    node.kernel.add_link(
        &Ns::Host,
        "knb00109",
        1500,
        [2, 0, 0, 0, 0, 9],
        Some("bridge"),
        &[],
    );
    node.kernel.add_link(
        &Ns::Host,
        "knx001092",
        1500,
        [2, 0, 0, 0, 0, 8],
        Some("veth"),
        &[],
    );
    node.kernel.add_link(
        &Ns::Host,
        "flannel.1",
        1450,
        [2, 0, 0, 0, 0, 7],
        Some("vxlan"),
        &[],
    );
    node.pods.synchronize(vec![]).await;
    assert_eq!(
        node.host_extras(),
        vec!["knb00109 bridge", "knx001092 veth", "flannel.1 vxlan"]
    );
}
