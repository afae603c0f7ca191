//! The kubelet's DRA calls over a real gRPC socket, with a client keeping the kubelet's 4 MiB
//! message limit: one claim's huge error is that claim's (cut) error and never fails the call,
//! and claim references that are not DNS names are refused before any API request.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::{Device, ResourceClaim};
use knic_driver::BoxFuture;
use knic_driver::claims::checkpoint::CheckpointStore;
use knic_driver::claims::{ClaimSource, ClaimStore, Preparer};
use knic_driver::kubelet::{self, DraService, MAX_CLAIM_ERROR_BYTES};
use knic_proto::dra::{v1, v1beta1};
use serde_json::json;
use tokio::sync::watch;

const DRIVER: &str = "knic.dev";
/// The kubelet's (and tonic's default) limit on a received message.
const KUBELET_MESSAGE_LIMIT: usize = 4 * 1024 * 1024;

/// Claims by name, counting every API read.
#[derive(Default)]
struct MemClaims {
    claims: Mutex<HashMap<String, ResourceClaim>>,
    gets: Mutex<Vec<(String, String)>>,
}

impl ClaimSource for MemClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, knic_driver::Result<Option<ResourceClaim>>> {
        Box::pin(async move {
            self.gets
                .lock()
                .unwrap()
                .push((namespace.to_owned(), name.to_owned()));
            Ok(self.claims.lock().unwrap().get(name).cloned())
        })
    }
}

/// An allocated claim for one device of this node, with `params` as its config.
fn claim(name: &str, uid: &str, device: &str, params: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": DRIVER, "pool": "node-a", "device": device}],
                "config": [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}],
            }},
            "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"), "uid": format!("pod-{uid}")}],
        },
    }))
    .unwrap()
}

fn valid_config() -> serde_json::Value {
    json!({"apiVersion": knic_proto::netconfig::API_VERSION, "kind": "NetworkConfig",
           "addresses": ["192.0.2.10/24"]})
}

/// A config whose 20 addresses (as many problems as a config error lists) are each a 300 KB
/// invalid value echoed in its problem: the full error text is about 6 MB, over the kubelet's
/// 4 MiB message limit.
fn huge_invalid_config() -> serde_json::Value {
    let bad: Vec<String> = (0..20)
        .map(|i| format!("not-an-address-{i}-{}", "x".repeat(300_000)))
        .collect();
    json!({"apiVersion": knic_proto::netconfig::API_VERSION, "kind": "NetworkConfig",
           "addresses": bad})
}

struct Served {
    source: Arc<MemClaims>,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _server: tokio::task::JoinHandle<()>,
}

/// Serves both DRA versions from one preparer on a socket in a temporary directory.
async fn serve(claims: Vec<ResourceClaim>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    for c in claims {
        let name = c.metadata.name.clone().unwrap();
        source.claims.lock().unwrap().insert(name, c);
    }
    let devices: Vec<Device> = ["dev-a", "dev-b"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            serde_json::from_value(
                json!({"name": name, "attributes": {"ifName": {"string": format!("eth{i}")}}}),
            )
            .unwrap()
        })
        .collect();
    let store = Arc::new(ClaimStore::open(CheckpointStore::new(
        dir.path().join("plugin"),
    )));
    let preparer =
        Preparer::new(DRIVER, source.clone(), store).with_devices(watch::channel(devices).1);
    let service = DraService::new(Arc::new(preparer));
    let socket = dir.path().join("dra.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(service.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(service))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener));
    let server = tokio::spawn(async move {
        server.await.unwrap();
    });
    Served {
        source,
        socket,
        _dir: dir,
        _server: server,
    }
}

fn v1_claim(namespace: &str, name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// The numbers of the cut marker `… (N more problems, M more bytes cut)` at the end of `text`.
fn cut_bytes(text: &str) -> usize {
    let tail = text.rsplit(", ").next().unwrap();
    tail.strip_suffix(" more bytes cut)")
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_claim_with_a_huge_error_is_cut_and_the_others_are_prepared() {
    let served = serve(vec![
        claim("huge", "uid-huge", "dev-a", huge_invalid_config()),
        claim("good", "uid-good", "dev-b", valid_config()),
    ])
    .await;
    let channel = kubelet::dial(&served.socket).await.unwrap();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(channel.clone())
        .max_decoding_message_size(KUBELET_MESSAGE_LIMIT);
    let answer = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![
                v1_claim("ns", "huge", "uid-huge"),
                v1_claim("ns", "good", "uid-good"),
            ],
        })
        .await
        .expect("the RPC must succeed whatever one claim's error is")
        .into_inner();

    let huge = &answer.claims["uid-huge"];
    eprintln!(
        "{} … {}",
        &huge.error[..300],
        &huge.error[huge.error.len() - 300..]
    );
    assert!(huge.devices.is_empty());
    assert!(
        huge.error.len() <= MAX_CLAIM_ERROR_BYTES,
        "{} bytes",
        huge.error.len()
    );
    assert!(
        huge.error.starts_with("ResourceClaim ns/huge: "),
        "{}",
        &huge.error[..200]
    );
    assert!(
        huge.error.contains("not-an-address-0"),
        "the first problems are kept"
    );
    assert!(huge.error.ends_with(" more bytes cut)"), "{}", huge.error);
    assert!(huge.error.contains(" more problems, "), "{}", huge.error);
    // What was cut is what would have broken the kubelet's limit.
    assert!(
        huge.error.len() + cut_bytes(&huge.error) > KUBELET_MESSAGE_LIMIT,
        "the fixture must produce an error over 4 MiB"
    );

    let good = &answer.claims["uid-good"];
    assert_eq!(good.error, "");
    assert_eq!(good.devices.len(), 1);
    assert_eq!(good.devices[0].device_name, "dev-b");

    // The same through v1beta1 (the huge claim is retried; the good one answers from the
    // checkpoint).
    let mut old = v1beta1::dra_plugin_client::DraPluginClient::new(channel)
        .max_decoding_message_size(KUBELET_MESSAGE_LIMIT);
    let answer = old
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![
                v1beta1::Claim {
                    namespace: "ns".into(),
                    name: "huge".into(),
                    uid: "uid-huge".into(),
                },
                v1beta1::Claim {
                    namespace: "ns".into(),
                    name: "good".into(),
                    uid: "uid-good".into(),
                },
            ],
        })
        .await
        .expect("the v1beta1 RPC must succeed too")
        .into_inner();
    assert!(answer.claims["uid-huge"].error.len() <= MAX_CLAIM_ERROR_BYTES);
    assert!(
        answer.claims["uid-huge"]
            .error
            .ends_with(" more bytes cut)")
    );
    assert_eq!(answer.claims["uid-good"].error, "");
    assert_eq!(answer.claims["uid-good"].devices.len(), 1);
}

#[tokio::test]
async fn claim_references_that_are_not_dns_names_are_refused_before_any_api_request() {
    let served = serve(vec![claim("good", "uid-good", "dev-a", valid_config())]).await;
    let channel = kubelet::dial(&served.socket).await.unwrap();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(channel);
    let long = "n".repeat(100_000);
    let answer = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![
                v1_claim("Bad_NS", "good", "uid-1"),
                v1_claim("ns", "../../secrets/x", "uid-2"),
                v1_claim("ns/../kube-system", "good", "uid-3"),
                v1_claim("ns", &long, "uid-4"),
                v1_claim("ns", "good", "uid-good"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let error = |uid: &str| answer.claims[uid].error.clone();
    let label_rule = "must be a DNS label (RFC 1123): 1 to 63 lower-case letters, digits and \
                      '-', starting and ending with a letter or digit";
    assert_eq!(
        error("uid-1"),
        format!("claims[0]: namespace \"Bad_NS\": {label_rule}")
    );
    assert_eq!(
        error("uid-2"),
        "claims[1]: name \"../../secrets/x\": must be a DNS subdomain (RFC 1123): \
         \"../../secrets/x\" is not a DNS subdomain: lower-case letters, digits, '-' and '.', \
         each part starting and ending with a letter or digit"
    );
    assert_eq!(
        error("uid-3"),
        format!("claims[2]: namespace \"ns/../kube-system\": {label_rule}")
    );
    let e4 = error("uid-4");
    assert!(e4.len() < 1024, "{} bytes", e4.len());
    assert!(
        e4.starts_with(&format!(
            "claims[3]: name \"{}\"… (99744 more bytes cut): must be a DNS subdomain (RFC \
             1123): must be 1 to 253 characters, got 100000",
            "n".repeat(256)
        )),
        "{e4}"
    );
    for uid in ["uid-1", "uid-2", "uid-3", "uid-4"] {
        assert!(answer.claims[uid].devices.is_empty(), "{uid}");
    }
    assert_eq!(error("uid-good"), "");
    assert_eq!(answer.claims["uid-good"].devices.len(), 1);
    // Only the valid claim was read from the API.
    assert_eq!(
        *served.source.gets.lock().unwrap(),
        vec![("ns".to_owned(), "good".to_owned())]
    );

    // Unprepare refuses the same references with the same rules.
    let answer = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim("ns", "../x", "uid-2")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer.claims["uid-2"]
            .error
            .starts_with("claims[0]: name \"../x\": must be a DNS subdomain"),
        "{}",
        answer.claims["uid-2"].error
    );
}
