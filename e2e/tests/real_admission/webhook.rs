//! The validating webhook for real: the `knic-controller` binary serves it on this host with
//! the certificate the chart itself makes (Helm's genCA/genSignedCert for
//! `knic-webhook.<namespace>.svc`), behind the chart's Service (its selector dropped: an
//! EndpointSlice of the test's points at this host) routed by the harness's `route-service`,
//! and the chart's ValidatingWebhookConfiguration, which the real apiserver calls.
//!
//! The configuration is the chart's with one addition: an objectSelector on a label only this
//! twin's objects carry, so while it exists (failurePolicy Fail, as shipped) it can refuse
//! nothing of anyone else's; it is removed at the end, and by a drop guard on failure.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime};
use k8s_openapi::jiff::Timestamp;
use knic_controller::webhook::Snapshot;
use knic_controller::webhook::review::answer;
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::harness::{controller_binary, eventually};
use knic_e2e::nodeauth::{Leftovers, refusal, render, routed};
use knic_proto::network::Network;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

/// The label that selects this twin's objects for its webhook configuration.
const LABEL: &str = "knic.dev/e2e-webhook";

/// The harness's `route-service`: in `KNIC_E2E_HARNESS` (the kit's directory), else next to
/// the checkout as `../shared/harness`.
fn route_service() -> PathBuf {
    std::env::var_os("KNIC_E2E_HARNESS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/harness"))
        .join("route-service")
}

/// The controller as a replica runs it; killed when dropped.
struct Controller {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Controller {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub(crate) async fn refuses_invalid_configs(real: RealCluster) -> anyhow::Result<()> {
    let cluster = Cluster::real(&real, "adm-webhook").await?;
    let mut leftovers = Leftovers::new(&real.kubeconfig);
    // Also on a panic, when the cleanup below never runs.
    leftovers.track::<Namespace>(&cluster.namespace);
    let mut controller = None;
    let mut vip = None;
    let outcome = scenario(&cluster, &mut leftovers, &mut controller, &mut vip).await;
    let log = controller
        .as_ref()
        .map(Controller::logs)
        .unwrap_or_default();
    drop(controller);
    let cleaned = cluster.cleanup().await;
    let removed = leftovers.remove().await;
    if let Err(e) = outcome {
        bail!("{e:#}\n--- controller log ---\n{log}");
    }
    removed?;
    if let Some(vip) = vip {
        ensure!(!routed(&vip)?, "the route to {vip} outlived the twin");
    }
    cleaned
}

/// The chart's webhook objects rendered into the twin's namespace.
struct Chart {
    cert: Vec<u8>,
    key: Vec<u8>,
    service: Service,
    configuration: ValidatingWebhookConfiguration,
}

async fn chart(cluster: &Cluster) -> anyhow::Result<Chart> {
    let rendered = render(&cluster.client, &cluster.namespace).await?;
    let secret = rendered
        .all::<Secret>()
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some("knic-webhook-tls"))
        .context("the chart renders no Secret knic-webhook-tls")?;
    let data = secret.data.clone().unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .map(|b| b.0.clone())
            .with_context(|| format!("Secret knic-webhook-tls has no {key}"))
    };
    let service = rendered
        .all::<Service>()
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some("knic-webhook"))
        .context("the chart renders no Service knic-webhook")?
        .clone();
    let configuration = rendered
        .all::<ValidatingWebhookConfiguration>()
        .into_iter()
        .next()
        .context("the chart renders no ValidatingWebhookConfiguration")?
        .clone();
    Ok(Chart {
        cert: field("tls.crt")?,
        key: field("tls.key")?,
        service,
        configuration,
    })
}

async fn node_ip(cluster: &Cluster) -> anyhow::Result<String> {
    let node = Api::<Node>::all(cluster.client.clone())
        .get(&cluster.node)
        .await?;
    node.status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .context("the node has no InternalIP")
}

/// Starts the controller as a standby replica serving the webhook on `port`: a Lease in the
/// twin's namespace held by a replica that never lets go keeps it from reconciling anything
/// of the shared cluster (the webhook serves whether or not a replica leads).
async fn start_controller(
    cluster: &Cluster,
    chart: &Chart,
    port: u16,
) -> anyhow::Result<Controller> {
    let ns = &cluster.namespace;
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "knic-controller", "namespace": ns},
        "spec": {"holderIdentity": "knic-e2e-elsewhere", "leaseDurationSeconds": 3600,
                 "renewTime": MicroTime(Timestamp::now())},
    }))?;
    Api::<Lease>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &lease)
        .await?;
    let dir = cluster.tmp.path();
    std::fs::write(dir.join("tls.crt"), &chart.cert)?;
    std::fs::write(dir.join("tls.key"), &chart.key)?;
    let log = dir.join("controller.log");
    let file = std::fs::File::create(&log)?;
    let child = tokio::process::Command::new(controller_binary().map_err(anyhow::Error::msg)?)
        .env_clear()
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("KNIC_HTTP_ADDRESS", "")
        .env("POD_NAME", "knic-e2e-webhook")
        .env("KNIC_LEADER_NAMESPACE", ns)
        .env("KNIC_WEBHOOK_ADDRESS", format!("0.0.0.0:{port}"))
        .env("KNIC_WEBHOOK_CERT", dir.join("tls.crt"))
        .env("KNIC_WEBHOOK_KEY", dir.join("tls.key"))
        .env("KNIC_LOG_FORMAT", "json")
        .env("KNIC_LOG_LEVEL", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .context("spawning knic-controller")?;
    Ok(Controller { child, log })
}

/// The apiserver's reach to the webhook: the chart's Service without its selector, an
/// EndpointSlice naming this host's `ip:port`, and the harness's DNAT of the Service address.
/// Returns the Service address.
async fn expose(
    cluster: &Cluster,
    chart: &Chart,
    ip: &str,
    port: u16,
    leftovers: &mut Leftovers,
) -> anyhow::Result<String> {
    let ns = &cluster.namespace;
    let mut service = chart.service.clone();
    if let Some(spec) = service.spec.as_mut() {
        spec.selector = None;
    }
    let service = Api::<Service>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &service)
        .await?;
    let vip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the Service got no ClusterIP")?;
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "knic-webhook-host", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": "knic-webhook"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }))?;
    Api::<EndpointSlice>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &slice)
        .await?;
    let script = route_service();
    if script.exists() {
        leftovers.track_route(&vip);
        let out = tokio::process::Command::new(&script)
            .arg(format!("{ns}/knic-webhook"))
            .env("KUBECONFIG", &cluster.kubeconfig)
            .output()
            .await?;
        ensure!(
            out.status.success(),
            "{} {ns}/knic-webhook: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("{}", String::from_utf8_lossy(&out.stderr).trim());
    } else {
        println!(
            "{} not found: the cluster is expected to route Services itself",
            script.display()
        );
    }
    Ok(vip)
}

/// The chart's configuration, renamed for this twin and limited to its labelled objects.
async fn register(
    cluster: &Cluster,
    chart: &Chart,
    leftovers: &mut Leftovers,
) -> anyhow::Result<()> {
    let ns = &cluster.namespace;
    let mut configuration = chart.configuration.clone();
    let name = format!("{ns}-knic-validation");
    configuration.metadata.name = Some(name.clone());
    let hooks = configuration.webhooks.as_mut().context("no webhooks")?;
    ensure!(hooks.len() == 4, "the chart has {} webhooks", hooks.len());
    for hook in hooks.iter_mut() {
        let service = hook
            .client_config
            .service
            .as_ref()
            .context("a webhook without a service")?;
        ensure!(
            service.namespace == *ns
                && service.name == "knic-webhook"
                && service.path.as_deref() == Some("/validate")
                && service.port == Some(443)
                && hook.client_config.ca_bundle.is_some()
                && hook.failure_policy.as_deref() == Some("Fail"),
            "webhook {} as rendered: {:?} (failurePolicy {:?})",
            hook.name,
            service,
            hook.failure_policy
        );
        hook.object_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(LABEL.to_owned(), ns.clone())])),
            ..Default::default()
        });
    }
    leftovers.track::<ValidatingWebhookConfiguration>(&name);
    Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
        .create(&PostParams::default(), &configuration)
        .await?;
    Ok(())
}

fn knic(parameters: Value) -> Value {
    let mut p = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
    if let (Some(p), Some(extra)) = (p.as_object_mut(), parameters.as_object()) {
        p.extend(extra.clone());
    }
    json!({"opaque": {"driver": "knic.dev", "parameters": p}})
}

/// What knic's webhook answers in-process for `object` of `kind` with `snapshot` as its
/// caches: the denial message, `None` when allowed.
fn in_process(
    kind: [&str; 3],
    object: &Value,
    snapshot: &Snapshot,
) -> anyhow::Result<Option<String>> {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "CREATE", "object": object,
            "kind": {"group": kind[0], "version": kind[1], "kind": kind[2]}}});
    let reply = answer(&serde_json::to_vec(&review)?, snapshot);
    let body: Value = serde_json::from_slice(&reply.body)?;
    Ok(match body["response"]["allowed"].as_bool() {
        Some(true) => None,
        _ => Some(
            body["response"]["status"]["message"]
                .as_str()
                .context("a denial without a message")?
                .to_owned(),
        ),
    })
}

/// `attempt` is refused by webhook `hook` with knic's own words for the object: the message
/// knic computes in-process (which must contain `words`, the field and the rule), as the
/// apiserver relays it. Repeated for a while: the webhook's caches fill a moment after it
/// starts, and a verdict that depends on them may be another until then.
async fn refused<F, Fut, T>(
    what: &str,
    hook: &str,
    expected: &str,
    words: &str,
    mut attempt: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    ensure!(
        expected.contains(words),
        "{what}: knic's own verdict {expected:?} lacks {words:?}"
    );
    let want = format!("admission webhook \"{hook}\" denied the request: {expected}");
    eventually(what, Duration::from_secs(30), || {
        let tried = attempt();
        let want = want.clone();
        async move {
            let (code, text) = refusal(what, tried.await)?;
            ensure!(
                code == 422 && text == want,
                "{code} {text:?}, want 422 {want:?}"
            );
            Ok(Some(()))
        }
    })
    .await?;
    println!("refused as it should be: {what}: {want}");
    Ok(())
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

async fn scenario(
    cluster: &Cluster,
    leftovers: &mut Leftovers,
    controller: &mut Option<Controller>,
    vip: &mut Option<String>,
) -> anyhow::Result<()> {
    let ns = cluster.namespace.clone();
    let chart = chart(cluster).await?;
    let ip = node_ip(cluster).await?;
    let port = {
        let probe = std::net::TcpListener::bind("0.0.0.0:0")?;
        probe.local_addr()?.port()
    };
    *controller = Some(start_controller(cluster, &chart, port).await?);
    eventually("the webhook listens", Duration::from_secs(20), || async {
        Ok(tokio::net::TcpStream::connect((ip.as_str(), port))
            .await
            .ok()
            .map(|_| ()))
    })
    .await?;
    *vip = Some(expose(cluster, &chart, &ip, port, leftovers).await?);
    register(cluster, &chart, leftovers).await?;

    let labels = json!({LABEL: ns});
    let classes: Api<DeviceClass> = Api::all(cluster.client.clone());
    let class_name = format!("{ns}.knic.dev");
    let class_value = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": class_name, "labels": labels},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"knic.dev\""}}],
                 "config": [knic(json!({"interface": {"mtu": 1000}}))]}});
    let bad_class_value = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": format!("{ns}-bad.knic.dev"), "labels": labels},
        "spec": {"config": [knic(json!({"interface": {"mtu": 50}}))]}});
    let bad_class: DeviceClass = serde_json::from_value(bad_class_value.clone())?;
    let (dry, post) = (dry_run(), PostParams::default());
    leftovers.track::<DeviceClass>(&class_name);
    leftovers.track::<DeviceClass>(&format!("{ns}-bad.knic.dev"));
    let class: DeviceClass = serde_json::from_value(class_value)?;
    let mut snapshot = Snapshot {
        classes: [(class_name.clone(), Arc::new(class.clone()))].into(),
        networks: Some(Vec::new()),
    };
    let class_kind = ["resource.k8s.io", "v1", "DeviceClass"];
    let expected = in_process(class_kind, &bad_class_value, &snapshot)?
        .context("knic allows the bad class in-process")?;
    // The first refusal also waits for the apiserver to load the configuration.
    refused(
        "a DeviceClass with MTU 50",
        "deviceclasses.validate.knic.dev",
        &expected,
        "interface.mtu: must be between 68 and 65535, got 50",
        || classes.create(&dry, &bad_class),
    )
    .await?;
    classes
        .create(&PostParams::default(), &class)
        .await
        .context("a valid DeviceClass")?;

    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), &ns);
    let claim = |name: &str, config: Value, annotations: Value| -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                         "annotations": annotations},
            "spec": {"devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": class_name}}],
                "config": [{"requests": ["nic"], "opaque": config["opaque"]}]}}})
    };
    let claim_kind = ["resource.k8s.io", "v1", "ResourceClaim"];
    for (name, config, words) in [
        (
            "mtu-50",
            knic(json!({"interface": {"mtu": 50}})),
            "request nic: interface.mtu: must be between 68 and 65535, got 50",
        ),
        // Only the class's MTU 1000 makes this IPv6 address wrong: the webhook read the
        // class from its cache of the cluster.
        (
            "ipv6-on-mtu-1000",
            knic(json!({"addresses": ["2001:db8::10/64"]})),
            "request nic: interface.mtu: 1000 is below 1280, the minimum MTU for IPv6",
        ),
    ] {
        let value = claim(name, config, json!({}));
        let expected = in_process(claim_kind, &value, &snapshot)?
            .with_context(|| format!("knic allows claim {name} in-process"))?;
        let typed: ResourceClaim = serde_json::from_value(value)?;
        refused(
            &format!("claim {name}"),
            "resourceclaims.validate.knic.dev",
            &expected,
            words,
            || claims.create(&post, &typed),
        )
        .await?;
    }
    let good = claim(
        "good",
        knic(json!({"addresses": ["192.0.2.10/24"]})),
        json!({}),
    );
    ensure!(in_process(claim_kind, &good, &snapshot)?.is_none());
    claims
        .create(&PostParams::default(), &serde_json::from_value(good)?)
        .await
        .context("a valid claim")?;
    // A claim made from a template for a pod is not sent (the chart's matchCondition, which
    // the apiserver evaluates): even a bad config goes through, as the template was checked.
    let generated = claim(
        "for-a-pod",
        knic(json!({"interface": {"mtu": 50}})),
        json!({"resource.kubernetes.io/pod-claim-name": "net"}),
    );
    claims
        .create(&PostParams::default(), &serde_json::from_value(generated)?)
        .await
        .context("a claim generated for a pod is not the webhook's")?;

    let templates: Api<ResourceClaimTemplate> = Api::namespaced(cluster.client.clone(), &ns);
    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "vlan-0", "namespace": ns, "labels": labels},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "nic", "exactly": {"deviceClassName": class_name}}],
            "config": [{"requests": ["nic"],
                        "opaque": knic(json!({"vlan": {"id": 0}}))["opaque"]}]}}}});
    let expected = in_process(
        ["resource.k8s.io", "v1", "ResourceClaimTemplate"],
        &template,
        &snapshot,
    )?
    .context("knic allows the template in-process")?;
    let typed: ResourceClaimTemplate = serde_json::from_value(template)?;
    refused(
        "a template with VLAN 0",
        "resourceclaimtemplates.validate.knic.dev",
        &expected,
        "vlan.id: must be between 1 and 4094, got 0",
        || templates.create(&post, &typed),
    )
    .await?;

    let networks: Api<Network> = Api::all(cluster.client.clone());
    snapshot.networks = Some(
        networks
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(Arc::new)
            .collect(),
    );
    let network = |name: &str, vlan: u32| -> Value {
        json!({"apiVersion": "knic.dev/v1alpha1", "kind": "Network",
            "metadata": {"name": name, "labels": labels},
            "spec": {"devices": {"deviceClassName": class_name}, "vlan": vlan,
                     "ipam": {"subnets": [{"cidr": "198.18.77.0/24"}]},
                     "namespaces": {"names": [ns]}}})
    };
    let network_kind = ["knic.dev", "v1alpha1", "Network"];
    for name in ["bad", "good"] {
        leftovers.track::<Network>(&format!("{ns}-{name}"));
    }
    let bad = network(&format!("{ns}-bad"), 5000);
    let expected =
        in_process(network_kind, &bad, &snapshot)?.context("knic allows VLAN 5000 in-process")?;
    let typed: Network = serde_json::from_value(bad)?;
    refused(
        "a Network with VLAN 5000",
        "networks.validate.knic.dev",
        &expected,
        "5000",
        || networks.create(&post, &typed),
    )
    .await?;
    let good = network(&format!("{ns}-good"), 3999);
    ensure!(
        in_process(network_kind, &good, &snapshot)?.is_none(),
        "knic refuses the valid Network in-process"
    );
    networks
        .create(&PostParams::default(), &serde_json::from_value(good)?)
        .await
        .context("a valid Network")?;
    // Live update (issue 26 part 4): a VLAN change running pods cannot follow is refused on
    // UPDATE through the real apiserver, in validate_update's words; an MTU change passes.
    let good_name = format!("{ns}-good");
    let vlan_patch = kube::api::Patch::Merge(json!({"spec": {"vlan": 3998}}));
    let patch_params = kube::api::PatchParams::default();
    refused(
        "a Network's VLAN changed under running pods",
        "networks.validate.knic.dev",
        "spec.vlan: cannot change from 3999 to 3998: running pods stay on VLAN 3999 and cannot \
         be moved live; create another Network and move the workloads",
        "spec.vlan: cannot change from 3999 to 3998",
        || networks.patch(&good_name, &patch_params, &vlan_patch),
    )
    .await?;
    networks
        .patch(
            &good_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"mtu": 1400}})),
        )
        .await
        .context("an MTU change is live, so allowed")?;
    networks
        .delete(&format!("{ns}-good"), &DeleteParams::default())
        .await?;

    let log = controller
        .as_ref()
        .map(Controller::logs)
        .unwrap_or_default();
    ensure!(
        controller
            .as_mut()
            .is_some_and(|c| matches!(c.child.try_wait(), Ok(None))),
        "the controller exited: {log}"
    );
    ensure!(
        !log.contains("leader lease acquired"),
        "the twin's controller led (it must stay standby):\n{log}"
    );
    Ok(())
}
