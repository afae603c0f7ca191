//! The KNI network runtime API end to end, driven by a client generated from the KNI
//! project's own api.proto (Python grpcio-tools, `knic_e2e::kni`): every call and refusal with
//! its status text.
//!
//! - `standalone/…`: `knic-driver kni --standalone`, no cluster: Networks from a file, veth
//!   devices (playing NICs) discovered from sysfs, a sandbox namespace made by CreateNetwork,
//!   a Network and an inline config attached, traffic through them, a restart, detach, and the
//!   node exactly as before;
//! - `fake/…`: `knic-driver run` against the in-process fake API with a test kubelet and NRI
//!   runtime: a DRA-attached pod seen through QueryPodNetwork, and QueryNodeNetworks following
//!   the driver's real state (registration, NRI, a device going away) (`kni/dra.rs`);
//! - `real/…`: its twin on the real cluster (only with `KNIC_E2E_KUBECONFIG`): the real driver
//!   of the real node, a pod through the real kubelet and containerd (`kni/real.rs`).
//!
//! Runs as root in private network and mount namespaces; without root the trials say so and
//! are ignored.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_e2e::harness::{Netns, eventually, ip, isolate, trial, udp_echo};
use knic_e2e::kni::KniClient;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

#[path = "kni/dra.rs"]
mod dra;
#[path = "kni/real.rs"]
mod real;

/// The standalone driver of a trial, killed when dropped.
struct Standalone {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Standalone {
    fn start(dir: &Path, root: &Path, include: &str) -> anyhow::Result<Standalone> {
        let log = dir.join("driver.log");
        let socket = dir.join("kni.sock");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(knic_e2e::driver::binary()?)
            .args(["kni", "--standalone"])
            .env_clear()
            .env("NODE_NAME", "knt-node")
            .env("KNIC_NETWORKS", dir.join("networks.yaml"))
            .env("KNIC_KNI_SOCKET", &socket)
            .env("KNIC_STATE_DIR", dir.join("state"))
            .env("KNIC_KNI_NETNS_DIR", dir.join("netns"))
            .env("KNIC_SYSFS_ROOT", root)
            .env("KNIC_INCLUDE", include)
            .env("KNIC_LOG_LEVEL", "info,knic_driver=debug")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Standalone { child, socket, log })
    }

    async fn ready(&self) -> anyhow::Result<()> {
        eventually("the KNI socket", Duration::from_secs(20), || async {
            Ok(self.socket.exists().then_some(()))
        })
        .await
        .with_context(|| self.logs())
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("driver pid")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid)?),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .context("the driver did not stop on SIGTERM")??;
        ensure!(status.success(), "exit {status}: {}", self.logs());
        ensure!(!self.socket.exists(), "the socket stays after SIGTERM");
        Ok(())
    }
}

/// `ip -o link` of `name` reduced to what a detach must restore.
fn link_state(name: &str) -> anyhow::Result<String> {
    let out = ip(&["-o", "link", "show", name])?;
    let field = |key: &str| {
        let words: Vec<&str> = out.split_whitespace().collect();
        words
            .iter()
            .position(|w| *w == key)
            .map(|i| words[i + 1].to_owned())
            .unwrap_or_default()
    };
    Ok(format!(
        "{name} mtu {} mac {}",
        field("mtu"),
        field("link/ether")
    ))
}

/// `ip ARGS` inside the namespace at `path`.
fn ip_in(path: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", path.display()))
        .arg("ip")
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "ip {args:?} in {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

const NETWORKS: &str = r#"
apiVersion: knic.dev/v1alpha1
kind: Network
metadata: {name: blue}
spec:
  devices:
    deviceClassName: knic.dev
    selectors: ['device.attributes["knic.dev"].ifName == "knt-s0"']
  mtu: 1400
  ipam:
    subnets:
      - cidr: 192.0.2.0/24
        gateway: 192.0.2.1
        exclude: ["192.0.2.2-192.0.2.9"]
        routes: [{destination: 203.0.113.0/24}]
  namespaces: {names: [tenant-a]}
"#;

async fn standalone(root: PathBuf) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("knt-kni-").tempdir()?;
    std::fs::write(dir.path().join("networks.yaml"), NETWORKS)?;
    let peer = Netns::new("knt-kpeer")?;
    for (host, other, addr) in [
        ("knt-s0", "knt-s1", "192.0.2.1/24"),
        ("knt-s2", "knt-s3", "198.51.100.1/24"),
    ] {
        ip(&[
            "link", "add", host, "type", "veth", "peer", "name", other, "netns", &peer.0,
        ])?;
        ip(&["link", "set", host, "up"])?;
        ip(&["-n", &peer.0, "addr", "add", addr, "dev", other])?;
        ip(&["-n", &peer.0, "link", "set", other, "up"])?;
    }
    let before = (link_state("knt-s0")?, link_state("knt-s2")?);
    let driver = Standalone::start(dir.path(), &root, "name=knt-s0,name=knt-s2")?;
    driver.ready().await?;
    let mode = std::fs::metadata(&driver.socket)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "socket mode {mode:o}");
    let mut kni = KniClient::connect(&driver.socket).await?;
    let outcome = scenario(&mut kni, dir.path(), &root, &peer, &before, driver).await;
    outcome.with_context(|| {
        format!(
            "driver log:\n{}",
            std::fs::read_to_string(dir.path().join("driver.log")).unwrap_or_default()
        )
    })
}

async fn scenario(
    kni: &mut KniClient,
    dir: &Path,
    root: &Path,
    peer: &Netns,
    before: &(String, String),
    driver: Standalone,
) -> anyhow::Result<()> {
    ensure!(kni.grpcio.starts_with("1."), "grpcio {}", kni.grpcio);
    // The node has what knic needs.
    kni.ok("SetupNodeNetwork", json!({})).await?;
    let nodes = kni.ok("QueryNodeNetworks", json!({})).await?;
    ensure!(nodes["extradata"]["node"] == "knt-node", "{nodes}");
    let blue = &nodes["networks"][0];
    ensure!(blue["name"] == "blue" && blue["ready"] == true, "{nodes}");
    let device = blue["extradata"]["freeDevices"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    ensure!(!device.is_empty() && !device.contains(','), "{nodes}");

    // A sandbox namespace, pinned under the configured directory.
    let created = kni
        .ok(
            "CreateNetwork",
            json!({"name": "vm-1", "uid": "sbx1", "namespace": "tenant-a"}),
        )
        .await?;
    let netns = PathBuf::from(created["netns_path"].as_str().unwrap_or_default());
    ensure!(netns == dir.join("netns/sbx1"), "{created}");
    ensure!(
        knic_driver::kni::pin::is_pinned(&netns),
        "not a namespace: {}",
        netns.display()
    );
    // Again: the same namespace.
    let again = kni
        .ok(
            "CreateNetwork",
            json!({"name": "vm-1", "uid": "sbx1", "namespace": "tenant-a"}),
        )
        .await?;
    ensure!(
        again["netns_path"] == created["netns_path"] && again["extradata"]["created"] == "false"
    );

    let attach = |id: &str, path: &Path, extradata: Value| {
        json!({"name": "vm-1", "id": id, "namespace": "tenant-a",
               "isolation": {"path": path.display().to_string(), "type": "netns"},
               "extradata": extradata})
    };
    let answer = kni
        .ok(
            "AttachInterface",
            attach("sbx1", &netns, json!({"network": "blue"})),
        )
        .await?;
    let net1 = &answer["ipconfigs"]["net1"];
    // One address of the subnet, never the gateway or an excluded one.
    let address = net1["ip"][0].as_str().unwrap_or_default().to_owned();
    let host: u8 = address
        .strip_prefix("192.0.2.")
        .and_then(|a| a.strip_suffix("/24"))
        .and_then(|h| h.parse().ok())
        .with_context(|| format!("{answer}"))?;
    ensure!(
        (10..255).contains(&host) && net1["ip"].as_array().map(Vec::len) == Some(1),
        "{answer}"
    );
    let mac = before.0.split_whitespace().last().unwrap_or_default();
    ensure!(net1["mac"] == mac, "{answer} vs {}", before.0);
    ensure!(net1["extradata"]["network"] == "blue", "{answer}");
    let inside = ip_in(&netns, &["-o", "addr", "show", "net1"])?;
    ensure!(inside.contains(&format!("inet {address}")), "{inside}");
    let mtu = ip_in(&netns, &["-o", "link", "show", "net1"])?;
    ensure!(mtu.contains("mtu 1400"), "{mtu}");
    let routes = ip_in(&netns, &["route", "show"])?;
    ensure!(
        routes.contains("203.0.113.0/24 via 192.0.2.1 dev net1"),
        "{routes}"
    );
    ensure!(
        !ip(&["-o", "link"])?.contains("knt-s0:"),
        "knt-s0 is still on the host"
    );
    udp_echo(&netns, &peer.path(), "192.0.2.1")?;
    // The address is a NetworkAddress file, named as the API would name it.
    let addresses: Vec<String> = std::fs::read_dir(dir.join("state/addresses"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ensure!(
        addresses == [format!("blue-192-0-2-{host}.json")],
        "{addresses:?}"
    );

    // Repeating the attach answers the same and moves nothing.
    let repeat = kni
        .ok(
            "AttachInterface",
            attach("sbx1", &netns, json!({"network": "blue"})),
        )
        .await?;
    ensure!(
        repeat["ipconfigs"] == answer["ipconfigs"],
        "{repeat} vs {answer}"
    );
    // The Network is now used up on this node, and says by whom.
    let nodes = kni.ok("QueryNodeNetworks", json!({})).await?;
    let reasons = nodes["networks"][0]["extradata"]["reasons"]
        .as_str()
        .unwrap_or_default();
    ensure!(nodes["networks"][0]["ready"] != true, "{nodes}");
    ensure!(
        reasons
            == format!(
                "0 of 1 matching devices free, 1 needed per pod (in use: {device} by tenant-a/kni-sbx1-blue)"
            ),
        "{reasons}"
    );

    // An inline config on the other device, into the same sandbox.
    let nodes_devices = kni.ok("QueryPodNetwork", json!({"id": "sbx1"})).await?;
    ensure!(
        nodes_devices["extradata"]["interfaces"] == "1",
        "{nodes_devices}"
    );
    let inline =
        json!({"interface": {"name": "data0"}, "addresses": ["198.51.100.10/24"]}).to_string();
    let s2 = device.replace("s0", "s2");
    let data = kni
        .ok(
            "AttachInterface",
            attach("sbx1", &netns, json!({"config": inline, "device": s2})),
        )
        .await?;
    ensure!(
        data["ipconfigs"]["data0"]["ip"] == json!(["198.51.100.10/24"]),
        "{data}"
    );
    udp_echo(&netns, &peer.path(), "198.51.100.1")?;

    // Every refusal with its status text.
    refusals(kni, &netns, dir).await?;

    // QueryPodNetwork by sandbox id and by name: both interfaces, with MACs.
    for who in [
        json!({"id": "sbx1"}),
        json!({"name": "vm-1", "namespace": "tenant-a"}),
    ] {
        let pod = kni.ok("QueryPodNetwork", who.clone()).await?;
        ensure!(pod["extradata"]["interfaces"] == "2", "{who}: {pod}");
        ensure!(pod["ipconfigs"]["net1"]["ip"] == json!([address]), "{pod}");
        ensure!(pod["ipconfigs"]["net1"]["mac"] == mac, "{pod}");
        ensure!(
            pod["ipconfigs"]["data0"]["extradata"]["present"] == "true",
            "{pod}"
        );
    }
    let nobody = kni.ok("QueryPodNetwork", json!({"id": "nobody"})).await?;
    ensure!(
        nobody["extradata"]["interfaces"] == "0" && nobody.get("ipconfigs").is_none(),
        "{nobody}"
    );

    // A restart keeps everything: the checkpoint is on disk.
    driver.stop().await?;
    let driver = Standalone::start(dir, root, "name=knt-s0,name=knt-s2")?;
    driver.ready().await?;
    let mut kni = KniClient::connect(&driver.socket).await?;
    let pod = kni.ok("QueryPodNetwork", json!({"id": "sbx1"})).await?;
    ensure!(
        pod["extradata"]["interfaces"] == "2",
        "after a restart: {pod}"
    );
    udp_echo(&netns, &peer.path(), "192.0.2.1")?;

    // Detach: both devices home exactly as they were; the address released.
    kni.ok(
        "DetachInterface",
        json!({"id": "sbx1", "name": "vm-1", "namespace": "tenant-a"}),
    )
    .await?;
    ensure!(
        link_state("knt-s0")? == before.0,
        "{} vs {}",
        link_state("knt-s0")?,
        before.0
    );
    ensure!(link_state("knt-s2")? == before.1);
    ensure!(
        std::fs::read_dir(dir.join("state/addresses"))?
            .next()
            .is_none(),
        "an address file stayed"
    );
    let pod = kni.ok("QueryPodNetwork", json!({"id": "sbx1"})).await?;
    ensure!(pod["extradata"]["interfaces"] == "0", "{pod}");
    // Again: success, nothing to do.
    kni.ok("DetachInterface", json!({"id": "sbx1"})).await?;
    kni.ok(
        "DeleteNetwork",
        json!({"id": "sbx1", "netns_path": netns.display().to_string()}),
    )
    .await?;
    ensure!(!netns.exists(), "the pin stays");
    kni.ok("DeleteNetwork", json!({"id": "sbx1"})).await?;
    let nodes = kni.ok("QueryNodeNetworks", json!({})).await?;
    ensure!(nodes["networks"][0]["ready"] == true, "{nodes}");
    driver.stop().await
}

async fn refusals(kni: &mut KniClient, netns: &Path, dir: &Path) -> anyhow::Result<()> {
    let path = netns.display().to_string();
    let attach = |id: &str, path: &str, extradata: Value| {
        json!({"name": "vm-2", "id": id, "namespace": "tenant-a",
               "isolation": {"path": path}, "extradata": extradata})
    };
    let big = "x".repeat(300 * 1024);
    let cases: Vec<(&str, Value, &str, String)> = vec![
        ("AttachInterface", attach("", &path, json!({"network": "blue"})), "INVALID_ARGUMENT",
            "id: must be 1 to 128 characters, got 0".into()),
        ("AttachInterface", attach("a/b", &path, json!({"network": "blue"})), "INVALID_ARGUMENT",
            "id: may hold only letters, digits, '-' and '_', got '/'".into()),
        ("AttachInterface", attach("sbx2", &path, json!({})), "INVALID_ARGUMENT",
            "extradata.network: required: the knic Network to attach (or extradata.config with extradata.device for an inline NetworkConfig)".into()),
        ("AttachInterface", attach("sbx2", "", json!({"network": "blue"})), "INVALID_ARGUMENT",
            "isolation.path: required: an absolute path".into()),
        ("AttachInterface", attach("sbx2", "/proc/self/ns/net", json!({"network": "blue"})), "FAILED_PRECONDITION",
            "isolation.path: /proc/self/ns/net is the driver's own network namespace (the node's); interfaces go into a sandbox's".into()),
        ("AttachInterface", attach("sbx2", &path, json!({"network": "red"})), "NOT_FOUND",
            "attaching Network \"red\" to sandbox sbx2: extradata.network: Network \"red\" does not exist".into()),
        ("AttachInterface", attach("sbx2", &path, json!({"network": "blue"})), "RESOURCE_EXHAUSTED",
            "attaching Network \"blue\" to sandbox sbx2: 0 of 1 matching devices free, 1 needed per pod".into()),
        ("AttachInterface", attach("sbx2", &path, json!({"config": "{mtu: 9000}", "device": "x"})), "INVALID_ARGUMENT",
            "extradata.config: mtu: unknown field".into()),
        ("AttachInterface", json!({"name": "vm-2", "id": "sbx2", "namespace": "tenant-a",
            "isolation": {"path": path}, "extradata": {"network": "blue"},
            "port_mappings": [{"protocol": "UDP", "container_port": 53, "host_port": 53}]}),
            "INVALID_ARGUMENT", "port_mappings: knic forwards no host ports".into()),
        ("AttachInterface", attach("sbx2", &path, json!({"config": big})), "OUT_OF_RANGE",
            "decoded message length too large: found 307272 bytes, the limit is: 262144 bytes".into()),
        ("QueryPodNetwork", json!({}), "INVALID_ARGUMENT",
            "id or name: one is required (the sandbox id or pod UID, or the pod's name)".into()),
        ("QueryPodNetwork", json!({"name": "Not_A_Pod"}), "INVALID_ARGUMENT",
            "name: the pod's name \"Not_A_Pod\" is not a DNS subdomain".into()),
        ("CreateNetwork", json!({"uid": "sbx9", "netns_path_prefix": "/etc"}), "INVALID_ARGUMENT",
            format!("netns_path_prefix: /etc is not under {} (--kni-netns-dir)", dir.join("netns").display())),
        ("CreateNetwork", json!({"uid": "../x"}), "INVALID_ARGUMENT",
            "uid: may hold only letters, digits, '-' and '_', got '.'".into()),
        ("DeleteNetwork", json!({"netns_path": path}), "FAILED_PRECONDITION",
            format!("DeleteNetwork: {path} still holds knic interfaces (")),
        ("DeleteNetwork", json!({"netns_path": "/run/netns/knt-kpeer"}), "INVALID_ARGUMENT",
            "netns_path: /run/netns/knt-kpeer is not a namespace under".into()),
        ("DetachInterface", json!({"id": ""}), "INVALID_ARGUMENT",
            "id: must be 1 to 128 characters, got 0".into()),
    ];
    for (method, request, code, text) in cases {
        let refusal = kni.refused(method, request.clone()).await?;
        ensure!(
            refusal.code == code && refusal.details.contains(&text),
            "{method} {}: got {refusal}, want {code} with {text:?}",
            knic_driver::bounded::quote(&request.to_string(), 300)
        );
    }
    // A second sandbox id into the namespace that has the first: the same device is taken.
    let taken = kni
        .refused(
            "AttachInterface",
            attach("sbx1", "/run/netns/knt-kpeer", json!({"network": "blue"})),
        )
        .await?;
    ensure!(
        taken.code == "ALREADY_EXISTS"
            && taken.details.contains(&format!(
                "isolation.path: this sandbox id has it attached in {path} already"
            )),
        "{taken}"
    );
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let real_cluster = knic_e2e::harness::real_cluster();
    // Before isolating: the real twin runs in the host's namespaces.
    let host = real::HostNamespaces::open();
    let isolated = isolate();
    if let Err(reason) = &isolated {
        eprintln!("skipped: KNI e2e tests: {reason}");
    }
    let root = isolated.clone().unwrap_or_default();
    let ignored = isolated.is_err();
    let trials = vec![
        trial(
            "standalone/attach_query_detach_with_the_upstream_client".into(),
            ignored,
            {
                let root = root.clone();
                move || standalone(root)
            },
        ),
        trial("fake/dra_pod_and_node_readiness".into(), ignored, {
            let root = root.clone();
            move || dra::dra_pod_and_node_readiness(root)
        }),
        real::trial(real_cluster, host),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    knic_e2e::driver::wait_for_the_kubelets_wipe();
    knic_e2e::harness::unisolate(&root);
    conclusion.exit()
}
