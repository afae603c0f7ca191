//! API faults: the fake API answers the requests of prepare, claim status, slice publishing,
//! IPAM and the controller with a 409, a 429 with `Retry-After`, a 500, or no answer at all,
//! for the first few attempts; each operation must still complete, with nothing lost (the claim
//! prepared with its address, the status written, every device published, the template
//! present, no NetworkAddress left behind), and a 429's `Retry-After` must be honoured (the
//! fake's request log shows when each attempt arrived). The binaries' request timeout is one
//! second here (`KNIC_API_TIMEOUT_SECONDS`), so a hung request costs a second. Fake API only:
//! a real apiserver cannot be made to fail on demand.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use knic_e2e::cluster::{Cluster, TestClaim};
use knic_e2e::driver::{DriverConfig, DriverProcess, vf_device};
use knic_e2e::fakeapi::{FakeApi, Recorded, RequestFault, path_matches};
use knic_e2e::harness::{eventually, trial};
use knic_e2e::kubelet::{self, ClaimId, DraVersion, Plugin, Prepared};
use knic_proto::backoff::RetryPolicy;
use knic_proto::network::{NETWORK_LABEL, Network, NetworkAddress};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

/// The request timeout the binaries and in-process clients get.
const TIMEOUT: Duration = Duration::from_secs(1);
/// What the throttled requests are told to wait.
const RETRY_AFTER: u64 = 1;
/// Every fault, each armed for the first [`FAULTY`] matching requests.
const FAULTS: [RequestFault; 4] = [
    RequestFault::Conflict,
    RequestFault::TooManyRequests {
        retry_after_secs: RETRY_AFTER,
    },
    RequestFault::Internal,
    RequestFault::Hang,
];
/// Attempts failed per operation: fewer than the client's attempts, so the operation must
/// complete within one call of it where the policy repeats.
const FAULTY: usize = 2;
/// How long an operation may take to complete after its faults.
const WAIT: Duration = Duration::from_secs(20);

fn fake(cluster: &Cluster) -> anyhow::Result<&FakeApi> {
    cluster.fake.as_ref().context("fake API")
}

/// An in-process client as the binaries build theirs, with the test's short timeout.
fn client(fake: &FakeApi) -> anyhow::Result<kube::Client> {
    let config = kube::Config::new(fake.url().parse()?);
    Ok(knic_controller::client::connect(
        config,
        RetryPolicy::with_timeout(TIMEOUT),
    )?)
}

/// Requests `method` whose path contains `path` as whole segments, in arrival order, from the `since`th request
/// the fake served on.
fn requests(fake: &FakeApi, since: usize, method: &str, path: &str) -> Vec<Recorded> {
    fake.requests()
        .into_iter()
        .skip(since)
        .filter(|r| r.method == method && path_matches(&r.path, path))
        .collect()
}

/// Every faulted request was followed by another attempt, and a throttled one not before its
/// `Retry-After`.
fn check_retries(
    fake: &FakeApi,
    since: usize,
    method: &str,
    path: &str,
    fault: RequestFault,
) -> anyhow::Result<()> {
    let seen = requests(fake, since, method, path);
    let faulted: Vec<usize> = (0..seen.len())
        .filter(|i| seen[*i].fault.is_some())
        .collect();
    ensure!(
        faulted.len() == FAULTY,
        "{fault:?}: {} of {method} {path} faulted, want {FAULTY}: {seen:?}",
        faulted.len()
    );
    for i in faulted {
        let next = seen
            .get(i + 1)
            .with_context(|| format!("{fault:?}: no attempt after faulted {method} {path}"))?;
        if let RequestFault::TooManyRequests { retry_after_secs } = fault {
            let waited = next.at.duration_since(seen[i].at);
            ensure!(
                waited >= Duration::from_secs(retry_after_secs),
                "{method} {path}: retried after {waited:?}, Retry-After said {retry_after_secs} s"
            );
        }
    }
    Ok(())
}

/// One driver process against a fake API, with the short request timeout.
struct Node {
    cluster: Cluster,
    config: DriverConfig,
    driver: DriverProcess,
    plugin: Arc<Plugin>,
}

impl Node {
    async fn start(
        test: &str,
        arm: impl FnOnce(&FakeApi) -> anyhow::Result<()>,
    ) -> anyhow::Result<Node> {
        let cluster = Cluster::fake(test).await?;
        cluster.ensure_node().await?;
        arm(fake(&cluster)?)?;
        let dir = cluster.tmp.path().join("node");
        std::fs::create_dir_all(&dir)?;
        let config = DriverConfig::under(&dir, &cluster.node, &cluster.kubeconfig)
            .with_env("KNIC_API_TIMEOUT_SECONDS", TIMEOUT.as_secs().to_string());
        let driver = DriverProcess::start(&config)?;
        let plugin = match kubelet::register(&config.registry_dir).await {
            Ok(p) => Arc::new(p),
            Err(e) => anyhow::bail!("{e:#}\ndriver log:\n{}", driver.logs()),
        };
        Ok(Node {
            cluster,
            config,
            driver,
            plugin,
        })
    }

    fn id(&self, claim: &TestClaim) -> ClaimId {
        ClaimId {
            namespace: self.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        }
    }

    async fn prepare(&self, claim: &TestClaim) -> anyhow::Result<Prepared> {
        let ids = [self.id(claim)];
        let call = self.plugin.prepare(DraVersion::V1, &ids);
        let mut out = tokio::time::timeout(WAIT, call)
            .await
            .context("prepare did not answer")??;
        out.remove(&claim.uid).context("no entry for the claim")
    }

    async fn unprepare(&self, claim: &TestClaim) -> anyhow::Result<String> {
        let ids = [self.id(claim)];
        let call = self.plugin.unprepare(DraVersion::V1, &ids);
        let mut out = tokio::time::timeout(WAIT, call)
            .await
            .context("unprepare did not answer")??;
        out.remove(&claim.uid).context("no entry for the claim")
    }

    fn with_log<T>(&self, outcome: anyhow::Result<T>) -> anyhow::Result<T> {
        outcome.map_err(|e| {
            anyhow::anyhow!(
                "{e:#}\ndriver ({}) log:\n{}",
                self.config.node_name,
                self.driver.logs()
            )
        })
    }
}

/// Prepare's claim read fails, then works: the claim is prepared in the same call.
async fn prepare_survives_claim_read_faults() -> anyhow::Result<()> {
    let node = Node::start("af-prepare", |_| Ok(())).await?;
    let outcome = async {
        let fake = fake(&node.cluster)?;
        for (i, fault) in FAULTS.into_iter().enumerate() {
            let name = format!("read-{i}");
            let claim = node
                .cluster
                .create_claim(&name, Some(&[("knic.dev", vf_device(i).as_str())]))
                .await?;
            let path = format!("/resourceclaims/{name}");
            let since = fake.requests().len();
            fake.fault_requests(&format!("GET {path}"), fault, FAULTY)?;
            let got = node.prepare(&claim).await?;
            ensure!(
                got.error.is_empty() && got.devices.len() == 1,
                "{fault:?}: prepare answered {got:?}"
            );
            check_retries(fake, since, "GET", &path, fault)?;
        }
        Ok(())
    }
    .await;
    node.with_log(outcome)
}

/// The slice publisher's creates fail, then work: every device is published.
async fn slices_survive_publish_faults() -> anyhow::Result<()> {
    // What a healthy start publishes.
    let baseline = Node::start("af-slices", |_| Ok(())).await?;
    let want = eventually("the baseline publishes", WAIT, || async {
        Ok(devices(&baseline.cluster).await?.filter(|d| !d.is_empty()))
    })
    .await?;
    drop(baseline);
    for fault in FAULTS {
        let node = Node::start("af-slices", |fake| {
            fake.fault_requests("POST /resourceslices", fault, FAULTY)
        })
        .await?;
        let outcome = async {
            eventually(
                &format!("{fault:?}: every device published"),
                WAIT,
                || async { Ok(devices(&node.cluster).await?.filter(|have| *have == want)) },
            )
            .await?;
            check_retries(fake(&node.cluster)?, 0, "POST", "/resourceslices", fault)
        }
        .await;
        node.with_log(outcome)?;
    }
    Ok(())
}

/// Device names across the node's published slices, sorted; `None` while any slice is missing.
async fn devices(cluster: &Cluster) -> anyhow::Result<Option<Vec<String>>> {
    let slices = cluster.slices().await?;
    let Some(count) = slices.first().map(|s| s.spec.pool.resource_slice_count) else {
        return Ok(None);
    };
    if slices.len() as i64 != count {
        return Ok(None);
    }
    let mut names: Vec<String> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
        .collect();
    names.sort();
    Ok(Some(names))
}

/// IPAM's create of the allocation object fails, then works: the claim gets one address; the
/// release's delete fails, then works: no NetworkAddress is left.
async fn ipam_survives_create_and_release_faults() -> anyhow::Result<()> {
    let node = Node::start("af-ipam", |_| Ok(())).await?;
    let outcome = async {
        let fake = fake(&node.cluster)?;
        let network = format!(
            "af-{}",
            node.cluster.namespace.rsplit('-').next().unwrap_or("x")
        );
        let spec = serde_json::from_value(json!({
            "devices": {"deviceClassName": "knic.dev"},
            "ipam": {"subnets": [{"cidr": "192.0.2.0/24"}]},
            "namespaces": {"names": [node.cluster.namespace]},
        }))?;
        Api::<Network>::all(node.cluster.client.clone())
            .create(&PostParams::default(), &Network::new(&network, spec))
            .await?;
        let addresses: Api<NetworkAddress> = Api::all(node.cluster.client.clone());
        let selector = ListParams::default().labels(&format!("{NETWORK_LABEL}={network}"));
        let config = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                            "ipam": {"network": network}});
        for (i, fault) in FAULTS.into_iter().enumerate() {
            let name = format!("ipam-{i}");
            let claim = node
                .cluster
                .create_claim_with_config(
                    &name,
                    Some(&[("knic.dev", vf_device(i).as_str())]),
                    Some(config.clone()),
                )
                .await?;
            let since = fake.requests().len();
            fake.fault_requests("POST /networkaddresses", fault, FAULTY)?;
            let got = node.prepare(&claim).await?;
            ensure!(got.error.is_empty(), "{fault:?}: prepare: {}", got.error);
            check_retries(fake, since, "POST", "/networkaddresses", fault)?;
            let ours: Vec<NetworkAddress> = addresses
                .list(&selector)
                .await?
                .items
                .into_iter()
                .filter(|a| a.spec.claim.uid == claim.uid)
                .collect();
            ensure!(
                ours.len() == 1,
                "{fault:?}: allocations of the claim: {ours:?}"
            );
            let object = ours[0]
                .metadata
                .name
                .clone()
                .context("unnamed allocation")?;

            fake.fault_requests(&format!("DELETE /networkaddresses/{object}"), fault, FAULTY)?;
            let out = node.unprepare(&claim).await?;
            ensure!(out.is_empty(), "{fault:?}: unprepare: {out}");
            ensure!(
                addresses.get_opt(&object).await?.is_none(),
                "{fault:?}: the released NetworkAddress {object} is still there"
            );
            check_retries(
                fake,
                0,
                "DELETE",
                &format!("/networkaddresses/{object}"),
                fault,
            )?;
        }
        Ok(())
    }
    .await;
    node.with_log(outcome)
}

/// The claim status write (server-side apply of `status.devices`) fails, then works, within
/// one write.
async fn claim_status_write_survives() -> anyhow::Result<()> {
    let cluster = Cluster::fake("af-status").await?;
    let fake = fake(&cluster)?;
    let status = knic_driver::api::KubeStatus::new(client(fake)?);
    for (i, fault) in FAULTS.into_iter().enumerate() {
        let name = format!("status-{i}");
        let claim = cluster
            .create_claim(&name, Some(&[("knic.dev", vf_device(i).as_str())]))
            .await?;
        let prepared: knic_driver::claims::checkpoint::PreparedClaim =
            serde_json::from_value(json!({
                "namespace": cluster.namespace, "name": name, "uid": claim.uid,
                "podUid": claim.pod_uid, "podName": format!("{name}-pod"),
                "devices": [], "configs": [], "preparedAt": 0,
            }))?;
        let entry = knic_driver::pods::DeviceStatus {
            updated: None,
            pool: cluster.node.clone(),
            device: vf_device(i),
            ready: true,
            reason: "InterfaceConfigured".into(),
            message: "net1 configured".into(),
            interface_name: Some("net1".into()),
            ips: vec!["192.0.2.10/24".into()],
            hardware_address: None,
            data: None,
        };
        let path = format!("/resourceclaims/{name}/status");
        let since = fake.requests().len();
        fake.fault_requests(&format!("PATCH {path}"), fault, FAULTY)?;
        use knic_driver::pods::StatusSink as _;
        tokio::time::timeout(WAIT, status.write(&prepared, std::slice::from_ref(&entry)))
            .await
            .with_context(|| format!("{fault:?}: the status write did not end"))?
            .with_context(|| format!("{fault:?}: the status write failed"))?;
        let stored = Api::<ResourceClaim>::namespaced(cluster.client.clone(), &cluster.namespace)
            .get(&name)
            .await?;
        let devices = stored.status.and_then(|s| s.devices).unwrap_or_default();
        ensure!(
            devices.len() == 1 && devices[0].device == entry.device,
            "{fault:?}: status.devices {devices:?}"
        );
        check_retries(fake, since, "PATCH", &path, fault)?;
    }
    Ok(())
}

/// The controller's template apply and status write fail, then work: every Network gets its
/// template and a Ready status.
async fn controller_survives_template_and_status_faults() -> anyhow::Result<()> {
    let cluster = Cluster::fake("af-controller").await?;
    let fake = fake(&cluster)?;
    let suffix = cluster
        .namespace
        .rsplit('-')
        .next()
        .unwrap_or("x")
        .to_owned();
    let names: BTreeMap<String, RequestFault> = FAULTS
        .into_iter()
        .enumerate()
        .map(|(i, f)| (format!("af-{suffix}-{i}"), f))
        .collect();
    for (name, fault) in &names {
        fake.fault_requests(
            &format!("PATCH /resourceclaimtemplates/{name}"),
            *fault,
            FAULTY,
        )?;
        fake.fault_requests(&format!("PATCH /networks/{name}/status"), *fault, FAULTY)?;
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = knic_controller::reconcile::Config {
        instance: Some("knic-e2e-api-faults".into()),
        retry: Duration::from_secs(1),
        ..knic_controller::reconcile::Config::default()
    };
    let controller = tokio::spawn(knic_controller::reconcile::run(
        client(fake)?,
        config,
        async {
            let _ = stopped.await;
        },
    ));
    let outcome = async {
        let networks: Api<Network> = Api::all(cluster.client.clone());
        for (i, name) in names.keys().enumerate() {
            let spec = serde_json::from_value(json!({
                "devices": {"deviceClassName": "knic.dev"},
                "ipam": {"subnets": [{"cidr": format!("10.77.{i}.0/24")}]},
                "namespaces": {"names": [cluster.namespace]},
            }))?;
            networks
                .create(&PostParams::default(), &Network::new(name, spec))
                .await?;
        }
        let templates: Api<ResourceClaimTemplate> =
            Api::namespaced(cluster.client.clone(), &cluster.namespace);
        for (name, fault) in &names {
            eventually(
                &format!("{fault:?}: Network {name} has its template and is Ready"),
                WAIT,
                || async {
                    let template = templates.get_opt(name).await?;
                    let ready = networks.get(name).await?.status.is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    });
                    Ok((template.is_some() && ready).then_some(()))
                },
            )
            .await?;
            check_retries(
                fake,
                0,
                "PATCH",
                &format!("/resourceclaimtemplates/{name}"),
                *fault,
            )?;
            check_retries(
                fake,
                0,
                "PATCH",
                &format!("/networks/{name}/status"),
                *fault,
            )?;
        }
        Ok(())
    }
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), controller).await;
    outcome
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = vec![
        trial(
            "fake/prepare_survives_claim_read_faults".into(),
            false,
            prepare_survives_claim_read_faults,
        ),
        trial(
            "fake/slices_survive_publish_faults".into(),
            false,
            slices_survive_publish_faults,
        ),
        trial(
            "fake/ipam_survives_create_and_release_faults".into(),
            false,
            ipam_survives_create_and_release_faults,
        ),
        trial(
            "fake/claim_status_write_survives".into(),
            false,
            claim_status_write_survives,
        ),
        trial(
            "fake/controller_survives_template_and_status_faults".into(),
            false,
            controller_survives_template_and_status_faults,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
