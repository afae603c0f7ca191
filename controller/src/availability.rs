//! "Which networks are available, and where": for every Network, how many nodes currently
//! offer at least one free device its generated claims would accept.
//!
//! A device counts when it is published in the newest generation of its pool by a node-local
//! `knic.dev` slice, is not in any claim's allocation, and passes every selector the scheduler
//! would apply: the DeviceClass's and the template's request selectors, including the
//! exhaustion selector, so a full network reports zero nodes, exactly as the scheduler sees it.
//! Selectors are evaluated by [`crate::cel`]; a Network whose selectors use CEL outside knic's
//! subset gets no number at all (the field is left unset) rather than a wrong one.
//!
//! The computation ([`available_nodes`], [`wanted_for`]) is pure. [`run`] keeps caches of
//! slices, claims, classes and Networks and rewrites `status.availableNodes` of the Networks
//! whose number changed, at most once per [`Settings::interval`]: claim and slice churn in a
//! big cluster must not become one status write per event. It patches that one field only, so
//! it never races the reconciler, which writes every other status field and never this one.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplateSpec, ResourceSlice,
};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cel::{self, Selector};
use crate::network::{CONDITION_INVALID, Network};
use crate::reconcile::{Plan, plan};

/// Timing of the availability loop.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The shortest time between two recomputations (changes in between are batched).
    pub interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interval: Duration::from_secs(5),
        }
    }
}

/// A device's identity in allocations: driver, pool, device.
pub type DeviceKey = (String, String, String);

/// What a claim from a template asks for: `count` devices that each pass every selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    /// The DeviceClass's selectors, then the request's, compiled, in the scheduler's order.
    pub selectors: Vec<Selector>,
    /// Devices per claim (`interfacesPerPod`): a node offers the network only with this many.
    pub count: u32,
}

impl Wanted {
    /// Whether `device` passes, evaluating the selectors in order like the scheduler: the first
    /// `false` settles it; an evaluation error is an `Err`, because in the scheduler it fails
    /// the pod's whole scheduling attempt rather than just this device.
    pub fn accepts(&self, device: &cel::Device) -> Result<bool, String> {
        for selector in &self.selectors {
            match selector.matches(device) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(true)
    }
}

/// What `network`'s generated claims ask for: see [`wanted_by`]. `Err` says why the number
/// cannot be known (an Invalid Network, a missing DeviceClass, or CEL outside knic's subset).
pub fn wanted_for(
    network: &Network,
    all: &[Network],
    classes: &BTreeMap<String, DeviceClass>,
) -> Result<Wanted, String> {
    // Invalid also when only the apiserver refused the template (e.g. a selector its CEL
    // compiler rejects): then there is no template, and the selectors are not to be trusted.
    if network.condition_is_true(CONDITION_INVALID) {
        return Err("the Network is Invalid".to_owned());
    }
    match plan(network, all) {
        Plan::Generate(template) => wanted_by(&template, classes),
        Plan::Invalid(_) => Err("the Network is Invalid".to_owned()),
    }
}

/// What a claim made from `template` asks for: its DeviceClass's selectors, then its request's
/// (knic templates have exactly one request), and the request's count.
pub fn wanted_by(
    template: &ResourceClaimTemplateSpec,
    classes: &BTreeMap<String, DeviceClass>,
) -> Result<Wanted, String> {
    let request = template
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .and_then(|r| r.first())
        .and_then(|r| r.exactly.as_ref())
        .ok_or("the template has no exact request")?;
    let class = classes
        .get(&request.device_class_name)
        .ok_or_else(|| format!("DeviceClass {:?} does not exist", request.device_class_name))?;
    let selectors = class
        .spec
        .selectors
        .iter()
        .flatten()
        .chain(request.selectors.iter().flatten())
        .map(|s| {
            let expression = &s
                .cel
                .as_ref()
                .ok_or("a selector that is not CEL")?
                .expression;
            Selector::compile(expression).map_err(|e| format!("selector {expression:?}: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let count = request
        .count
        .map_or(Ok(1), u32::try_from)
        .map_err(|_| "the request's count is out of range".to_owned())?;
    Ok(Wanted { selectors, count })
}

/// The devices claims hold exclusively, so they are not counted as free. Admin-access
/// allocations share the device and do not take it, as for the scheduler.
pub fn allocated<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> BTreeSet<DeviceKey> {
    claims
        .into_iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.admin_access != Some(true))
        .map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone()))
        .collect()
}

/// How many nodes publish at least `wanted.count` free devices that pass `wanted`'s
/// selectors. Only node-local slices of the newest generation of their pool count, like for
/// the scheduler. `Err` when a selector fails to evaluate on a free device: the scheduler would
/// then fail pods of this network outright, so no number would be honest.
pub fn available_nodes(
    wanted: &Wanted,
    slices: &[&ResourceSlice],
    allocated: &BTreeSet<DeviceKey>,
) -> Result<u32, String> {
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for s in slices {
        let key = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        let generation = newest.entry(key).or_insert(s.spec.pool.generation);
        *generation = (*generation).max(s.spec.pool.generation);
    }
    let mut free: BTreeMap<&str, u32> = BTreeMap::new();
    for s in slices {
        let Some(node) = s.spec.node_name.as_deref() else {
            continue;
        };
        let key = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        if newest.get(&key) != Some(&s.spec.pool.generation) {
            continue;
        }
        for device in s.spec.devices.iter().flatten() {
            let id = (
                s.spec.driver.clone(),
                s.spec.pool.name.clone(),
                device.name.clone(),
            );
            if allocated.contains(&id) {
                continue;
            }
            let view = cel::Device::from_slice(&s.spec.driver, device);
            let accepted = wanted
                .accepts(&view)
                .map_err(|e| format!("device {} of node {node}: {e}", device.name))?;
            if accepted {
                *free.entry(node).or_default() += 1;
            }
        }
    }
    let nodes = free.values().filter(|&&n| n >= wanted.count).count();
    Ok(u32::try_from(nodes).unwrap_or(u32::MAX))
}

/// Every Network's number (or `None` when it cannot be known), from the caches' contents.
///
/// Generic over [`Borrow`] so the loop passes its caches' `Arc`s without copying every slice
/// and claim on each recomputation, and tests pass plain values.
pub fn compute<S, C, D>(
    networks: &[Network],
    slices: &[S],
    claims: &[C],
    classes: &[D],
) -> BTreeMap<String, Option<u32>>
where
    S: Borrow<ResourceSlice>,
    C: Borrow<ResourceClaim>,
    D: Borrow<DeviceClass>,
{
    let classes: BTreeMap<String, DeviceClass> = classes
        .iter()
        .map(|c| (c.borrow().name_any(), c.borrow().clone()))
        .collect();
    let slices: Vec<&ResourceSlice> = slices
        .iter()
        .map(Borrow::borrow)
        .filter(|s| s.spec.driver == knic_proto::DRIVER_NAME)
        .collect();
    let taken = allocated(claims.iter().map(Borrow::borrow));
    networks
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| {
            let number = match wanted_for(n, networks, &classes)
                .and_then(|wanted| available_nodes(&wanted, &slices, &taken))
            {
                Ok(number) => Some(number),
                Err(why) => {
                    tracing::debug!(network = %n.name_any(), %why, "available nodes unknown");
                    None
                }
            };
            (n.name_any(), number)
        })
        .collect()
}

/// Keeps `status.availableNodes` of every Network current until `shutdown` completes.
pub async fn run(client: Client, settings: Settings, shutdown: impl Future<Output = ()>) {
    /// A cache of `K` and the stream that fills it (yielding once per event). A failing watch
    /// (RBAC, an API version not served) is logged once until it works again, because it
    /// leaves `availableNodes` unset and nothing else would say why.
    fn cache<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, impl futures::Stream<Item = ()>)
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        let (store, writer) = reflector::store();
        let mut failing = false;
        let events = reflector(writer, watcher(api, config))
            .default_backoff()
            .map(move |event| match event {
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(kind = %K::kind(&()), error = %e,
                            "watch failed; status.availableNodes is not updated until it works");
                }
                Err(_) => {}
                Ok(_) => failing = false,
            });
        (store, events)
    }
    let all = watcher::Config::default;
    let networks_api: Api<Network> = Api::all(client.clone());
    let (networks, a) = cache(networks_api.clone(), all());
    // Only knic's slices: other drivers' devices can never carry a knic network.
    let knic_slices = all().fields(&format!("spec.driver={}", knic_proto::DRIVER_NAME));
    let (slices, b) = cache(Api::<ResourceSlice>::all(client.clone()), knic_slices);
    let (claims, c) = cache(Api::<ResourceClaim>::all(client.clone()), all());
    let (classes, d) = cache(Api::<DeviceClass>::all(client.clone()), all());
    let mut changes = std::pin::pin!(futures::stream::select_all([
        a.boxed(),
        b.boxed(),
        c.boxed(),
        d.boxed()
    ]));
    let mut shutdown = std::pin::pin!(shutdown);
    let ready = async {
        let _ = networks.wait_until_ready().await;
        let _ = slices.wait_until_ready().await;
        let _ = claims.wait_until_ready().await;
        let _ = classes.wait_until_ready().await;
    };
    // The caches fill through the same stream, so it must be polled while waiting.
    let mut ready = std::pin::pin!(ready);
    loop {
        tokio::select! {
            () = &mut ready => break,
            Some(()) = changes.next() => {}
            () = &mut shutdown => return,
        }
    }
    loop {
        let all: Vec<Network> = networks.state().iter().map(|n| (**n).clone()).collect();
        let numbers = compute(&all, &slices.state(), &claims.state(), &classes.state());
        let mut failed = false;
        for network in &all {
            let name = network.name_any();
            let Some(number) = numbers.get(&name) else {
                continue;
            };
            let current = network.status.as_ref().and_then(|s| s.available_nodes);
            if current == *number {
                continue;
            }
            let patch = json!({"status": {"availableNodes": number}});
            match networks_api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => tracing::debug!(network = %name, available = ?number, "available nodes"),
                Err(e) => {
                    tracing::warn!(network = %name, error = %e,
                        "writing status.availableNodes failed; retrying");
                    failed = true;
                }
            }
        }
        // Wait for a change (or, after a failed write, just the interval), then let the burst
        // settle for the interval.
        if !failed {
            tokio::select! {
                next = changes.next() => if next.is_none() { return },
                () = &mut shutdown => return,
            }
        }
        let settle = tokio::time::sleep(settings.interval);
        let mut settle = std::pin::pin!(settle);
        loop {
            tokio::select! {
                () = &mut settle => break,
                Some(()) = changes.next() => {}
                () = &mut shutdown => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn network(name: &str, devices: Value) -> Network {
        let mut n: Network = serde_json::from_value(json!({
            "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"devices": devices,
                     "ipam": {"subnets": [{"cidr": "192.0.2.0/24"}]},
                     "namespaces": {"names": ["a"]}},
        }))
        .unwrap();
        n.metadata.generation = Some(1);
        n
    }

    fn class(name: &str, expression: &str) -> DeviceClass {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }))
        .unwrap()
    }

    fn classes() -> Vec<DeviceClass> {
        vec![
            class("knic.dev", "device.driver == \"knic.dev\""),
            class(
                "vf.knic.dev",
                "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].kind == \"vf\"",
            ),
        ]
    }

    /// A slice of `node` whose devices are `(name, kind, extra attributes)`.
    fn slice(node: &str, generation: i64, devices: &[(&str, &str, Value)]) -> ResourceSlice {
        let devices: Vec<Value> = devices
            .iter()
            .map(|(name, kind, extra)| {
                let mut attributes = json!({"kind": {"string": kind}});
                if let (Some(a), Some(e)) = (attributes.as_object_mut(), extra.as_object()) {
                    a.extend(e.clone());
                }
                json!({"name": name, "attributes": attributes})
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-{generation}")},
            "spec": {"driver": "knic.dev", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices},
        }))
        .unwrap()
    }

    fn claim(allocated: &[(&str, &str)]) -> ResourceClaim {
        let results: Vec<Value> = allocated
            .iter()
            .map(|(pool, device)| {
                json!({"request": "network", "driver": "knic.dev", "pool": pool,
                       "device": device})
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "a"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    const NO_CLAIMS: &[ResourceClaim] = &[];

    fn vf_network() -> Network {
        network("blue", json!({"kind": "vf"}))
    }

    #[test]
    fn counts_nodes_with_a_free_matching_device() {
        let slices = [
            slice(
                "node-a",
                1,
                &[("vf0", "vf", json!({})), ("pf0", "pf", json!({}))],
            ),
            slice("node-b", 1, &[("vf0", "vf", json!({}))]),
            slice("node-c", 1, &[("pf0", "pf", json!({}))]),
        ];
        let networks = [vf_network()];
        let numbers = compute(&networks, &slices, NO_CLAIMS, &classes());
        assert_eq!(numbers["blue"], Some(2), "node-c has no VF");
        let taken = [claim(&[("node-b", "vf0")])];
        let numbers = compute(&networks, &slices, &taken, &classes());
        assert_eq!(numbers["blue"], Some(1), "node-b's only VF is allocated");
        let taken = [claim(&[("node-b", "vf0"), ("node-a", "vf0")])];
        assert_eq!(
            compute(&networks, &slices, &taken, &classes())["blue"],
            Some(0)
        );
    }

    #[test]
    fn a_node_needs_as_many_free_devices_as_a_pod_asks_for() {
        let slices = [
            slice(
                "node-a",
                1,
                &[("vf0", "vf", json!({})), ("vf1", "vf", json!({}))],
            ),
            slice(
                "node-b",
                1,
                &[("vf0", "vf", json!({})), ("pf0", "pf", json!({}))],
            ),
        ];
        let mut two = vf_network();
        two.spec.interfaces_per_pod = Some(2);
        assert_eq!(
            compute(std::slice::from_ref(&two), &slices, NO_CLAIMS, &classes())["blue"],
            Some(1)
        );
        let taken = [claim(&[("node-a", "vf1")])];
        assert_eq!(
            compute(&[two], &slices, &taken, &classes())["blue"],
            Some(0)
        );
    }

    #[test]
    fn admin_access_does_not_take_a_device() {
        let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
        let mut watching = claim(&[("node-a", "vf0")]);
        if let Some(results) = watching
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
        {
            results[0].admin_access = Some(true);
        }
        assert_eq!(
            compute(&[vf_network()], &slices, &[watching], &classes())["blue"],
            Some(1)
        );
    }

    #[test]
    fn an_evaluation_error_on_a_free_device_makes_the_number_unknown() {
        // The scheduler fails a pod whose selector errors on a candidate device; knic does not
        // pretend to know where it would fit.
        let speedy = network(
            "speedy",
            json!({"deviceClassName": "knic.dev",
                   "selectors": ["device.attributes[\"knic.dev\"].speed >= 25000"]}),
        );
        let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
        assert_eq!(
            compute(
                std::slice::from_ref(&speedy),
                &slices,
                NO_CLAIMS,
                &classes()
            )["speedy"],
            None
        );
        let fast = json!({"speed": {"int": 100000}});
        let slices = [slice("node-a", 1, &[("vf0", "vf", fast)])];
        assert_eq!(
            compute(&[speedy], &slices, NO_CLAIMS, &classes())["speedy"],
            Some(1)
        );
    }

    #[test]
    fn a_network_marked_invalid_gets_no_number() {
        // E.g. the apiserver refused its template: plan() alone would not know.
        let mut refused = vf_network();
        refused.status = Some(knic_proto::network::NetworkStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: CONDITION_INVALID.into(),
                status: "True".into(),
                reason: "Invalid".into(),
                message: "spec.devices.selectors[0]: compilation failed".into(),
                observed_generation: Some(1),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            }],
            ..Default::default()
        });
        let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
        assert_eq!(
            compute(&[refused], &slices, NO_CLAIMS, &classes())["blue"],
            None
        );
    }

    #[test]
    fn only_the_newest_generation_of_a_pool_counts() {
        let slices = [
            slice("node-a", 1, &[("vf0", "vf", json!({}))]),
            slice("node-a", 2, &[("pf0", "pf", json!({}))]),
        ];
        assert_eq!(
            compute(&[vf_network()], &slices, NO_CLAIMS, &classes())["blue"],
            Some(0)
        );
    }

    #[test]
    fn an_exhausted_network_is_available_nowhere_but_others_are() {
        let token = knic_proto::network::exhaustion_token("blue");
        let listed = json!({"exhaustedNetworks": {"string": format!(",{token},")}});
        let slices = [slice("node-a", 1, &[("vf0", "vf", listed)])];
        let mut red = network("red", json!({"kind": "vf"}));
        red.spec.ipam.subnets[0].cidr = "198.51.100.0/24".into();
        let networks = [vf_network(), red];
        let numbers = compute(&networks, &slices, NO_CLAIMS, &classes());
        assert_eq!(numbers["blue"], Some(0));
        assert_eq!(numbers["red"], Some(1));
    }

    #[test]
    fn unknown_when_the_class_is_missing_the_cel_unsupported_or_the_network_invalid() {
        let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
        let mut unknown_class = network(
            "raw",
            json!({"deviceClassName": "gpu.example.com", "selectors": []}),
        );
        unknown_class.spec.devices.kind = None;
        let unsupported = network(
            "regex",
            json!({"deviceClassName": "knic.dev",
                   "selectors": ["device.attributes[\"knic.dev\"].kind.matches(\"^v\")"]}),
        );
        let mut invalid = vf_network();
        invalid.metadata.name = Some("invalid".into());
        invalid.spec.vlan = Some(5000);
        let networks = [unknown_class, unsupported, invalid];
        let numbers = compute(&networks, &slices, NO_CLAIMS, &classes());
        assert_eq!(numbers["raw"], None);
        assert_eq!(numbers["regex"], None);
        assert_eq!(numbers["invalid"], None);
        let all = networks.to_vec();
        let classes: BTreeMap<String, DeviceClass> =
            classes().into_iter().map(|c| (c.name_any(), c)).collect();
        assert_eq!(
            wanted_for(&networks[0], &all, &classes).err().as_deref(),
            Some("DeviceClass \"gpu.example.com\" does not exist")
        );
        assert_eq!(
            wanted_for(&networks[2], &all, &classes).err().as_deref(),
            Some("the Network is Invalid")
        );
        let regex = wanted_for(&networks[1], &all, &classes)
            .err()
            .unwrap_or_default();
        assert!(regex.starts_with("selector \"device.attributes"), "{regex}");
    }

    #[test]
    fn slices_without_a_node_and_of_other_drivers_are_ignored() {
        let mut shared = slice("node-a", 1, &[("vf0", "vf", json!({}))]);
        shared.spec.node_name = None;
        shared.spec.all_nodes = Some(true);
        let mut other = slice("node-b", 1, &[("vf0", "vf", json!({}))]);
        other.spec.driver = "other.example.com".into();
        assert_eq!(
            compute(&[vf_network()], &[shared, other], NO_CLAIMS, &classes())["blue"],
            Some(0)
        );
    }
}
