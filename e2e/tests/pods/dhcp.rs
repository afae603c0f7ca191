//! `addressing: {mode: dhcp}` through the real driver: dnsmasq serves leases in the peer
//! namespace on the far end of the pod's veth; the NRI hook gets the lease into the pod
//! (address, default route, claim status), a `kill -9` and restart keep renewing it from the
//! checkpoint, and the pod's stop releases it (gone from dnsmasq's lease file); a driver that
//! died while the pod ran releases the recorded lease once it is back and the pod is gone.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_e2e::harness::{Netns, eventually, ip, udp_echo};
use knic_e2e::kubelet::DraVersion;
use serde_json::json;

use super::{Env, network_config};

/// dnsmasq on the peer's end of device 0, killed on drop.
struct Dnsmasq {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dnsmasq {
    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }
}

fn dnsmasq(env: &Env) -> anyhow::Result<Dnsmasq> {
    let dir = tempfile::tempdir()?;
    let path = |n: &str| -> PathBuf { dir.path().join(n) };
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &env.peer.0,
            "dnsmasq",
            "--no-daemon",
            "--port=0",
        ])
        .arg(format!("--interface=knt-{}1", env.tag))
        .args(["--bind-interfaces", "--dhcp-authoritative", "--log-dhcp"])
        .arg("--dhcp-range=192.0.2.50,192.0.2.60,255.255.255.0,2m")
        .args(["--dhcp-option=option:T1,6", "--dhcp-option=option:T2,9"])
        .arg(format!("--dhcp-leasefile={}", path("leases").display()))
        .arg(format!("--log-facility={}", path("log").display()))
        .arg(format!("--pid-file={}", path("pid").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting dnsmasq")?;
    Ok(Dnsmasq { child, dir })
}

pub(crate) async fn dhcp_lease_follows_the_pod(env: &mut Env) -> anyhow::Result<()> {
    if Command::new("dnsmasq").arg("--version").output().is_err() {
        anyhow::bail!(
            "dnsmasq is not installed (Debian: dnsmasq-base); e2e/run-tests.sh installs it"
        );
    }
    let server = dnsmasq(env)?;
    let c = env
        .cluster
        .create_claim_with_config(
            "dhcp",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({
                "addressing": {"mode": "dhcp", "timeoutSeconds": 15},
            }))),
        )
        .await?;
    let out = env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?;
    ensure!(
        out[&c.uid].error.is_empty(),
        "prepare: {}",
        out[&c.uid].error
    );
    let ns = Netns::new(&format!("knt-pd-{}", env.tag))?;
    let pod = env.pod(&c, Some(&ns));
    // The lease is part of the sandbox hook, so the runtime must give the hook longer than
    // its 2 s default (containerd: `plugin_request_timeout` of the NRI plugin section);
    // dnsmasq alone takes 3 s, pinging the address before it offers it.
    env.runtime.set_request_timeout(Duration::from_secs(20));
    let started = std::time::Instant::now();
    env.runtime
        .run_pod_sandbox(&pod)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n--- dnsmasq ---\n{}", server.file("log")))?;
    let took = started.elapsed();

    let leases = server.file("leases");
    let address = leases
        .split_whitespace()
        .nth(2)
        .with_context(|| format!("no lease in dnsmasq's file: {leases:?}"))?
        .to_owned();
    eprintln!("pod attached with DHCP lease {address} in {took:?}");
    let net1 = ip(&["-n", &ns.0, "-4", "addr", "show", "net1"])?;
    ensure!(net1.contains(&format!("inet {address}/24")), "{net1}");
    let route = ip(&["-n", &ns.0, "route", "show", "default"])?;
    ensure!(route.contains("default via 192.0.2.1 dev net1"), "{route}");
    udp_echo(&ns.path(), &env.peer.path(), "192.0.2.1").context("traffic through net1")?;
    let status = eventually("claim status", Duration::from_secs(10), || async {
        let s = env.claim_status("dhcp").await?;
        Ok(s["devices"][0]["networkData"]["ips"]
            .is_array()
            .then_some(s))
    })
    .await?;
    ensure!(
        status["devices"][0]["networkData"]["ips"] == json!([format!("{address}/24")]),
        "{status}"
    );
    let checkpoint = std::fs::read_to_string(env.config.plugin_dir.join("checkpoint.json"))?;
    ensure!(
        checkpoint.contains("\"lease\""),
        "lease not recorded: {checkpoint}"
    );

    // kill -9 and a restart: the lease is renewed from the checkpoint's record.
    let acks = |s: &Dnsmasq| s.file("log").matches("DHCPACK(").count();
    let before = acks(&server);
    env.driver.kill9().await?;
    env.restart_driver(None, vec![pod.clone()]).await?;
    eventually(
        "a renewal after the restart",
        Duration::from_secs(15),
        || async { Ok((acks(&server) > before).then_some(())) },
    )
    .await
    .with_context(|| server.file("log"))?;
    let renewed = server.file("log");
    ensure!(
        renewed.contains(&format!("DHCPREQUEST(knt-{}1) {address}", env.tag)),
        "{renewed}"
    );

    // The pod stops: the lease is released, then the device goes home.
    env.runtime
        .stop_pod_sandbox(&pod)
        .await
        .map_err(anyhow::Error::msg)?;
    eventually("the lease released", Duration::from_secs(5), || async {
        Ok((!server.file("leases").contains(&address)).then_some(()))
    })
    .await
    .with_context(|| server.file("log"))?;
    ensure!(
        server.file("log").contains("DHCPRELEASE("),
        "{}",
        server.file("log")
    );
    env.runtime
        .remove_pod_sandbox(&env.pod(&c, None))
        .await
        .map_err(anyhow::Error::msg)?;

    // Again, but the driver dies while the pod runs and the pod is gone when it comes back:
    // the restarted driver releases the lease its checkpoint records.
    let ns2 = Netns::new(&format!("knt-pe-{}", env.tag))?;
    let pod2 = env.pod(&c, Some(&ns2));
    env.runtime
        .run_pod_sandbox(&pod2)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n--- dnsmasq ---\n{}", server.file("log")))?;
    let second = server
        .file("leases")
        .split_whitespace()
        .nth(2)
        .context("no second lease")?
        .to_owned();
    env.driver.kill9().await?;
    let released = server.file("log").matches("DHCPRELEASE(").count();
    env.restart_driver(None, vec![]).await?;
    eventually(
        "the recorded lease released after the restart",
        Duration::from_secs(10),
        || async {
            Ok(
                (server.file("log").matches("DHCPRELEASE(").count() > released
                    && !server.file("leases").contains(&second))
                .then_some(()),
            )
        },
    )
    .await
    .with_context(|| server.file("log"))?;
    let out = env.plugin.unprepare(DraVersion::V1, &[env.id(&c)]).await?;
    ensure!(out[&c.uid].is_empty(), "unprepare: {}", out[&c.uid]);
    let checkpoint = std::fs::read_to_string(env.config.plugin_dir.join("checkpoint.json"))?;
    ensure!(
        checkpoint.contains("\"claims\":{}"),
        "checkpoint not empty: {checkpoint}"
    );
    Ok(())
}

/// `slaac` on device 0 (dnsmasq sends router advertisements for 2001:db8::/64) and
/// `unnumbered` on device 2 (no address, an on-link route only), through the real driver; then
/// `dhcp` on device 2, whose peer runs no server: the attach fails within the bound.
pub(crate) async fn slaac_and_unnumbered(env: &mut Env) -> anyhow::Result<()> {
    if Command::new("dnsmasq").arg("--version").output().is_err() {
        anyhow::bail!(
            "dnsmasq is not installed (Debian: dnsmasq-base); e2e/run-tests.sh installs it"
        );
    }
    let dir = tempfile::tempdir()?;
    let _ra = Dnsmasq {
        child: Command::new("ip")
            .args([
                "netns",
                "exec",
                &env.peer.0,
                "dnsmasq",
                "--no-daemon",
                "--port=0",
            ])
            .arg(format!("--interface=knt-{}1", env.tag))
            .args(["--bind-interfaces", "--enable-ra"])
            .arg(format!(
                "--dhcp-range=::,constructor:knt-{}1,ra-only",
                env.tag
            ))
            .arg(format!(
                "--dhcp-leasefile={}",
                dir.path().join("leases").display()
            ))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dnsmasq")?,
        dir,
    };
    let s = env
        .cluster
        .create_claim_with_config(
            "slaac",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({
                "addressing": {"mode": "slaac", "timeoutSeconds": 10},
            }))),
        )
        .await?;
    let u = env
        .cluster
        .create_claim_with_config(
            "unnumbered",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(json!({
                "interface": {"name": "un0"},
                "addressing": {"mode": "unnumbered"},
                "routes": [{"destination": "198.51.100.0/24"}],
            }))),
        )
        .await?;
    for claim in [&s, &u] {
        let out = env.plugin.prepare(DraVersion::V1, &[env.id(claim)]).await?;
        ensure!(
            out[&claim.uid].error.is_empty(),
            "prepare: {}",
            out[&claim.uid].error
        );
    }
    env.runtime.set_request_timeout(Duration::from_secs(20));
    let (ns_s, ns_u) = (
        Netns::new(&format!("knt-ps-{}", env.tag))?,
        Netns::new(&format!("knt-pu-{}", env.tag))?,
    );
    let started = std::time::Instant::now();
    env.runtime
        .run_pod_sandbox(&env.pod(&s, Some(&ns_s)))
        .await
        .map_err(anyhow::Error::msg)?;
    eprintln!("SLAAC address waited for in {:?}", started.elapsed());
    let addr = ip(&[
        "-n", &ns_s.0, "-6", "addr", "show", "net1", "scope", "global",
    ])?;
    ensure!(
        addr.contains("inet6 2001:db8:") && addr.contains("dynamic"),
        "{addr}"
    );
    let status = eventually("slaac status", Duration::from_secs(10), || async {
        let st = env.claim_status("slaac").await?;
        Ok(st["devices"][0]["networkData"]["ips"]
            .is_array()
            .then_some(st))
    })
    .await?;
    let ips = status["devices"][0]["networkData"]["ips"].to_string();
    ensure!(ips.contains("2001:db8:") && ips.contains("/64"), "{status}");

    env.runtime
        .run_pod_sandbox(&env.pod(&u, Some(&ns_u)))
        .await
        .map_err(anyhow::Error::msg)?;
    let v4 = ip(&["-n", &ns_u.0, "-4", "addr", "show", "un0"])?;
    ensure!(
        !v4.contains("inet "),
        "unnumbered has an IPv4 address: {v4}"
    );
    let global6 = ip(&[
        "-n", &ns_u.0, "-6", "addr", "show", "un0", "scope", "global",
    ])?;
    ensure!(
        global6.trim().is_empty(),
        "unnumbered has a global IPv6 address: {global6}"
    );
    let route = ip(&["-n", &ns_u.0, "route", "show", "198.51.100.0/24"])?;
    ensure!(route.contains("198.51.100.0/24 dev un0"), "{route}");
    let autoconf = ip(&[
        "netns",
        "exec",
        &ns_u.0,
        "cat",
        "/proc/sys/net/ipv6/conf/un0/autoconf",
    ])?;
    ensure!(autoconf.trim() == "0", "autoconf {autoconf:?}");

    for (claim, ns) in [(&s, &ns_s), (&u, &ns_u)] {
        env.runtime
            .stop_pod_sandbox(&env.pod(claim, Some(ns)))
            .await
            .map_err(anyhow::Error::msg)?;
        env.runtime
            .remove_pod_sandbox(&env.pod(claim, None))
            .await
            .map_err(anyhow::Error::msg)?;
        let out = env
            .plugin
            .unprepare(DraVersion::V1, &[env.id(claim)])
            .await?;
        ensure!(out[&claim.uid].is_empty(), "unprepare: {}", out[&claim.uid]);
    }

    // DHCP where no server answers (device 2's peer runs none): the sandbox fails within the
    // claim's bound with the reason, and the device is back on the host as it was.
    let before = super::host_link(&env.dev(2))?;
    let d = env
        .cluster
        .create_claim_with_config(
            "no-server",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(
                json!({"addressing": {"mode": "dhcp", "timeoutSeconds": 2}}),
            )),
        )
        .await?;
    let out = env.plugin.prepare(DraVersion::V1, &[env.id(&d)]).await?;
    ensure!(
        out[&d.uid].error.is_empty(),
        "prepare: {}",
        out[&d.uid].error
    );
    let ns_d = Netns::new(&format!("knt-pn-{}", env.tag))?;
    let started = std::time::Instant::now();
    let err = env
        .runtime
        .run_pod_sandbox(&env.pod(&d, Some(&ns_d)))
        .await
        .err()
        .context("an attach without a DHCP server must fail")?
        .to_string();
    let took = started.elapsed();
    eprintln!("no DHCP server: failed after {took:?}: {err}");
    ensure!(
        err.contains(
            "getting a DHCP lease for net1: no DHCPOFFER (sent DHCPDISCOVER 2 times) within 2 s"
        ),
        "{err}"
    );
    ensure!(took < Duration::from_secs(4), "{took:?}");
    ensure!(
        super::host_link(&env.dev(2))? == before,
        "the device is not back as it was"
    );
    ensure!(
        ip(&["-n", &ns_d.0, "link", "show", "net1"]).is_err(),
        "net1 left in the pod"
    );
    let out = env.plugin.unprepare(DraVersion::V1, &[env.id(&d)]).await?;
    ensure!(out[&d.uid].is_empty(), "unprepare: {}", out[&d.uid]);
    Ok(())
}
