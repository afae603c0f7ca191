//! Rules and VRFs against the fake kernel: order within attach, what detach takes back while
//! the pod lives, sharing a VRF, clashes, and crashes between the steps.

use knic_proto::netconfig::{Cidr, Route, RoutingSettings, SourceRouting};

use super::super::fake::{FakeKernel, plan as base_plan};
use super::super::{
    AttachMode, AttachPlan, Kernel, LinkChange, Ns, Session, attach, capture, detach,
};
use super::*;

fn cidr(s: &str) -> Cidr {
    s.parse().expect("CIDR")
}

fn pod() -> Ns {
    Ns::Pod("/var/run/netns/cni-r".into())
}

const P: &str = "/var/run/netns/cni-r";

fn default_route() -> Route {
    Route {
        destination: cidr("0.0.0.0/0"),
        gateway: Some("192.0.2.1".parse().expect("ip")),
        source: None,
        metric: None,
        table: None,
    }
}

fn mark_rule() -> Rule {
    Rule {
        family: Family::Ipv4,
        from: None,
        to: None,
        iif: None,
        oif: None,
        fwmark: Some(16),
        fwmask: None,
        table: 200,
        priority: 900,
    }
}

/// A plan for `device` (host `host`, pod `pod_ifname`) with `settings` expanded as prepare
/// expands them.
fn routed(device: &str, host: &str, pod_ifname: &str, settings: &RoutingSettings) -> AttachPlan {
    let base = base_plan(device, host, pod_ifname, &["192.0.2.10/24"]);
    let (routes, routing) = super::plan(settings, &base.addresses, &[default_route()]);
    AttachPlan {
        mac: Some([2, 0, 0, 0, 0, device.len() as u8]),
        routes,
        routing,
        ..base
    }
}

fn sbr() -> RoutingSettings {
    RoutingSettings {
        rules: vec![mark_rule()],
        source_routing: Some(SourceRouting {
            table: 101,
            priority: 100,
        }),
        vrf: None,
    }
}

fn vrf(name: &str, table: u32) -> RoutingSettings {
    RoutingSettings {
        rules: Vec::new(),
        source_routing: None,
        vrf: Some(Vrf {
            name: name.into(),
            table,
        }),
    }
}

fn kernel() -> FakeKernel {
    let k = FakeKernel::new();
    k.add_link(&Ns::Host, "eth1", 1500, [0xaa, 0, 0, 0, 0, 1], None, &[]);
    k.add_link(&Ns::Host, "eth2", 1500, [0xaa, 0, 0, 0, 0, 2], None, &[]);
    k.add_namespace(&pod());
    k
}

fn tables(k: &FakeKernel) -> Vec<(String, Option<u32>)> {
    k.routes(&pod())
        .iter()
        .map(|(_, r)| (r.destination.to_string(), r.table))
        .collect()
}

fn on_host(k: &FakeKernel, name: &str) -> bool {
    k.links(&Ns::Host).iter().any(|l| l.name == name)
}

#[tokio::test]
async fn source_routing_fills_its_table_then_adds_the_rules_and_detach_takes_them_back() {
    let k = kernel();
    let p = routed("dev-a", "eth1", "net1", &sbr());
    let restore = capture(&k, &p).await.expect("capture");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attach");
    let log = k.log();
    let route_at = log
        .iter()
        .position(|l| l.contains("route add 0.0.0.0/0"))
        .expect("default route");
    let rule_at = log
        .iter()
        .position(|l| l.contains("rule add"))
        .expect("rule");
    assert!(route_at < rule_at, "routes before rules: {log:#?}");
    assert_eq!(
        tables(&k),
        vec![
            ("0.0.0.0/0".to_owned(), Some(101)),
            ("192.0.2.0/24".to_owned(), Some(101)),
        ]
    );
    let rules = k.rules(&pod());
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].from, Some(cidr("192.0.2.10/32")));
    assert_eq!((rules[0].table, rules[0].priority), (101, 100));
    assert_eq!(rules[1], mark_rule());

    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach");
    assert!(
        k.rules(&pod()).is_empty(),
        "rules left: {:?}",
        k.rules(&pod())
    );
    assert!(on_host(&k, "eth1"));
    assert!(k.routes(&pod()).is_empty());
    // Repeated: nothing left to delete is fine.
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach again");
}

#[tokio::test]
async fn a_vrf_is_made_and_joined_before_addresses_and_deleted_with_its_last_member() {
    let k = kernel();
    let p = routed("dev-a", "eth1", "net1", &vrf("blue", 10));
    let restore = capture(&k, &p).await.expect("capture");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attach");
    let log: Vec<String> = k
        .log()
        .into_iter()
        .filter_map(|l| l.strip_prefix(&format!("{P}: ")).map(str::to_owned))
        .collect();
    assert_eq!(
        log[..3],
        [
            "link add blue type vrf table 10 up".to_owned(),
            "link set net1 master blue".to_owned(),
            "addr add 192.0.2.10/24 dev net1".to_owned(),
        ]
    );
    assert_eq!(tables(&k), vec![("0.0.0.0/0".to_owned(), Some(10))]);
    let link = k.vrf_link(&pod(), "blue").expect("vrf");
    assert_eq!(link.table, Some(10));
    assert_eq!(link.members, vec!["net1".to_owned()]);

    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach");
    assert!(on_host(&k, "eth1"));
    assert_eq!(k.vrf_link(&pod(), "blue"), None, "the empty VRF is deleted");
}

#[tokio::test]
async fn two_claims_share_a_vrf_which_outlives_the_first_detach() {
    let k = kernel();
    let a = routed("dev-a", "eth1", "net1", &vrf("blue", 10));
    let b = routed("dev-bb", "eth2", "net2", &vrf("blue", 10));
    let ra = capture(&k, &a).await.expect("capture a");
    let rb = capture(&k, &b).await.expect("capture b");
    attach(&k, &a, &pod(), &ra, false).await.expect("attach a");
    attach(&k, &b, &pod(), &rb, false).await.expect("attach b");
    let adds = k.log().iter().filter(|l| l.contains("type vrf")).count();
    assert_eq!(adds, 1, "the second claim joins the VRF the first made");
    assert_eq!(
        k.vrf_link(&pod(), "blue").expect("vrf").members,
        vec!["net1".to_owned(), "net2".to_owned()]
    );
    detach(&k, &a, Some(&pod()), &ra).await.expect("detach a");
    assert_eq!(
        k.vrf_link(&pod(), "blue").expect("kept").members,
        vec!["net2".to_owned()]
    );
    detach(&k, &b, Some(&pod()), &rb).await.expect("detach b");
    assert_eq!(k.vrf_link(&pod(), "blue"), None);
}

#[tokio::test]
async fn a_vrf_name_clash_fails_the_attach_and_leaves_the_device_home() {
    let k = kernel();
    k.add_vrf_link(&pod(), "blue", 20);
    let p = routed("dev-a", "eth1", "net1", &vrf("blue", 10));
    let restore = capture(&k, &p).await.expect("capture");
    let e = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("other table");
    assert!(
        e.to_string().contains(
            "VRF blue already exists in the pod with table 20, not 10; another claim of this pod \
             uses the name with another table (vrf.table)"
        ),
        "{e}"
    );
    assert!(on_host(&k, "eth1"));
    // Not knic's to delete: another table.
    assert_eq!(k.vrf_link(&pod(), "blue").expect("kept").table, Some(20));

    let k = kernel();
    k.add_link(
        &pod(),
        "blue",
        1500,
        [2, 0, 0, 0, 0, 0x33],
        Some("veth"),
        &[],
    );
    let e = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("not a VRF");
    assert!(
        e.to_string().contains(
            "a link named blue already exists in the pod and is not a VRF; choose another vrf.name"
        ),
        "{e}"
    );
    assert!(on_host(&k, "eth1"));
    assert!(
        k.links(&pod()).iter().any(|l| l.name == "blue"),
        "a foreign link stays"
    );
}

#[tokio::test]
async fn a_refused_rule_undoes_the_attach_with_its_rules_and_vrf() {
    let k = kernel();
    let mut settings = vrf("blue", 10);
    settings.rules = vec![
        Rule {
            oif: Some("blue".into()),
            ..mark_rule()
        },
        mark_rule(),
    ];
    let p = routed("dev-a", "eth1", "net1", &settings);
    let restore = capture(&k, &p).await.expect("capture");
    // The second rule fails after the first was made.
    k.fail_on(
        &format!("{P}: rule add -4 rule priority 900 fwmark"),
        "Invalid argument",
    );
    let e = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("refused rule");
    assert!(e.to_string().contains("Invalid argument"), "{e}");
    assert!(on_host(&k, "eth1"), "device home");
    assert!(k.rules(&pod()).is_empty(), "half-made rules undone");
    assert_eq!(k.vrf_link(&pod(), "blue"), None, "half-made VRF undone");
}

#[tokio::test]
async fn a_child_whose_enslaving_fails_is_deleted_with_the_vrf_it_made() {
    let k = kernel();
    let mut p = routed("dev-a", "eth1", "net1", &vrf("blue", 10));
    p.mode = AttachMode::Vlan { id: 7 };
    let restore = capture(&k, &p).await.expect("capture");
    k.fail_on(
        &format!("{P}: link set net1 master blue"),
        "Operation not supported",
    );
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("refused enslaving");
    assert!(
        k.links(&pod()).is_empty(),
        "child and VRF gone: {:?}",
        k.links(&pod())
    );
}

/// A crash after the VRF was made (the undo never ran): the repeated hook resumes and
/// finishes, a detach then takes everything back.
#[tokio::test]
async fn a_resumed_attach_after_a_crash_between_vrf_and_rules_completes() {
    let k = kernel();
    let mut settings = vrf("blue", 10);
    settings.rules = vec![mark_rule()];
    let p = routed("dev-a", "eth1", "net1", &settings);
    let restore = capture(&k, &p).await.expect("capture");
    // What the crashed attach left: the device moved and the VRF made, nothing else.
    let mut host = k.open(&Ns::Host).await.expect("open").expect("host");
    host.move_link(
        "eth1",
        &pod(),
        &LinkChange {
            name: Some("net1".into()),
            mtu: p.mtu,
            mac: p.mac,
            ..LinkChange::default()
        },
    )
    .await
    .expect("move");
    let mut in_pod = k.open(&pod()).await.expect("open").expect("pod");
    in_pod
        .add_vrf(p.routing.vrf.as_ref().expect("vrf"))
        .await
        .expect("vrf");
    drop(in_pod);

    attach(&k, &p, &pod(), &restore, true)
        .await
        .expect("resumed");
    assert_eq!(
        k.vrf_link(&pod(), "blue").expect("vrf").members,
        vec!["net1".to_owned()]
    );
    assert_eq!(k.rules(&pod()), vec![mark_rule()]);
    assert_eq!(
        k.log().iter().filter(|l| l.contains("type vrf")).count(),
        1,
        "the VRF there is reused"
    );
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach");
    assert!(k.rules(&pod()).is_empty());
    assert_eq!(k.vrf_link(&pod(), "blue"), None);
}

/// A detach cut short between the rules and the rest is simply repeated.
#[tokio::test]
async fn a_detach_failing_on_the_rules_is_repeated_to_the_end() {
    let k = kernel();
    let p = routed("dev-a", "eth1", "net1", &sbr());
    let restore = capture(&k, &p).await.expect("capture");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attach");
    k.fail_on(&format!("{P}: rule del -4 rule priority 900"), "killed");
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect_err("cut short");
    assert_eq!(
        k.rules(&pod()),
        vec![mark_rule()],
        "the source rule went first"
    );
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("repeated");
    assert!(k.rules(&pod()).is_empty());
    assert!(on_host(&k, "eth1"));
}

#[tokio::test]
async fn a_gone_pod_takes_its_rules_and_vrf_along() {
    let k = kernel();
    let mut settings = vrf("blue", 10);
    settings.rules = vec![mark_rule()];
    let p = routed("dev-a", "eth1", "net1", &settings);
    let restore = capture(&k, &p).await.expect("capture");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attach");
    k.delete_namespace(&pod());
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach");
    assert!(on_host(&k, "eth1"));
    assert!(k.rules(&pod()).is_empty());
}

#[test]
fn an_empty_routing_is_left_out_of_the_checkpoint() {
    let p = routed("dev-a", "eth1", "net1", &RoutingSettings::default());
    let stored = serde_json::to_value(&p).expect("json");
    assert!(stored.get("routing").is_none(), "{stored}");
    let p = routed("dev-a", "eth1", "net1", &sbr());
    let stored = serde_json::to_value(&p).expect("json");
    assert_eq!(stored["routing"]["rules"][0]["from"], "192.0.2.10/32");
    let back: AttachPlan = serde_json::from_value(stored).expect("loads");
    assert_eq!(back, p);
}
