//! IPv4 per-interface sysctls carried by the move itself (`IFLA_AF_SPEC` → `AF_INET` →
//! `IFLA_INET_CONF`): the kernel applies them to the device as the pod has it, values that
//! differ from a new namespace's defaults (also a 0) read back from the pod's `/proc/sys`,
//! and the attach makes as many requests as one without sysctls. `forwarding` and IPv6 stay
//! file writes and land too.

use std::collections::BTreeMap;

use anyhow::ensure;
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, Ns, attach, capture, detach};
use knic_e2e::harness::{Netns, in_netns, ip};

use super::{Links, plan};

/// `/proc/sys/net/<family>/conf/net1/<leaf>` inside `pod`, trimmed.
fn read(pod: &Netns, family: &str, leaf: &str) -> anyhow::Result<String> {
    let path = format!("/proc/sys/net/{family}/conf/net1/{leaf}");
    let text = in_netns(&pod.path(), || std::fs::read_to_string(&path))??;
    Ok(text.trim().to_owned())
}

/// Attach requests of a move of `host_ifname` into `pod` with `sysctls`, then detach.
async fn attach_requests(
    host_ifname: &str,
    pod: &Netns,
    sysctls: &[(&str, &str)],
    check: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let k = Rtnl::new(None);
    let mut p = plan(host_ifname, AttachMode::Move);
    p.sysctls = sysctls
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect::<BTreeMap<_, _>>();
    let ns = Ns::Pod(pod.path());
    let restore = capture(&k, &p).await?;
    let before = k.requests();
    let link = attach(&k, &p, &ns, &restore, false).await?;
    let spent = k.requests() - before;
    ensure!(link.up, "{link:?}");
    let checked = check();
    detach(&k, &p, Some(&ns), &restore).await?;
    checked?;
    Ok(spent)
}

pub(crate) async fn ipv4_sysctls_ride_on_the_move(_: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-y")?;
    let _links = Links(vec!["knt-y0"]);
    ip(&[
        "link", "add", "knt-y0", "type", "veth", "peer", "name", "knt-y1",
    ])?;
    let without = attach_requests("knt-y0", &pod, &[], || Ok(())).await?;
    // A new namespace's defaults: arp_ignore 0, arp_announce 0, rp_filter 0 (or what
    // all/default say), accept_redirects 1, forwarding 0, IPv6 accept_ra 1.
    let sysctls = [
        ("ipv4.arp_ignore", "2"),
        ("ipv4.arp_announce", "2"),
        ("net.ipv4.conf.net1.rp_filter", "2"),
        ("ipv4.accept_redirects", "0"),
        ("ipv4.forwarding", "1"),
        ("ipv6.accept_ra", "0"),
    ];
    let with = attach_requests("knt-y0", &pod, &sysctls, || {
        for (family, leaf, want) in [
            ("ipv4", "arp_ignore", "2"),
            ("ipv4", "arp_announce", "2"),
            ("ipv4", "rp_filter", "2"),
            ("ipv4", "accept_redirects", "0"),
            ("ipv4", "forwarding", "1"),
            ("ipv6", "accept_ra", "0"),
        ] {
            let got = read(&pod, family, leaf)?;
            ensure!(got == want, "{family}.{leaf} is {got}, want {want}");
        }
        Ok(())
    })
    .await?;
    ensure!(
        with == without,
        "attach requests with sysctls {with}, without {without}"
    );
    Ok(())
}
