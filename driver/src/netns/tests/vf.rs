//! VF settings through the fake kernel: made through the PF before the move, put back after
//! the device is home, rolled back when attach fails, and reset from the checkpointed record
//! after a crash.

use knic_proto::netconfig::{VfLinkState, VfSettings, VfVlanProtocol};

use super::super::fake::FakeKernel;
use super::super::vf::VfVlanTag;
use super::*;

const PF: &str = "ens1f0";
const VF_NETDEV: &str = "ens1f0v3";
const VF_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x33];

fn settings() -> VfSettings {
    VfSettings {
        mac: Some(VF_MAC),
        vlan: Some(100),
        qos: Some(2),
        vlan_protocol: Some(VfVlanProtocol::Dot1Ad),
        spoof_chk: Some(false),
        trust: Some(true),
        max_tx_rate: Some(5000),
        link_state: Some(VfLinkState::Enable),
        ..VfSettings::default()
    }
}

/// A PF with VF 3, whose netdev is on the host; and a pod namespace.
fn kernel() -> FakeKernel {
    let k = FakeKernel::new();
    k.add_link(&Ns::Host, PF, 1500, [0xaa, 0, 0, 0, 0, 0xf0], None, &[]);
    k.add_link(&Ns::Host, VF_NETDEV, 1500, [0xaa, 0, 0, 0, 0, 3], None, &[]);
    k.add_vf(PF, 3, unassigned_vf());
    k.add_namespace(&pod());
    k
}

/// The plan `claims::plan` makes for such a VF: the PF's MAC for the VF is the netdev's too.
fn vf_plan(mode: AttachMode) -> AttachPlan {
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mode,
        mac: Some(VF_MAC),
        vf: Some(VfPlan {
            pf: PF.into(),
            index: 3,
            settings: settings(),
        }),
        ..super::super::fake::plan("pci-0000-a2-01-3", VF_NETDEV, "net1", &["192.0.2.10/24"])
    }
}

/// The requests that set `settings()`: one per setting, in the kernel's order.
const SET: [&str; 6] = [
    "host: link set ens1f0 vf 3 mac 02:00:00:00:00:33",
    "host: link set ens1f0 vf 3 vlan 100 qos 2 proto 802.1ad",
    "host: link set ens1f0 vf 3 min_tx_rate 0 max_tx_rate 5000",
    "host: link set ens1f0 vf 3 spoofchk off",
    "host: link set ens1f0 vf 3 state enable",
    "host: link set ens1f0 vf 3 trust on",
];
/// The requests that put `unassigned_vf()` back.
const RESET: [&str; 6] = [
    "host: link set ens1f0 vf 3 mac 00:00:00:00:00:00",
    "host: link set ens1f0 vf 3 vlan 0 qos 0 proto 802.1Q",
    "host: link set ens1f0 vf 3 min_tx_rate 0 max_tx_rate 0",
    "host: link set ens1f0 vf 3 spoofchk on",
    "host: link set ens1f0 vf 3 state auto",
    "host: link set ens1f0 vf 3 trust off",
];

fn position(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {log:#?}"))
}

#[tokio::test]
async fn capture_records_the_previous_values_of_exactly_what_will_change() {
    let k = kernel();
    let mut partial = vf_plan(AttachMode::Move);
    if let Some(vf) = &mut partial.vf {
        vf.settings = VfSettings {
            trust: Some(true),
            ..VfSettings::default()
        };
    }
    let restore = capture(&k, &partial).await.expect("captures");
    assert_eq!(
        restore.vf,
        Some(VfState {
            trust: Some(false),
            ..VfState::default()
        })
    );
    let restore = capture(&k, &vf_plan(AttachMode::Move))
        .await
        .expect("captures");
    assert_eq!(restore.vf, Some(unassigned_vf()));
    assert!(k.log().is_empty(), "capture only reads: {:?}", k.log());
}

#[tokio::test]
async fn attach_sets_the_vf_through_the_pf_before_the_move() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    let link = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    assert_eq!(link.mac, Some(VF_MAC));
    let log = k.log();
    assert_eq!(log[..6], SET);
    // The move carries no MAC: the one the PF assigned reaches the netdev once it is open in
    // the pod (a PF enforcing it would refuse the VF's request during the move).
    assert_eq!(
        log[6],
        "host: link set ens1f0v3 netns /var/run/netns/cni-1 name net1 mtu 9000"
    );
    let up = position(&log, "/var/run/netns/cni-1: link set net1 up");
    assert!(
        position(
            &log,
            "/var/run/netns/cni-1: link set net1 address 02:00:00:00:00:33"
        ) > up,
        "{log:#?}"
    );
    assert_eq!(
        k.vf(PF, 3),
        Some(VfState {
            mac: Some(VF_MAC),
            vlan: Some(VfVlanTag {
                id: 100,
                qos: 2,
                protocol: VfVlanProtocol::Dot1Ad
            }),
            rate: Some((0, 5000)),
            spoof_chk: Some(false),
            trust: Some(true),
            link_state: Some(VfLinkState::Enable),
        })
    );
}

#[tokio::test]
async fn detach_puts_the_vf_back_after_the_device_is_home_idempotently() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    let attached = k.log().len();
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    let log = k.log()[attached..].to_vec();
    let home = position(&log, "/var/run/netns/cni-1: link set net1 netns host");
    assert!(position(&log, RESET[0]) > home, "{log:#?}");
    // The netdev's own MAC last, once its PF no longer enforces the claim's.
    assert!(
        position(&log, "host: link set ens1f0v3 address aa:00:00:00:00:03")
            > position(&log, RESET[5]),
        "{log:#?}"
    );
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
    let host = k.links(&Ns::Host);
    assert!(host.contains(&restore.host), "{host:?}");
    let before = k.log().len();
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert_eq!(k.log().len(), before, "a second detach changes nothing");
}

#[tokio::test]
async fn a_failed_move_rolls_the_vf_back() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    k.fail_on("host: link set ens1f0v3 netns", "Device or resource busy");
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("the move fails")
        .to_string();
    assert!(err.contains("Device or resource busy"), "{err}");
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
    let log = k.log();
    assert_eq!(log[..6], SET);
    assert_eq!(log[log.len() - 6..], RESET);
}

#[tokio::test]
async fn a_failure_after_the_move_brings_the_device_home_and_then_rolls_the_vf_back() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    k.fail_on("/var/run/netns/cni-1: addr add", "No space left on device");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("the address fails");
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
    assert!(k.links(&pod()).is_empty());
    let log = k.log();
    assert!(
        position(&log, RESET[0]) > position(&log, "/var/run/netns/cni-1: link set net1 netns host"),
        "{log:#?}"
    );
}

#[tokio::test]
async fn a_pf_refusing_the_settings_leaves_the_device_on_the_host() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    k.fail_on("host: link set ens1f0 vf 3", "Operation not supported");
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("the PF refuses")
        .to_string();
    assert!(err.contains("Operation not supported"), "{err}");
    assert!(k.links(&pod()).is_empty(), "nothing moved");
    assert_eq!(k.log().len(), 1, "nothing else was tried: {:?}", k.log());
}

#[tokio::test]
async fn settings_a_pf_made_before_refusing_one_are_rolled_back() {
    let k = kernel();
    k.refuse_trust(PF);
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("the PF cannot set trust")
        .to_string();
    assert_eq!(
        err,
        "host: setting VF 3 of ens1f0: vf.trust (trust on): the PF's driver does not support \
         this setting: Operation not supported (os error 95)"
    );
    // The MAC, VLAN, rate, spoof check and link state were made before trust failed; exactly
    // those are undone (asking this PF for trust again would fail the undo too).
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
    assert_eq!(k.log()[..6], SET);
    assert_eq!(k.log()[6..], RESET[..5]);
    assert!(k.links(&pod()).is_empty(), "nothing moved");
}

#[tokio::test]
async fn a_crash_after_the_settings_is_reset_from_the_checkpointed_record() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    // The checkpoint holds the plan and the record as JSON.
    let checkpoint = serde_json::to_string(&(&p, &restore)).expect("serializes");
    // The VF was set, then the driver died before the move.
    let mut host = k.open(&Ns::Host).await.expect("opens").expect("host");
    let wanted = super::super::vf::request(&settings(), &unassigned_vf());
    host.set_vf(PF, 3, &wanted).await.expect("sets");
    drop(host);
    assert_ne!(k.vf(PF, 3), Some(unassigned_vf()));
    // The restarted driver only has the checkpoint; the pod went away meanwhile.
    let (p, restore): (AttachPlan, Restore) =
        serde_json::from_str(&checkpoint).expect("deserializes");
    k.delete_namespace(&pod());
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
    let log = k.log();
    assert_eq!(log[log.len() - 6..], RESET);
    let vf_netdev = k.links(&Ns::Host).into_iter().find(|l| l.name == VF_NETDEV);
    assert_eq!(vf_netdev, Some(restore.host), "the netdev never moved");
}

#[tokio::test]
async fn a_lost_device_still_gets_its_vf_settings_back() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    // The netdev vanished (its VF driver was unbound, say); the PF still holds the settings.
    let mut in_pod = k.open(&pod()).await.expect("opens").expect("pod");
    in_pod.del_link("net1").await.expect("deletes");
    drop(in_pod);
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
}

#[tokio::test]
async fn a_vlan_child_of_a_vf_also_gets_the_vf_settings_and_gives_them_back() {
    let k = kernel();
    let p = vf_plan(AttachMode::Vlan { id: 7 });
    let restore = capture(&k, &p).await.expect("captures");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    let log = k.log();
    assert!(
        position(&log, SET[5]) < position(&log, "host: link add"),
        "{log:#?}"
    );
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
    // And a failed VLAN attach after the child was created rolls the VF back too.
    k.fail_on("/var/run/netns/cni-1: addr add", "No space left on device");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("the address fails");
    assert_eq!(k.vf(PF, 3), Some(unassigned_vf()));
    assert!(k.links(&pod()).is_empty());
    let temp = p.vlan_temp_name();
    assert!(k.links(&Ns::Host).iter().all(|l| l.name != temp));
}

#[tokio::test]
async fn capture_refuses_a_vf_the_pf_does_not_have() {
    let k = kernel();
    let mut p = vf_plan(AttachMode::Move);
    if let Some(vf) = &mut p.vf {
        vf.index = 7;
    }
    let err = capture(&k, &p).await.expect_err("no VF 7").to_string();
    assert_eq!(
        err,
        "host: reading VF 7 of ens1f0: PF ens1f0 has no VF 7 (were its VFs re-created?)"
    );
}

#[tokio::test]
async fn a_vanished_pf_does_not_block_detach() {
    let k = kernel();
    let p = vf_plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("captures");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    let mut host = k.open(&Ns::Host).await.expect("opens").expect("host");
    host.del_link(PF).await.expect("deletes");
    drop(host);
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert!(k.links(&Ns::Host).iter().any(|l| l.name == VF_NETDEV));
}

#[test]
fn checkpoints_written_before_vf_settings_still_load() {
    let plan: AttachPlan = serde_json::from_value(serde_json::json!({
        "pool": "node-a", "device": "d", "request": "nic", "hostIfname": "eth1",
        "mode": {"type": "move"}, "podIfname": "net1", "mtu": null, "mac": null,
        "addresses": [], "routes": [], "sysctls": {}
    }))
    .expect("old plan loads");
    assert_eq!(plan.vf, None);
    let restore: Restore = serde_json::from_value(serde_json::json!({
        "host": {"index": 3, "name": "eth1", "mtu": 1500, "mac": null, "up": true,
                 "addresses": [], "kind": null}
    }))
    .expect("old record loads");
    assert_eq!(restore.vf, None);
    // And the new fields survive a round trip.
    let p = vf_plan(AttachMode::Move);
    let stored = serde_json::to_value(&p).expect("serializes");
    assert_eq!(stored["vf"]["pf"], "ens1f0");
    assert_eq!(stored["vf"]["settings"]["vlanProtocol"], "802.1ad");
    assert_eq!(
        serde_json::from_value::<AttachPlan>(stored).expect("loads"),
        p
    );
}
