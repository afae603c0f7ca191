//! The KNI door against the fake kernel: attach, repeat, query, detach and every refusal, with
//! the same checkpoint and pod networks the kubelet's door uses. The socket, the real kernel
//! and a client generated from the upstream .proto are exercised in `e2e/tests/kni.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;
use knic_proto::kni::kni_server::Kni as _;
use knic_proto::network::Network;
use serde_json::json;
use tokio::sync::{Mutex, watch};
use tonic::{Code, Request};

use super::catalog::{Catalog, Classes, builtin_classes};
use super::ready::NodeFacts;
use super::sandbox::{self, Sandbox, Wanted};
use super::*;
use crate::claims::checkpoint::CheckpointStore;
use crate::netns::Ns;
use crate::netns::fake::FakeKernel;
use crate::pods::LogStatus;
use crate::wiring::{self, Parts};

struct Networks(Vec<Network>);

impl Catalog for Networks {
    fn networks(&self) -> crate::BoxFuture<'_, crate::Result<Vec<Network>>> {
        Box::pin(async move { Ok(self.0.clone()) })
    }
    fn classes(&self) -> crate::BoxFuture<'_, crate::Result<Classes>> {
        Box::pin(async move { Ok(builtin_classes()) })
    }
    fn validates(&self) -> bool {
        true
    }
}

fn network(name: &str, spec: serde_json::Value) -> Network {
    serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("network")
}

fn blue() -> Network {
    network(
        "blue",
        json!({"devices": {"kind": "nic"}, "mtu": 1400, "ipam": {"static": {}},
               "namespaces": {"names": ["default"]}}),
    )
}

fn device(name: &str, ifname: &str, kind: &str) -> Device {
    serde_json::from_value(json!({"name": name, "attributes": {
        "ifName": {"string": ifname}, "kind": {"string": kind},
    }}))
    .expect("device")
}

struct Setup {
    kernel: FakeKernel,
    door: Arc<Door<FakeKernel>>,
    service: KniService<FakeKernel>,
    facts: watch::Sender<NodeFacts>,
    withheld: watch::Receiver<BTreeSet<String>>,
    _dir: tempfile::TempDir,
}

fn pod_netns(n: u32) -> PathBuf {
    PathBuf::from(format!("/var/run/netns/sbx-{n}"))
}

fn setup(networks: Vec<Network>) -> Setup {
    let kernel = FakeKernel::new();
    for (i, ifname) in ["eth1", "eth2"].iter().enumerate() {
        let mac = u8::try_from(i + 1).expect("small");
        kernel.add_link(&Ns::Host, ifname, 1500, [0xaa, 0, 0, 0, 0, mac], None, &[]);
    }
    for n in 1..=2 {
        kernel.add_namespace(&Ns::Pod(pod_netns(n)));
    }
    let devices = vec![
        device("dev-1", "eth1", "nic"),
        device("dev-2", "eth2", "nic"),
    ];
    let (_devices_tx, devices_rx) = watch::channel(devices);
    let dir = tempfile::tempdir().expect("tempdir");
    let node = wiring::node(Parts {
        source: Arc::new(sandbox::Pending::default()),
        checkpoint: CheckpointStore::new(dir.path()),
        devices: devices_rx.clone(),
        kernel: kernel.clone(),
        status: Arc::new(LogStatus),
        address_book: None,
        pool: "node-a".into(),
        sysfs_root: dir.path().into(),
        fail_closed: None,
        sharing: None,
    });
    let (facts, facts_rx) = watch::channel(NodeFacts::default());
    let (withheld_tx, withheld) = watch::channel(BTreeSet::new());
    tokio::spawn(super::withheld(node.claims.clone(), withheld_tx));
    let door = Arc::new(Door {
        pool: "node-a".into(),
        catalog: Arc::new(Networks(networks)),
        offered: devices_rx,
        facts: facts_rx,
        claims: node.claims.clone(),
        preparer: node.kni_preparer.clone(),
        pending: node.kni_pending.clone(),
        pods: node.pods.clone(),
        serial: Mutex::new(()),
    });
    // The sender must outlive the test: a dropped one would still leave the value readable.
    std::mem::forget(_devices_tx);
    let service = KniService::new(
        door.clone(),
        Settings {
            netns_dir: dir.path().join("netns"),
            sysfs_root: dir.path().into(),
            node: "node-a".into(),
        },
    );
    Setup {
        kernel,
        door,
        service,
        facts,
        withheld,
        _dir: dir,
    }
}

fn sbx(id: &str) -> Sandbox {
    sandbox::sandbox(id, "vm-1", "tenant-a").expect("sandbox")
}

fn blue_wanted() -> Wanted {
    Wanted::Network {
        name: "blue".into(),
        device: None,
    }
}

fn links(kernel: &FakeKernel, ns: &Ns) -> Vec<String> {
    let mut names: Vec<String> = kernel.links(ns).into_iter().map(|l| l.name).collect();
    names.sort();
    names
}

#[tokio::test]
async fn attach_query_detach_through_the_kubelets_code() {
    let s = setup(vec![blue()]);
    let (ipconfigs, extradata) = s
        .door
        .attach(&sbx("sbx1"), &blue_wanted(), pod_netns(1))
        .await
        .expect("attach");
    assert_eq!(extradata["sandbox"], "sbx1");
    let net1 = &ipconfigs["net1"];
    assert_eq!(net1.mac, "aa:00:00:00:00:01");
    assert_eq!(net1.extradata["device"], "node-a/dev-1");
    assert_eq!(net1.extradata["network"], "blue");
    assert_eq!(links(&s.kernel, &Ns::Pod(pod_netns(1))), ["net1"]);
    let moved = &s.kernel.links(&Ns::Pod(pod_netns(1)))[0];
    assert_eq!(moved.mtu, 1400, "the Network's MTU is applied");
    assert_eq!(links(&s.kernel, &Ns::Host), ["eth2"]);

    // Recorded like a kubelet prepare, under the sandbox's UIDs.
    let checkpoint = s.door.claims.snapshot().await.expect("checkpoint");
    let claim = &checkpoint.claims["kni.sbx1.network.blue"];
    assert_eq!(claim.pod_uid, "kni.sbx1");
    assert_eq!(claim.pod_name, "vm-1");
    assert_eq!(claim.namespace, "tenant-a");
    assert!(claim.attachments[0].restore.is_some());

    // Withheld from the slices while attached.
    let mut withheld = s.withheld.clone();
    withheld
        .wait_for(|w| *w == BTreeSet::from(["dev-1".to_owned()]))
        .await
        .expect("withheld");

    // A repeat answers the same and moves nothing.
    let requests = s.kernel.requests();
    let (again, _) = s
        .door
        .attach(&sbx("sbx1"), &blue_wanted(), pod_netns(1))
        .await
        .expect("repeat");
    assert_eq!(again, ipconfigs);
    assert_eq!(links(&s.kernel, &Ns::Host), ["eth2"]);
    assert!(
        s.kernel.requests() > requests,
        "the repeat checks the kernel"
    );

    // The same id into another namespace is refused.
    let other = s
        .door
        .attach(&sbx("sbx1"), &blue_wanted(), pod_netns(2))
        .await
        .expect_err("another netns");
    assert_eq!(other.code(), Code::AlreadyExists);
    assert!(
        other.message().contains(
            "isolation.path: this sandbox id has it attached in /var/run/netns/sbx-1 already"
        ),
        "{}",
        other.message()
    );

    // The runtime's hooks and the orphan reaper leave it alone: the runtime never lists a
    // KNI sandbox, and there is no ResourceClaim to look up.
    use crate::nri::NriHandler as _;
    s.door.pods.synchronize(Vec::new()).await;
    assert_eq!(links(&s.kernel, &Ns::Pod(pod_netns(1))), ["net1"]);
    let mut reaper = crate::claims::orphans::Reaper::new(
        knic_proto::DRIVER_NAME,
        crate::claims::orphans::OrphanSettings {
            idle: std::time::Duration::ZERO,
            ..Default::default()
        },
    );
    // Even when none of its devices is away (an attach that failed half-way).
    let mut idle = checkpoint.clone();
    for claim in idle.claims.values_mut() {
        for a in &mut claim.attachments {
            a.restore = None;
        }
    }
    let now = std::time::Instant::now();
    let _ = reaper.due(&idle, now);
    assert!(
        reaper
            .due(&idle, now + std::time::Duration::from_secs(3600))
            .is_empty()
    );

    // Query by sandbox id: the interface with its MAC.
    let query = Query {
        id: Some("sbx1".into()),
        ..Query::default()
    };
    let (found, extradata) = s.door.query(&query).await.expect("query");
    assert_eq!(extradata["interfaces"], "1");
    assert_eq!(found["net1"].mac, "aa:00:00:00:00:01");
    assert_eq!(found["net1"].extradata["present"], "true");
    assert_eq!(found["net1"].extradata["attachedBy"], "kni");

    // A second sandbox gets the other device.
    let (second, _) = s
        .door
        .attach(&sbx("sbx2"), &blue_wanted(), pod_netns(2))
        .await
        .expect("second");
    assert_eq!(second["net1"].extradata["device"], "node-a/dev-2");
    // Now nothing is free: a third is refused with the reason.
    let third = s
        .door
        .attach(&sbx("sbx3"), &blue_wanted(), pod_netns(2))
        .await
        .expect_err("no device left");
    assert_eq!(third.code(), Code::ResourceExhausted);
    assert!(
        third.message().contains(
            "attaching Network \"blue\" to sandbox sbx3: 0 of 2 matching devices free, 1 needed \
             per pod (in use: dev-1 by tenant-a/kni-sbx1-blue, dev-2 by tenant-a/kni-sbx2-blue)"
        ),
        "{}",
        third.message()
    );

    // Detach: devices home with their names, records gone, nothing withheld.
    assert_eq!(s.door.detach("sbx1", None).await.expect("detach"), 1);
    assert_eq!(s.door.detach("sbx2", None).await.expect("detach"), 1);
    assert_eq!(links(&s.kernel, &Ns::Host), ["eth1", "eth2"]);
    assert!(links(&s.kernel, &Ns::Pod(pod_netns(1))).is_empty());
    assert!(
        s.door
            .claims
            .snapshot()
            .await
            .expect("cp")
            .claims
            .is_empty()
    );
    withheld
        .wait_for(BTreeSet::is_empty)
        .await
        .expect("released");
    // Detaching again is success.
    assert_eq!(s.door.detach("sbx1", None).await.expect("again"), 0);
}

#[tokio::test]
async fn a_failed_attach_leaves_nothing_behind() {
    let s = setup(vec![blue()]);
    s.kernel
        .fail_on("host: link set eth1 netns", "Numerical result out of range");
    let refused = s
        .door
        .attach(&sbx("sbx1"), &blue_wanted(), pod_netns(1))
        .await
        .expect_err("the kernel refuses");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        refused.message(),
        "attaching Network \"blue\" to sandbox sbx1: device node-a/dev-1: host: link set eth1 \
         netns /var/run/netns/sbx-1 name net1 mtu 1400: Numerical result out of range"
    );
    assert_eq!(links(&s.kernel, &Ns::Host), ["eth1", "eth2"]);
    assert!(
        s.door
            .claims
            .snapshot()
            .await
            .expect("cp")
            .claims
            .is_empty()
    );
}

#[tokio::test]
async fn an_inline_config_on_a_named_device() {
    let s = setup(vec![]);
    let config = json!({"interface": {"name": "data0"}, "addresses": ["192.0.2.10/24"],
        "routes": [{"destination": "203.0.113.0/24", "gateway": "192.0.2.1"}]});
    let extradata = std::collections::HashMap::from([
        ("config".to_owned(), config.to_string()),
        ("device".to_owned(), "dev-2".to_owned()),
        ("vendor".to_owned(), "x".to_owned()),
    ]);
    let (wanted, ignored) = sandbox::wanted(&extradata).expect("wanted");
    assert_eq!(ignored, ["\"vendor\""]);
    let (ipconfigs, _) = s
        .door
        .attach(&sbx("vm7"), &wanted, pod_netns(1))
        .await
        .expect("attach");
    assert_eq!(ipconfigs["data0"].ip, ["192.0.2.10/24"]);
    assert_eq!(s.kernel.routes(&Ns::Pod(pod_netns(1))).len(), 1);
    // The same device for another sandbox is refused, naming its holder.
    let busy = s
        .door
        .attach(&sbx("vm8"), &wanted, pod_netns(2))
        .await
        .expect_err("busy");
    assert_eq!(busy.code(), Code::FailedPrecondition);
    assert!(
        busy.message()
            .ends_with("extradata.device: device \"dev-2\" is in use by tenant-a/kni-vm7-dev-2"),
        "{}",
        busy.message()
    );
    s.door.detach("vm7", Some(&wanted)).await.expect("detach");
    assert_eq!(links(&s.kernel, &Ns::Host), ["eth1", "eth2"]);
}

#[tokio::test]
async fn refusals_name_the_field_and_the_rule() {
    let s = setup(vec![
        blue(),
        network(
            "broken",
            json!({"devices": {}, "ipam": {"static": {}},
        "namespaces": {"names": ["default"]}}),
        ),
    ]);
    let attach = |extradata: &[(&str, &str)], id: &str, path: &str| {
        knic_proto::kni::AttachInterfaceRequest {
            name: "vm-1".into(),
            id: id.into(),
            namespace: "tenant-a".into(),
            isolation: Some(knic_proto::kni::Isolation {
                path: path.into(),
                ..Default::default()
            }),
            extradata: extradata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        }
    };
    let cases: Vec<(knic_proto::kni::AttachInterfaceRequest, Code, &str)> = vec![
        (
            attach(&[("network", "blue")], "", "/proc/self/ns/net"),
            Code::InvalidArgument,
            "id: must be 1 to 128 characters, got 0",
        ),
        (
            attach(&[("network", "blue")], "a.b", "/proc/self/ns/net"),
            Code::InvalidArgument,
            "id: may hold only letters, digits, '-' and '_', got '.'",
        ),
        (
            attach(&[], "s1", "/proc/self/ns/net"),
            Code::InvalidArgument,
            "extradata.network: required: the knic Network to attach",
        ),
        (
            attach(
                &[("network", "blue"), ("config", "{}")],
                "s1",
                "/proc/self/ns/net",
            ),
            Code::InvalidArgument,
            "extradata: names both network and config",
        ),
        (
            attach(&[("config", "{}")], "s1", "/proc/self/ns/net"),
            Code::InvalidArgument,
            "extradata.device: required with extradata.config",
        ),
        (
            attach(
                &[("config", "{mtu: 1}"), ("device", "dev-1")],
                "s1",
                "/proc/self/ns/net",
            ),
            Code::InvalidArgument,
            "extradata.config: mtu: unknown field",
        ),
        (
            attach(&[("network", "Blue!")], "s1", "/proc/self/ns/net"),
            Code::InvalidArgument,
            "extradata.network: the Network's name \"Blue!\" is not a DNS subdomain",
        ),
        (
            attach(&[("network", "blue")], "s1", ""),
            Code::InvalidArgument,
            "isolation.path: required: an absolute path",
        ),
        (
            attach(&[("network", "blue")], "s1", "relative/ns"),
            Code::InvalidArgument,
            "isolation.path: \"relative/ns\" must be an absolute path without '..'",
        ),
        (
            attach(&[("network", "blue")], "s1", "/proc/self/ns/net"),
            Code::FailedPrecondition,
            "isolation.path: /proc/self/ns/net is the driver's own network namespace",
        ),
        (
            attach(&[("network", "blue")], "s1", "/proc/self/status"),
            Code::FailedPrecondition,
            "isolation.path: /proc/self/status is not a namespace file",
        ),
        (
            attach(&[("network", "blue")], "s1", "/nonexistent/knt-ns"),
            Code::FailedPrecondition,
            "isolation.path: /nonexistent/knt-ns: No such file or directory",
        ),
    ];
    for (request, code, text) in cases {
        let refused = s
            .service
            .attach_interface(Request::new(request.clone()))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), code, "{request:?}: {}", refused.message());
        assert!(
            refused.message().contains(text),
            "{request:?}: want {text:?} in {:?}",
            refused.message()
        );
    }
    let mut ports = attach(&[("network", "blue")], "s1", "/proc/self/ns/net");
    ports
        .port_mappings
        .push(knic_proto::kni::PortMapping::default());
    let refused = s
        .service
        .attach_interface(Request::new(ports))
        .await
        .expect_err("ports");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused
            .message()
            .starts_with("port_mappings: knic forwards no host ports")
    );
    let mut big = attach(&[("network", "blue")], "s1", "/proc/self/ns/net");
    big.labels = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
    let refused = s
        .service
        .attach_interface(Request::new(big))
        .await
        .expect_err("labels");
    assert_eq!(refused.message(), "labels: at most 64 entries, got 65");

    // Past the request checks, the door's: an unknown and an invalid Network.
    let missing = s
        .door
        .attach(
            &sbx("s1"),
            &Wanted::Network {
                name: "red".into(),
                device: None,
            },
            pod_netns(1),
        )
        .await
        .expect_err("missing");
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(
        missing.message(),
        "attaching Network \"red\" to sandbox s1: extradata.network: Network \"red\" does not exist"
    );
    let broken = s
        .door
        .attach(
            &sbx("s1"),
            &Wanted::Network {
                name: "broken".into(),
                device: None,
            },
            pod_netns(1),
        )
        .await
        .expect_err("invalid");
    assert_eq!(broken.code(), Code::FailedPrecondition);
    assert!(
        broken
            .message()
            .contains("Network \"broken\" is not ready on this node: Network \"broken\" is Invalid: spec.devices"),
        "{}",
        broken.message()
    );
    let wrong = s
        .door
        .attach(
            &sbx("s1"),
            &Wanted::Network {
                name: "blue".into(),
                device: Some("dev-9".into()),
            },
            pod_netns(1),
        )
        .await
        .expect_err("no such device");
    assert!(
        wrong.message().ends_with(
            "extradata.device: device \"dev-9\" does not match the Network's spec.devices on \
             this node (matching: dev-1, dev-2)"
        ),
        "{}",
        wrong.message()
    );
    // Queries need a who.
    let refused = s
        .service
        .query_pod_network(Request::new(
            knic_proto::kni::QueryPodNetworkRequest::default(),
        ))
        .await
        .expect_err("who");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().starts_with("id or name: one is required"));
    // Nothing was recorded by any refusal.
    assert!(
        s.door
            .claims
            .snapshot()
            .await
            .expect("cp")
            .claims
            .is_empty()
    );
}

#[tokio::test]
async fn node_networks_follow_the_drivers_state() {
    let s = setup(vec![blue()]);
    let ask = || async {
        s.service
            .query_node_networks(Request::new(Default::default()))
            .await
            .expect("query")
            .into_inner()
    };
    let answer = ask().await;
    assert_eq!(answer.extradata["ready"], "true");
    assert_eq!(answer.networks.len(), 1);
    assert!(answer.networks[0].ready, "{:?}", answer.networks[0]);
    assert_eq!(answer.networks[0].extradata["freeDevices"], "dev-1,dev-2");

    s.facts.send_replace(NodeFacts {
        published: Some(true),
        registered: Some(true),
        nri: Some(false),
    });
    let answer = ask().await;
    assert_eq!(answer.extradata["ready"], "false");
    assert_eq!(
        answer.extradata["reasons"],
        "NRI plugin not connected to the container runtime"
    );
    assert!(!answer.networks[0].ready);
    assert_eq!(
        answer.networks[0].extradata["reasons"],
        "NRI plugin not connected to the container runtime"
    );
    s.facts.send_replace(NodeFacts {
        published: Some(true),
        registered: Some(true),
        nri: Some(true),
    });
    assert!(ask().await.networks[0].ready);

    // Both devices taken: not ready, and the reason names the holders.
    for (id, n) in [("a", 1), ("b", 2)] {
        s.door
            .attach(&sbx(id), &blue_wanted(), pod_netns(n))
            .await
            .expect("attach");
    }
    let answer = ask().await;
    assert!(!answer.networks[0].ready);
    assert!(
        answer.networks[0].extradata["reasons"].starts_with("0 of 2 matching devices free"),
        "{:?}",
        answer.networks[0].extradata
    );
    let missing = s.service.missing().await;
    assert!(missing.iter().all(|m| !m.contains("NRI")), "{missing:?}");
}

#[test]
fn sandbox_ids_and_uids() {
    let wanted = blue_wanted();
    let uid = sandbox::claim_uid("abc_1-2", &wanted);
    assert_eq!(uid, "kni.abc_1-2.network.blue");
    assert!(knic_proto::names::is_sandbox_claim_uid(&uid));
    assert_eq!(sandbox::sandbox_of(&uid), Some("abc_1-2"));
    assert_eq!(sandbox::sandbox_of("0f8e-uuid"), None);
    let claim = sandbox::claim(
        &sbx("abc"),
        &Wanted::Inline {
            device: "dev-1".into(),
            config: json!({}),
        },
        "node-a",
        &[("dev-1".into(), true)],
        &json!({}),
    )
    .expect("claim");
    let result = &claim
        .status
        .expect("status")
        .allocation
        .expect("allocation")
        .devices
        .expect("devices")
        .results
        .expect("results")[0];
    let share = result.share_id.clone().expect("a share of a shared port");
    assert_eq!(share.len(), 36, "{share}");
    let _ = BTreeMap::<String, String>::new();
}
