//! The real `knic-driver` binary's `/metrics`, `/healthz` and `/readyz` over HTTP, and its
//! Events in the fake API: readiness flips as each condition (slices published, kubelet
//! registration acknowledged, NRI connected) comes and goes; after prepares, unprepares and NRI
//! hooks the scrape shows the counts; a failed prepare leaves one Event on the claim and one on
//! its pod, with the kubelet's error text, and a repeat within the minute none. Two controller
//! replicas are both ready (leader and healthy standby) and the leader's metrics count a
//! Network by condition with its addresses.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_controller::network::Network;
use knic_driver::nri::PodSandbox;
use knic_driver::nri::runtime::TestRuntime;
use knic_e2e::cluster::Cluster;
use knic_e2e::driver::{DriverConfig, DriverProcess, free_loopback_address, http_get, vf_device};
use knic_e2e::harness::eventually;
use knic_e2e::kubelet::{self, ClaimId, DraVersion};
use libtest_mimic::Trial;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// Waits until `url` answers `status` with exactly `body`.
async fn answers(url: &str, status: u16, body: &str) -> anyhow::Result<()> {
    eventually(
        &format!("{url} to answer {status} {body:?}"),
        WAIT,
        || async {
            let got = http_get(url).await?;
            ensure!(got.0 == status && got.1 == body, "last answer: {got:?}");
            Ok(Some(()))
        },
    )
    .await
}

/// The value of the sample line `series` (name and labels exactly as exposed).
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

fn expect(scrape: &str, series: &str, wanted: f64) -> anyhow::Result<()> {
    let got = sample(scrape, series);
    ensure!(
        got == Some(wanted),
        "{series}: got {got:?}, want {wanted}\n--- scrape ---\n{scrape}"
    );
    Ok(())
}

fn expect_at_least(scrape: &str, series: &str, wanted: f64) -> anyhow::Result<()> {
    let got = sample(scrape, series);
    ensure!(
        got.is_some_and(|v| v >= wanted),
        "{series}: got {got:?}, want at least {wanted}\n--- scrape ---\n{scrape}"
    );
    Ok(())
}

fn events(cluster: &Cluster) -> Vec<Value> {
    cluster
        .fake
        .as_ref()
        .map(|f| f.objects("apis/events.k8s.io/v1/events", &cluster.namespace))
        .unwrap_or_default()
}

async fn metrics_health_and_events() -> anyhow::Result<()> {
    let cluster = Cluster::fake("metrics").await?;
    cluster.ensure_node().await?;
    let (config, base) =
        DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
            .without_stand_in_runtime()
            .with_http()?;
    let nri_socket = config
        .env_value("KNIC_NRI_SOCKET")
        .context("NRI socket")?
        .to_owned();
    let driver = DriverProcess::start(&config)?;
    let (healthz, readyz, metrics) = (
        format!("{base}/healthz"),
        format!("{base}/readyz"),
        format!("{base}/metrics"),
    );

    answers(&healthz, 200, "ok\n").await?;
    // Slices go out on their own; nobody registered the plugin and no runtime runs.
    answers(
        &readyz,
        503,
        "not ready: kubelet registration acknowledged, NRI plugin connected\n",
    )
    .await?;
    let plugin = kubelet::register(&config.registry_dir).await?;
    answers(&readyz, 503, "not ready: NRI plugin connected\n").await?;
    let mut runtime = TestRuntime::listen(std::path::Path::new(&nri_socket)).await?;
    runtime.accept(Vec::new()).await?;
    answers(&readyz, 200, "ok\n").await?;

    // One prepare that works, one refused (allocated in another node's pool), one unprepare.
    let good = cluster
        .create_claim("good", Some(&[("knic.dev", &vf_device(0))]))
        .await?;
    let bad = cluster
        .create_claim_in_pool(
            "bad",
            "other-node",
            Some(&[("knic.dev", &vf_device(1))]),
            None,
        )
        .await?;
    let id = |c: &knic_e2e::cluster::TestClaim| ClaimId {
        namespace: cluster.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    };
    let out = plugin.prepare(DraVersion::V1, &[id(&good)]).await?;
    ensure!(out[&good.uid].error.is_empty(), "{:?}", out[&good.uid]);
    let out = plugin.prepare(DraVersion::V1, &[id(&bad)]).await?;
    let refusal = out[&bad.uid].error.clone();
    ensure!(
        !refusal.is_empty(),
        "a claim of another pool must be refused"
    );
    let out = plugin.unprepare(DraVersion::V1, &[id(&good)]).await?;
    ensure!(out[&good.uid].is_empty(), "{}", out[&good.uid]);
    // A sandbox without knic claims: the hook runs and succeeds.
    runtime
        .run_pod_sandbox(&PodSandbox {
            id: "sandbox-1".into(),
            name: "plain".into(),
            uid: "plain-uid".into(),
            namespace: cluster.namespace.clone(),
            netns: None,
            ips: vec![],
        })
        .await?;

    // The failed prepare: one Event on the claim, one on its pod, with the kubelet's text.
    let recorded = eventually("two Events", WAIT, || {
        let found = events(&cluster);
        async move { Ok((found.len() >= 2).then_some(found)) }
    })
    .await?;
    let mut kinds = Vec::new();
    for e in &recorded {
        ensure!(e["type"] == "Warning", "{e}");
        ensure!(e["reason"] == "PrepareFailed", "{e}");
        ensure!(e["action"] == "PrepareResources", "{e}");
        ensure!(
            e["note"] == json!(refusal),
            "note {} != {refusal:?}",
            e["note"]
        );
        ensure!(e["reportingController"] == "knic.dev/driver", "{e}");
        ensure!(
            e["reportingInstance"] == json!(format!("knic-driver-{}", cluster.node)),
            "{e}"
        );
        ensure!(e["series"].is_null(), "a first Event has no series: {e}");
        kinds.push((
            e["regarding"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            e["regarding"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ));
    }
    kinds.sort();
    ensure!(
        kinds
            == [
                ("Pod".to_owned(), "bad-pod".to_owned()),
                ("ResourceClaim".to_owned(), "bad".to_owned())
            ],
        "{kinds:?}"
    );
    // Again within the minute: held back and counted; the claim's Event being held back, its
    // pods are not even looked up (the kubelet retries prepare every few seconds).
    let out = plugin.prepare(DraVersion::V1, &[id(&bad)]).await?;
    ensure!(out[&bad.uid].error == refusal);
    let scrape = eventually("suppressed Events counted", WAIT, || {
        let url = metrics.clone();
        async move {
            let (_, body) = http_get(&url).await?;
            Ok((sample(
                &body,
                "knic_driver_events_total{reason=\"PrepareFailed\",outcome=\"suppressed\"}",
            ) == Some(1.0))
            .then_some(body))
        }
    })
    .await?;
    ensure!(events(&cluster).len() == 2, "{:?}", events(&cluster));

    let (status, _) = http_get(&metrics).await?;
    ensure!(status == 200);
    for (series, value) in [
        (
            "knic_driver_kubelet_requests_total{method=\"NodePrepareResources\",result=\"success\"}",
            1.0,
        ),
        (
            "knic_driver_kubelet_requests_total{method=\"NodePrepareResources\",result=\"error\"}",
            2.0,
        ),
        (
            "knic_driver_kubelet_requests_total{method=\"NodeUnprepareResources\",result=\"success\"}",
            1.0,
        ),
        (
            "knic_driver_kubelet_requests_total{method=\"NodeUnprepareResources\",result=\"error\"}",
            0.0,
        ),
        (
            "knic_driver_kubelet_request_duration_seconds_count{method=\"NodePrepareResources\"}",
            3.0,
        ),
        (
            "knic_driver_claims_total{operation=\"prepare\",result=\"error\"}",
            2.0,
        ),
        (
            "knic_driver_claims_total{operation=\"prepare\",result=\"success\"}",
            1.0,
        ),
        (
            "knic_driver_claims_total{operation=\"unprepare\",result=\"success\"}",
            1.0,
        ),
        (
            "knic_driver_nri_hooks_total{hook=\"RunPodSandbox\",result=\"success\"}",
            1.0,
        ),
        (
            "knic_driver_nri_hook_duration_seconds_count{hook=\"RunPodSandbox\"}",
            1.0,
        ),
        (
            "knic_driver_nri_hooks_total{hook=\"Synchronize\",result=\"success\"}",
            1.0,
        ),
        ("knic_driver_published_devices{kind=\"vf\"}", 32.0),
        ("knic_driver_published_devices{kind=\"pf\"}", 1.0),
        ("knic_driver_nri_connected", 1.0),
        ("knic_driver_kubelet_registered", 1.0),
        (
            "knic_driver_events_total{reason=\"PrepareFailed\",outcome=\"sent\"}",
            2.0,
        ),
        ("knic_driver_ipam_exhausted_total", 0.0),
        ("knic_driver_attaches_total{result=\"error\"}", 0.0),
    ] {
        expect(&scrape, series, value)?;
    }
    expect_at_least(
        &scrape,
        "knic_driver_resourceslice_writes_total{operation=\"create\",result=\"success\"}",
        1.0,
    )?;
    // Prepare and unprepare each replaced the checkpoint.
    expect_at_least(
        &scrape,
        "knic_driver_checkpoint_writes_total{result=\"success\"}",
        2.0,
    )?;
    for family in [
        "# TYPE knic_driver_kubelet_request_duration_seconds histogram",
        "# TYPE knic_driver_attach_duration_seconds histogram",
        "# TYPE knic_driver_detach_duration_seconds histogram",
        "# TYPE knic_driver_ipam_allocations_total counter",
        "# TYPE knic_driver_ipam_releases_total counter",
        "# HELP knic_driver_nri_connected 1 while the NRI plugin is registered with the container runtime.",
    ] {
        ensure!(scrape.contains(family), "{family} missing:\n{scrape}");
    }

    // IPAM: a Network with one usable address; the second claim is refused as exhausted (two
    // more Events, on its claim and pod, with the exhaustion text), the first gives its
    // address back at unprepare.
    let network = format!("metrics-{}", cluster.namespace);
    let spec = serde_json::from_value(json!({
        "devices": {"deviceClassName": "knic.dev"},
        "ipam": {"subnets": [{"cidr": "192.0.2.0/30", "gateway": "192.0.2.1"}]},
        "namespaces": {"names": [cluster.namespace]},
    }))?;
    kube::Api::<Network>::all(cluster.client.clone())
        .create(&Default::default(), &Network::new(&network, spec))
        .await?;
    let config = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                        "ipam": {"network": network}});
    let mut ipam = Vec::new();
    for (name, vf) in [("ipam-1", 2), ("ipam-2", 3)] {
        let pool = cluster.node.clone();
        let claim = cluster
            .create_claim_in_pool(
                name,
                &pool,
                Some(&[("knic.dev", &vf_device(vf))]),
                Some(config.clone()),
            )
            .await?;
        let out = plugin.prepare(DraVersion::V1, &[id(&claim)]).await?;
        ipam.push((claim, out));
    }
    ensure!(
        ipam[0].1[&ipam[0].0.uid].error.is_empty(),
        "{:?}",
        ipam[0].1
    );
    let exhausted = ipam[1].1[&ipam[1].0.uid].error.clone();
    ensure!(
        exhausted.ends_with("subnet 192.0.2.0/30 has no free address (1 in use of 1)"),
        "{exhausted}"
    );
    let out = plugin.unprepare(DraVersion::V1, &[id(&ipam[0].0)]).await?;
    ensure!(out[&ipam[0].0.uid].is_empty(), "{}", out[&ipam[0].0.uid]);
    let scrape = eventually("IPAM counted", WAIT, || async {
        let (_, body) = http_get(&metrics).await?;
        Ok((sample(
            &body,
            "knic_driver_events_total{reason=\"PrepareFailed\",outcome=\"sent\"}",
        ) == Some(4.0))
        .then_some(body))
    })
    .await?;
    for (series, value) in [
        (
            "knic_driver_ipam_allocations_total{result=\"success\"}",
            1.0,
        ),
        ("knic_driver_ipam_allocations_total{result=\"error\"}", 1.0),
        ("knic_driver_ipam_exhausted_total", 1.0),
        ("knic_driver_ipam_releases_total{result=\"success\"}", 1.0),
    ] {
        expect(&scrape, series, value)?;
    }
    let refused: Vec<Value> = events(&cluster)
        .into_iter()
        .filter(|e| e["regarding"]["name"] == "ipam-2" || e["regarding"]["name"] == "ipam-2-pod")
        .collect();
    ensure!(
        refused.len() == 2 && refused.iter().all(|e| e["note"] == json!(exhausted)),
        "{refused:?}"
    );

    // The runtime goes away: not ready again, naming it.
    runtime.shutdown().await;
    drop(runtime);
    answers(&readyz, 503, "not ready: NRI plugin connected\n").await?;
    let (_, body) = http_get(&metrics).await?;
    expect(&body, "knic_driver_nri_connected", 0.0)?;
    // Unknown paths and methods.
    let (status, body) = http_get(&format!("{base}/nope")).await?;
    ensure!(
        status == 404 && body == "not found: /nope (try /metrics, /healthz, /readyz)\n",
        "{status} {body:?}"
    );
    drop(driver);
    Ok(())
}

/// Events the apiserver refuses are refused by the fake with the apiserver's text.
async fn fake_api_validates_events() -> anyhow::Result<()> {
    let cluster = Cluster::fake("events").await?;
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        cluster.client.clone(),
        &cluster.namespace,
        &kube::api::ApiResource {
            group: "events.k8s.io".into(),
            version: "v1".into(),
            api_version: "events.k8s.io/v1".into(),
            kind: "Event".into(),
            plural: "events".into(),
        },
    );
    let create = |body: Value| {
        let api = api.clone();
        async move {
            let obj: kube::api::DynamicObject = serde_json::from_value(body)?;
            match api.create(&Default::default(), &obj).await {
                Ok(_) => Ok::<_, anyhow::Error>(None),
                Err(kube::Error::Api(e)) => Ok(Some((e.code, e.message))),
                Err(e) => Err(e.into()),
            }
        }
    };
    let ns = cluster.namespace.clone();
    let regarding = json!({"kind": "Pod", "namespace": ns, "name": "p", "uid": "u"});
    let refused = create(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e1", "namespace": ns},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": regarding,
        "reportingController": "knic driver",
        "reportingInstance": "i".repeat(129),
        "action": "",
        "reason": "r".repeat(129),
        "note": "n".repeat(1025),
        "type": "Bad",
        "series": {"count": 1, "lastObservedTime": "2026-01-01T00:00:00.000000Z"},
    }))
    .await?;
    let wanted = "Event.events.k8s.io \"e1\" is invalid: [reportingController: Invalid value: \
         \"knic driver\": name part must consist of alphanumeric characters, '-', '_' or '.', \
         and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  \
         or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]'), \
         reportingInstance: Invalid value: \"\": can have at most 128 characters, action: \
         Required value, reason: Invalid value: \"\": can have at most 128 characters, message: \
         Invalid value: \"\": can have at most 1024 characters, series.count: Invalid value: \
         \"\": should be at least 2, type: Invalid value: \"\": has invalid value: Bad]";
    ensure!(
        refused == Some((422, wanted.to_owned())),
        "{refused:?}\nwanted {wanted}"
    );
    let refused = create(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e2", "namespace": ns},
        "regarding": regarding, "reason": "R", "action": "A", "type": "Normal",
        "reportingController": "knic.dev/driver", "reportingInstance": "i",
    }))
    .await?;
    ensure!(
        refused
            == Some((
                422,
                "Event.events.k8s.io \"e2\" is invalid: eventTime: Required value".to_owned()
            )),
        "{refused:?}"
    );
    let accepted = create(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e3", "namespace": ns},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": regarding, "reason": "R", "action": "A", "type": "Warning",
        "reportingController": "knic.dev/driver", "reportingInstance": "i", "note": "n",
    }))
    .await?;
    ensure!(accepted.is_none(), "{accepted:?}");
    // core/v1 Events get the legacy rules only: the involved object's namespace must match.
    let core: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(cluster.client.clone(), &ns);
    let legacy: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "e4", "namespace": ns},
        "involvedObject": {"kind": "Pod", "namespace": "elsewhere", "name": "p"},
        "reason": "R", "message": "m", "type": "Warning",
    }))?;
    match core.create(&Default::default(), &legacy).await {
        Err(kube::Error::Api(e)) => ensure!(
            e.code == 422
                && e.message
                    == "Event \"e4\" is invalid: involvedObject.namespace: Invalid value: \
                        \"elsewhere\": does not match event.namespace",
            "{e:?}"
        ),
        other => anyhow::bail!("a core Event in another namespace was {other:?}"),
    }
    let mut legacy = legacy;
    legacy.involved_object.namespace = Some(ns.clone());
    core.create(&Default::default(), &legacy).await?;
    Ok(())
}

/// A `knic-controller` replica with its HTTP server on a free loopback port; killed when
/// dropped.
struct Replica {
    _child: tokio::process::Child,
    log: PathBuf,
    /// Base URL of its `/metrics`, `/healthz` and `/readyz`.
    http: String,
}

impl Replica {
    fn start(bin: &Path, cluster: &Cluster, identity: &str) -> anyhow::Result<Replica> {
        let log = cluster.tmp.path().join(format!("{identity}.log"));
        let file = std::fs::File::create(&log)?;
        let address = free_loopback_address()?;
        let child = tokio::process::Command::new(bin)
            .env_clear()
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("POD_NAME", identity)
            .env("KNIC_LEADER_NAMESPACE", &cluster.namespace)
            .env("KNIC_HTTP_ADDRESS", &address)
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .context("spawning knic-controller")?;
        Ok(Replica {
            _child: child,
            log,
            http: format!("http://{address}"),
        })
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Two replicas of the real binary: both ready (one leads, one is a healthy standby), and
/// `/metrics` says which leads.
async fn leader_and_standby_are_ready(bin: PathBuf) -> anyhow::Result<()> {
    let cluster = Cluster::fake("leader-ready").await?;
    let a = Replica::start(&bin, &cluster, "replica-a")?;
    let scrape = |r: &Replica| {
        let url = format!("{}/metrics", r.http);
        async move { http_get(&url).await }
    };
    eventually(
        "replica-a ready and leading",
        Duration::from_secs(10),
        || async {
            let ready = http_get(&format!("{}/readyz", a.http)).await?;
            let (_, metrics) = scrape(&a).await?;
            Ok((ready == (200, "ok\n".to_owned())
                && metrics.contains("\nknic_controller_leader 1\n"))
            .then_some(()))
        },
    )
    .await
    .with_context(|| a.logs())?;
    let b = Replica::start(&bin, &cluster, "replica-b")?;
    eventually(
        "replica-b ready as a standby",
        Duration::from_secs(10),
        || async {
            let ready = http_get(&format!("{}/readyz", b.http)).await?;
            let (_, metrics) = scrape(&b).await?;
            Ok((ready == (200, "ok\n".to_owned())
                && metrics.contains("\nknic_controller_leader 0\n"))
            .then_some(()))
        },
    )
    .await
    .with_context(|| b.logs())?;
    let live = http_get(&format!("{}/healthz", b.http)).await?;
    ensure!(live == (200, "ok\n".to_owned()), "{live:?}");
    // The leader reconciles a Network: counted, by condition, with its addresses.
    let network: knic_controller::network::Network = serde_json::from_value(serde_json::json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": "metrics-net"},
        "spec": {
            "devices": {"deviceClassName": "vf.knic.dev"},
            "ipam": {"subnets": [{"cidr": "10.77.0.0/24", "gateway": "10.77.0.1"}]},
            "namespaces": {"names": ["default"]},
        },
    }))?;
    kube::Api::<knic_controller::network::Network>::all(cluster.client.clone())
        .create(&Default::default(), &network)
        .await?;
    let metrics = eventually(
        "the Network in the leader's metrics",
        Duration::from_secs(10),
        || async {
            let (_, metrics) = scrape(&a).await?;
            Ok(metrics
                .contains("knic_controller_network_free_addresses{network=\"metrics-net\"} 253\n")
                .then_some(metrics))
        },
    )
    .await
    .with_context(|| a.logs())?;
    for line in [
        "knic_controller_network_allocatable_addresses{network=\"metrics-net\"} 253\n",
        "knic_controller_networks{condition=\"Ready\",status=\"True\"} 1\n",
    ] {
        ensure!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    ensure!(
        !metrics.contains("knic_controller_reconciles_total{result=\"success\"} 0\n"),
        "{metrics}"
    );
    for family in [
        "# TYPE knic_controller_reconciles_total counter",
        "# TYPE knic_controller_reconcile_duration_seconds histogram",
        "# TYPE knic_controller_networks gauge",
        "# TYPE knic_controller_network_free_addresses gauge",
        "# TYPE knic_controller_network_allocatable_addresses gauge",
    ] {
        ensure!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let mut trials: Vec<Trial> = vec![
        knic_e2e::harness::trial("metrics_health_and_events".into(), false, || {
            metrics_health_and_events()
        }),
        knic_e2e::harness::trial("fake_api_validates_events".into(), false, || {
            fake_api_validates_events()
        }),
    ];
    let binary = knic_e2e::harness::controller_binary();
    if let Err(reason) = &binary {
        eprintln!("skipped: controller_leader_and_standby_are_ready: {reason}");
    }
    trials.push(knic_e2e::harness::trial(
        "controller_leader_and_standby_are_ready".into(),
        binary.is_err(),
        move || leader_and_standby_are_ready(binary.unwrap_or_default()),
    ));
    libtest_mimic::run(&args, trials).exit();
}
