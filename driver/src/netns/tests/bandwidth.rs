//! Egress limits through the fake kernel: a TBF set in the pod before the link goes up, for a
//! moved device and for a child alike; idempotent on a repeated or resumed hook; removed from
//! a moved device before it goes home; refused (and the attach undone) when the operator's
//! burst cannot hold one frame.

use knic_proto::netconfig::{Bandwidth, ChildKind};

use super::*;

fn limited(mode: AttachMode, burst: Option<u32>) -> AttachPlan {
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        bandwidth: Some(Bandwidth {
            egress: 2_000_000_000,
            burst,
        }),
        ..plan(mode)
    }
}

#[tokio::test]
async fn a_moved_device_is_limited_before_it_goes_up_and_released_before_it_goes_home() {
    let (k, _) = kernel();
    let p = limited(AttachMode::Move, Some(256 * 1024));
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    let log = k.log();
    let qdisc = log
        .iter()
        .position(|l| l.contains("qdisc replace"))
        .expect("a qdisc was set");
    let up = log
        .iter()
        .position(|l| l.ends_with("link set net1 up"))
        .expect("up");
    assert_eq!(
        log[qdisc],
        "/var/run/netns/cni-1: qdisc replace dev net1 root tbf rate 2000000000bit burst 262144b \
         limit 12762144b"
    );
    assert!(qdisc < up, "limited before up: {log:?}");
    assert_eq!(
        k.egress_limit(&pod(), "net1"),
        Some(Tbf {
            rate: 250_000_000,
            burst: 262_144,
            limit: 262_144 + 12_500_000
        })
    );

    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    let log = k.log();
    let cleared = log
        .iter()
        .position(|l| l == "/var/run/netns/cni-1: qdisc del dev net1 root tbf")
        .expect("cleared");
    let moved = log
        .iter()
        .position(|l| l.starts_with("/var/run/netns/cni-1: link set net1 netns host"))
        .expect("moved back");
    assert!(
        cleared < moved,
        "cleared in the pod, before the move: {log:?}"
    );
    assert_eq!(k.egress_limit(&pod(), "net1"), None);
    assert_eq!(k.egress_limit(&Ns::Host, "ens1f0v0"), None);
    let host = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.name == "ens1f0v0")
        .unwrap();
    assert_eq!(host, restore.host);
}

#[tokio::test]
async fn a_child_is_limited_in_the_pod_and_needs_nothing_on_detach() {
    let (k, _) = kernel();
    let p = limited(
        AttachMode::Child {
            child: ChildKind::Macvlan("bridge".into()),
            uplink: None,
        },
        None,
    );
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    // knic's own bucket: 10 ms at 250 MB/s.
    assert_eq!(
        k.egress_limit(&pod(), "net1").map(|t| (t.rate, t.burst)),
        Some((250_000_000, 2_500_000))
    );
    assert!(
        k.log().iter().all(|l| !l.starts_with("host: qdisc")),
        "the parent on the host is not limited: {:?}",
        k.log()
    );
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert!(
        !k.log().iter().any(|l| l.contains("qdisc del")),
        "a child dies with its limit: {:?}",
        k.log()
    );
    assert_eq!(k.egress_limit(&pod(), "net1"), None);
}

#[tokio::test]
async fn a_resumed_attach_sets_the_same_limit_again_and_a_repeated_one_nothing() {
    let (k, _) = kernel();
    let p = limited(AttachMode::Move, None);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    let first = k.egress_limit(&pod(), "net1");
    let before = k.log().len();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(k.log().len(), before, "a repeated hook changes nothing");
    attach(&k, &p, &pod(), &restore, true).await.unwrap();
    let replaced = k
        .log()
        .iter()
        .filter(|l| l.contains("qdisc replace"))
        .count();
    assert_eq!(replaced, 2, "resume replaces in place: {:?}", k.log());
    assert_eq!(k.egress_limit(&pod(), "net1"), first);
}

#[tokio::test]
async fn a_burst_smaller_than_a_frame_fails_the_attach_and_undoes_it() {
    let (k, _) = kernel();
    // MTU 9000 in the pod: a 4 KiB bucket cannot hold one frame.
    let p = limited(AttachMode::Move, Some(4096));
    let restore = capture(&k, &p).await.unwrap();
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "/var/run/netns/cni-1: limiting the egress of net1: bandwidth.burst 4096 bytes is less \
         than one full frame (MTU 9000 + 18 bytes of header = 9018); every such frame would be \
         dropped"
    );
    let host = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.name == "ens1f0v0")
        .unwrap();
    assert_eq!(host, restore.host, "undone");
    assert!(k.links(&pod()).is_empty());
}

#[tokio::test]
async fn without_a_planned_mtu_the_links_own_sizes_the_bucket() {
    let (k, _) = kernel();
    let mut p = limited(AttachMode::Move, Some(1600));
    p.mtu = None; // the device keeps its 1500
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(k.egress_limit(&pod(), "net1").map(|t| t.burst), Some(1600));
}

#[tokio::test]
async fn a_kernel_refusal_of_the_qdisc_undoes_the_attach() {
    let (k, _) = kernel();
    let p = limited(AttachMode::Move, None);
    let restore = capture(&k, &p).await.unwrap();
    k.fail_on(
        "/var/run/netns/cni-1: qdisc replace",
        "No such file or directory",
    );
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("No such file or directory"), "{err}");
    assert!(k.links(&pod()).is_empty());
    assert!(k.links(&Ns::Host).iter().any(|l| l.name == "ens1f0v0"));
}

#[test]
fn plans_without_a_limit_keep_the_checkpoint_form() {
    let p = plan(AttachMode::Move);
    let stored = serde_json::to_value(&p).unwrap();
    assert!(stored.get("bandwidth").is_none(), "{stored}");
    let loaded: AttachPlan = serde_json::from_value(stored).unwrap();
    assert_eq!(loaded.bandwidth, None);
    let limited = limited(AttachMode::Move, Some(1 << 20));
    let stored = serde_json::to_value(&limited).unwrap();
    assert_eq!(
        stored["bandwidth"],
        serde_json::json!({"egress": 2_000_000_000u64, "burst": 1_048_576})
    );
    assert_eq!(
        serde_json::from_value::<AttachPlan>(stored).unwrap(),
        limited
    );
}
