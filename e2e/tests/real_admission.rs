//! Real twins of knic's admission control: the chart's ValidatingAdmissionPolicies and RBAC
//! applied to a real apiserver and met with the driver's own credentials (its ServiceAccount's
//! token bound to the test node, so the apiserver gives its user the
//! `authentication.kubernetes.io/node-name` extra), and the controller's validating webhook
//! called by the real apiserver through a Service. The chart tests (tests/chart/policies.rs,
//! tests/webhook_parity.rs) evaluate the same expressions with knic's own CEL evaluator; these
//! show the apiserver agrees. Run only against a real cluster (`KNIC_E2E_KUBECONFIG`).

use std::pin::Pin;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use knic_driver::api::events::{event, reporting_instance};
use knic_driver::api::{KubeStatus, status_patch};
use knic_driver::claims::ClaimRef;
use knic_driver::claims::checkpoint::PreparedClaim;
use knic_driver::events::Warning;
use knic_driver::pods::{DeviceStatus, StatusSink};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::harness::trial;
use knic_e2e::nodeauth::{
    DRIVER_SA, Installed, Leftovers, NO_NODE, OTHER_NODE, assert_denied, client_from,
    driver_identity, driver_token, policy_denial, refusal, token_kubeconfig, until_refused, whoami,
};
use knic_proto::network::NetworkAddress;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

// The webhook, served by the real controller binary and called by the apiserver.
#[path = "real_admission/webhook.rs"]
mod webhook;

/// One twin's cluster side: its namespace, the chart's policies, the driver's client.
struct Twin {
    cluster: Cluster,
    leftovers: Leftovers,
    installed: Installed,
    /// Acts as the driver: the ServiceAccount's token, bound to the test node.
    driver: kube::Client,
}

impl Twin {
    fn node(&self) -> &str {
        &self.cluster.node
    }

    fn ns(&self) -> &str {
        &self.cluster.namespace
    }

    /// A client with a token of the driver's ServiceAccount bound to nothing (no node).
    async fn unbound(&self) -> anyhow::Result<kube::Client> {
        let token = driver_token(&self.cluster, None).await?;
        let path = self.cluster.tmp.path().join("unbound.kubeconfig");
        token_kubeconfig(&self.cluster.kubeconfig, &token, &path)?;
        let client = client_from(&path).await?;
        let (_, nodes) = whoami(&client).await?;
        ensure!(nodes.is_empty(), "an unbound token carries node {nodes:?}");
        Ok(client)
    }
}

type Body =
    for<'a> fn(&'a mut Twin) -> Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + 'a>>;

/// Sets a twin up (namespace, chart objects, node-bound token), runs `body`, and removes
/// everything whatever happened.
async fn run(real: RealCluster, test: &str, body: Body) -> anyhow::Result<()> {
    let cluster = Cluster::real(&real, test).await?;
    let mut leftovers = Leftovers::new(&real.kubeconfig);
    // Also on a panic, when the cleanup below never runs.
    leftovers.track::<Namespace>(&cluster.namespace);
    let setup = driver_identity(&cluster, &mut leftovers).await;
    let (outcome, mut leftovers, cluster) = match setup {
        Ok(identity) => {
            let mut twin = Twin {
                cluster,
                leftovers,
                installed: identity.installed,
                driver: identity.client,
            };
            let outcome = body(&mut twin).await;
            (outcome, twin.leftovers, twin.cluster)
        }
        Err(e) => (Err(e), leftovers, cluster),
    };
    let cleaned = cluster.cleanup().await;
    let removed = leftovers.remove().await;
    outcome?;
    removed?;
    cleaned
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

fn slice(name: &str, node: Option<&str>, driver: &str) -> anyhow::Result<ResourceSlice> {
    let mut spec = json!({"driver": driver,
        "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "knt-forged0"}]});
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        None => spec["allNodes"] = json!(true),
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name}, "spec": spec,
    }))?)
}

/// The driver writes, updates and deletes its own node's slices; every write of another
/// node's, a cluster-wide or another driver's slice is refused by the policy, and so is a
/// token bound to no node.
async fn resourceslices_of_its_own_node_only(t: &mut Twin) -> anyhow::Result<()> {
    let policy = t
        .installed
        .policy("knic-resourceslices-own-node")?
        .to_owned();
    let (ns, node) = (t.ns().to_owned(), t.node().to_owned());
    let driver: Api<ResourceSlice> = Api::all(t.driver.clone());
    let admin: Api<ResourceSlice> = Api::all(t.cluster.client.clone());
    let post = PostParams::default();
    let on_other = format!(
        "this user running on node '{node}' may not modify resourceslices on node '{OTHER_NODE}'"
    );
    let forged = slice(&format!("{ns}-forged"), Some(OTHER_NODE), "knic.dev")?;
    let dry = dry_run();
    until_refused("the slice policy acts", &on_other, || {
        driver.create(&dry, &forged)
    })
    .await?;

    let own = format!("{ns}-own");
    t.leftovers.track::<ResourceSlice>(&own);
    driver
        .create(&post, &slice(&own, Some(&node), "knic.dev")?)
        .await
        .context("the driver creating its own node's slice")?;
    // The driver may not read single slices (list and watch only): the admin's copy.
    let mut current = admin.get(&own).await?;
    current.spec.pool.generation = 2;
    driver
        .replace(&own, &post, &current)
        .await
        .context("the driver updating its own node's slice")?;

    t.leftovers
        .track::<ResourceSlice>(&forged.metadata.name.clone().unwrap_or_default());
    assert_denied(
        "a slice for another node",
        driver.create(&post, &forged).await,
        &policy,
        &on_other,
    )?;
    let theirs = format!("{ns}-theirs");
    t.leftovers.track::<ResourceSlice>(&theirs);
    admin
        .create(&post, &slice(&theirs, Some(OTHER_NODE), "knic.dev")?)
        .await?;
    let mut other = admin.get(&theirs).await?;
    other.spec.pool.generation = 2;
    assert_denied(
        "updating another node's slice",
        driver.replace(&theirs, &post, &other).await,
        &policy,
        &on_other,
    )?;
    assert_denied(
        "deleting another node's slice",
        driver.delete(&theirs, &DeleteParams::default()).await,
        &policy,
        &on_other,
    )?;
    // Moving it to the driver's node: the apiserver's own validation comes first.
    let mut moved = admin.get(&theirs).await?;
    moved.spec.node_name = Some(node.clone());
    let (code, text) = refusal(
        "moving another node's slice here",
        driver.replace(&theirs, &post, &moved).await,
    )?;
    println!("refused: moving another node's slice here: {code} {text}");
    let immutable = format!(
        "ResourceSlice.resource.k8s.io \"{theirs}\" is invalid: spec.nodeName: Invalid value: \
         \"{node}\": field is immutable"
    );
    ensure!(
        code == 422 && (text == immutable || text.ends_with(&on_other)),
        "moving another node's slice: {code} {text:?}, want 422 {immutable:?}"
    );
    assert_denied(
        "a slice for all nodes",
        driver
            .create(&post, &slice(&format!("{ns}-all"), None, "knic.dev")?)
            .await,
        &policy,
        &format!("this user running on node '{node}' may not modify cluster resourceslices"),
    )?;
    t.leftovers.track::<ResourceSlice>(&format!("{ns}-all"));
    t.leftovers.track::<ResourceSlice>(&format!("{ns}-gpu"));
    assert_denied(
        "another driver's slice on its own node",
        driver
            .create(
                &post,
                &slice(&format!("{ns}-gpu"), Some(&node), "gpu.example.com")?,
            )
            .await,
        &policy,
        "this user may only modify resourceslices of driver knic.dev, not of driver 'gpu.example.com'",
    )?;
    let unbound: Api<ResourceSlice> = Api::all(t.unbound().await?);
    assert_denied(
        "a token bound to no node",
        unbound
            .create(&dry_run(), &slice(&own, Some(&node), "knic.dev")?)
            .await,
        &policy,
        NO_NODE,
    )?;
    driver
        .delete(&own, &DeleteParams::default())
        .await
        .context("the driver deleting its own node's slice")?;
    Ok(())
}

/// A claim allocated by the "scheduler" (the admin here) to `node` with a knic.dev device and
/// one of another driver, reserved for a pod held back by a scheduling gate.
async fn allocated_claim(t: &Twin, name: &str, node: &str) -> anyhow::Result<PreparedClaim> {
    let ns = t.ns();
    let claims: Api<ResourceClaim> = Api::namespaced(t.cluster.client.clone(), ns);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [
            {"name": "nic", "exactly": {"deviceClassName": "knic.dev"}},
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
        ]}},
    }))?;
    let claim = claims.create(&PostParams::default(), &claim).await?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-pod"), "namespace": ns},
        "spec": {
            "schedulingGates": [{"name": "knic.dev/e2e-hold"}],
            "resourceClaims": [{"name": "net", "resourceClaimName": name}],
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "net"}]}}],
        },
    }))?;
    let pod = Api::<Pod>::namespaced(t.cluster.client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    let status = json!({"status": {
        "allocation": {
            "devices": {"results": [
                {"request": "nic", "driver": "knic.dev", "pool": node, "device": "knt-dev0"},
                {"request": "gpu", "driver": "gpu.example.com", "pool": node, "device": "gpu0"},
            ]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"),
                         "uid": pod.metadata.uid}],
    }});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(PreparedClaim {
        network_label: None,
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: claim.metadata.uid.unwrap_or_default(),
        pod_uid: pod.metadata.uid.unwrap_or_default(),
        pod_name: format!("{name}-pod"),
        devices: vec![],
        configs: vec![],
        prepared_at: 0,
        attachments: vec![],
        allocations: vec![],
        functions: vec![],
    })
}

fn configured(pool: &str) -> DeviceStatus {
    DeviceStatus {
        updated: None,
        pool: pool.to_owned(),
        device: "knt-dev0".into(),
        ready: true,
        reason: "InterfaceConfigured".into(),
        message: "net1 configured".into(),
        interface_name: Some("net1".into()),
        ips: vec!["192.0.2.10/24".into()],
        hardware_address: None,
        data: None,
    }
}

/// Kubernetes 1.36's own refusal (DRAResourceClaimGranularStatusAuthorization, checked while
/// the apiserver validates the update, before any admission policy runs) of a status.devices
/// write on a claim the token's node is not associated with, or for another driver.
/// On a claim of the token's own node either grant would do (`own_node`); on another's only
/// arbitrary-node.
fn driver_grant_refusal(ns: &str, claim: &str, driver: &str, own_node: bool) -> String {
    let (verbs, first) = if own_node {
        (
            "associated-node:patch arbitrary-node:patch",
            "associated-node:patch",
        )
    } else {
        ("arbitrary-node:patch", "arbitrary-node:patch")
    };
    format!(
        "ResourceClaim.resource.k8s.io \"{claim}\" is invalid: status.devices: Forbidden: \
         changing status.devices requires resource=\"resourceclaims/driver\", \
         verb=\"[{verbs}]\" permission: resourceclaims.resource.k8s.io \"{driver}\" \
         is forbidden: User \"system:serviceaccount:{ns}:{DRIVER_SA}\" cannot {first} \
         resource \"resourceclaims/driver\" in API group \"resource.k8s.io\" in the namespace \
         \"{ns}\""
    )
}

/// The same check's refusal of a change of the allocation or the reservation.
fn binding_refusal(ns: &str, claim: &str) -> String {
    format!(
        "ResourceClaim.resource.k8s.io \"{claim}\" is invalid: status.allocation: Forbidden: \
         changing status.allocation or status.reservedFor requires \
         resource=\"resourceclaims/binding\", verb=\"patch\" permission: \
         resourceclaims.resource.k8s.io is forbidden: User \
         \"system:serviceaccount:{ns}:{DRIVER_SA}\" cannot patch resource \
         \"resourceclaims/binding\" in API group \"resource.k8s.io\" at the cluster scope"
    )
}

/// One forbidden status write: what, on which claim, the body and its patch.
struct Forged<'a> {
    what: &'static str,
    claim: &'static str,
    patch: Patch<&'a serde_json::Value>,
    params: PatchParams,
    /// 1.36's own refusal.
    apiserver: String,
    /// The policy's.
    policy: String,
}

/// Refused either by the apiserver's granular status authorization (`apiserver`, from 1.36)
/// or, where that does not exist, by `policy`: tried as a dry run until refused (a policy acts
/// a moment after it is created), then for real.
async fn refused_by_either(
    driver: &Api<ResourceClaim>,
    forged: &Forged<'_>,
    policy: &str,
) -> anyhow::Result<()> {
    let policy_text = policy_denial(policy, &forged.policy);
    let accept = |text: &str| text == forged.apiserver || text.ends_with(&policy_text);
    let dry = PatchParams {
        dry_run: true,
        ..forged.params.clone()
    };
    until_refused(forged.what, "", || {
        driver.patch_status(forged.claim, &dry, &forged.patch)
    })
    .await?;
    let (code, text) = refusal(
        forged.what,
        driver
            .patch_status(forged.claim, &forged.params, &forged.patch)
            .await,
    )?;
    ensure!(
        code == 422 && accept(&text),
        "{}: {code} {text:?}, want 422 {:?} or the policy's {:?}",
        forged.what,
        forged.apiserver,
        forged.policy
    );
    let by = if text.ends_with(&policy_text) {
        "the policy"
    } else {
        "the apiserver's granular status authorization"
    };
    println!("refused as it should be, by {by}: {}: {text}", forged.what);
    Ok(())
}

/// The driver's own status adapter writes a claim allocated to its node; the same write on a
/// claim allocated to another node, a change of the reservation and another driver's entry
/// are refused. On 1.36 the apiserver's own checks of the `resourceclaims/driver` and
/// `resourceclaims/binding` grants refuse them before the policy sees them; with those grants
/// widened to any node, any driver and the binding (the rights a 1.34/1.35 apiserver gives
/// `resourceclaims/status` alone) the policy refuses each with its own words.
async fn claim_status_on_its_own_node_only(t: &mut Twin) -> anyhow::Result<()> {
    let policy = t
        .installed
        .policy("knic-resourceclaim-status-own-node")?
        .to_owned();
    let (ns, node) = (t.ns().to_owned(), t.node().to_owned());
    let mine = allocated_claim(t, "mine", &node).await?;
    let theirs = allocated_claim(t, "theirs", OTHER_NODE).await?;
    let driver: Api<ResourceClaim> = Api::namespaced(t.driver.clone(), &ns);
    let apply = PatchParams::apply(knic_proto::DRIVER_NAME).force();
    let now = "2026-01-01T00:00:00Z";

    KubeStatus::new(t.driver.clone())
        .write(&mine, &[configured(&node)])
        .await
        .context("the driver's status adapter on a claim of its own node")?;
    let written = Api::<ResourceClaim>::namespaced(t.cluster.client.clone(), &ns)
        .get("mine")
        .await?;
    let written = serde_json::to_value(written.status)?;
    ensure!(
        written["devices"][0]["networkData"]["interfaceName"] == "net1",
        "{written}"
    );

    let forged = status_patch(&theirs, &[configured(OTHER_NODE)], now);
    let unreserve = json!({"status": {"reservedFor": null}});
    // The entry of the claim's other device, allocated from driver gpu.example.com.
    let mut gpu = status_patch(&mine, &[configured(&node)], now);
    gpu["status"]["devices"][0]["driver"] = json!("gpu.example.com");
    gpu["status"]["devices"][0]["device"] = json!("gpu0");
    let cases = [
        Forged {
            what: "the status of a claim allocated to another node",
            claim: "theirs",
            patch: Patch::Apply(&forged),
            params: apply.clone(),
            apiserver: driver_grant_refusal(&ns, "theirs", "knic.dev", false),
            policy: format!(
                "this user running on node '{node}' may not write the status of ResourceClaim \
                 {ns}/theirs, allocated to node '{OTHER_NODE}'"
            ),
        },
        Forged {
            what: "dropping the reservation of its own node's claim",
            claim: "mine",
            patch: Patch::Merge(&unreserve),
            params: PatchParams::default(),
            apiserver: binding_refusal(&ns, "mine"),
            policy: "this user may only write status.devices; status.allocation and \
                     status.reservedFor are the scheduler's"
                .into(),
        },
        Forged {
            what: "another driver's status entry",
            claim: "mine",
            patch: Patch::Apply(&gpu),
            params: PatchParams::apply("gpu.example.com").force(),
            apiserver: driver_grant_refusal(&ns, "mine", "gpu.example.com", true),
            policy: "this user may only write status.devices entries of driver knic.dev".into(),
        },
    ];
    for case in &cases {
        refused_by_either(&driver, case, &policy).await?;
    }

    // The grants widened to every node, both drivers and the binding: now only the policy
    // stands between the node and the other node's claim.
    let wide = format!("{ns}-widened");
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": wide},
        "rules": [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
             "resourceNames": ["knic.dev", "gpu.example.com"],
             "verbs": ["arbitrary-node:patch", "associated-node:patch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"],
             "verbs": ["patch"]},
        ],
    }))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": wide},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": wide},
        "subjects": [{"kind": "ServiceAccount", "name": DRIVER_SA, "namespace": ns}],
    }))?;
    t.leftovers.track::<ClusterRole>(&wide);
    t.leftovers.track::<ClusterRoleBinding>(&wide);
    let post = PostParams::default();
    Api::<ClusterRole>::all(t.cluster.client.clone())
        .create(&post, &role)
        .await?;
    Api::<ClusterRoleBinding>::all(t.cluster.client.clone())
        .create(&post, &binding)
        .await?;
    for case in &cases {
        let dry = PatchParams {
            dry_run: true,
            ..case.params.clone()
        };
        until_refused(
            &format!("{}, once the grants are widened", case.what),
            &policy_denial(&policy, &case.policy),
            || driver.patch_status(case.claim, &dry, &case.patch),
        )
        .await?;
        assert_denied(
            &format!("{}, with the grants widened", case.what),
            driver
                .patch_status(case.claim, &case.params, &case.patch)
                .await,
            &policy,
            &case.policy,
        )?;
    }
    Ok(())
}

fn address(name: &str, ns: &str, node: Option<&str>) -> anyhow::Result<NetworkAddress> {
    let mut spec = json!({"network": ns, "address": "192.0.2.10/24",
        "claim": {"namespace": ns, "name": "c", "uid": "u"}});
    if let Some(node) = node {
        spec["node"] = json!(node);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkAddress",
        "metadata": {"name": name}, "spec": spec,
    }))?)
}

/// The driver allocates and releases addresses in its own node's name only.
async fn networkaddresses_of_its_own_node_only(t: &mut Twin) -> anyhow::Result<()> {
    let policy = t
        .installed
        .policy("knic-networkaddresses-own-node")?
        .to_owned();
    let (ns, node) = (t.ns().to_owned(), t.node().to_owned());
    let driver: Api<NetworkAddress> = Api::all(t.driver.clone());
    let admin: Api<NetworkAddress> = Api::all(t.cluster.client.clone());
    let post = PostParams::default();
    let write_other = format!(
        "this user running on node '{node}' may not write NetworkAddresses of node '{OTHER_NODE}'"
    );
    let forged = address(&format!("{ns}-forged"), &ns, Some(OTHER_NODE))?;
    let dry = dry_run();
    until_refused("the address policy acts", &write_other, || {
        driver.create(&dry, &forged)
    })
    .await?;
    for name in ["own", "forged", "unnamed", "theirs"] {
        t.leftovers.track::<NetworkAddress>(&format!("{ns}-{name}"));
    }

    let own = format!("{ns}-own");
    driver
        .create(&post, &address(&own, &ns, Some(&node))?)
        .await
        .context("the driver allocating in its own node's name")?;
    driver
        .delete(&own, &DeleteParams::default())
        .await
        .context("the driver releasing its own node's address")?;
    assert_denied(
        "an address in another node's name",
        driver.create(&post, &forged).await,
        &policy,
        &write_other,
    )?;
    assert_denied(
        "an address without a node",
        driver
            .create(&post, &address(&format!("{ns}-unnamed"), &ns, None)?)
            .await,
        &policy,
        &format!(
            "this user running on node '{node}' may not write NetworkAddresses without spec.node"
        ),
    )?;
    let theirs = format!("{ns}-theirs");
    admin
        .create(&post, &address(&theirs, &ns, Some(OTHER_NODE))?)
        .await?;
    assert_denied(
        "releasing another node's address",
        driver.delete(&theirs, &DeleteParams::default()).await,
        &policy,
        &format!(
            "this user running on node '{node}' may not delete NetworkAddresses of node '{OTHER_NODE}'"
        ),
    )?;
    ensure!(
        admin.get_opt(&theirs).await?.is_some(),
        "another node's address is gone"
    );
    // Holding its own (unprepare with a grace period) is a metadata patch the driver may make;
    // another node's held allocation (its identity returned here) it may delete.
    let held = json!({"metadata": {"labels": {"knic.dev/held": "true"}}});
    driver
        .create(&post, &address(&own, &ns, Some(&node))?)
        .await
        .context("the driver allocating again")?;
    driver
        .patch(&own, &PatchParams::default(), &Patch::Merge(&held))
        .await
        .context("the driver holding its own node's address")?;
    driver.delete(&own, &DeleteParams::default()).await?;
    admin
        .patch(&theirs, &PatchParams::default(), &Patch::Merge(&held))
        .await?;
    driver
        .delete(&theirs, &DeleteParams::default())
        .await
        .context("the driver taking over another node's held address")?;
    Ok(())
}

/// The driver writes its own node's NodeNetworks object and status with its own code
/// (`api::nodenetworks::write`, server-side apply, only `patch` granted), which kubectl then
/// shows; another node's object or status, and a token bound to no node, are refused.
async fn nodenetworks_of_its_own_node_only(t: &mut Twin) -> anyhow::Result<()> {
    use knic_proto::network::readiness::{NodeNetwork, NodeNetworks, NodeNetworksStatus};
    let policy = t.installed.policy("knic-nodenetworks-own-node")?.to_owned();
    let node = t.node().to_owned();
    let driver: Api<NodeNetworks> = Api::all(t.driver.clone());
    let admin: Api<NodeNetworks> = Api::all(t.cluster.client.clone());
    let object = |name: &str| {
        json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NodeNetworks",
               "metadata": {"name": name}, "spec": {"nodeName": name}})
    };
    let apply = PatchParams::apply("knic.dev").force();
    let dry = PatchParams {
        dry_run: true,
        ..apply.clone()
    };
    let write_other = format!(
        "this user running on node '{node}' may not write the NodeNetworks of node '{OTHER_NODE}'"
    );
    // Someone's driver may keep the node's object: it is left as it was found.
    let found = admin.get_opt(&node).await?;
    if found.is_none() {
        t.leftovers.track::<NodeNetworks>(&node);
    }
    t.leftovers.track::<NodeNetworks>(OTHER_NODE);
    let forged_object = Patch::Apply(object(OTHER_NODE));
    until_refused("the NodeNetworks policy acts", &write_other, || {
        driver.patch(OTHER_NODE, &dry, &forged_object)
    })
    .await?;

    let mut status = NodeNetworksStatus {
        ready: false,
        reasons: vec!["NRI plugin not connected to the container runtime".into()],
        networks: vec![NodeNetwork {
            name: "knt-blue".into(),
            ready: false,
            reasons: vec!["NRI plugin not connected to the container runtime".into()],
            free_devices: vec!["knt-dev0".into()],
        }],
        ..Default::default()
    };
    status.summarise();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(t.driver.clone());
    knic_driver::api::nodenetworks::write(&driver, &nodes, &node, &status)
        .await
        .context("the driver writing its own node's NodeNetworks with its own code")?;
    let written = admin.get(&node).await?;
    let got = written.status.clone().unwrap_or_default();
    ensure!(
        got.networks == status.networks
            && got.networks_summary.as_deref() == Some("0/1")
            && got.updated.is_some()
            && written
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o[0].kind == "Node"),
        "{written:?}"
    );
    // Visible with kubectl, with the printer columns.
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&t.cluster.kubeconfig)
        .args(["get", "nodenetworks", &node, "-o", "wide"])
        .output()
        .context("running kubectl")?;
    let table = String::from_utf8_lossy(&out.stdout);
    println!("kubectl get nodenetworks {node} -o wide:\n{table}");
    ensure!(
        out.status.success()
            && table
                .lines()
                .next()
                .is_some_and(|h| h.split_whitespace().collect::<Vec<_>>()
                    == ["NAME", "READY", "NETWORKS", "READY-NETWORKS", "UPDATED"])
            && table.contains(&format!("{node} "))
            && table.contains("0/1"),
        "kubectl: {table} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert_denied(
        "another node's NodeNetworks",
        driver
            .patch(OTHER_NODE, &apply, &Patch::Apply(object(OTHER_NODE)))
            .await,
        &policy,
        &write_other,
    )?;
    admin
        .patch(OTHER_NODE, &apply, &Patch::Apply(object(OTHER_NODE)))
        .await
        .context("the admin writing another node's object")?;
    let forged = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NodeNetworks",
        "metadata": {"name": OTHER_NODE}, "status": {"ready": true}});
    assert_denied(
        "another node's NodeNetworks status",
        driver
            .patch_status(OTHER_NODE, &apply, &Patch::Apply(forged))
            .await,
        &policy,
        &write_other,
    )?;
    // The driver never deletes its object (the Node owns it): RBAC grants no delete at all.
    let (code, text) = knic_e2e::nodeauth::refusal(
        "deleting another node's NodeNetworks",
        driver.delete(OTHER_NODE, &DeleteParams::default()).await,
    )?;
    ensure!(
        code == 403 && text.contains("cannot delete resource \"nodenetworks\""),
        "deleting another node's NodeNetworks: refused with {code} {text:?}, want RBAC's 403"
    );
    let unbound: Api<NodeNetworks> = Api::all(t.unbound().await?);
    assert_denied(
        "a token bound to no node",
        unbound
            .patch(&node, &dry, &Patch::Apply(object(&node)))
            .await,
        &policy,
        NO_NODE,
    )?;
    if let Some(found) = found {
        // Put back what the node's own driver had written.
        let mut back = serde_json::to_value(&found)?;
        back["metadata"] = json!({"name": node});
        admin
            .patch_status(&node, &apply, &Patch::Apply(back))
            .await?;
    }
    Ok(())
}

/// The driver's Events (built by its own `api::events::event`) go through as its own node's
/// instance; the same Event as another node's driver is refused.
async fn events_as_its_own_node_only(t: &mut Twin) -> anyhow::Result<()> {
    let policy = t.installed.policy("knic-events-own-node")?.to_owned();
    let (ns, node) = (t.ns().to_owned(), t.node().to_owned());
    let claim = allocated_claim(t, "mine", &node).await?;
    let driver: Api<Event> = Api::namespaced(t.driver.clone(), &ns);
    let post = PostParams::default();
    let warning = Warning {
        claim: ClaimRef {
            namespace: ns.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        },
        pod: None,
        action: "PrepareResources",
        reason: "PrepareFailed",
        message: "request nic: interface.mtu: must be between 68 and 65535, got 50".into(),
    };
    let regarding = ObjectReference {
        api_version: Some("resource.k8s.io/v1".into()),
        kind: Some("ResourceClaim".into()),
        namespace: Some(ns.clone()),
        name: Some(claim.name.clone()),
        uid: Some(claim.uid.clone()),
        ..Default::default()
    };
    let as_node = |instance_node: &str| {
        event(
            &regarding,
            None,
            &warning,
            1,
            Timestamp::now(),
            &reporting_instance(instance_node),
        )
    };
    let only_own = format!(
        "this user running on node '{node}' may only write Events with reportingInstance \
         'knic-driver-{node}'"
    );
    let (dry, forged) = (dry_run(), as_node(OTHER_NODE));
    until_refused("the event policy acts", &only_own, || {
        driver.create(&dry, &forged)
    })
    .await?;
    driver
        .create(&post, &as_node(&node))
        .await
        .context("the driver's Event as its own node")?;
    assert_denied(
        "an Event as another node's driver",
        driver.create(&post, &as_node(OTHER_NODE)).await,
        &policy,
        &only_own,
    )?;
    // What the policy does not cover: what an Event is about. One about a claim allocated to
    // another node, as this node's driver, goes through (it can mislead only under this
    // node's name).
    let theirs = allocated_claim(t, "theirs", OTHER_NODE).await?;
    let mut about = as_node(&node);
    about.regarding = Some(ObjectReference {
        name: Some(theirs.name.clone()),
        uid: Some(theirs.uid.clone()),
        ..regarding.clone()
    });
    driver
        .create(&post, &about)
        .await
        .context("an Event about another node's claim, as this node's driver")?;
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let real = knic_e2e::harness::real_cluster();
    let twins: [(&str, &str, Body); 5] = [
        (
            "policies/resourceslices_of_its_own_node_only",
            "adm-slices",
            |t| Box::pin(resourceslices_of_its_own_node_only(t)),
        ),
        (
            "policies/claim_status_on_its_own_node_only",
            "adm-status",
            |t| Box::pin(claim_status_on_its_own_node_only(t)),
        ),
        (
            "policies/networkaddresses_of_its_own_node_only",
            "adm-addresses",
            |t| Box::pin(networkaddresses_of_its_own_node_only(t)),
        ),
        ("policies/events_as_its_own_node_only", "adm-events", |t| {
            Box::pin(events_as_its_own_node_only(t))
        }),
        (
            "policies/nodenetworks_of_its_own_node_only",
            "adm-nodenet",
            |t| Box::pin(nodenetworks_of_its_own_node_only(t)),
        ),
    ];
    let mut trials = Vec::new();
    for (name, slug, body) in twins {
        let real = real.clone();
        trials.push(trial(
            format!("real/{name}"),
            real.is_none(),
            move || async move {
                match real {
                    Some(r) => run(r, slug, body).await,
                    None => Ok(()),
                }
            },
        ));
    }
    let real_webhook = real.clone();
    trials.push(trial(
        "real/webhook/refuses_invalid_configs_through_the_apiserver".into(),
        real.is_none(),
        move || async move {
            match real_webhook {
                Some(r) => webhook::refuses_invalid_configs(r).await,
                None => Ok(()),
            }
        },
    ));
    libtest_mimic::run(&args, trials).exit();
}
