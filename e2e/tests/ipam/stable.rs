//! Stable addresses with a grace period (`stableAddresses.gracePeriodSeconds`) end to end:
//! identities (pod names, as a StatefulSet's) re-created round after round with new claims on
//! changing driver processes, all prepared and unprepared at once, get their address back every
//! time, while after every step no address belongs to two existing claims; a returning identity
//! whose old claim is still being deleted is refused until it is gone; the controller's
//! collection (run in-process) releases the holds of identities that cannot return and, once
//! the grace period passed, all of them.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use knic_e2e::cluster::TestClaim;
use knic_e2e::driver::vf_device;
use knic_proto::network::stable::{HELD_LABEL, HELD_SINCE_ANNOTATION};
use knic_proto::network::{Network, NetworkAddress};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::Env;

/// The identities' StatefulSet name: pods `db-0`, `db-1`, …
const SET: &str = "db";

fn is_held(o: &NetworkAddress) -> bool {
    o.labels().get(HELD_LABEL).is_some_and(|v| v == "true")
}

impl Env {
    /// A claim on node `node`'s VF `vf` for pod `pod`, asking the test's Network.
    async fn stable_claim(
        &self,
        node: usize,
        name: &str,
        pod: &str,
        vf: usize,
    ) -> anyhow::Result<TestClaim> {
        let config = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                            "ipam": {"network": self.network}});
        let pool = &self.nodes[node].config.node_name;
        let results = vec![json!({"request": "nic", "driver": "knic.dev", "pool": pool,
                                  "device": vf_device(vf)})];
        self.cluster
            .create_claim_for_pod(name, pod, Some(results), Some(config))
            .await
    }

    /// Deletes a claim and its pod for good (the pod first, as the garbage collector would).
    async fn delete_claim_and_pod(&self, claim: &str, pod: &str) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace);
        pods.delete(pod, &DeleteParams::default()).await?;
        let claims: Api<ResourceClaim> =
            Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace);
        claims.delete(claim, &DeleteParams::default()).await?;
        Ok(())
    }

    /// The invariant, checked after every step: every `live` claim (uid → name) has exactly
    /// one allocation, no two live claims share an address, and no live claim's allocation is
    /// held. Returns each live claim's address.
    async fn check_unique(
        &self,
        live: &BTreeMap<String, String>,
    ) -> anyhow::Result<BTreeMap<String, String>> {
        let objects = self.addresses().await?;
        let mut by_address: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut of_claim: BTreeMap<String, String> = BTreeMap::new();
        for o in &objects {
            let uid = o.spec.claim.uid.as_str();
            if let Some(name) = live.get(uid) {
                ensure!(
                    !is_held(o),
                    "live claim {name}'s allocation {} is held",
                    o.spec.address
                );
                by_address.entry(&o.spec.address).or_default().push(name);
                ensure!(
                    of_claim
                        .insert(name.clone(), o.spec.address.clone())
                        .is_none(),
                    "claim {name} has two allocations"
                );
            }
        }
        for (address, claims) in &by_address {
            ensure!(
                claims.len() == 1,
                "address {address} belongs to live claims {claims:?}"
            );
        }
        for name in live.values() {
            ensure!(
                of_claim.contains_key(name),
                "live claim {name} has no allocation"
            );
        }
        Ok(of_claim)
    }
}

/// Identities churn over several driver processes (three on the fake API; one on a real
/// cluster, where a second node cannot be faked): every round re-creates every identity's pod
/// with a new claim on another node, prepares them all at once with a few ordinary pods, checks
/// every identity got its first address, then unprepares them all at once (holding the
/// addresses) and deletes the claims.
pub(super) async fn stable_addresses_survive_churn(env: &mut Env) -> anyhow::Result<()> {
    let fake = env.cluster.fake.is_some();
    let (nodes, identities, rounds) = if fake { (3, 12, 4) } else { (1, 4, 3) };
    for n in 1..nodes {
        let name = format!("{}-{}", env.cluster.node, (b'a' + n as u8) as char);
        env.add_node(&name).await?;
    }
    // 30 addresses: the identities' holds and every round's ordinary pods' holds fit.
    env.create_stable_network(
        json!([{"cidr": "10.30.0.0/27"}]),
        Some(json!({"by": "podName", "gracePeriodSeconds": 3600})),
    )
    .await?;
    let mut first: BTreeMap<usize, String> = BTreeMap::new();
    for round in 0..rounds {
        let mut claims: Vec<(usize, TestClaim, String)> = Vec::new();
        for i in 0..identities {
            let node = (i + round) % nodes;
            let pod = format!("{SET}-{i}");
            let claim = env
                .stable_claim(node, &format!("{pod}-r{round}"), &pod, i)
                .await?;
            claims.push((node, claim, pod));
        }
        // Ordinary pods of the round: identities of their own, never one of the held ones.
        for node in 0..nodes {
            let pod = format!("noise-{round}-{node}");
            let claim = env
                .stable_claim(node, &format!("{pod}-c"), &pod, identities + node)
                .await?;
            claims.push((node, claim, pod));
        }
        let pairs: Vec<(usize, TestClaim)> =
            claims.iter().map(|(n, c, _)| (*n, c.clone())).collect();
        let outcomes = env.prepare_all(&pairs).await?;
        for ((_, claim, _), got) in claims.iter().zip(&outcomes) {
            ensure!(
                got.error.is_empty(),
                "round {round} {}: {}",
                claim.name,
                got.error
            );
        }
        let live: BTreeMap<String, String> = claims
            .iter()
            .map(|(_, c, _)| (c.uid.clone(), c.name.clone()))
            .collect();
        let addresses = env.check_unique(&live).await?;
        for (i, (_, claim, _)) in claims.iter().take(identities).enumerate() {
            let got = &addresses[&claim.name];
            match first.get(&i) {
                None => {
                    first.insert(i, got.clone());
                }
                Some(want) => ensure!(
                    got == want,
                    "round {round}: identity {SET}-{i} got {got}, its address is {want}"
                ),
            }
        }
        // All pods stop at once: every unprepare holds.
        let mut tasks = Vec::new();
        for (node, claim, _) in &claims {
            let plugin = env.nodes[*node].plugin.clone();
            let id = env.id(claim);
            tasks.push(tokio::spawn(async move {
                let uid = id.uid.clone();
                let mut out = plugin
                    .unprepare(knic_e2e::kubelet::DraVersion::V1, &[id])
                    .await?;
                out.remove(&uid).context("no entry for the claim")
            }));
        }
        for task in tasks {
            let out = task.await??;
            ensure!(out.is_empty(), "round {round} unprepare: {out}");
        }
        for (_, claim, pod) in &claims {
            env.delete_claim_and_pod(&claim.name, pod).await?;
        }
        let objects = env.addresses().await?;
        ensure!(
            objects.len() == identities + nodes * (round + 1),
            "round {round}: {} allocations, want one held per identity and ordinary pod",
            objects.len()
        );
        for o in &objects {
            ensure!(is_held(o), "{} not held after unprepare", o.spec.address);
            ensure!(
                o.annotations().contains_key(HELD_SINCE_ANNOTATION),
                "{} has no held-since",
                o.spec.address
            );
        }
        env.check_unique(&BTreeMap::new()).await?;
    }
    returning_while_the_old_claim_is_deleted(env, &first).await?;
    holds_end_when_the_identity_is_gone_or_the_grace_passed(env, identities, &first).await
}

/// Identity `db-0` returns while its last claim is still being deleted (a finalizer keeps it,
/// unprepare not yet run): refused with the text, then, once unprepared and gone, its address.
async fn returning_while_the_old_claim_is_deleted(
    env: &mut Env,
    first: &BTreeMap<usize, String>,
) -> anyhow::Result<()> {
    let pod = format!("{SET}-0");
    let old = env.stable_claim(0, "db-0-old", &pod, 0).await?;
    let got = env.prepare(0, &old).await?;
    ensure!(got.error.is_empty(), "prepare db-0-old: {}", got.error);
    let claims: Api<ResourceClaim> =
        Api::namespaced(env.cluster.client.clone(), &env.cluster.namespace);
    claims
        .patch(
            "db-0-old",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["knic.dev/e2e-hold"]}})),
        )
        .await?;
    claims.delete("db-0-old", &DeleteParams::default()).await?;
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &env.cluster.namespace);
    pods.delete(&pod, &DeleteParams::default()).await?;
    let new = env.stable_claim(0, "db-0-new", &pod, 1).await?;
    let refused = env.prepare(0, &new).await?;
    let ip = first[&0].split('/').next().unwrap_or_default().to_owned();
    let want = format!(
        "address {ip} of identity {}/{pod} is still held by claim {}/db-0-old, which is being \
         deleted; retrying",
        env.cluster.namespace, env.cluster.namespace
    );
    ensure!(
        refused.error.contains(&want),
        "error {:?}, want {want:?}",
        refused.error
    );
    let live = BTreeMap::from([(old.uid.clone(), old.name.clone())]);
    env.check_unique(&live).await?;
    // The old pod's sandbox stops: unprepare holds, the finalizer goes, the claim is gone.
    ensure!(env.unprepare(0, &old).await?.is_empty());
    claims
        .patch(
            "db-0-old",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let again = env.prepare(0, &new).await?;
    ensure!(again.error.is_empty(), "retry: {}", again.error);
    let live = BTreeMap::from([(new.uid.clone(), new.name.clone())]);
    let addresses = env.check_unique(&live).await?;
    ensure!(
        addresses["db-0-new"] == first[&0],
        "db-0 got {}",
        addresses["db-0-new"]
    );
    ensure!(env.unprepare(0, &new).await?.is_empty());
    env.delete_claim_and_pod("db-0-new", &pod).await?;
    Ok(())
}

/// The controller's collection: with StatefulSet `db` at half the identities' replicas, the
/// holds of the ordinals above and of the ordinary pods (no StatefulSet) end, the rest stay;
/// a grace period of one second then ends them all.
async fn holds_end_when_the_identity_is_gone_or_the_grace_passed(
    env: &mut Env,
    identities: usize,
    first: &BTreeMap<usize, String>,
) -> anyhow::Result<()> {
    let keep = identities / 2;
    let sets: Api<StatefulSet> =
        Api::namespaced(env.cluster.client.clone(), &env.cluster.namespace);
    // Its pods (on a real cluster) stay unscheduled and use no claim.
    let set: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": SET, "namespace": env.cluster.namespace},
        "spec": {
            "replicas": keep, "serviceName": SET,
            "selector": {"matchLabels": {"app": SET}},
            "template": {
                "metadata": {"labels": {"app": SET}},
                "spec": {
                    "schedulingGates": [{"name": "knic.dev/e2e-hold"}],
                    "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }))?;
    sets.create(&PostParams::default(), &set).await?;
    let collected = knic_controller::gc::collect_addresses(&env.cluster.client, true).await?;
    let left = env.addresses().await?;
    let left_addresses: BTreeSet<&str> = left.iter().map(|o| o.spec.address.as_str()).collect();
    let want: BTreeSet<&str> = (0..keep).map(|i| first[&i].as_str()).collect();
    ensure!(
        left_addresses == want,
        "after collection ({collected} released): {left_addresses:?}, want the holds of \
         {SET}-0..{SET}-{} only: {want:?}",
        keep - 1
    );
    ensure!(left.iter().all(is_held), "a kept allocation lost its hold");
    // The grace period shortened to a second: every hold is older by now.
    let networks: Api<Network> = Api::all(env.cluster.client.clone());
    networks
        .patch(
            &env.network,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stableAddresses": {"gracePeriodSeconds": 1}}})),
        )
        .await?;
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    knic_controller::gc::collect_addresses(&env.cluster.client, true).await?;
    let left = env.addresses().await?;
    ensure!(
        left.is_empty(),
        "after the grace period: {:?}",
        left.iter().map(|o| o.name_any()).collect::<Vec<_>>()
    );
    sets.delete(SET, &DeleteParams::default()).await?;
    Ok(())
}
