//! Policy routing on a real kernel (issue 27): source-based routing and rules on a moved veth
//! (the host kernel has what they need), and a VRF made in the pod (the `vrf` module: the
//! test VM loads it; a kernel without it reports the trial ignored). Each trial checks what
//! `ip` reads back and that traffic takes the table: a UDP exchange through a gateway that
//! only the policy table knows works from the interface's address (or bound to the VRF) and
//! fails without it, then detach while the pod lives leaves no rule or VRF behind.

use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, AttachPlan, Kernel, Ns, Session, attach, capture, detach};
use knic_e2e::harness::{Netns, in_netns, ip};
use knic_proto::netconfig::{Family, Route, RoutingSettings, Rule, SourceRouting, Vrf};

use super::{Links, cidr, plan};

/// The far address only the gateway (the peer) has, behind 192.0.2.1.
const FAR: &str = "203.0.113.1";

/// A veth `host` whose peer sits in `peer` as the gateway 192.0.2.1/24 with [`FAR`] on its
/// loopback.
fn gateway_veth(host: &str, peer_ns: &str) -> anyhow::Result<()> {
    let peer_end = format!("{host}p");
    ip(&[
        "link", "add", host, "type", "veth", "peer", "name", &peer_end, "netns", peer_ns,
    ])?;
    ip(&[
        "-n",
        peer_ns,
        "addr",
        "add",
        "192.0.2.1/24",
        "dev",
        &peer_end,
    ])?;
    ip(&[
        "-n",
        peer_ns,
        "addr",
        "add",
        &format!("{FAR}/32"),
        "dev",
        "lo",
    ])?;
    ip(&["-n", peer_ns, "link", "set", &peer_end, "up"])?;
    Ok(())
}

/// How a UDP client in the pod reaches [`FAR`].
enum Source<'a> {
    /// No bound address or device: the main table decides.
    Anywhere,
    /// Bound to this source address: the `from` rule decides.
    Address(&'a str),
    /// Bound to this device (a VRF): its table decides.
    Device(&'a str),
}

/// One UDP exchange from the pod to [`FAR`] answered in `peer`; `Err` carries the socket's
/// error (ENETUNREACH when no table has a route).
fn exchange(pod: &Netns, peer: &Netns, from: Source<'_>) -> anyhow::Result<()> {
    // An ephemeral port: a fixed one was once found taken in the VM (EADDRINUSE) while the
    // trials ran side by side.
    let server = in_netns(&peer.path(), || UdpSocket::bind(format!("{FAR}:0")))??;
    let port = server.local_addr()?.port();
    server.set_read_timeout(Some(Duration::from_secs(3)))?;
    let client = in_netns(&pod.path(), || -> anyhow::Result<UdpSocket> {
        let socket = match from {
            Source::Address(a) => UdpSocket::bind(format!("{a}:0"))?,
            Source::Anywhere | Source::Device(_) => UdpSocket::bind("0.0.0.0:0")?,
        };
        if let Source::Device(d) = from {
            nix::sys::socket::setsockopt(
                &socket.as_fd(),
                nix::sys::socket::sockopt::BindToDevice,
                &std::ffi::OsString::from(d),
            )?;
        }
        Ok(socket)
    })??;
    client.set_read_timeout(Some(Duration::from_secs(3)))?;
    client.send_to(b"knic", format!("{FAR}:{port}"))?;
    let mut buf = [0u8; 16];
    let (n, sender) = server.recv_from(&mut buf)?;
    server.send_to(&buf[..n], sender)?;
    let (n, _) = client.recv_from(&mut buf)?;
    ensure!(&buf[..n] == b"knic", "echo returned {:?}", &buf[..n]);
    Ok(())
}

fn default_via_gateway() -> Route {
    Route {
        destination: cidr("0.0.0.0/0"),
        gateway: Some("192.0.2.1".parse().expect("ip")),
        source: None,
        metric: None,
        table: None,
    }
}

/// The plan prepare makes for `settings` on a veth `host`, addresses 192.0.2.10/24 and
/// 2001:db8::10/64 and a default route via the gateway.
fn routed_plan(host: &str, settings: &RoutingSettings) -> AttachPlan {
    let mut p = plan(host, AttachMode::Move);
    p.sysctls.clear();
    p.mtu = None;
    let (routes, routing) =
        knic_driver::netns::routing::plan(settings, &p.addresses, &[default_via_gateway()]);
    p.routes = routes;
    p.routing = routing;
    p
}

pub async fn source_based_routing_and_rules_on_a_veth(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-sbr")?;
    let peer = Netns::new("knt-peer-sbr")?;
    let _links = Links(vec!["knt-sbr0"]);
    gateway_veth("knt-sbr0", "knt-peer-sbr")?;
    let mark = Rule {
        family: Family::Ipv4,
        from: None,
        to: Some(cidr("198.51.100.0/24")),
        iif: None,
        oif: None,
        fwmark: Some(0x10),
        fwmask: Some(0xff),
        table: 200,
        priority: 900,
    };
    let both = Rule {
        family: Family::Ipv6,
        to: None,
        fwmark: Some(7),
        fwmask: None,
        iif: Some("lo".into()),
        ..mark.clone()
    };
    let settings = RoutingSettings {
        rules: vec![mark, both],
        source_routing: Some(SourceRouting {
            table: 101,
            priority: 100,
        }),
        vrf: None,
    };
    let p = routed_plan("knt-sbr0", &settings);
    let ns = Ns::Pod(pod.path());
    let restore = capture(k, &p).await?;
    attach(k, &p, &ns, &restore, false).await?;

    let rules4 = ip(&["-n", "knt-pod-sbr", "-4", "rule", "show"])?;
    let rules6 = ip(&["-n", "knt-pod-sbr", "-6", "rule", "show"])?;
    for expected in [
        "100:\tfrom 192.0.2.10 lookup 101",
        "900:\tfrom all to 198.51.100.0/24 fwmark 0x10/0xff lookup 200",
    ] {
        ensure!(rules4.contains(expected), "no {expected:?} in\n{rules4}");
    }
    for expected in [
        "100:\tfrom 2001:db8::10 lookup 101",
        "900:\tfrom all fwmark 0x7 iif lo lookup 200",
    ] {
        ensure!(rules6.contains(expected), "no {expected:?} in\n{rules6}");
    }
    let table = ip(&["-n", "knt-pod-sbr", "route", "show", "table", "101"])?;
    ensure!(
        table.contains("default via 192.0.2.1 dev net1 proto static")
            && table.contains("192.0.2.0/24 dev net1 proto static scope link src 192.0.2.10"),
        "table 101:\n{table}"
    );
    let main = ip(&["-n", "knt-pod-sbr", "route", "show", "table", "main"])?;
    ensure!(
        !main.contains("default"),
        "the default moved out of main:\n{main}"
    );

    // The table is taken by traffic from the address, and only by it.
    exchange(&pod, &peer, Source::Address("192.0.2.10")).context("from the address")?;
    let unrouted = exchange(&pod, &peer, Source::Anywhere);
    ensure!(
        unrouted
            .as_ref()
            .is_err_and(|e| e.to_string().contains("unreachable")),
        "without the source the main table has no route: {unrouted:?}"
    );

    // A repeated attach (resumed after a crash) finds every rule there.
    attach(k, &p, &ns, &restore, true).await?;
    let again = ip(&["-n", "knt-pod-sbr", "-4", "rule", "show"])?;
    ensure!(again == rules4, "rules changed on repeat:\n{again}");

    detach(k, &p, Some(&ns), &restore).await?;
    let left4 = ip(&["-n", "knt-pod-sbr", "-4", "rule", "show"])?;
    let left6 = ip(&["-n", "knt-pod-sbr", "-6", "rule", "show"])?;
    ensure!(
        !left4.contains("lookup 101") && !left4.contains("lookup 200"),
        "rules left:\n{left4}"
    );
    ensure!(
        !left6.contains("lookup 101") && !left6.contains("lookup 200"),
        "rules left:\n{left6}"
    );
    ensure!(
        ip(&["link", "show", "knt-sbr0"]).is_ok(),
        "the device is home"
    );
    detach(k, &p, Some(&ns), &restore).await?;
    Ok(())
}

/// Whether this kernel can make VRF devices (the VM loads `vrf`; the host may lack it).
pub fn vrf_missing() -> Option<String> {
    let probe = "knt-vrfprobe";
    match ip(&["link", "add", probe, "type", "vrf", "table", "4242"]) {
        Ok(_) => {
            let _ = ip(&["link", "del", probe]);
            None
        }
        Err(e) => Some(format!("kernel cannot make a VRF device (module vrf): {e}")),
    }
}

pub async fn vrf_in_the_pod(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-vrf")?;
    let peer = Netns::new("knt-peer-vrf")?;
    let _links = Links(vec!["knt-vrf0", "knt-vrf2"]);
    gateway_veth("knt-vrf0", "knt-peer-vrf")?;
    let settings = RoutingSettings {
        rules: Vec::new(),
        source_routing: None,
        vrf: Some(Vrf {
            name: "blue".into(),
            table: 10,
        }),
    };
    let p = routed_plan("knt-vrf0", &settings);
    let ns = Ns::Pod(pod.path());
    let restore = capture(k, &p).await?;
    attach(k, &p, &ns, &restore, false).await?;

    let vrf = ip(&["-n", "knt-pod-vrf", "-d", "link", "show", "blue"])?;
    ensure!(
        vrf.contains("vrf table 10") && vrf.contains("state UP"),
        "VRF:\n{vrf}"
    );
    let member = ip(&["-n", "knt-pod-vrf", "link", "show", "net1"])?;
    ensure!(member.contains("master blue"), "net1:\n{member}");
    let table = ip(&["-n", "knt-pod-vrf", "route", "show", "table", "10"])?;
    ensure!(
        table.contains("default via 192.0.2.1 dev net1 proto static")
            && table.contains("192.0.2.0/24 dev net1 proto kernel scope link src 192.0.2.10"),
        "the connected and configured routes are in the VRF's table:\n{table}"
    );
    let main = ip(&["-n", "knt-pod-vrf", "route", "show", "table", "main"])?;
    ensure!(!main.contains("net1"), "nothing of net1 in main:\n{main}");
    exchange(&pod, &peer, Source::Device("blue")).context("bound to the VRF")?;
    let unrouted = exchange(&pod, &peer, Source::Anywhere);
    ensure!(
        unrouted
            .as_ref()
            .is_err_and(|e| e.to_string().contains("unreachable")),
        "outside the VRF there is no route: {unrouted:?}"
    );

    // A second claim of the pod under the same name with another table is refused, and
    // leaves the VRF and its member as they are.
    let _second = Links(vec!["knt-vrf2"]);
    ip(&[
        "link", "add", "knt-vrf2", "type", "veth", "peer", "name", "knt-vrf3",
    ])?;
    let mut other = routed_plan(
        "knt-vrf2",
        &RoutingSettings {
            vrf: Some(Vrf {
                name: "blue".into(),
                table: 11,
            }),
            ..settings.clone()
        },
    );
    other.pod_ifname = "net2".into();
    other.mac = Some([0x02, 0, 0, 0, 0x4b, 0x11]);
    other.addresses = vec![cidr("192.0.3.10/24")];
    other.routes.clear();
    let other_restore = capture(k, &other).await?;
    let e = attach(k, &other, &ns, &other_restore, false)
        .await
        .err()
        .context("a VRF table clash must fail")?
        .to_string();
    ensure!(
        e.contains("VRF blue already exists in the pod with table 10, not 11"),
        "{e}"
    );
    ensure!(ip(&["link", "show", "knt-vrf2"]).is_ok(), "undone: home");
    ensure!(
        ip(&["-n", "knt-pod-vrf", "link", "show", "net1"])?.contains("master blue"),
        "the first member stays"
    );

    detach(k, &p, Some(&ns), &restore).await?;
    let home = ip(&["link", "show", "knt-vrf0"])?;
    ensure!(
        !home.contains("master"),
        "the kernel released the device from the VRF on its way home:\n{home}"
    );
    let mut s = k.open(&ns).await?.context("pod")?;
    ensure!(s.vrf("blue").await?.is_none(), "the empty VRF is deleted");
    detach(k, &p, Some(&ns), &restore).await?;
    Ok(())
}
