//! VF settings through a PF that behaves as the real igb driver did in the test VM
//! (`e2e/tests/sriov_vm.rs`, QEMU's 82576): it refuses link state, a minimum rate and 802.1ad
//! with their errnos, enforces a MAC it assigned (the VF may not set any MAC, not even that
//! one, until it is trusted or the assignment is cleared), and the VF takes the assigned MAC
//! as its current and permanent one when its netdev opens. Each test is a defect the real
//! kernel showed and the message-level tests could not.

use knic_proto::netconfig::{VfLinkState, VfSettings, VfVlanProtocol};

use super::super::fake::FakeKernel;
use super::*;

const PF: &str = "eth1";
const VF_NETDEV: &str = "eth2";
const VF_PCI: &str = "0000:02:10.0";
const OWN_MAC: [u8; 6] = [0x56, 0xd4, 0x2b, 0x71, 0x9f, 0xe8];

/// An igb PF with VF 0, whose netdev (down, random MAC) is on the host; and a pod namespace.
fn kernel() -> FakeKernel {
    let k = FakeKernel::new();
    k.add_link(
        &Ns::Host,
        PF,
        1500,
        [0x52, 0x54, 0, 0x12, 0x34, 0x57],
        None,
        &[],
    );
    k.add_link(&Ns::Host, VF_NETDEV, 1500, OWN_MAC, None, &[]);
    k.set_down(&Ns::Host, VF_NETDEV);
    k.vf_netdev(&Ns::Host, VF_NETDEV, PF, 0, VF_PCI);
    k.add_vf(PF, 0, unassigned_vf());
    k.igb(PF);
    k.add_namespace(&pod());
    k
}

fn vf_plan(mac: [u8; 6], settings: VfSettings) -> AttachPlan {
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mac: Some(mac),
        vf: Some(VfPlan {
            pf: PF.into(),
            index: 0,
            settings: VfSettings {
                mac: Some(mac),
                ..settings
            },
        }),
        ..super::super::fake::plan("pci-0000-02-10-0", VF_NETDEV, "net1", &["192.0.2.10/24"])
    }
}

fn vlan(id: u16) -> VfSettings {
    VfSettings {
        vlan: Some(id),
        spoof_chk: Some(false),
        ..VfSettings::default()
    }
}

fn vf_link(k: &FakeKernel, ns: &Ns, name: &str) -> LinkState {
    k.links(ns)
        .into_iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no {name} in {ns}: {:?}", k.links(ns)))
}

/// The claim's MAC reaches the VF in the pod although igb refuses the VF's own request for
/// it (it asks with the VF trusted for that one request), and detach gives the netdev its own
/// MAC back only after the PF's assignment is cleared: with the MAC in the move home, the
/// kernel answered EADDRNOTAVAIL and the VF stayed away.
#[tokio::test]
async fn an_assigned_mac_comes_and_goes_through_an_enforcing_pf() {
    let k = kernel();
    let mac = [0x02, 0, 0, 0, 0x20, 0x01];
    let p = vf_plan(mac, vlan(100));
    let restore = capture(&k, &p).await.expect("captures");
    let link = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    assert_eq!(link.mac, Some(mac));
    assert_eq!(vf_link(&k, &pod(), "net1").mac, Some(mac));
    assert_eq!(
        k.vf(PF, 0).and_then(|v| v.trust),
        Some(false),
        "trust put back"
    );
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    let home = vf_link(&k, &Ns::Host, VF_NETDEV);
    assert_eq!(home.mac, Some(OWN_MAC));
    // The assignment is cleared; the PF has learnt the VF's own MAC, as igb reports it.
    assert_eq!(
        k.vf(PF, 0),
        Some(VfState {
            mac: Some(OWN_MAC),
            ..unassigned_vf()
        })
    );
}

/// igb has no `ndo_set_vf_link_state`: the attach fails naming the field, and the settings
/// made before it are undone.
#[tokio::test]
async fn a_setting_igb_lacks_fails_the_attach_naming_it() {
    let k = kernel();
    for (settings, want) in [
        (
            VfSettings {
                link_state: Some(VfLinkState::Enable),
                ..vlan(300)
            },
            "host: setting VF 0 of eth1: vf.linkState (state enable): the PF's driver does not \
             support this setting: Operation not supported (os error 95)",
        ),
        (
            VfSettings {
                min_tx_rate: Some(10),
                ..vlan(300)
            },
            "host: setting VF 0 of eth1: vf.minTxRate/vf.maxTxRate (min_tx_rate 10 max_tx_rate \
             0): the PF's driver refused the rate (some support only a maximum, or none above \
             the link speed): Invalid argument (os error 22)",
        ),
        (
            VfSettings {
                vlan_protocol: Some(VfVlanProtocol::Dot1Ad),
                ..vlan(300)
            },
            "host: setting VF 0 of eth1: vf.vlanProtocol (vlan 300 qos 0 proto 802.1ad): the \
             PF's driver does not support this VLAN protocol: Protocol not supported (os error \
             93)",
        ),
    ] {
        let p = vf_plan([0x02, 0, 0, 0, 0x20, 0x09], settings);
        let restore = capture(&k, &p).await.expect("captures");
        let err = attach(&k, &p, &pod(), &restore, false)
            .await
            .expect_err("igb refuses")
            .to_string();
        assert_eq!(err, want);
        assert_eq!(k.vf(PF, 0), Some(unassigned_vf()));
        assert!(k.links(&pod()).is_empty(), "nothing moved");
        assert_eq!(vf_link(&k, &Ns::Host, VF_NETDEV).mac, Some(OWN_MAC));
    }
}

/// igbvf takes an assigned MAC as its permanent one when it resets in the pod, and keeps it:
/// the next claim of the VF records that one and finds the claim's after the attach. The PCI
/// function identifies the VF, so both come home.
#[tokio::test]
async fn a_vf_whose_permanent_mac_changes_comes_home_every_time() {
    let k = kernel();
    for (round, mac) in [[0x02, 0, 0, 0, 0x20, 1], [0x02, 0, 0, 0, 0x20, 2]]
        .into_iter()
        .enumerate()
    {
        let p = vf_plan(mac, VfSettings::default());
        let restore = capture(&k, &p).await.expect("captures");
        attach(&k, &p, &pod(), &restore, false)
            .await
            .expect("attaches");
        assert_eq!(vf_link(&k, &pod(), "net1").permanent_mac, Some(mac));
        detach(&k, &p, Some(&pod()), &restore)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let home = vf_link(&k, &Ns::Host, VF_NETDEV);
        assert_eq!(home.permanent_mac, Some(mac), "round {round}");
        assert!(k.links(&pod()).is_empty(), "round {round}: left in the pod");
    }
}

/// igb reports the MAC a VF registered for itself as the VF's MAC: put back through the PF it
/// would become an assigned, enforced one and the VF could never change its MAC again. knic
/// clears the assignment instead, and a second detach leaves the VF's filter alone.
#[tokio::test]
async fn a_mac_the_vf_registered_itself_is_not_turned_into_an_assigned_one() {
    let k = kernel();
    k.add_vf(
        PF,
        0,
        VfState {
            mac: Some(OWN_MAC),
            ..unassigned_vf()
        },
    );
    let p = vf_plan([0x02, 0, 0, 0, 0x20, 3], VfSettings::default());
    let restore = capture(&k, &p).await.expect("captures");
    assert_eq!(restore.vf.as_ref().and_then(|v| v.mac), Some([0; 6]));
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attaches");
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches");
    assert_eq!(k.vf(PF, 0).and_then(|v| v.mac), Some(OWN_MAC));
    let before = k.log().len();
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detaches again");
    assert_eq!(k.log().len(), before, "a second detach changes nothing");
    // Not enforced: the VF may change its own MAC.
    let mut host = k.open(&Ns::Host).await.expect("opens").expect("host");
    host.set_link(
        VF_NETDEV,
        &LinkChange {
            mac: Some([0x02, 0, 0, 0, 0x77, 0x77]),
            ..LinkChange::default()
        },
    )
    .await
    .expect("the VF's own MAC change is accepted");
}
