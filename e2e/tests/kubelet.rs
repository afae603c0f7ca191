//! The kubelet's side of the DRA plugin contract, end to end: a test kubelet speaks the real
//! gRPC over the real unix sockets to the real `knic-driver` binary, which reads claims from the
//! API (the in-process fake in CI; a real cluster when `KNIC_E2E_KUBECONFIG` is set, otherwise
//! those runs are reported as ignored with the reason).

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use knic_e2e::cluster::{Cluster, ENV_KUBECONFIG, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess, vf_device};
use knic_e2e::kubelet::{self, ClaimId, Device, DraVersion, Plugin};
use libtest_mimic::{Failed, Trial};

struct Env {
    cluster: Cluster,
    config: DriverConfig,
    driver: DriverProcess,
    plugin: Arc<Plugin>,
    version: DraVersion,
}

impl Env {
    fn id(&self, claim: &knic_e2e::cluster::TestClaim) -> ClaimId {
        ClaimId {
            namespace: self.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        }
    }

    fn checkpoint(&self) -> String {
        std::fs::read_to_string(self.config.plugin_dir.join("checkpoint.json")).unwrap_or_default()
    }

    async fn restart(&mut self) -> anyhow::Result<()> {
        self.driver = DriverProcess::start(&self.config)?;
        self.plugin = Arc::new(kubelet::register(&self.config.registry_dir).await?);
        Ok(())
    }

    /// The answer for `dev` prepared for claim `uid`: with the CDI device whose hook holds
    /// the pod's containers until the interface is there.
    fn expect_device(&self, dev: &str, uid: &str) -> Vec<Device> {
        vec![Device {
            pool: self.cluster.node.clone(),
            device: dev.into(),
            request_names: vec!["nic".into()],
            // The interface's hook device, and its request's KEP-5304 metadata mount.
            cdi_device_ids: vec![
                format!("knic.dev/interface={uid}-0"),
                format!("knic.dev/interface={uid}-meta-nic"),
            ],
            share_id: None,
        }]
    }
}

type Scenario = knic_e2e::harness::Scenario<Env>;

macro_rules! scenarios {
    ($($name:ident: $versioned:expr),* $(,)?) => {
        vec![$((stringify!($name), $versioned, (|e| Box::pin($name(e))) as Scenario)),*]
    };
}

async fn registration(env: &mut Env) -> anyhow::Result<()> {
    let info = &env.plugin.info;
    ensure!(
        info.name == "knic.dev" && info.r#type == "DRAPlugin",
        "GetInfo: {info:?}"
    );
    ensure!(
        info.supported_versions
            == [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"
            ],
        "{info:?}"
    );
    let dra = env.config.plugin_dir.join("dra.sock");
    ensure!(
        info.endpoint == dra.to_string_lossy(),
        "endpoint {} != {}",
        info.endpoint,
        dra.display()
    );
    for socket in [&dra, &env.plugin.registration_socket] {
        let mode = std::fs::metadata(socket)?.permissions().mode() & 0o777;
        ensure!(
            mode == 0o600,
            "{} has mode {mode:o}, want 600 (root only)",
            socket.display()
        );
    }
    ensure!(env.plugin.registration_socket == env.config.registry_dir.join("knic.dev-reg.sock"));
    // A rejection is answered with an error carrying the kubelet's text and logged as an error.
    let mut plugin = kubelet::register(&env.config.registry_dir).await?;
    let status = plugin
        .reject("version skew: knic.dev not supported")
        .await
        .err()
        .context("rejection must fail")?;
    ensure!(
        status
            .message()
            .contains("plugin registration rejected by the kubelet: version skew"),
        "{status:?}"
    );
    let logs = env.driver.logs();
    ensure!(
        logs.lines().any(|l| l.contains("\"level\":\"ERROR\"")
            && l.contains("kubelet rejected the plugin registration")
            && l.contains("version skew")),
        "rejection not logged as an error:\n{logs}"
    );
    Ok(())
}

async fn health_stream(env: &mut Env) -> anyhow::Result<()> {
    // The synthetic tree's links are up: every published device is healthy, on both versions.
    for v1 in [true, false] {
        let snapshot = env.plugin.health(v1).await?;
        ensure!(
            snapshot.len() == knic_e2e::driver::VFS + 1,
            "v1={v1}: {} devices",
            snapshot.len()
        );
        ensure!(
            snapshot.iter().any(|(d, _, _)| *d == vf_device(0)),
            "v1={v1}: {snapshot:?}"
        );
        ensure!(
            snapshot
                .iter()
                .all(|(_, h, m)| *h == 1 && m == "link is up"),
            "v1={v1}: {snapshot:?}"
        );
    }
    Ok(())
}

async fn prepare_allocated(env: &mut Env) -> anyhow::Result<()> {
    let claim = env
        .cluster
        .create_claim("alloc", Some(&[("knic.dev", vf_device(0).as_str())]))
        .await?;
    let out = env.plugin.prepare(env.version, &[env.id(&claim)]).await?;
    let got = out.get(&claim.uid).context("no entry for the claim")?;
    ensure!(got.error.is_empty(), "error: {}", got.error);
    ensure!(
        got.devices == env.expect_device(&vf_device(0), &claim.uid),
        "devices: {:?}",
        got.devices
    );
    let cp = env.checkpoint();
    ensure!(
        cp.contains(&claim.uid) && cp.contains(&claim.pod_uid),
        "checkpoint lacks the claim: {cp}"
    );
    Ok(())
}

async fn prepare_unallocated(env: &mut Env) -> anyhow::Result<()> {
    let bad = env.cluster.create_claim("unalloc", None).await?;
    let good = env
        .cluster
        .create_claim("good", Some(&[("knic.dev", vf_device(1).as_str())]))
        .await?;
    let out = env
        .plugin
        .prepare(env.version, &[env.id(&bad), env.id(&good)])
        .await?;
    ensure!(out.len() == 2, "every claim needs an entry: {out:?}");
    let want = format!(
        "ResourceClaim {}/unalloc: status.allocation is not set: the claim is not allocated",
        env.cluster.namespace
    );
    ensure!(
        out[&bad.uid].error == want,
        "{:?} != {want:?}",
        out[&bad.uid].error
    );
    ensure!(
        out[&good.uid].error.is_empty()
            && out[&good.uid].devices == env.expect_device(&vf_device(1), &good.uid)
    );
    Ok(())
}

async fn prepare_uid_changed(env: &mut Env) -> anyhow::Result<()> {
    let old = env
        .cluster
        .create_claim("replaced", Some(&[("knic.dev", vf_device(2).as_str())]))
        .await?;
    env.cluster.delete_claim("replaced").await?;
    let new = env
        .cluster
        .create_claim("replaced", Some(&[("knic.dev", vf_device(2).as_str())]))
        .await?;
    ensure!(old.uid != new.uid);
    let out = env.plugin.prepare(env.version, &[env.id(&old)]).await?;
    let err = &out
        .get(&old.uid)
        .context("entry keyed by the requested uid")?
        .error;
    ensure!(
        err.contains(&format!(
            "metadata.uid is \"{}\" but the kubelet asked for \"{}\"",
            new.uid, old.uid
        )) && err.contains("deleted and recreated"),
        "{err}"
    );
    ensure!(!env.checkpoint().contains(&old.uid));
    Ok(())
}

async fn prepare_other_driver(env: &mut Env) -> anyhow::Result<()> {
    let claim = env
        .cluster
        .create_claim("gpu", Some(&[("gpu.example.com", "gpu-0")]))
        .await?;
    let out = env.plugin.prepare(env.version, &[env.id(&claim)]).await?;
    let got = &out[&claim.uid];
    ensure!(got.error.is_empty() && got.devices.is_empty(), "{got:?}");
    Ok(())
}

/// Both sockets answer whatever `:authority` real clients send: grpc-go's percent-encoded path
/// (the kubelet's plugin watcher), the raw path, none at all, and Python grpcio's (gRPC C-core)
/// for `unix:` targets; each got `RST_STREAM(PROTOCOL_ERROR)` from h2 before the shim.
async fn real_client_authorities(env: &mut Env) -> anyhow::Result<()> {
    use knic_e2e::grpcwire::{grpc_go_authority, python_call, raw_call};
    use knic_proto::pluginregistration as reg;
    use prost::Message;
    const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
    const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";
    const PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
    let reg_socket = env.plugin.registration_socket.clone();
    let dra = env.config.plugin_dir.join("dra.sock");
    let notify = reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    }
    .encode_to_vec();
    let kubelet_authority = grpc_go_authority(&reg_socket);
    ensure!(
        kubelet_authority.starts_with("%2F") && kubelet_authority.ends_with("%2Fknic.dev-reg.sock"),
        "{kubelet_authority}"
    );
    let raw_path = reg_socket.to_string_lossy().into_owned();
    for authority in [kubelet_authority.as_str(), raw_path.as_str(), ""] {
        let info = raw_call(&reg_socket, authority.as_bytes(), GET_INFO, &[]).await?;
        ensure!(
            info.status.as_deref() == Some("0") && info.reset.is_none(),
            "GetInfo with :authority {authority:?}: {info:?}"
        );
        let info = reg::PluginInfo::decode(info.body.as_slice())?;
        ensure!(info.name == "knic.dev", "{info:?}");
        let reply = raw_call(&reg_socket, authority.as_bytes(), NOTIFY, &notify).await?;
        ensure!(
            reply.status.as_deref() == Some("0"),
            "NotifyRegistrationStatus with :authority {authority:?}: {reply:?}"
        );
    }

    let claim = env
        .cluster
        .create_claim("authority", Some(&[("knic.dev", vf_device(0).as_str())]))
        .await?;
    let prepare = knic_proto::dra::v1::NodePrepareResourcesRequest {
        claims: vec![knic_proto::dra::v1::Claim {
            namespace: env.cluster.namespace.clone(),
            uid: claim.uid.clone(),
            name: claim.name.clone(),
        }],
    }
    .encode_to_vec();
    let check_prepared = |body: &[u8], how: &str| -> anyhow::Result<()> {
        let answer = knic_proto::dra::v1::NodePrepareResourcesResponse::decode(body)?;
        let got = answer
            .claims
            .get(&claim.uid)
            .context("no entry for the claim")?;
        ensure!(
            got.error.is_empty()
                && got.devices.len() == 1
                && got.devices[0].device_name == vf_device(0),
            "{how}: {got:?}"
        );
        Ok(())
    };
    let reply = raw_call(&dra, grpc_go_authority(&dra).as_bytes(), PREPARE, &prepare).await?;
    ensure!(
        reply.status.as_deref() == Some("0"),
        "prepare, raw: {reply:?}"
    );
    check_prepared(&reply.body, "prepare, raw")?;

    // gRPC C-core, through Python: one that sends the percent-encoded path as :authority.
    let grpcio = knic_e2e::grpcwire::python_grpcio_version()?;
    ensure!(
        grpcio >= (1, 57),
        "grpcio {grpcio:?} predates the percent-encoded unix authority; use >= 1.57"
    );
    let reg_target = format!("unix:{}", reg_socket.display());
    let body = python_call(&reg_target, GET_INFO, &[])?
        .map_err(|e| anyhow::anyhow!("grpcio GetInfo: {e}"))?;
    ensure!(reg::PluginInfo::decode(body.as_slice())?.name == "knic.dev");
    python_call(&reg_target, NOTIFY, &notify)?
        .map_err(|e| anyhow::anyhow!("grpcio NotifyRegistrationStatus: {e}"))?;
    let body = python_call(&format!("unix:{}", dra.display()), PREPARE, &prepare)?
        .map_err(|e| anyhow::anyhow!("grpcio prepare: {e}"))?;
    check_prepared(&body, "prepare, grpcio")?;

    // tonic's own dial (valid authority) still works.
    let mut client =
        reg::registration_client::RegistrationClient::new(kubelet::dial(&reg_socket).await?);
    client
        .get_info(reg::InfoRequest {})
        .await
        .context("GetInfo, tonic")?;
    Ok(())
}

async fn prepare_repeated(env: &mut Env) -> anyhow::Result<()> {
    let claim = env
        .cluster
        .create_claim("again", Some(&[("knic.dev", vf_device(3).as_str())]))
        .await?;
    let first = env.plugin.prepare(env.version, &[env.id(&claim)]).await?;
    let second = env.plugin.prepare(env.version, &[env.id(&claim)]).await?;
    ensure!(first == second, "{first:?} != {second:?}");
    ensure!(first[&claim.uid].devices == env.expect_device(&vf_device(3), &claim.uid));
    if let Some(fake) = &env.cluster.fake {
        let gets = fake
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/resourceclaims/again"))
            .count();
        ensure!(
            gets == 1,
            "a repeated prepare must answer from the checkpoint, saw {gets} GETs"
        );
    }
    Ok(())
}

async fn unprepare_after_claim_deleted(env: &mut Env) -> anyhow::Result<()> {
    let claim = env
        .cluster
        .create_claim("gone", Some(&[("knic.dev", vf_device(4).as_str())]))
        .await?;
    let out = env.plugin.prepare(env.version, &[env.id(&claim)]).await?;
    ensure!(out[&claim.uid].error.is_empty());
    env.cluster.delete_claim("gone").await?;
    let out = env.plugin.unprepare(env.version, &[env.id(&claim)]).await?;
    ensure!(out.get(&claim.uid).is_some_and(String::is_empty), "{out:?}");
    ensure!(
        !env.checkpoint().contains(&claim.uid),
        "claim still in checkpoint"
    );
    Ok(())
}

async fn unprepare_unknown(env: &mut Env) -> anyhow::Result<()> {
    let unknown = ClaimId {
        namespace: env.cluster.namespace.clone(),
        name: "never-prepared".into(),
        uid: "00000000-0000-4000-8000-00000000beef".into(),
    };
    let out = env
        .plugin
        .unprepare(env.version, std::slice::from_ref(&unknown))
        .await?;
    ensure!(
        out.get(&unknown.uid).is_some_and(String::is_empty),
        "{out:?}"
    );
    Ok(())
}

async fn concurrent_prepares(env: &mut Env) -> anyhow::Result<()> {
    let mut claims = Vec::new();
    for i in 0..16 {
        claims.push(
            env.cluster
                .create_claim(
                    &format!("par-{i:02}"),
                    Some(&[("knic.dev", vf_device(8 + i).as_str())]),
                )
                .await?,
        );
    }
    let mut tasks = Vec::new();
    for claim in &claims {
        let plugin = env.plugin.clone();
        let id = env.id(claim);
        let version = env.version;
        tasks.push(tokio::spawn(
            async move { plugin.prepare(version, &[id]).await },
        ));
    }
    for (i, (task, claim)) in tasks.into_iter().zip(&claims).enumerate() {
        let out = task.await??;
        let got = &out[&claim.uid];
        ensure!(got.error.is_empty(), "claim {i}: {}", got.error);
        ensure!(
            got.devices == env.expect_device(&vf_device(8 + i), &claim.uid),
            "claim {i}: {:?}",
            got.devices
        );
    }
    let cp = env.checkpoint();
    ensure!(
        claims.iter().all(|c| cp.contains(&c.uid)),
        "checkpoint lost a concurrent prepare"
    );
    let ids: Vec<_> = claims.iter().map(|c| env.id(c)).collect();
    let out = env.plugin.unprepare(env.version, &ids).await?;
    ensure!(
        out.len() == 16 && out.values().all(String::is_empty),
        "{out:?}"
    );
    ensure!(claims.iter().all(|c| !env.checkpoint().contains(&c.uid)));
    Ok(())
}

async fn kill9_then_unprepare_from_checkpoint(env: &mut Env) -> anyhow::Result<()> {
    let claim = env
        .cluster
        .create_claim("crash", Some(&[("knic.dev", vf_device(5).as_str())]))
        .await?;
    ensure!(
        env.plugin.prepare(env.version, &[env.id(&claim)]).await?[&claim.uid]
            .error
            .is_empty()
    );
    env.driver.kill9().await?;
    // kill -9 leaves both socket files behind; the restart must replace them.
    ensure!(
        env.plugin.registration_socket.exists(),
        "socket vanished without cleanup code running?"
    );
    env.cluster.delete_claim("crash").await?;
    env.restart().await?;
    let out = env.plugin.unprepare(env.version, &[env.id(&claim)]).await?;
    ensure!(
        out[&claim.uid].is_empty(),
        "unprepare after restart: {}",
        out[&claim.uid]
    );
    ensure!(!env.checkpoint().contains(&claim.uid));
    Ok(())
}

async fn truncated_checkpoint(env: &mut Env) -> anyhow::Result<()> {
    let claim = env
        .cluster
        .create_claim("trunc", Some(&[("knic.dev", vf_device(6).as_str())]))
        .await?;
    ensure!(
        env.plugin.prepare(env.version, &[env.id(&claim)]).await?[&claim.uid]
            .error
            .is_empty()
    );
    let status = env.driver.terminate().await?;
    ensure!(status.success(), "SIGTERM exit: {status}");
    ensure!(
        !env.plugin.registration_socket.exists(),
        "registration socket left after SIGTERM"
    );
    ensure!(
        !env.config.plugin_dir.join("dra.sock").exists(),
        "DRA socket left after SIGTERM"
    );
    let path = env.config.plugin_dir.join("checkpoint.json");
    let full = std::fs::read(&path)?;
    std::fs::write(&path, &full[..full.len() / 2])?;
    env.restart().await?;
    let documented = format!(
        "checkpoint {} is corrupt: the file is truncated",
        path.display()
    );
    let logs = env.driver.logs();
    ensure!(
        logs.contains(&documented),
        "start-up log lacks {documented:?}:\n{logs}"
    );
    let other = env
        .cluster
        .create_claim("after", Some(&[("knic.dev", vf_device(7).as_str())]))
        .await?;
    let out = env.plugin.prepare(env.version, &[env.id(&other)]).await?;
    ensure!(
        out[&other.uid].error.contains(&documented),
        "{:?}",
        out[&other.uid]
    );
    let out = env.plugin.unprepare(env.version, &[env.id(&claim)]).await?;
    ensure!(
        out[&claim.uid].contains(&documented),
        "unprepare must not forget silently: {out:?}"
    );
    ensure!(
        env.driver.is_running(),
        "a corrupt checkpoint must not crash the driver"
    );
    ensure!(
        std::fs::read(&path)? == full[..full.len() / 2],
        "the corrupt file must be left untouched"
    );
    // The operator restores the file: work resumes without a restart.
    std::fs::write(&path, &full)?;
    let out = env.plugin.unprepare(env.version, &[env.id(&claim)]).await?;
    ensure!(out[&claim.uid].is_empty(), "{out:?}");
    Ok(())
}

/// The entries of `dir`, sorted (none when it does not exist).
fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A graceful stop keeps what a prepared claim needs (checkpoint, CDI spec, hook) for the next
/// start, and once nothing is prepared leaves nothing of knic in the plugin directory: no
/// sockets, no empty checkpoint, no hook (what `helm uninstall` must leave).
async fn sigterm_keeps_only_what_prepared_claims_need(env: &mut Env) -> anyhow::Result<()> {
    let plugin_dir = env.config.plugin_dir.clone();
    let cdi_dir = std::path::PathBuf::from(env.config.env_value("KNIC_CDI_DIR").context("cdi")?);
    let claim = env
        .cluster
        .create_claim("kept", Some(&[("knic.dev", vf_device(8).as_str())]))
        .await?;
    let out = env.plugin.prepare(env.version, &[env.id(&claim)]).await?;
    ensure!(out[&claim.uid].error.is_empty(), "{:?}", out[&claim.uid]);
    let spec = format!("knic.dev-{}.json", claim.uid);
    let status = env.driver.terminate().await?;
    ensure!(status.success(), "SIGTERM exit: {status}");
    ensure!(
        entries(&plugin_dir) == ["bin", "checkpoint.json", "metadata"]
            && entries(&plugin_dir.join("bin")) == ["knic-driver"],
        "with a claim prepared the checkpoint, the hook and the claim's device metadata stay, \
         the socket goes: {:?} {:?}",
        entries(&plugin_dir),
        entries(&plugin_dir.join("bin"))
    );
    ensure!(
        env.checkpoint().contains(&claim.uid),
        "{}",
        env.checkpoint()
    );
    ensure!(
        entries(&cdi_dir) == [spec.clone()],
        "{:?}",
        entries(&cdi_dir)
    );
    ensure!(
        env.driver.logs().contains(
            "claims are still prepared: the checkpoint, their CDI specs and the CDI hook stay"
        ),
        "{}",
        env.driver.logs()
    );

    env.restart().await?;
    let out = env.plugin.unprepare(env.version, &[env.id(&claim)]).await?;
    ensure!(
        out[&claim.uid].is_empty(),
        "unprepare after restart: {}",
        out[&claim.uid]
    );
    ensure!(entries(&cdi_dir).is_empty(), "{:?}", entries(&cdi_dir));
    let status = env.driver.terminate().await?;
    ensure!(status.success(), "SIGTERM exit: {status}");
    ensure!(
        plugin_dir.is_dir() && entries(&plugin_dir).is_empty(),
        "nothing prepared: the plugin directory must be left empty, not {:?}",
        entries(&plugin_dir)
    );
    ensure!(
        !entries(&env.config.registry_dir)
            .iter()
            .any(|e| e.starts_with("knic.dev")),
        "{:?}",
        entries(&env.config.registry_dir)
    );
    ensure!(
        env.driver
            .logs()
            .contains("nothing prepared: removed the empty checkpoint and the CDI hook"),
        "{}",
        env.driver.logs()
    );
    // The next start finds no claims and installs the hook again.
    env.restart().await?;
    ensure!(plugin_dir.join("bin/knic-driver").is_file());
    let again = env
        .cluster
        .create_claim("again", Some(&[("knic.dev", vf_device(9).as_str())]))
        .await?;
    let out = env.plugin.prepare(env.version, &[env.id(&again)]).await?;
    ensure!(out[&again.uid].error.is_empty(), "{:?}", out[&again.uid]);
    let out = env.plugin.unprepare(env.version, &[env.id(&again)]).await?;
    ensure!(out[&again.uid].is_empty(), "{}", out[&again.uid]);
    Ok(())
}

async fn run(
    real: Option<RealCluster>,
    test: String,
    version: DraVersion,
    scenario: Scenario,
) -> anyhow::Result<()> {
    let cluster = match &real {
        Some(r) => Cluster::real(r, &test).await?,
        None => Cluster::fake(&test).await?,
    };
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig);
    let driver = DriverProcess::start(&config)?;
    let plugin = match kubelet::register(&config.registry_dir).await {
        Ok(p) => Arc::new(p),
        Err(e) => bail!("{e:#}\ndriver log:\n{}", driver.logs()),
    };
    let mut env = Env {
        cluster,
        config,
        driver,
        plugin,
        version,
    };
    let outcome = scenario(&mut env).await;
    let cleanup = env.cluster.cleanup().await;
    match outcome {
        Ok(()) => cleanup,
        Err(e) => bail!("{e:#}\n--- driver log ---\n{}", env.driver.logs()),
    }
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let real = match RealCluster::from_env() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    if real.is_none() {
        eprintln!("skipped: real-cluster runs (real/*): {ENV_KUBECONFIG} is not set");
    }
    let all = scenarios![
        registration: false,
        health_stream: false,
        real_client_authorities: false,
        prepare_allocated: true,
        prepare_unallocated: true,
        prepare_uid_changed: true,
        prepare_other_driver: true,
        prepare_repeated: true,
        unprepare_after_claim_deleted: true,
        unprepare_unknown: true,
        concurrent_prepares: true,
        kill9_then_unprepare_from_checkpoint: true,
        truncated_checkpoint: true,
        sigterm_keeps_only_what_prepared_claims_need: false,
    ];
    let mut trials = Vec::new();
    for backend in ["fake", "real"] {
        for (name, versioned, scenario) in &all {
            let versions: &[DraVersion] = if *versioned {
                &[DraVersion::V1, DraVersion::V1beta1]
            } else {
                &[DraVersion::V1]
            };
            for &version in versions {
                let suffix = match (versioned, version) {
                    (false, _) => "",
                    (true, DraVersion::V1) => "/v1",
                    (true, DraVersion::V1beta1) => "/v1beta1",
                };
                let test = format!("{backend}/{name}{suffix}");
                let cluster = if backend == "real" {
                    real.clone()
                } else {
                    None
                };
                let scenario = *scenario;
                let ignored = backend == "real" && real.is_none();
                let label = test.clone();
                trials.push(
                    Trial::test(test, move || {
                        let rt = tokio::runtime::Builder::new_multi_thread()
                            .worker_threads(2)
                            .enable_all()
                            .build()
                            .map_err(|e| Failed::from(e.to_string()))?;
                        rt.block_on(run(cluster, label, version, scenario))
                            .map_err(|e| Failed::from(format!("{e:#}")))
                    })
                    .with_ignored_flag(ignored),
                );
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
