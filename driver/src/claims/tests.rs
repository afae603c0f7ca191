use super::*;
use serde_json::json;
use std::collections::HashMap as Map;
use std::sync::Mutex as StdMutex;

const DRIVER: &str = "knic.dev";

/// A claim builder over the real JSON shape, so fixtures read like `kubectl get -o json`.
pub(super) struct ClaimBuilder(serde_json::Value);

impl ClaimBuilder {
    pub(super) fn new(name: &str, uid: &str) -> Self {
        ClaimBuilder(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "knic.dev"}}]}},
        }))
    }
    pub(super) fn allocated(mut self, results: &[(&str, &str, &str)]) -> Self {
        let results: Vec<_> = results
            .iter()
            .map(|(req, driver, dev)| json!({"request": req, "driver": driver, "pool": "node-a", "device": dev}))
            .collect();
        self.0["status"]["allocation"] = json!({"devices": {"results": results, "config": []}});
        self
    }
    fn config(mut self, source: &str, driver: &str, params: serde_json::Value) -> Self {
        self.0["status"]["allocation"]["devices"]["config"]
            .as_array_mut()
            .unwrap()
            .push(json!({"source": source, "opaque": {"driver": driver, "parameters": params}}));
        self
    }
    pub(super) fn reserved_for(mut self, pods: &[(&str, &str)]) -> Self {
        self.0["status"]["reservedFor"] = pods
            .iter()
            .map(|(n, u)| json!({"resource": "pods", "name": n, "uid": u}))
            .collect();
        self
    }
    pub(super) fn build(self) -> ResourceClaim {
        serde_json::from_value(self.0).unwrap()
    }
    fn clone_build(&self) -> ResourceClaim {
        serde_json::from_value(self.0.clone()).unwrap()
    }
}

pub(super) fn wanted(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: "claim".into(),
        uid: uid.into(),
    }
}

#[test]
fn resolve_keeps_only_this_drivers_results_and_orders_config() {
    let claim = ClaimBuilder::new("claim", "u1")
        .allocated(&[
            ("nic/fast", DRIVER, "pci-0000-03-00-0"),
            ("gpu", "gpu.example.com", "gpu-0"),
        ])
        .config("FromClaim", DRIVER, json!({"claim": 1}))
        .config("FromClass", "other.example.com", json!({"other": 1}))
        .config("FromClass", DRIVER, json!({"class": 1}))
        .reserved_for(&[("pod-a", "pod-uid-a")])
        .build();
    let p = resolve(DRIVER, &wanted("u1"), &claim, 5).unwrap();
    assert_eq!(p.pod_uid, "pod-uid-a");
    assert_eq!(p.pod_name, "pod-a");
    assert_eq!(p.devices.len(), 1);
    assert_eq!(p.devices[0].device, "pci-0000-03-00-0");
    let params: Vec<_> = p.configs.iter().map(|c| c.parameters.clone()).collect();
    assert_eq!(params, vec![json!({"class": 1}), json!({"claim": 1})]);
    let a = answer(&p);
    assert_eq!(
        a[0].request_names,
        vec!["nic".to_string()],
        "subrequest suffix stripped"
    );
}

/// The reason of a refused claim, checking the error names the claim.
fn refusal(result: Result<PreparedClaim>) -> String {
    match result {
        Err(Error::Claim {
            namespace,
            name,
            reason,
        }) if namespace == "ns" && name == "claim" => reason,
        other => panic!("expected a refusal of ns/claim, got {other:?}"),
    }
}

/// G1: Kubernetes copies the generated template's label into the claim; resolve keeps it (and
/// only it) so the plans name the claim's Network.
#[test]
fn resolve_keeps_the_network_label() {
    let mut b = ClaimBuilder::new("claim", "u1")
        .allocated(&[("nic", DRIVER, "dev-a")])
        .reserved_for(&[("pod", "pod-uid")]);
    let unlabelled = resolve(DRIVER, &wanted("u1"), &b.clone_build(), 7).unwrap();
    assert_eq!(unlabelled.network_label, None);
    b.0["metadata"]["labels"] = json!({"knic.dev/network": "blue", "app": "x"});
    let labelled = resolve(DRIVER, &wanted("u1"), &b.build(), 7).unwrap();
    assert_eq!(labelled.network_label.as_deref(), Some("blue"));
    // Not checkpointed (the plans carry what it means): older drivers keep reading the file.
    let stored = serde_json::to_value(&labelled).unwrap();
    assert!(stored.get("networkLabel").is_none(), "{stored}");
}

#[test]
fn resolve_rejections_name_the_field() {
    let unallocated = ClaimBuilder::new("claim", "u1").build();
    assert_eq!(
        refusal(resolve(DRIVER, &wanted("u1"), &unallocated, 0)),
        "status.allocation is not set: the claim is not allocated"
    );
    let replaced = ClaimBuilder::new("claim", "u2").allocated(&[]).build();
    let err = refusal(resolve(DRIVER, &wanted("u1"), &replaced, 0));
    assert!(
        err.starts_with("metadata.uid is \"u2\" but the kubelet asked for \"u1\""),
        "{err}"
    );
    let unreserved = ClaimBuilder::new("claim", "u1")
        .allocated(&[("nic", DRIVER, "d")])
        .build();
    assert!(
        refusal(resolve(DRIVER, &wanted("u1"), &unreserved, 0))
            .starts_with("status.reservedFor names no pod")
    );
    let shared = ClaimBuilder::new("claim", "u1")
        .allocated(&[("nic", DRIVER, "d")])
        .reserved_for(&[("a", "1"), ("b", "2")])
        .build();
    let err = refusal(resolve(DRIVER, &wanted("u1"), &shared, 0));
    assert!(
        err.starts_with("status.reservedFor names 2 pods (a, b)"),
        "{err}"
    );
}

#[derive(Default)]
pub(super) struct MemClaims {
    pub(super) claims: StdMutex<Map<String, ResourceClaim>>,
    pub(super) gets: std::sync::atomic::AtomicUsize,
}

impl ClaimSource for MemClaims {
    fn get<'a>(
        &'a self,
        _ns: &'a str,
        name: &'a str,
    ) -> crate::BoxFuture<'a, Result<Option<ResourceClaim>>> {
        Box::pin(async move {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(self.claims.lock().unwrap().get(name).cloned())
        })
    }
}

/// The node's published devices, as the inventory would give them.
fn devices() -> watch::Receiver<Vec<Device>> {
    let devices = ["dev-a", "dev-b"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            serde_json::from_value(
                json!({"name": name, "attributes": {"ifName": {"string": format!("eth{i}")}}}),
            )
            .unwrap()
        })
        .collect();
    watch::channel(devices).1
}

/// A claim store on the checkpoint in `dir`, as a restarted driver would open it.
fn store_in(dir: &tempfile::TempDir) -> Arc<ClaimStore> {
    Arc::new(ClaimStore::open(
        crate::claims::checkpoint::CheckpointStore::new(dir.path()),
    ))
}

/// A preparer on the checkpoint in `dir` that snapshots published devices.
pub(super) fn in_dir(source: Arc<MemClaims>, dir: &tempfile::TempDir) -> Preparer {
    Preparer::new(DRIVER, source, store_in(dir)).with_devices(devices())
}

/// Claim `claim` (uid `u1`) with `results` allocated, reserved for pod `p`.
pub(super) fn claim_u1(results: &[(&str, &str, &str)]) -> ResourceClaim {
    ClaimBuilder::new("claim", "u1")
        .allocated(results)
        .reserved_for(&[("p", "pu")])
        .build()
}

/// The answer of a prepare of `claim` that must succeed.
pub(super) async fn prepared(preparer: &Preparer, claim: ClaimRef) -> Vec<PreparedAnswer> {
    let uid = claim.uid.clone();
    match preparer.prepare(&[claim]).await.remove(&uid) {
        Some(Ok(answer)) => answer,
        other => panic!("prepare of {uid} failed: {other:?}"),
    }
}

pub(super) fn add(source: &Arc<MemClaims>, claim: ResourceClaim) {
    let name = claim.metadata.name.clone().unwrap();
    source.claims.lock().unwrap().insert(name, claim);
}

#[tokio::test]
async fn prepare_is_idempotent_and_unprepare_needs_no_api() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    let preparer = in_dir(source.clone(), &dir);
    let first = prepared(&preparer, wanted("u1")).await;
    let again = prepared(&preparer, wanted("u1")).await;
    assert_eq!(first, again);
    assert_eq!(
        source.gets.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "repeat must not re-read the API"
    );

    // A fresh process sees the same state from disk.
    let reloaded = Preparer::new(DRIVER, source.clone(), store_in(&dir));
    assert!(
        reloaded
            .claims()
            .snapshot()
            .await
            .unwrap()
            .claims
            .contains_key("u1")
    );
    source.claims.lock().unwrap().clear();
    reloaded
        .unprepare(&[wanted("u1")])
        .await
        .remove("u1")
        .unwrap()
        .unwrap();
    assert!(
        reloaded
            .claims()
            .snapshot()
            .await
            .unwrap()
            .claims
            .is_empty()
    );
    reloaded
        .unprepare(&[wanted("never")])
        .await
        .remove("never")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_device_prepared_for_one_claim_is_refused_to_another() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    let mut other = ClaimBuilder::new("other", "u2")
        .allocated(&[("nic", DRIVER, "dev-a")])
        .reserved_for(&[("q", "qu")]);
    other.0["metadata"]["name"] = json!("other");
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    add(&source, other.build());
    let preparer = in_dir(source, &dir);
    prepared(&preparer, wanted("u1")).await;
    let second = ClaimRef {
        namespace: "ns".into(),
        name: "other".into(),
        uid: "u2".into(),
    };
    let err = preparer
        .prepare(&[second])
        .await
        .remove("u2")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/other: device node-a/dev-a is still prepared for claim ns/claim (uid \
         u1); it is released when that claim is unprepared"
    );
}

fn ipam_claim(name: &str, uid: &str, device: &str) -> ResourceClaim {
    let mut b = ClaimBuilder::new(name, uid)
        .allocated(&[("nic", DRIVER, device)])
        .config(
            "FromClaim",
            DRIVER,
            json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig", "ipam": {"network": "blue"}}),
        )
        .reserved_for(&[(&format!("{name}-pod"), &format!("{uid}-pod"))]);
    b.0["metadata"]["name"] = json!(name);
    b.build()
}

fn claim_ref(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

#[tokio::test]
async fn ipam_addresses_are_planned_checkpointed_and_released_by_unprepare() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, ipam_claim("a", "ua", "dev-a"));
    add(&source, ipam_claim("b", "ub", "dev-b"));
    add(&source, ipam_claim("c", "uc", "dev-a"));
    let book = Arc::new(crate::claims::ipam::memory::MemBook::default());
    // A /30 has two usable addresses.
    book.add_network(
        "blue",
        json!({"devices": {"deviceClassName": "knic.dev"}, "namespaces": {"names": ["ns"]},
               "ipam": {"subnets": [{"cidr": "192.0.2.0/30"}]}}),
    );
    let preparer = in_dir(source, &dir).with_address_book(book.clone(), "node-a");
    let out = preparer
        .prepare(&[claim_ref("a", "ua"), claim_ref("a", "ua")])
        .await;
    out["ua"].as_ref().unwrap();
    let prepared = preparer.claims().claim("ua").await.unwrap().unwrap();
    assert_eq!(
        prepared.allocations.len(),
        1,
        "a repeated prepare allocates once"
    );
    let address = prepared.allocations[0].address;
    assert_eq!(prepared.attachments[0].plan.addresses, [address]);
    // G1 through prepare: a hand-written claim's Network is its config's ipam.network.
    let plan = &prepared.attachments[0].plan;
    assert_eq!(
        (plan.network.as_deref(), plan.from_template),
        (Some("blue"), false)
    );
    assert_eq!(book.addresses(), [address.to_string()]);

    preparer.prepare(&[claim_ref("b", "ub")]).await["ub"]
        .as_ref()
        .unwrap();
    // The subnet is full now, and "c" also wants a device "a" holds: the exhaustion text
    // is the claim's error, and nothing stays allocated for it.
    let err = preparer.prepare(&[claim_ref("c", "uc")]).await["uc"]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/c: request nic: ipam.network: network blue: subnet 192.0.2.0/30 \
         has no free address (2 in use of 2)"
    );
    preparer
        .unprepare(&[claim_ref("b", "ub")])
        .await
        .remove("ub")
        .unwrap()
        .unwrap();
    assert_eq!(book.addresses(), [address.to_string()]);
    // Now an address is free but the device is busy: the allocation made for the failed
    // prepare is released again.
    let err = preparer.prepare(&[claim_ref("c", "uc")]).await["uc"]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("device node-a/dev-a is still prepared"),
        "{err}"
    );
    assert_eq!(book.addresses(), [address.to_string()]);

    // A fresh process releases from the checkpoint alone.
    let reloaded = Preparer::new(DRIVER, Arc::new(MemClaims::default()), store_in(&dir))
        .with_address_book(book.clone(), "node-a");
    reloaded
        .unprepare(&[claim_ref("a", "ua")])
        .await
        .remove("ua")
        .unwrap()
        .unwrap();
    assert!(book.addresses().is_empty());
    assert!(
        reloaded
            .claims()
            .snapshot()
            .await
            .unwrap()
            .claims
            .is_empty()
    );
}

#[tokio::test]
async fn ipam_without_an_address_book_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, ipam_claim("a", "ua", "dev-a"));
    let preparer = in_dir(source, &dir);
    let err = preparer.prepare(&[claim_ref("a", "ua")]).await["ua"]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/a: request nic: ipam.network: this driver runs without API access, \
         so it cannot allocate from network \"blue\""
    );
}

#[tokio::test]
async fn corrupt_checkpoint_refuses_work_until_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::claims::checkpoint::CheckpointStore::new(dir.path());
    std::fs::write(store.path(), b"{\"version\":1,\"crc32\":\"00").unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    let preparer = in_dir(source, &dir);
    let err = preparer
        .unprepare(&[wanted("u1")])
        .await
        .remove("u1")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(err.contains("is corrupt: the file is truncated"), "{err}");
    let err = preparer
        .prepare(&[wanted("u1")])
        .await
        .remove("u1")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prepare/unprepare are refused until it is repaired or removed"),
        "{err}"
    );
    assert!(
        store.path().exists(),
        "the corrupt file is kept for the operator"
    );
    // The operator removes it: the next call works without a restart.
    std::fs::remove_file(store.path()).unwrap();
    prepared(&preparer, wanted("u1")).await;
}

/// The error text prepare gave claim `u1`.
async fn prepare_error(preparer: &Preparer) -> String {
    match preparer.prepare(&[wanted("u1")]).await.remove("u1") {
        Some(Err(e)) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn results_this_node_must_not_act_on_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    let preparer = in_dir(source.clone(), &dir).with_pool("node-a");

    // Allocated in another node's pool: this node's dev-a must not go to that pod.
    let mut foreign = ClaimBuilder::new("claim", "u1")
        .allocated(&[("nic", DRIVER, "dev-a")])
        .reserved_for(&[("p", "pu")]);
    foreign.0["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("node-b");
    add(&source, foreign.build());
    assert_eq!(
        prepare_error(&preparer).await,
        "ResourceClaim ns/claim: request nic: device node-b/dev-a is in pool \"node-b\", not this \
         node's pool \"node-a\": the claim was allocated for another node"
    );

    // One device for two requests.
    add(
        &source,
        claim_u1(&[("nic", DRIVER, "dev-a"), ("second", DRIVER, "dev-a")]),
    );
    assert_eq!(
        prepare_error(&preparer).await,
        "ResourceClaim ns/claim: device dev-a is allocated twice (requests nic and second); a \
         device serves one request"
    );

    // A device this node does not publish.
    add(&source, claim_u1(&[("nic", DRIVER, "dev-z")]));
    assert_eq!(
        prepare_error(&preparer).await,
        "ResourceClaim ns/claim: request nic: device node-a/dev-z is not published by this node"
    );
    assert!(
        preparer
            .claims()
            .snapshot()
            .await
            .unwrap()
            .claims
            .is_empty()
    );
}

#[tokio::test]
async fn the_busy_check_is_on_the_device_whatever_the_pool_string() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    // No pool check configured (as before `with_pool`): the device alone decides.
    let preparer = in_dir(source.clone(), &dir);
    let mut other = ClaimBuilder::new("other", "u2")
        .allocated(&[("nic", DRIVER, "dev-a")])
        .reserved_for(&[("q", "qu")]);
    other.0["metadata"]["name"] = json!("other");
    add(&source, other.build());
    prepared(&preparer, claim_ref("other", "u2")).await;
    let mut renamed = ClaimBuilder::new("claim", "u1")
        .allocated(&[("nic", DRIVER, "dev-a")])
        .reserved_for(&[("p", "pu")]);
    renamed.0["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("another-pool");
    add(&source, renamed.build());
    let err = prepare_error(&preparer).await;
    assert!(
        err.starts_with(
            "ResourceClaim ns/claim: device another-pool/dev-a is still prepared for claim ns/other"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn prepare_is_refused_while_the_runtime_hooks_are_down() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    let (connected, hooks) = watch::channel(false);
    let preparer = in_dir(source, &dir)
        .with_runtime_hooks(hooks, "/run/nri/nri.sock")
        .waiting_for_runtime_hooks(Duration::from_millis(50));
    assert_eq!(
        prepare_error(&preparer).await,
        "knic is not connected to the container runtime's NRI socket /run/nri/nri.sock: a pod \
         started now would run without its interfaces, so prepare is refused until it reconnects \
         (the kubelet retries)"
    );
    assert!(
        preparer
            .claims()
            .snapshot()
            .await
            .unwrap()
            .claims
            .is_empty()
    );
    connected.send_replace(true);
    prepared(&preparer, wanted("u1")).await;
    // Already prepared: answered from the checkpoint even while disconnected (the CDI check
    // still holds its containers back).
    connected.send_replace(false);
    prepared(&preparer, wanted("u1")).await;
}

/// A runtime restarting (or knic reconnecting) while the kubelet prepares is waited for, not
/// refused: the real kubelet retries a refused prepare only at its next sync of the pod, a
/// minute or more later, while knic is back on the runtime within seconds.
#[tokio::test]
async fn prepare_waits_for_the_runtime_to_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    let (connected, hooks) = watch::channel(false);
    let preparer = in_dir(source, &dir).with_runtime_hooks(hooks, "/run/nri/nri.sock");
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        connected.send_replace(true);
        connected
    });
    let started = std::time::Instant::now();
    prepared(&preparer, wanted("u1")).await;
    assert!(
        started.elapsed() < super::RUNTIME_HOOKS_WAIT,
        "answered only after the whole wait"
    );
    drop(back.await.unwrap());
}

/// One call waits once: every claim of a call whose wait ran out is refused at once, so a
/// call of many claims answers within the kubelet's deadline (45 s) instead of one wait each.
#[tokio::test]
async fn one_prepare_call_waits_for_the_runtime_once() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    add(
        &source,
        ClaimBuilder::new("other", "u2")
            .allocated(&[("nic", DRIVER, "dev-b")])
            .reserved_for(&[("p2", "pu2")])
            .build(),
    );
    let (_connected, hooks) = watch::channel(false);
    let wait = Duration::from_secs(1);
    let preparer = in_dir(source, &dir)
        .with_runtime_hooks(hooks, "/run/nri/nri.sock")
        .waiting_for_runtime_hooks(wait);
    let other = ClaimRef {
        namespace: "ns".into(),
        name: "other".into(),
        uid: "u2".into(),
    };
    let started = std::time::Instant::now();
    let mut out = preparer.prepare(&[wanted("u1"), other]).await;
    let waited = started.elapsed();
    for uid in ["u1", "u2"] {
        let refusal = match out.remove(uid) {
            Some(Err(e)) => e.to_string(),
            other => panic!("{uid}: expected a refusal, got {other:?}"),
        };
        assert!(
            refusal.starts_with("knic is not connected to the container runtime's NRI socket"),
            "{uid}: {refusal}"
        );
    }
    // One wait per claim would be two seconds at least.
    assert!(
        waited >= wait && waited < 2 * wait,
        "two claims waited {waited:?}, not one wait of {wait:?}"
    );
}

#[tokio::test]
async fn prepared_devices_carry_a_cdi_device_whose_spec_lives_as_long_as_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    let cdi_dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(
        &source,
        claim_u1(&[("nic", DRIVER, "dev-a"), ("second", DRIVER, "dev-b")]),
    );
    let specs = crate::cdi::CdiSpecs::new(cdi_dir.path(), "/hook/knic-driver");
    let preparer = in_dir(source, &dir).with_cdi(specs.clone());
    let answer = prepared(&preparer, wanted("u1")).await;
    let ids: Vec<_> = answer.iter().map(|a| a.cdi_device_ids.clone()).collect();
    assert_eq!(
        ids,
        [
            vec!["knic.dev/interface=u1-0".to_string()],
            vec!["knic.dev/interface=u1-1".to_string()]
        ]
    );
    // A spec lost in a crash is written again by the kubelet's retry.
    std::fs::remove_file(specs.path("u1")).unwrap();
    prepared(&preparer, wanted("u1")).await;
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(specs.path("u1")).unwrap()).unwrap();
    assert_eq!(
        spec["devices"][1]["containerEdits"]["hooks"][0]["args"][5],
        "net2"
    );
    preparer
        .unprepare(&[wanted("u1")])
        .await
        .remove("u1")
        .unwrap()
        .expect("unprepared");
    assert!(!specs.path("u1").exists(), "the spec goes with the claim");
}

#[tokio::test]
async fn a_spec_that_cannot_be_written_leaves_the_claim_unprepared() {
    let dir = tempfile::tempdir().unwrap();
    let blocked = tempfile::NamedTempFile::new().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    // The CDI "directory" is a file: the spec cannot be written.
    let specs = crate::cdi::CdiSpecs::new(blocked.path().join("cdi"), "/hook");
    let preparer = in_dir(source, &dir).with_cdi(specs);
    let err = prepare_error(&preparer).await;
    assert!(err.starts_with("creating "), "{err}");
    // Nothing recorded: the kubelet's retry prepares from scratch (addresses of the failed
    // attempt are released as orphans, never left recorded and released at once).
    assert!(
        preparer
            .claims()
            .snapshot()
            .await
            .unwrap()
            .claims
            .is_empty()
    );
}

/// Issue 27: a second claim of the pod naming the first claim's VRF with another table fails
/// prepare, with the field and the first claim's interface in the text.
#[tokio::test]
async fn a_vrf_of_the_pod_with_another_table_is_refused_at_prepare() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    let vrf = |table: u32| {
        json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
               "vrf": {"name": "blue", "table": table}})
    };
    let first = ClaimBuilder::new("claim", "u1")
        .allocated(&[("nic", DRIVER, "dev-a")])
        .config("FromClaim", DRIVER, vrf(10))
        .reserved_for(&[("p", "pu")])
        .build();
    let mut second = ClaimBuilder::new("other", "u2")
        .allocated(&[("nic", DRIVER, "dev-b")])
        .config("FromClaim", DRIVER, vrf(11))
        .reserved_for(&[("p", "pu")]);
    second.0["metadata"]["name"] = json!("other");
    add(&source, first);
    add(&source, second.build());
    let preparer = in_dir(source, &dir);
    prepared(&preparer, wanted("u1")).await;
    let err = preparer
        .prepare(&[claim_ref("other", "u2")])
        .await
        .remove("u2")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/other: request nic: vrf.table: VRF blue is already used with table 10 \
         by another claim's net1 in this pod; one VRF has one table"
    );
}
