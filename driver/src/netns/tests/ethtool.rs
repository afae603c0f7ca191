//! ethtool settings through the fake kernel: the previous values of exactly what changes
//! recorded on the host before a move, applied in the pod before the link goes up, put back
//! on detach (also after a crash, from the checkpointed record); children start fresh; a fixed
//! feature, a size above the device's maximum, a part the driver lacks, each refused with the
//! device, the setting and the kernel's text, and the attach undone.

use knic_proto::netconfig::{Channels, ChildKind, Coalesce, EthtoolSettings, Rings};

use super::super::fake::FakeEthtool;
use super::*;

fn features(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

fn tuned(mode: AttachMode, settings: EthtoolSettings) -> AttachPlan {
    AttachPlan {
        ethtool: Some(settings),
        ..plan(mode)
    }
}

fn asked() -> EthtoolSettings {
    EthtoolSettings {
        // gro on (off now), tso off (on now), rx-checksum on (already): two changes.
        features: features(&[
            ("rx-gro", true),
            ("tcp-segmentation-offload", false),
            ("rx-checksum", true),
        ]),
        rings: Some(Rings {
            rx: Some(1024),
            tx: Some(256), // already
            ..Rings::default()
        }),
        channels: Some(Channels {
            combined: Some(4),
            ..Channels::default()
        }),
        coalesce: Some(Coalesce {
            rx_usecs: Some(50),
            adaptive_rx: Some(true),
            ..Coalesce::default()
        }),
    }
}

/// The host NIC with an igb-like model.
fn nic() -> (FakeKernel, u32) {
    let (k, index) = kernel();
    k.set_ethtool(&Ns::Host, "ens1f0v0", FakeEthtool::nic());
    (k, index)
}

fn previous() -> EthtoolSettings {
    EthtoolSettings {
        features: features(&[
            ("rx-gro", false),
            ("tx-tcp-segmentation", true),
            ("tx-tcp6-segmentation", true),
        ]),
        rings: Some(Rings {
            rx: Some(256),
            ..Rings::default()
        }),
        channels: Some(Channels {
            combined: Some(2),
            ..Channels::default()
        }),
        coalesce: Some(Coalesce {
            rx_usecs: Some(3),
            adaptive_rx: None,
            ..Coalesce::default()
        }),
    }
}

#[tokio::test]
async fn a_moved_device_is_tuned_before_up_and_gets_exactly_the_changed_values_back() {
    let (k, _) = nic();
    let p = tuned(AttachMode::Move, asked());
    let restore = capture(&k, &p).await.expect("captures");
    // Only what differs is recorded: rx-checksum and the tx ring were already as asked; the
    // driver reports no adaptive-rx, so there is no previous value for it.
    assert_eq!(restore.ethtool, Some(previous()));
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    let log = k.log();
    let set = log
        .iter()
        .position(|l| l.contains("ethtool --set net1"))
        .expect("set");
    let up = log
        .iter()
        .position(|l| l.ends_with("link set net1 up"))
        .expect("up");
    assert!(set < up, "tuned before up: {log:?}");
    assert_eq!(
        log[set],
        "/var/run/netns/cni-1: ethtool --set net1 features rx-gro on tx-tcp-segmentation off \
         tx-tcp6-segmentation off, rings rx 1024, channels combined 4, coalesce adaptive-rx on \
         rx-usecs 50"
    );
    let now = k.ethtool(&pod(), "net1").expect("model");
    assert!(now.active.contains("rx-gro") && !now.active.contains("tx-tcp-segmentation"));
    assert_eq!(now.rings.expect("rings").0.rx, Some(1024));
    assert_eq!(now.channels.expect("channels").0.combined, Some(4));
    assert_eq!(now.coalesce.expect("coalesce").adaptive_rx, Some(true));

    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    let back = k.ethtool(&Ns::Host, "ens1f0v0").expect("model");
    let mut expected = FakeEthtool::nic();
    // adaptive-rx had no value to go back to: it stays as the claim left it.
    if let Some(c) = expected.coalesce.as_mut() {
        c.adaptive_rx = Some(true);
    }
    assert_eq!(back, expected);
    let log = k.log();
    let sets: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("host: ethtool --set"))
        .collect();
    assert_eq!(
        sets,
        vec![
            "host: ethtool --set ens1f0v0 features rx-gro off tx-tcp-segmentation on \
             tx-tcp6-segmentation on, rings rx 256, channels combined 2, coalesce rx-usecs 3"
        ]
    );
    // A repeated detach sends nothing more.
    let before = k.log().len();
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches again");
    assert!(
        !k.log()[before..]
            .iter()
            .any(|l| l.contains("ethtool --set")),
        "{:?}",
        &k.log()[before..]
    );
}

#[tokio::test]
async fn nothing_to_change_records_nothing_and_sends_no_set() {
    let (k, _) = nic();
    let p = tuned(
        AttachMode::Move,
        EthtoolSettings {
            features: features(&[("rx-checksum", true), ("rx-lro", false)]),
            ..EthtoolSettings::default()
        },
    );
    let restore = capture(&k, &p).await.expect("captures");
    assert_eq!(restore.ethtool, None);
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    assert!(!k.log().iter().any(|l| l.contains("ethtool --set")));
}

#[tokio::test]
async fn a_fixed_feature_is_refused_before_anything_moves() {
    let (k, _) = nic();
    let p = tuned(
        AttachMode::Move,
        EthtoolSettings {
            features: features(&[("rx-vlan-filter", true), ("rx-gro", true)]),
            ..EthtoolSettings::default()
        },
    );
    let err = capture(&k, &p).await.expect_err("fixed").to_string();
    assert_eq!(
        err,
        "host: setting ethtool features of ens1f0v0: rx-vlan-filter cannot be turned on: the \
         device has it fixed off"
    );
    assert!(k.links(&pod()).is_empty());
}

#[tokio::test]
async fn a_group_alias_changes_the_members_it_can_and_is_refused_when_it_can_change_none() {
    let (k, _) = nic();
    // tx-checksumming on: only tx-checksum-ip-generic is changeable, and it is on already;
    // the others are fixed off, as on a veth. ethtool -K tx on leaves them; so does knic.
    let p = tuned(
        AttachMode::Move,
        EthtoolSettings {
            features: features(&[("tx-checksumming", false)]),
            ..EthtoolSettings::default()
        },
    );
    let restore = capture(&k, &p).await.expect("captures");
    assert_eq!(
        restore.ethtool.map(|e| e.features),
        Some(features(&[("tx-checksum-ip-generic", true)]))
    );
    let on = tuned(
        AttachMode::Move,
        EthtoolSettings {
            features: features(&[("tx-checksumming", true)]),
            ..EthtoolSettings::default()
        },
    );
    let (k2, _) = nic();
    let mut model = FakeEthtool::nic();
    model.active.remove("tx-checksum-ip-generic");
    model.changeable.remove("tx-checksum-ip-generic");
    k2.set_ethtool(&Ns::Host, "ens1f0v0", model);
    let err = capture(&k2, &on)
        .await
        .expect_err("none changeable")
        .to_string();
    assert_eq!(
        err,
        "host: setting ethtool features of ens1f0v0: tx-checksumming (tx-checksum-ipv4, \
         tx-checksum-ip-generic, tx-checksum-ipv6, tx-checksum-fcoe-crc, tx-checksum-sctp) \
         cannot be turned on: the device has tx-checksum-ipv4, tx-checksum-ip-generic, \
         tx-checksum-ipv6, tx-checksum-fcoe-crc, tx-checksum-sctp fixed off"
    );
}

#[tokio::test]
async fn a_size_above_the_maximum_fails_the_attach_names_the_maxima_and_is_undone() {
    let (k, _) = nic();
    let p = tuned(
        AttachMode::Move,
        EthtoolSettings {
            features: features(&[("rx-gro", true)]),
            rings: Some(Rings {
                rx: Some(8192),
                ..Rings::default()
            }),
            ..EthtoolSettings::default()
        },
    );
    let restore = capture(&k, &p).await.expect("captures");
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("too large")
        .to_string();
    assert_eq!(
        err,
        "/var/run/netns/cni-1: setting ethtool rings of net1 (rx 8192): Invalid argument (os \
         error 22): requested ring size exceeds maximum; the device's maxima: rx 4096 tx 4096"
    );
    // Undone: home, and GRO (set before the refused rings) back off.
    assert!(k.links(&pod()).is_empty());
    let home = k.ethtool(&Ns::Host, "ens1f0v0").expect("model");
    assert_eq!(home, FakeEthtool::nic());
}

#[tokio::test]
async fn a_part_the_driver_lacks_is_refused_at_capture() {
    let (k, _) = kernel();
    k.set_ethtool(&Ns::Host, "ens1f0v0", FakeEthtool::veth());
    let p = tuned(
        AttachMode::Move,
        EthtoolSettings {
            rings: Some(Rings {
                rx: Some(512),
                ..Rings::default()
            }),
            ..EthtoolSettings::default()
        },
    );
    let err = capture(&k, &p).await.expect_err("no rings").to_string();
    assert_eq!(
        err,
        "host: reading ethtool rings of ens1f0v0: the device's driver does not support ethtool \
         rings (Operation not supported (os error 95))"
    );
}

#[tokio::test]
async fn a_feature_the_kernel_keeps_off_is_an_error_naming_it() {
    let (k, _) = nic();
    let mut model = FakeEthtool::nic();
    model.changeable.insert("rx-gro-hw".into());
    model.needs.insert("rx-gro-hw".into(), "rx-lro".into());
    k.set_ethtool(&Ns::Host, "ens1f0v0", model);
    let p = tuned(
        AttachMode::Move,
        EthtoolSettings {
            features: features(&[("rx-gro-hw", true)]),
            ..EthtoolSettings::default()
        },
    );
    let restore = capture(&k, &p).await.expect("captures");
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("kept off")
        .to_string();
    assert_eq!(
        err,
        "/var/run/netns/cni-1: setting ethtool features of net1: the kernel took the request but \
         rx-gro-hw stays off (asked on): it depends on another feature or on the device's state"
    );
    assert!(k.links(&pod()).is_empty(), "undone");
}

#[tokio::test]
async fn a_child_is_tuned_in_the_pod_and_needs_no_restore() {
    let (k, _) = nic();
    let p = tuned(
        AttachMode::Child {
            child: ChildKind::Macvlan("bridge".into()),
            uplink: None,
        },
        EthtoolSettings {
            features: features(&[("rx-gro", true)]),
            ..EthtoolSettings::default()
        },
    );
    let restore = capture(&k, &p).await.expect("captures");
    assert_eq!(restore.ethtool, None, "a child starts fresh");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    let child = k.ethtool(&pod(), "net1");
    assert!(
        child.is_some_and(|m| m.active.contains("rx-gro")),
        "{:?}",
        k.log()
    );
    // The parent is untouched.
    assert_eq!(k.ethtool(&Ns::Host, "ens1f0v0"), Some(FakeEthtool::nic()));
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert!(!k.log().iter().any(|l| l.starts_with("host: ethtool --set")));
}

#[tokio::test]
async fn a_crash_after_the_record_and_before_the_change_puts_nothing_back_wrongly() {
    let (k, _) = nic();
    let p = tuned(AttachMode::Move, asked());
    let restore = capture(&k, &p).await.expect("captures");
    let checkpoint = serde_json::to_string(&(&p, &restore)).expect("serializes");
    assert!(
        checkpoint.contains("\"ethtool\""),
        "the record is checkpointed"
    );
    // The driver died before the move; the restarted one detaches from the checkpoint.
    let (p, restore): (AttachPlan, Restore) =
        serde_json::from_str(&checkpoint).expect("deserializes");
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert_eq!(k.ethtool(&Ns::Host, "ens1f0v0"), Some(FakeEthtool::nic()));
    assert!(
        !k.log().iter().any(|l| l.contains("ethtool --set")),
        "nothing differed: {:?}",
        k.log()
    );
}

#[tokio::test]
async fn a_crash_after_the_change_is_undone_from_the_checkpointed_record_when_the_pod_dies() {
    let (k, _) = nic();
    let p = tuned(AttachMode::Move, asked());
    let restore = capture(&k, &p).await.expect("captures");
    let checkpoint = serde_json::to_string(&(&p, &restore)).expect("serializes");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    // The driver dies; the pod goes away and the kernel hands the NIC back by itself, tuned.
    k.delete_namespace(&pod());
    let (p, restore): (AttachPlan, Restore) =
        serde_json::from_str(&checkpoint).expect("deserializes");
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    let mut expected = FakeEthtool::nic();
    if let Some(c) = expected.coalesce.as_mut() {
        c.adaptive_rx = Some(true);
    }
    assert_eq!(k.ethtool(&Ns::Host, "ens1f0v0"), Some(expected));
}

#[test]
fn an_older_checkpoint_without_ethtool_loads_and_a_new_one_omits_it_when_unset() {
    let p = plan(AttachMode::Move);
    let json = serde_json::to_value(&p).expect("json");
    assert!(json.get("ethtool").is_none());
    let back: AttachPlan = serde_json::from_value(json).expect("loads");
    assert_eq!(back.ethtool, None);
}

#[tokio::test]
async fn another_device_under_the_name_is_not_given_the_recorded_values() {
    let (k, _) = nic();
    let p = tuned(AttachMode::Move, asked());
    let restore = capture(&k, &p).await.expect("captures");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    // The pod's namespace dies with a virtual device standing in for the NIC: it is gone, and
    // another device (new index, no hardware identity) took the host name.
    let mut in_pod = k.open(&pod()).await.expect("opens").expect("pod");
    in_pod.del_link("net1").await.expect("deletes");
    drop(in_pod);
    k.add_link(
        &Ns::Host,
        "ens1f0v0",
        1500,
        [0xcc, 0, 0, 0, 0, 1],
        None,
        &[],
    );
    k.set_ethtool(&Ns::Host, "ens1f0v0", FakeEthtool::veth());
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert_eq!(k.ethtool(&Ns::Host, "ens1f0v0"), Some(FakeEthtool::veth()));
    assert!(!k.log().iter().any(|l| l.starts_with("host: ethtool --set")));
}
