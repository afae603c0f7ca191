//! Live update against the fake kernel: the pure diff (what a Network change means for one
//! attachment, and the `from_template` rule), then applied, refused, failed and replayed after
//! a crash between the checkpoint and the kernel.

use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};

use knic_proto::netconfig::{Cidr, Route};
use knic_proto::network::Network;
use serde_json::json;

use super::update::{LiveUpdate, RateLimit, live_change};
use super::*;
use crate::claims::checkpoint::{Attachment, CheckpointStore, OpaqueConfig, PreparedDevice};
use crate::claims::ipam::Allocation;
use crate::events::EventSink;
use crate::netns::fake::{FakeKernel, plan};

const POD_UID: &str = "pod-uid";

fn netns_path() -> PathBuf {
    PathBuf::from("/var/run/netns/cni-live")
}

fn pod_ns() -> Ns {
    Ns::Pod(netns_path())
}

fn route(destination: &str, gateway: &str) -> Route {
    Route {
        destination: destination.parse().expect("cidr"),
        gateway: Some(gateway.parse().expect("ip")),
        source: None,
        metric: None,
        table: None,
    }
}

/// Network blue at `generation` with `mtu` and the subnet's `routes`.
fn blue(generation: i64, mtu: u32, routes: serde_json::Value) -> Network {
    serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": "blue", "generation": generation},
        "spec": {
            "devices": {"kind": "vf"}, "mtu": mtu,
            "ipam": {"subnets": [{"cidr": "192.0.2.0/24", "gateway": "192.0.2.1", "routes": routes}]},
            "namespaces": {"names": ["ns"]}
        }
    }))
    .expect("network")
}

/// A claim as prepare leaves it for a pod of Network blue (generation 6: MTU 1450, route
/// 198.51.100.0/24): the template's config, the allocation, the plan; `from_template` as given.
fn claim(from_template: bool) -> PreparedClaim {
    let device = PreparedDevice {
        request: "network".into(),
        pool: "node-a".into(),
        device: "dev-0".into(),
        share_id: None,
        consumed: Default::default(),
        published: Some(
            serde_json::from_value(
                json!({"name": "dev-0", "attributes": {"ifName": {"string": "ens1f0v0"}}}),
            )
            .expect("device"),
        ),
    };
    let mut p = plan("dev-0", "ens1f0v0", "net1", &["192.0.2.10/24"]);
    p.request = "network".into();
    p.mtu = Some(1450);
    p.routes = vec![route("198.51.100.0/24", "192.0.2.1")];
    p.network = Some("blue".into());
    p.from_template = from_template;
    PreparedClaim {
        network_label: from_template.then(|| "blue".into()),
        namespace: "ns".into(),
        name: "c".into(),
        uid: "claim-uid".into(),
        pod_uid: POD_UID.into(),
        pod_name: "pod".into(),
        devices: vec![device],
        configs: vec![OpaqueConfig {
            source: "FromClaim".into(),
            requests: vec!["network".into()],
            parameters: json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"mtu": 1450}, "ipam": {"network": "blue"}}),
        }],
        prepared_at: 0,
        attachments: vec![Attachment::planned(p)],
        allocations: vec![Allocation {
            network: "blue".into(),
            name: "blue-192-0-2-10".into(),
            uid: "a-uid".into(),
            address: "192.0.2.10/24".parse::<Cidr>().expect("cidr"),
            identity: None,
        }],
        functions: vec![],
    }
}

#[test]
fn a_route_and_mtu_change_is_the_diff_with_its_summary() {
    let c = claim(true);
    let n = blue(7, 1400, json!([{"destination": "203.0.113.0/24"}]));
    let change = live_change(&c, 0, &n).expect("valid").expect("a change");
    assert_eq!(change.routes, [route("203.0.113.0/24", "192.0.2.1")]);
    assert_eq!(change.add, [route("203.0.113.0/24", "192.0.2.1")]);
    assert_eq!(change.remove, [route("198.51.100.0/24", "192.0.2.1")]);
    assert_eq!(change.mtu, Some((Some(1450), 1400)));
    assert_eq!(
        change.summary("blue", 7),
        "MTU 1450→1400, routes +203.0.113.0/24 −198.51.100.0/24 (Network blue generation 7)"
    );
    // The same Network as planned: nothing to do.
    let same = blue(6, 1450, json!([{"destination": "198.51.100.0/24"}]));
    assert_eq!(live_change(&c, 0, &same), Ok(None));
}

#[test]
fn a_hand_written_claim_keeps_its_own_mtu_and_routes() {
    let mut c = claim(false);
    // The claim's own route stays behind the subnet's, as prepare orders them.
    c.configs[0].parameters["routes"] =
        json!([{"destination": "10.9.0.0/16", "gateway": "192.0.2.254"}]);
    c.attachments[0]
        .plan
        .routes
        .push(route("10.9.0.0/16", "192.0.2.254"));
    let n = blue(7, 1400, json!([]));
    let change = live_change(&c, 0, &n).expect("valid").expect("a change");
    assert_eq!(
        change.mtu, None,
        "not from the template: the MTU is the claim's"
    );
    assert_eq!(change.routes, [route("10.9.0.0/16", "192.0.2.254")]);
    assert_eq!(change.remove, [route("198.51.100.0/24", "192.0.2.1")]);
    assert!(change.add.is_empty());
}

#[test]
fn a_change_prepare_would_refuse_is_refused_with_its_text() {
    let c = claim(true);
    // A route through a gateway off the pod's subnet: the same rule as at prepare.
    let n = blue(
        7,
        1450,
        json!([{"destination": "203.0.113.0/24", "gateway": "10.0.0.1"}]),
    );
    let err = live_change(&c, 0, &n).expect_err("refused");
    assert!(
        err.contains("routes[0].gateway") && err.contains("10.0.0.1"),
        "{err}"
    );
    let low = blue(7, 40, json!([]));
    let err = live_change(&c, 0, &low).expect_err("refused");
    assert!(err.contains("interface.mtu"), "{err}");
}

#[derive(Default)]
struct Recorder(StdMutex<Vec<Vec<DeviceStatus>>>);

impl StatusSink for Recorder {
    fn write<'a>(
        &'a self,
        _: &'a PreparedClaim,
        devices: &'a [DeviceStatus],
    ) -> crate::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Ok(mut seen) = self.0.lock() {
                seen.push(devices.to_vec());
            }
            Ok(())
        })
    }
}

impl Recorder {
    async fn last(&self, n: usize) -> Vec<DeviceStatus> {
        for _ in 0..400 {
            let seen = self.0.lock().map(|s| s.clone()).unwrap_or_default();
            if seen.len() >= n {
                return seen[n - 1].clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("fewer than {n} status writes");
    }
}

#[derive(Default)]
struct Events(StdMutex<Vec<(&'static str, String)>>);

impl EventSink for Events {
    fn warn(&self, w: Warning) {
        if let Ok(mut seen) = self.0.lock() {
            seen.push((w.reason, w.message));
        }
    }
}

struct Setup {
    kernel: FakeKernel,
    claims: Arc<ClaimStore>,
    pods: Arc<PodNetworks<FakeKernel>>,
    status: Arc<Recorder>,
    events: Arc<Events>,
    dir: tempfile::TempDir,
}

/// The claim prepared and its pod attached (the fake kernel has net1 with MTU 1450 and the
/// old route).
async fn attached() -> Setup {
    attached_claim(claim(true), "ens1f0v0").await
}

/// `c` prepared and attached, its device's netdev `host` on the host.
async fn attached_claim(c: PreparedClaim, host: &str) -> Setup {
    let kernel = FakeKernel::new();
    kernel.add_link(&Ns::Host, host, 1500, [0xaa, 0, 0, 0, 0, 1], None, &[]);
    kernel.add_namespace(&pod_ns());
    let dir = tempfile::tempdir().expect("tempdir");
    let claims = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
    {
        let mut locked = claims.lock().await;
        let mut next = locked.checkpoint().expect("checkpoint").clone();
        next.claims.insert(c.uid.clone(), c);
        locked.save(next, true).await.expect("save");
    }
    let status = Arc::new(Recorder::default());
    let events = Arc::new(Events::default());
    let pods = PodNetworks::new(kernel.clone(), claims.clone(), status.clone());
    pods.set_events(events.clone());
    pods.run_pod_sandbox(crate::nri::PodSandbox {
        id: "sandbox".into(),
        name: "pod".into(),
        uid: POD_UID.into(),
        namespace: "ns".into(),
        netns: Some(netns_path()),
        ips: vec![],
    })
    .await
    .expect("attach");
    status.last(1).await;
    Setup {
        kernel,
        claims,
        pods,
        status,
        events,
        dir,
    }
}

fn pod_routes(kernel: &FakeKernel) -> Vec<String> {
    kernel
        .routes(&pod_ns())
        .iter()
        .map(|(dev, r)| format!("{} dev {dev}", r.destination))
        .collect()
}

fn mtu(kernel: &FakeKernel) -> u32 {
    kernel
        .links(&pod_ns())
        .iter()
        .find(|l| l.name == "net1")
        .expect("net1")
        .mtu
}

async fn live(claims: &ClaimStore) -> (netns::AttachPlan, Option<LiveUpdate>) {
    let c = claims
        .claim("claim-uid")
        .await
        .expect("store")
        .expect("claim");
    (c.attachments[0].plan.clone(), c.attachments[0].live.clone())
}

#[tokio::test]
async fn an_update_is_applied_recorded_and_reported() {
    let s = attached().await;
    assert_eq!(pod_routes(&s.kernel), ["198.51.100.0/24 dev net1"]);
    assert_eq!(mtu(&s.kernel), 1450);
    let n = blue(7, 1400, json!([{"destination": "203.0.113.0/24"}]));
    assert_eq!(s.pods.update_network(&n, &RateLimit::new(10)).await, 1);
    assert_eq!(pod_routes(&s.kernel), ["203.0.113.0/24 dev net1"]);
    assert_eq!(mtu(&s.kernel), 1400);
    let (plan, record) = live(&s.claims).await;
    assert_eq!(plan.mtu, Some(1400));
    assert_eq!(plan.routes, [route("203.0.113.0/24", "192.0.2.1")]);
    let record = record.expect("recorded");
    assert!(!record.pending && record.failed.is_none() && record.remove_routes.is_empty());
    let summary =
        "MTU 1450→1400, routes +203.0.113.0/24 −198.51.100.0/24 (Network blue generation 7)";
    let status = s.status.last(2).await;
    assert_eq!(status.len(), 1);
    assert!(status[0].ready, "Ready stays as attach wrote it");
    let updated = status[0].updated.clone().expect("condition");
    assert_eq!(
        (
            updated.ok,
            updated.reason.as_str(),
            updated.message.as_str()
        ),
        (true, "Applied", summary)
    );
    assert_eq!(status[0].ips, ["192.0.2.10/24"]);
    assert_eq!(
        s.events.0.lock().unwrap().clone(),
        [("NetworkUpdated", summary.to_owned())]
    );
    // The same generation again is not applied twice.
    assert_eq!(s.pods.update_network(&n, &RateLimit::new(10)).await, 0);
}

#[tokio::test]
async fn a_refused_change_touches_nothing_and_says_why() {
    let s = attached().await;
    let n = blue(
        7,
        1450,
        json!([{"destination": "203.0.113.0/24", "gateway": "10.0.0.1"}]),
    );
    assert_eq!(s.pods.update_network(&n, &RateLimit::new(10)).await, 1);
    assert_eq!(pod_routes(&s.kernel), ["198.51.100.0/24 dev net1"]);
    let (plan, record) = live(&s.claims).await;
    assert_eq!(
        plan.routes,
        [route("198.51.100.0/24", "192.0.2.1")],
        "plan kept"
    );
    let why = record.and_then(|r| r.failed).expect("refusal recorded");
    assert!(
        why.starts_with("Network blue generation 7 cannot be applied: ")
            && why.contains("10.0.0.1"),
        "{why}"
    );
    let updated = s.status.last(2).await[0]
        .updated
        .clone()
        .expect("condition");
    assert_eq!(
        (updated.ok, updated.reason.as_str()),
        (false, "UpdateFailed")
    );
    assert_eq!(updated.message, why);
    assert_eq!(s.events.0.lock().unwrap()[0].0, "NetworkUpdateFailed");
}

#[tokio::test]
async fn the_kernels_refusal_is_reported_in_its_words() {
    let s = attached().await;
    // A child cannot go above its parent's MTU: the kernel says so.
    s.kernel.fail_on(
        "/var/run/netns/cni-live: link set net1",
        "Numerical result out of range",
    );
    let n = blue(7, 9000, json!([{"destination": "198.51.100.0/24"}]));
    s.pods.update_network(&n, &RateLimit::new(10)).await;
    let (_, record) = live(&s.claims).await;
    let record = record.expect("recorded");
    let why = record.failed.expect("failed");
    assert!(why.contains("Numerical result out of range"), "{why}");
    assert!(
        !record.pending,
        "the result is final; a later generation tries again"
    );
    let updated = s.status.last(2).await[0]
        .updated
        .clone()
        .expect("condition");
    assert_eq!(
        (updated.ok, updated.reason.as_str()),
        (false, "UpdateFailed")
    );
    assert!(updated.message.contains("Numerical result out of range"));
}

#[tokio::test]
async fn a_restart_finishes_a_recorded_update() {
    let s = attached().await;
    // The crash: the checkpoint has the new plan and the pending record, the kernel the old.
    s.claims
        .update("claim-uid", |c| {
            let a = &mut c.attachments[0];
            a.plan.mtu = Some(1400);
            a.plan.routes = vec![route("203.0.113.0/24", "192.0.2.1")];
            a.live = Some(LiveUpdate {
                generation: 7,
                summary: "MTU 1450→1400".into(),
                remove_routes: vec![route("198.51.100.0/24", "192.0.2.1")],
                pending: true,
                failed: None,
            });
        })
        .await
        .expect("write");
    // A new process over the same checkpoint and kernel.
    let claims = Arc::new(ClaimStore::open(CheckpointStore::new(s.dir.path())));
    let status = Arc::new(Recorder::default());
    let pods = PodNetworks::new(s.kernel.clone(), claims.clone(), status.clone());
    assert_eq!(pods.replay_live_updates().await, 1);
    assert_eq!(pod_routes(&s.kernel), ["203.0.113.0/24 dev net1"]);
    assert_eq!(mtu(&s.kernel), 1400);
    let (_, record) = live(&claims).await;
    assert!(!record.expect("recorded").pending);
    // Replaying again changes nothing (idempotent), and nothing is pending any more.
    assert_eq!(pods.replay_live_updates().await, 0);
    assert_eq!(
        status.last(1).await[0]
            .updated
            .clone()
            .expect("condition")
            .reason,
        "Applied"
    );
}

#[tokio::test]
async fn the_rate_limit_spreads_pods_over_time() {
    let limit = RateLimit::new(20);
    let start = tokio::time::Instant::now();
    for _ in 0..20 {
        limit.take().await;
    }
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "a burst of the rate is at once"
    );
    for _ in 0..20 {
        limit.take().await;
    }
    // Then 20 per second: the next 20 take about a second.
    let spent = start.elapsed();
    assert!(
        spent >= Duration::from_millis(900) && spent < Duration::from_millis(1600),
        "{spent:?}"
    );
}

/// An overlay interface's MTU raised live: its host end on the bridge first, then the pod's
/// (a host end left smaller would drop the larger frames without a word).
#[tokio::test]
async fn an_overlay_interfaces_host_end_follows_a_new_mtu() {
    let mut c = claim(true);
    c.devices[0].device = "overlay".into();
    c.devices[0].published = Some(
        serde_json::from_value(json!({"name": "overlay", "attributes": {
            "kind": {"string": "overlay"}, "ifName": {"string": "eth1"},
            "vtep": {"string": "10.99.0.1"}, "mtu": {"int": 1450}, "shareable": {"bool": true}}}))
        .expect("device"),
    );
    let p = &mut c.attachments[0].plan;
    p.device = "overlay".into();
    p.host_ifname = "eth1".into();
    p.mtu = Some(1400);
    p.mac = Some([2, 0x4b, 0, 0, 0, 1]);
    p.mode = crate::netns::AttachMode::Overlay {
        segment: crate::netns::overlay::Segment::new(
            4242,
            4789,
            "10.99.0.1".parse().expect("ip"),
            "eth1",
            1450,
        ),
        host_veth: "knh-live".into(),
    };
    c.configs[0].parameters["interface"]["mtu"] = json!(1400);
    let s = attached_claim(c, "eth1").await;
    let host_mtu = |k: &FakeKernel| {
        k.links(&Ns::Host)
            .iter()
            .find(|l| l.name == "knh-live")
            .expect("host end")
            .mtu
    };
    assert_eq!((host_mtu(&s.kernel), mtu(&s.kernel)), (1400, 1400));
    let mut n = blue(7, 1450, json!([{"destination": "198.51.100.0/24"}]));
    n.spec.devices = Default::default();
    n.spec.vxlan = Some(knic_proto::network::Vxlan {
        vni: 4242,
        port: None,
    });
    assert_eq!(s.pods.update_network(&n, &RateLimit::new(10)).await, 1);
    assert_eq!((host_mtu(&s.kernel), mtu(&s.kernel)), (1450, 1450));
    let log = s.kernel.log();
    let host_first = log
        .iter()
        .position(|l| l.starts_with("host: link set knh-live"));
    let pod_after = log
        .iter()
        .rposition(|l| l.starts_with("/var/run/netns/cni-live: link set net1"));
    assert!(
        host_first.is_some() && host_first < pod_after,
        "host end first: {log:#?}"
    );
    let (plan, record) = live(&s.claims).await;
    assert_eq!(plan.mtu, Some(1450));
    assert!(
        matches!(plan.mode, crate::netns::AttachMode::Overlay { .. }),
        "still on its segment"
    );
    assert!(record.expect("recorded").failed.is_none());
}
