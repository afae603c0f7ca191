//! Issue 27 on the real kernel: static neighbors (permanent ARP/NDP entries) on a moved veth
//! and on a macvlan child, proven used by a peer that never answers ARP; gone after a detach
//! while the pod lives; and every ARP/ND sysctl of the allowlist written and read back in
//! the pod (each exists per interface on this kernel).

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, Kernel, LinkSettings, Ns, Session, attach, capture, detach};
use knic_e2e::harness::{Netns, in_netns, ip, udp_echo};
use knic_proto::netconfig::{ChildKind, Neighbor, OffloadSizes};

use super::{Links, plan};

/// The MAC of `dev` in namespace `ns`, from `ip -br link`.
fn mac_of(ns: &str, dev: &str) -> anyhow::Result<[u8; 6]> {
    let text = ip(&["-n", ns, "-br", "link", "show", "dev", dev])?;
    let word = text
        .split_whitespace()
        .nth(2)
        .with_context(|| format!("no MAC in {text:?}"))?;
    let mut mac = [0u8; 6];
    for (i, part) in word.split(':').enumerate() {
        *mac.get_mut(i).context("long MAC")? = u8::from_str_radix(part, 16)?;
    }
    Ok(mac)
}

/// A peer namespace `peer_ns` with `peer_if` at 192.0.2.1/24 and 2001:db8::1/64 that never
/// answers ARP (`arp_ignore` 8): the pod reaches it only through a static entry.
fn silent_peer(peer: &Netns, peer_if: &str) -> anyhow::Result<()> {
    let peer_ns = peer.0.as_str();
    ip(&["-n", peer_ns, "addr", "add", "192.0.2.1/24", "dev", peer_if])?;
    ip(&[
        "-n",
        peer_ns,
        "addr",
        "add",
        "2001:db8::1/64",
        "dev",
        peer_if,
        "nodad",
    ])?;
    ip(&["-n", peer_ns, "link", "set", peer_if, "up"])?;
    let path = format!("/proc/sys/net/ipv4/conf/{peer_if}/arp_ignore");
    in_netns(&peer.path(), || std::fs::write(&path, "8"))??;
    Ok(())
}

/// `ip neigh` lines of `net1` in the pod that are PERMANENT.
fn permanent_entries(pod: &str) -> anyhow::Result<Vec<String>> {
    let text = ip(&[
        "-n",
        pod,
        "neigh",
        "show",
        "dev",
        "net1",
        "nud",
        "permanent",
    ])?;
    Ok(text.lines().map(|l| l.trim().to_owned()).collect())
}

async fn neighbors_case(k: &Rtnl, mode: AttachMode, tag: &str) -> anyhow::Result<()> {
    let pod_name = format!("knt-pod-n{tag}");
    let peer_name = format!("knt-peer-n{tag}");
    let pod = Netns::new(&pod_name)?;
    let peer = Netns::new(&peer_name)?;
    let host_if: &'static str = if tag == "m" { "knt-nm0" } else { "knt-nv0" };
    let _links = Links(vec![host_if]);
    let peer_if = format!("{host_if}p");
    ip(&[
        "link", "add", host_if, "type", "veth", "peer", "name", &peer_if, "netns", &peer_name,
    ])?;
    ip(&["link", "set", host_if, "up"])?;
    silent_peer(&peer, &peer_if)?;
    let peer_mac = mac_of(&peer_name, &peer_if)?;

    let mut p = plan(host_if, mode);
    p.routes.clear();
    p.link = LinkSettings {
        sizes: OffloadSizes::default(),
        neighbors: vec![
            Neighbor {
                address: "192.0.2.1".parse()?,
                hardware_address: peer_mac,
            },
            Neighbor {
                address: "2001:db8::1".parse()?,
                hardware_address: peer_mac,
            },
            Neighbor {
                address: "192.0.2.77".parse()?,
                hardware_address: [0x02, 0, 0, 0, 0x77, 0x77],
            },
        ],
    };
    let ns = Ns::Pod(pod.path());
    let restore = capture(k, &p).await?;
    attach(k, &p, &ns, &restore, false).await?;
    let mac = knic_driver::netns::mac_text(&peer_mac);
    let entries = permanent_entries(&pod_name)?;
    ensure!(
        entries.contains(&format!("192.0.2.1 lladdr {mac} PERMANENT"))
            && entries.contains(&format!("2001:db8::1 lladdr {mac} PERMANENT"))
            && entries.contains(&"192.0.2.77 lladdr 02:00:00:00:77:77 PERMANENT".to_owned()),
        "entries: {entries:?}"
    );
    // The peer answers no ARP: only the static entry gets the datagram there. Without it
    // (deleted by hand) the echo fails; a resumed hook puts it back.
    udp_echo(&pod.path(), &peer.path(), "192.0.2.1")?;
    ip(&["-n", &pod_name, "neigh", "del", "192.0.2.1", "dev", "net1"])?;
    ensure!(
        udp_echo(&pod.path(), &peer.path(), "192.0.2.1").is_err(),
        "the peer answered ARP: the static entry proves nothing"
    );
    attach(k, &p, &ns, &restore, true).await?;
    udp_echo(&pod.path(), &peer.path(), "192.0.2.1")?;

    // A resumed hook replaces the entries in place; one changed meanwhile is put back.
    ip(&[
        "-n",
        &pod_name,
        "neigh",
        "replace",
        "192.0.2.77",
        "lladdr",
        "02:00:00:00:00:01",
        "dev",
        "net1",
        "nud",
        "permanent",
    ])?;
    attach(k, &p, &ns, &restore, true).await?;
    let again = permanent_entries(&pod_name)?;
    ensure!(
        again.contains(&"192.0.2.77 lladdr 02:00:00:00:77:77 PERMANENT".to_owned())
            && again.len() == entries.len(),
        "after resume: {again:?}"
    );

    // Detach while the pod lives: nothing of knic's is left in the pod or on the host.
    detach(k, &p, Some(&ns), &restore).await?;
    let left = ip(&["-n", &pod_name, "neigh", "show", "nud", "permanent"])?;
    ensure!(left.trim().is_empty(), "left in the pod: {left}");
    if matches!(p.mode, AttachMode::Move) {
        let home = ip(&["neigh", "show", "dev", host_if, "nud", "permanent"])?;
        ensure!(home.trim().is_empty(), "carried home: {home}");
    }
    Ok(())
}

pub async fn static_neighbors_on_a_moved_veth(k: &Rtnl) -> anyhow::Result<()> {
    neighbors_case(k, AttachMode::Move, "v").await
}

pub async fn static_neighbors_on_a_macvlan_child(k: &Rtnl) -> anyhow::Result<()> {
    neighbors_case(
        k,
        AttachMode::Child {
            child: ChildKind::Macvlan("bridge".into()),
            uplink: None,
        },
        "m",
    )
    .await
}

/// Every ARP/ND sysctl of the allowlist, set to a value other than the new namespace's
/// default, lands in the pod (IPv4 ones on the move, IPv6 ones as files).
pub async fn arp_nd_sysctls_land_in_the_pod(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-an")?;
    let _links = Links(vec!["knt-an0"]);
    ip(&[
        "link", "add", "knt-an0", "type", "veth", "peer", "name", "knt-an1",
    ])?;
    let wanted: BTreeMap<&str, &str> = BTreeMap::from([
        ("ipv4.arp_accept", "2"),
        ("ipv4.arp_evict_nocarrier", "0"),
        ("ipv4.arp_filter", "1"),
        ("ipv4.arp_notify", "1"),
        ("ipv4.drop_gratuitous_arp", "1"),
        ("ipv4.drop_unicast_in_l2_multicast", "1"),
        ("ipv4.proxy_arp_pvlan", "1"),
        ("ipv6.accept_dad", "2"),
        ("ipv6.accept_untracked_na", "1"),
        ("ipv6.dad_transmits", "3"),
        ("ipv6.drop_unicast_in_l2_multicast", "1"),
        ("ipv6.drop_unsolicited_na", "1"),
        ("ipv6.ndisc_evict_nocarrier", "0"),
        ("ipv6.ndisc_notify", "1"),
        ("ipv6.proxy_ndp", "1"),
    ]);
    let mut p = plan("knt-an0", AttachMode::Move);
    p.sysctls = wanted
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    // Each is also accepted by the contract's validation.
    for (key, value) in &wanted {
        let config = knic_proto::netconfig::parse(
            &serde_json::json!({
                "apiVersion": knic_proto::netconfig::API_VERSION,
                "kind": knic_proto::netconfig::KIND,
                "sysctls": { *key: *value },
            }),
            "",
        )?;
        knic_proto::netconfig::validate(&config)?;
    }
    let ns = Ns::Pod(pod.path());
    let restore = capture(k, &p).await?;
    attach(k, &p, &ns, &restore, false).await?;
    let mut wrong = Vec::new();
    for (key, value) in &wanted {
        let (family, leaf) = key.split_once('.').context("short key")?;
        let path = format!("/proc/sys/net/{family}/conf/net1/{leaf}");
        let got = in_netns(&pod.path(), || std::fs::read_to_string(&path))??;
        if got.trim() != *value {
            wrong.push(format!("{key}={} (wanted {value})", got.trim()));
        }
    }
    detach(k, &p, Some(&ns), &restore).await?;
    ensure!(wrong.is_empty(), "not applied: {wrong:?}");
    Ok(())
}

/// Whether this kernel is at least `major.minor` (`/proc/sys/kernel/osrelease`).
fn kernel_at_least(major: u32, minor: u32) -> anyhow::Result<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    Ok(found >= (major, minor))
}

/// The sizes `name` reports in `ns`, read back with RTM_GETLINK.
async fn sizes_of(k: &Rtnl, ns: &Ns, name: &str) -> anyhow::Result<OffloadSizes> {
    k.open(ns)
        .await?
        .context("namespace")?
        .offload_sizes(name)
        .await?
        .with_context(|| format!("no link {name}"))
}

/// Big TCP sizes on a moved veth (set by the move itself, read back in the pod, the host's
/// own put back by the move home) and on a macvlan child (set by its creation). On a kernel
/// before 6.3 the IPv4 variants are refused by name before anything changes, and the others
/// still apply.
pub async fn gso_gro_sizes_on_a_moved_veth_and_a_child(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-gs")?;
    let _links = Links(vec!["knt-gs0"]);
    ip(&[
        "link", "add", "knt-gs0", "type", "veth", "peer", "name", "knt-gs1",
    ])?;
    ip(&[
        "link",
        "set",
        "knt-gs0",
        "gso_max_size",
        "60000",
        "gro_max_size",
        "50000",
    ])?;
    let host_before = sizes_of(k, &Ns::Host, "knt-gs0").await?;
    ensure!(
        host_before.gso_max_size == Some(60_000) && host_before.gro_max_size == Some(50_000),
        "host sizes {host_before:?}"
    );
    let has_ipv4 = kernel_at_least(6, 3)?;
    let ns = Ns::Pod(pod.path());
    let mut p = plan("knt-gs0", AttachMode::Move);
    p.link.sizes = OffloadSizes {
        gso_max_size: Some(185_000),
        gro_max_size: Some(185_000),
        gso_ipv4_max_size: Some(185_000),
        gro_ipv4_max_size: Some(150_000),
    };
    if !has_ipv4 {
        ensure!(
            host_before.gso_ipv4_max_size.is_none(),
            "a kernel before 6.3 reported {host_before:?}"
        );
        let err = capture(k, &p)
            .await
            .err()
            .context("a kernel without the IPv4 sizes must refuse them")?
            .to_string();
        ensure!(
            err == "host: setting the GSO/GRO sizes of node/knt-gs0: this kernel does not \
                    support interface.gsoIpv4MaxSize (IFLA_GSO_IPV4_MAX_SIZE, Linux 6.3+), \
                    interface.groIpv4MaxSize (IFLA_GRO_IPV4_MAX_SIZE, Linux 6.3+) (it reports \
                    no such size for knt-gs0, and would ignore the setting)",
            "{err}"
        );
        p.link.sizes.gso_ipv4_max_size = None;
        p.link.sizes.gro_ipv4_max_size = None;
    }
    let restore = capture(k, &p).await?;
    ensure!(
        restore.sizes.and_then(|s| s.gso_max_size) == Some(60_000),
        "recorded {:?}",
        restore.sizes
    );
    attach(k, &p, &ns, &restore, false).await?;
    let in_pod = sizes_of(k, &ns, "net1").await?;
    ensure!(
        in_pod.gso_max_size == Some(185_000) && in_pod.gro_max_size == Some(185_000),
        "in the pod: {in_pod:?}"
    );
    if has_ipv4 {
        ensure!(
            in_pod.gso_ipv4_max_size == Some(185_000) && in_pod.gro_ipv4_max_size == Some(150_000),
            "in the pod: {in_pod:?}"
        );
    }
    detach(k, &p, Some(&ns), &restore).await?;
    let home = sizes_of(k, &Ns::Host, "knt-gs0").await?;
    ensure!(
        home == host_before,
        "home {home:?} != before {host_before:?}"
    );

    // A child: created with the sizes; its parent keeps its own.
    let mut c = p.clone();
    c.mode = AttachMode::Child {
        child: ChildKind::Macvlan("bridge".into()),
        uplink: None,
    };
    let restore = capture(k, &c).await?;
    ensure!(restore.sizes.is_none(), "a child records nothing");
    attach(k, &c, &ns, &restore, false).await?;
    let child = sizes_of(k, &ns, "net1").await?;
    ensure!(
        child.gso_max_size == Some(185_000) && child.gro_max_size == Some(185_000),
        "child: {child:?}"
    );
    ensure!(sizes_of(k, &Ns::Host, "knt-gs0").await? == host_before);
    detach(k, &c, Some(&ns), &restore).await?;
    Ok(())
}
