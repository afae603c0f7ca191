//! Overlay segments (issue 26) on the real kernel: two "nodes" as namespaces joined by a veth
//! underlay, each with knic's bridge and VXLAN device of one VNI and a pod whose veth peer was
//! created directly in it; the pods exchange UDP across the VXLAN only once each node holds the
//! other's flood and MAC entries, and no longer once they are removed.

use anyhow::{Context, ensure};
use knic_driver::netns::overlay::{FdbEntry, Segment, bridge_name, vxlan_name};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{Kernel, LinkChange, Ns, Session};
use knic_e2e::harness::{Netns, ip, udp_echo};

use super::cidr;

const VNI: u32 = 4242;

fn segment(local: &str, underlay: &str) -> Segment {
    Segment::new(VNI, 4789, local.parse().unwrap(), underlay, 1450)
}

/// A node namespace with its end of the underlay, addressed and up.
fn node(name: &str, underlay: &str, address: &str) -> anyhow::Result<Netns> {
    let n = Netns::new(name)?;
    ip(&["link", "set", underlay, "netns", name])?;
    ip(&["-n", name, "addr", "add", address, "dev", underlay])?;
    ip(&["-n", name, "link", "set", underlay, "up"])?;
    Ok(n)
}

/// Puts a pod on `node`'s segment: the veth from the node, the address and link up from inside.
async fn pod_on(
    node: &Rtnl,
    pod: &Netns,
    host_end: &str,
    mac: [u8; 6],
    address: &str,
) -> anyhow::Result<()> {
    let mut s = node.open(&Ns::Host).await?.context("node")?;
    let change = LinkChange {
        name: Some("net1".into()),
        mac: Some(mac),
        ..LinkChange::default()
    };
    s.add_veth(
        host_end,
        &bridge_name(VNI),
        &Ns::Pod(pod.path()),
        1450,
        &change,
    )
    .await?;
    let mut p = node.open(&Ns::Pod(pod.path())).await?.context("pod")?;
    p.add_addresses("net1", &[cidr(address)]).await?;
    p.set_link(
        "net1",
        &LinkChange {
            up: Some(true),
            ..LinkChange::default()
        },
    )
    .await?;
    Ok(())
}

pub async fn two_nodes_one_segment(_host: &Rtnl) -> anyhow::Result<()> {
    ip(&[
        "link", "add", "knt-ula", "type", "veth", "peer", "name", "knt-ulb",
    ])?;
    let na = node("knt-ovl-na", "knt-ula", "10.99.0.1/24")?;
    let nb = node("knt-ovl-nb", "knt-ulb", "10.99.0.2/24")?;
    let pa = Netns::new("knt-ovl-pa")?;
    let pb = Netns::new("knt-ovl-pb")?;
    let ka = Rtnl::new(Some(na.path()));
    let kb = Rtnl::new(Some(nb.path()));
    let (mac_a, mac_b) = ([2, 0x4b, 0, 0, 0, 0xa], [2, 0x4b, 0, 0, 0, 0xb]);

    let mut a = ka.open(&Ns::Host).await?.context("node a")?;
    let mut b = kb.open(&Ns::Host).await?.context("node b")?;
    a.ensure_segment(&segment("10.99.0.1", "knt-ula")).await?;
    // A repeated call (a second pod, a restarted driver) finds knic's own links and changes
    // nothing.
    a.ensure_segment(&segment("10.99.0.1", "knt-ula")).await?;
    b.ensure_segment(&segment("10.99.0.2", "knt-ulb")).await?;
    pod_on(&ka, &pa, "knh-a", mac_a, "10.42.0.1/24").await?;
    pod_on(&kb, &pb, "knh-b", mac_b, "10.42.0.2/24").await?;

    // What the kernel made, as `ip` reports it.
    let vxlan = ip(&["-n", "knt-ovl-na", "-d", "link", "show", &vxlan_name(VNI)])?;
    for want in [
        "vxlan id 4242",
        "local 10.99.0.1",
        "dev knt-ula",
        "dstport 4789",
        "nolearning",
        "mtu 1450",
        &format!("master {}", bridge_name(VNI)),
    ] {
        ensure!(vxlan.contains(want), "{want:?} not in {vxlan}");
    }
    let ports = ip(&[
        "-n",
        "knt-ovl-na",
        "-br",
        "link",
        "show",
        "master",
        &bridge_name(VNI),
    ])?;
    ensure!(
        ports.contains("knh-a") && ports.contains(&vxlan_name(VNI)),
        "bridge ports: {ports}"
    );
    let pod_link = ip(&["-n", "knt-ovl-pa", "-d", "link", "show", "net1"])?;
    ensure!(
        pod_link.contains("mtu 1450")
            && pod_link.contains("02:4b:00:00:00:0a")
            && pod_link.contains("veth"),
        "{pod_link}"
    );

    // No entries yet: nothing crosses (no multicast group, no learning).
    ensure!(
        udp_echo(&pa.path(), &pb.path(), "10.42.0.2").is_err(),
        "UDP crossed the overlay before any forwarding entry existed"
    );
    // The failed resolution left a FAILED neighbour behind, which the kernel retries only on
    // its own schedule: start from a clean cache, as a pod whose peers appear later does.
    for pod in ["knt-ovl-pa", "knt-ovl-pb"] {
        ip(&["-n", pod, "neigh", "flush", "all"])?;
    }
    let to_b = [
        FdbEntry {
            mac: [0; 6],
            dst: "10.99.0.2".parse()?,
        },
        FdbEntry {
            mac: mac_b,
            dst: "10.99.0.2".parse()?,
        },
    ];
    let to_a = [
        FdbEntry {
            mac: [0; 6],
            dst: "10.99.0.1".parse()?,
        },
        FdbEntry {
            mac: mac_a,
            dst: "10.99.0.1".parse()?,
        },
    ];
    a.set_fdb(&vxlan_name(VNI), &to_b, &[]).await?;
    a.set_fdb(&vxlan_name(VNI), &to_b, &[]).await?; // again: already there is fine
    b.set_fdb(&vxlan_name(VNI), &to_a, &[]).await?;
    let mut read = a.fdb(&vxlan_name(VNI)).await?;
    read.sort();
    ensure!(read == to_b.to_vec(), "read back {read:?}");
    let shown = ip(&[
        "-n",
        "knt-ovl-na",
        "-j",
        "neigh",
        "show",
        "nud",
        "permanent",
    ])
    .unwrap_or_default();
    let bridge_fdb = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            "knt-ovl-na",
            "bridge",
            "fdb",
            "show",
            "dev",
            &vxlan_name(VNI),
        ])
        .output()?;
    let bridge_fdb = String::from_utf8_lossy(&bridge_fdb.stdout);
    ensure!(
        bridge_fdb.contains("00:00:00:00:00:00 dst 10.99.0.2 self permanent")
            && bridge_fdb.contains("02:4b:00:00:00:0b dst 10.99.0.2 self permanent"),
        "bridge fdb: {bridge_fdb} (neigh: {shown})"
    );
    udp_echo(&pa.path(), &pb.path(), "10.42.0.2").context("UDP across the overlay")?;
    udp_echo(&pb.path(), &pa.path(), "10.42.0.1").context("UDP back across the overlay")?;

    // A MAC that moved node is replaced, not duplicated.
    let moved = FdbEntry {
        mac: mac_b,
        dst: "10.99.0.3".parse()?,
    };
    a.set_fdb(&vxlan_name(VNI), &[moved], &[]).await?;
    let read = a.fdb(&vxlan_name(VNI)).await?;
    ensure!(
        read.iter().filter(|e| e.mac == mac_b).collect::<Vec<_>>() == vec![&moved],
        "after the move: {read:?}"
    );
    // Entries removed (the remote pod left): the pods are cut off again.
    a.set_fdb(&vxlan_name(VNI), &[], &[to_b[0], moved]).await?;
    a.set_fdb(&vxlan_name(VNI), &[], &[to_b[0], moved]).await?; // already gone is fine
    ensure!(a.fdb(&vxlan_name(VNI)).await?.is_empty());
    ensure!(
        udp_echo(&pa.path(), &pb.path(), "10.42.0.2").is_err(),
        "UDP crossed after the entries were removed"
    );

    // Another device on the VNI and port (the cluster's CNI): a clear refusal naming both.
    ip(&[
        "-n",
        "knt-ovl-na",
        "link",
        "add",
        "knt-fx",
        "type",
        "vxlan",
        "id",
        "77",
        "dstport",
        "4789",
        "local",
        "10.99.0.1",
        "dev",
        "knt-ula",
    ])?;
    let clash = Segment::new(77, 4789, "10.99.0.1".parse()?, "knt-ula", 1450);
    let err = a
        .ensure_segment(&clash)
        .await
        .err()
        .context("a VNI clash must fail")?
        .to_string();
    ensure!(
        err.contains("VXLAN port 4789 VNI 77 is used by another link on this node"),
        "{err}"
    );
    ensure!(
        ip(&["-n", "knt-ovl-na", "-br", "link"])?
            .lines()
            .all(|l| !l.starts_with("knx00004d") && !l.starts_with("knb00004d")),
        "a half-made segment was left"
    );
    // A link of knic's name that is not knic's: never adopted.
    let theirs = Segment::new(VNI, 8472, "10.99.0.1".parse()?, "knt-ula", 1450);
    let err = a
        .ensure_segment(&theirs)
        .await
        .err()
        .context("a foreign vxlan must be refused")?
        .to_string();
    ensure!(
        err.contains("a vxlan link of that name exists with VNI 4242 port 4789 local 10.99.0.1; it is not knic's"),
        "{err}"
    );

    // Detach: deleting the host end takes the pod's end with it; then the segment goes.
    a.del_link("knh-a").await?;
    ensure!(!ip(&["-n", "knt-ovl-pa", "-br", "link"])?.contains("net1"));
    a.del_link(&vxlan_name(VNI)).await?;
    a.del_link(&bridge_name(VNI)).await?;
    let left = ip(&["-n", "knt-ovl-na", "-br", "link"])?;
    ensure!(!left.contains("knb") && !left.contains("knx"), "{left}");
    drop((pa, pb, na, nb));
    Ok(())
}
