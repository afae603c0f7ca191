//! knic's NRI plugin end to end over a real Unix socket, against the in-process `TestRuntime`:
//! registration and subscription, chunked Synchronize, pod events through the dedicated RPCs and
//! through StateChange, handler errors reaching the runtime, reconnecting after a runtime
//! restart, and the shutdown watch. Plus the settings rules, with their exact messages.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knic_driver::BoxFuture;
use knic_driver::nri::mux::{self, Mux};
use knic_driver::nri::runtime::{Registered, TestRuntime};
use knic_driver::nri::ttrpc::{self, CallError, Client};
use knic_driver::nri::{self, NriHandler, NriSettings, PodSandbox};
use knic_proto::nri as api;
use knic_proto::ttrpc::Status;
use prost::Message;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const STEP: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<(&'static str, PodSandbox)>>,
    syncs: Mutex<Vec<Vec<PodSandbox>>>,
}

impl Recorder {
    fn record(&self, kind: &'static str, pod: PodSandbox) -> knic_driver::Result<()> {
        let fail = pod.uid.starts_with("bad-");
        self.events.lock().unwrap().push((kind, pod.clone()));
        if fail {
            return Err(knic_driver::Error::Nri(format!(
                "cannot {kind} pod {}: no such device",
                pod.uid
            )));
        }
        Ok(())
    }
    fn events(&self) -> Vec<(&'static str, PodSandbox)> {
        self.events.lock().unwrap().clone()
    }
    fn syncs(&self) -> Vec<Vec<PodSandbox>> {
        self.syncs.lock().unwrap().clone()
    }
}

impl NriHandler for Recorder {
    fn run_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async move { self.record("run", pod) })
    }
    fn stop_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async move { self.record("stop", pod) })
    }
    fn remove_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async move { self.record("remove", pod) })
    }
    fn synchronize(&self, pods: Vec<PodSandbox>) -> BoxFuture<'_, ()> {
        self.syncs.lock().unwrap().push(pods);
        Box::pin(async {})
    }
}

fn pod(n: u32, netns: bool) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{n}"),
        name: format!("pod-{n}"),
        uid: format!("uid-{n}"),
        namespace: "default".into(),
        netns: netns.then(|| PathBuf::from(format!("/var/run/netns/cni-{n}"))),
        ips: vec![format!("192.0.2.{n}")],
    }
}

fn settings(socket: &Path) -> NriSettings {
    NriSettings {
        socket: socket.to_owned(),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
        ..NriSettings::default()
    }
}

struct Plugin {
    handler: Arc<Recorder>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn start_plugin(socket: &Path) -> Plugin {
    let handler = Arc::new(Recorder::default());
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(nri::run(settings(socket), handler.clone(), rx));
    Plugin {
        handler,
        stop,
        task,
    }
}

impl Plugin {
    async fn shutdown(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(1), self.task)
            .await
            .expect("run() ends promptly when shutdown becomes true")
            .unwrap();
    }
}

async fn accept(rt: &mut TestRuntime, pods: Vec<PodSandbox>) -> Registered {
    tokio::time::timeout(STEP, rt.accept(pods))
        .await
        .expect("plugin connects and registers in time")
        .unwrap()
}

#[tokio::test]
async fn nri_plugin_registers_and_synchronizes_in_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let mut rt = TestRuntime::listen(&socket).await.unwrap();
    rt.set_sync_chunk_size(2);
    let plugin = start_plugin(&socket);

    let pods = vec![pod(1, true), pod(2, false), pod(3, true)];
    let reg = accept(&mut rt, pods.clone()).await;
    assert_eq!(
        reg,
        Registered {
            name: "knic".into(),
            index: "10".into(),
            events: 7,
            nri_version: "v0.12.0".into(),
        }
    );
    assert_eq!(rt.sync_messages(), 2, "3 pods at 2 per message");
    let syncs = plugin.handler.syncs();
    assert_eq!(syncs.len(), 1, "one synchronize call after the last chunk");
    assert_eq!(syncs[0], pods);
    assert_eq!(
        syncs[0][0].netns,
        Some(PathBuf::from("/var/run/netns/cni-1"))
    );
    assert_eq!(syncs[0][1].netns, None);
    assert_eq!(syncs[0][2].uid, "uid-3");

    // One pod per message (after a runtime restart): three messages, same result.
    rt.shutdown().await;
    rt.set_sync_chunk_size(1);
    accept(&mut rt, pods.clone()).await;
    assert_eq!(rt.sync_messages(), 3);
    assert_eq!(plugin.handler.syncs().last().unwrap(), &pods);

    // No pods at all: one empty message.
    rt.shutdown().await;
    accept(&mut rt, Vec::new()).await;
    assert_eq!(rt.sync_messages(), 1);
    assert!(plugin.handler.syncs().last().unwrap().is_empty());

    plugin.shutdown().await;
}

#[tokio::test]
async fn nri_plugin_pod_events_via_dedicated_rpcs_and_state_change() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let mut rt = TestRuntime::listen(&socket).await.unwrap();
    let plugin = start_plugin(&socket);
    accept(&mut rt, Vec::new()).await;

    let a = pod(1, true);
    rt.run_pod_sandbox(&a).await.unwrap();
    assert_eq!(rt.last_delivery().as_deref(), Some("RunPodSandbox"));
    rt.stop_pod_sandbox(&a).await.unwrap();
    assert_eq!(rt.last_delivery().as_deref(), Some("StopPodSandbox"));
    let a_removed = PodSandbox {
        netns: None,
        ..a.clone()
    };
    rt.remove_pod_sandbox(&a_removed).await.unwrap();
    assert_eq!(rt.last_delivery().as_deref(), Some("RemovePodSandbox"));

    rt.use_state_change(true);
    let b = pod(2, true);
    rt.run_pod_sandbox(&b).await.unwrap();
    assert_eq!(rt.last_delivery().as_deref(), Some("StateChange"));
    rt.stop_pod_sandbox(&b).await.unwrap();
    assert_eq!(rt.last_delivery().as_deref(), Some("StateChange"));
    rt.remove_pod_sandbox(&b).await.unwrap();
    assert_eq!(rt.last_delivery().as_deref(), Some("StateChange"));

    let events = plugin.handler.events();
    let seen: Vec<(&str, &str, Option<PathBuf>)> = events
        .iter()
        .map(|(k, p)| (*k, p.uid.as_str(), p.netns.clone()))
        .collect();
    let ns = |n: u32| Some(PathBuf::from(format!("/var/run/netns/cni-{n}")));
    assert_eq!(
        seen,
        [
            ("run", "uid-1", ns(1)),
            ("stop", "uid-1", ns(1)),
            ("remove", "uid-1", None),
            ("run", "uid-2", ns(2)),
            ("stop", "uid-2", ns(2)),
            ("remove", "uid-2", ns(2)),
        ]
    );
    assert_eq!(events[0].1, a, "every field arrives");
    assert_eq!(events[3].1, b);
    plugin.shutdown().await;
}

#[tokio::test]
async fn nri_plugin_handler_error_reaches_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let mut rt = TestRuntime::listen(&socket).await.unwrap();
    let plugin = start_plugin(&socket);
    accept(&mut rt, Vec::new()).await;

    let bad = PodSandbox {
        uid: "bad-1".into(),
        ..pod(9, true)
    };
    assert_eq!(
        rt.run_pod_sandbox(&bad).await.map_err(|e| e.to_string()),
        Err("cannot run pod bad-1: no such device".to_owned())
    );
    rt.use_state_change(true);
    assert_eq!(
        rt.stop_pod_sandbox(&bad).await.map_err(|e| e.to_string()),
        Err("cannot stop pod bad-1: no such device".to_owned())
    );
    // The connection survives a failed event.
    assert!(rt.is_connected());
    rt.use_state_change(false);
    rt.run_pod_sandbox(&pod(1, true)).await.unwrap();
    assert_eq!(plugin.handler.events().len(), 3);
    plugin.shutdown().await;
}

#[tokio::test]
async fn nri_plugin_reconnects_after_runtime_restart() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let mut rt = TestRuntime::listen(&socket).await.unwrap();
    let plugin = start_plugin(&socket);
    accept(&mut rt, vec![pod(1, true)]).await;
    rt.run_pod_sandbox(&pod(1, true)).await.unwrap();

    // Runtime goes down (Shutdown, connection and listener gone) and comes back on the same path.
    rt.shutdown().await;
    assert!(!rt.is_connected());
    assert!(rt.run_pod_sandbox(&pod(5, true)).await.is_err());
    drop(rt);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut rt = TestRuntime::listen(&socket).await.unwrap();
    let started = std::time::Instant::now();
    let reg = accept(&mut rt, vec![pod(1, true), pod(2, true)]).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((reg.name.as_str(), reg.events), ("knic", 7));
    let syncs = plugin.handler.syncs();
    assert_eq!(syncs.len(), 2, "synchronized again after reconnecting");
    assert_eq!(syncs[1], vec![pod(1, true), pod(2, true)]);
    rt.stop_pod_sandbox(&pod(2, true)).await.unwrap();
    let last = plugin.handler.events().pop().unwrap();
    assert_eq!((last.0, last.1.uid.as_str()), ("stop", "uid-2"));

    // The same TestRuntime can also restart in place: shutdown, then accept binds again.
    rt.shutdown().await;
    let reg = accept(&mut rt, Vec::new()).await;
    assert_eq!(reg.index, "10");
    assert_eq!(plugin.handler.syncs().len(), 3);
    plugin.shutdown().await;
}

#[tokio::test]
async fn nri_shutdown_watch_ends_run_while_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    // Nobody listens: run() is in its reconnect loop.
    let plugin = start_plugin(&dir.path().join("absent.sock"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!plugin.task.is_finished());
    plugin.shutdown().await;

    // A dropped sender also ends it, so the task cannot outlive its owner.
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(nri::run(
        settings(&dir.path().join("absent.sock")),
        Arc::new(Recorder::default()),
        rx,
    ));
    drop(stop);
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn nri_serve_once_returns_on_runtime_shutdown_and_connect_errors() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let err = nri::serve_once(&settings(&socket), &Arc::new(Recorder::default()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "connecting to the NRI socket {}:",
            socket.display()
        )),
        "{err}"
    );

    let mut rt = TestRuntime::listen(&socket).await.unwrap();
    let handler = Arc::new(Recorder::default());
    let once = {
        let (s, h) = (settings(&socket), handler.clone());
        tokio::spawn(async move { nri::serve_once(&s, &h).await })
    };
    accept(&mut rt, vec![pod(1, true)]).await;
    rt.shutdown().await;
    let ended = tokio::time::timeout(Duration::from_secs(2), once)
        .await
        .unwrap()
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(handler.syncs().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Hand-made peers, for what TestRuntime and knic's plugin never do on their own.

/// A runtime that accepts registration, to poke the plugin with arbitrary calls.
struct AcceptAll;

impl ttrpc::Service for AcceptAll {
    async fn call(&self, method: &str, _: &[u8]) -> Result<Vec<u8>, Status> {
        assert_eq!(method, "RegisterPlugin");
        Ok(Vec::new())
    }
}

#[tokio::test]
async fn nri_plugin_answers_unknown_methods_unimplemented_and_ignored_ones_empty() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let plugin = start_plugin(&socket);
    let (stream, _) = tokio::time::timeout(STEP, listener.accept())
        .await
        .unwrap()
        .unwrap();
    let mut mux = Mux::new(
        stream,
        &[mux::PLUGIN_SERVICE_CONN, mux::RUNTIME_SERVICE_CONN],
    );
    let runtime_side = mux.open(mux::RUNTIME_SERVICE_CONN).unwrap();
    tokio::spawn(async move {
        ttrpc::serve(runtime_side, nri::RUNTIME_SERVICE, Arc::new(AcceptAll)).await
    });
    let client = Client::new(mux.open(mux::PLUGIN_SERVICE_CONN).unwrap());
    let t = Duration::from_secs(2);

    let err = client
        .call(nri::PLUGIN_SERVICE, "Frobnicate", Vec::new(), t)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        CallError::Status {
            code: 12,
            message: "method Frobnicate".into()
        }
    );
    let err = client
        .call("nri.pkg.api.v1alpha1.Other", "Configure", Vec::new(), t)
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Status { code: 12, .. }), "{err}");
    for method in [
        "CreateContainer",
        "UpdateContainer",
        "StopContainer",
        "UpdatePodSandbox",
        "PostCreateContainer",
        "ValidateContainerAdjustment",
    ] {
        let reply = client
            .call(nri::PLUGIN_SERVICE, method, Vec::new(), t)
            .await
            .unwrap();
        assert!(reply.is_empty(), "{method}");
    }
    // Container events through StateChange are acknowledged and not passed to the handler.
    let evt = api::StateChangeEvent {
        event: api::Event::StartContainer as i32,
        pod: Some(pod(1, true).to_proto()),
        container: Some(api::Container {
            id: "c1".into(),
            pod_sandbox_id: "sandbox-1".into(),
            name: "app".into(),
        }),
    };
    client
        .call(nri::PLUGIN_SERVICE, "StateChange", evt.encode_to_vec(), t)
        .await
        .unwrap();
    // A request that does not decode is refused, not guessed at.
    let err = client
        .call(nri::PLUGIN_SERVICE, "RunPodSandbox", vec![0xff, 0xff], t)
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Status { code: 3, .. }), "{err}");
    assert!(plugin.handler.events().is_empty());

    // Shutdown ends the connection from the plugin's side.
    client
        .call(nri::PLUGIN_SERVICE, "Shutdown", Vec::new(), t)
        .await
        .unwrap();
    let err = client
        .call(nri::PLUGIN_SERVICE, "Frobnicate", Vec::new(), t)
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Closed | CallError::Io(_)), "{err}");
    plugin.shutdown().await;
}

/// A plugin built from the library's pieces that implements only StateChange (like NRI <= 0.11
/// stubs), and is slow to stop pods.
struct OldPlugin {
    seen: Mutex<Vec<String>>,
}

impl ttrpc::Service for OldPlugin {
    async fn call(&self, method: &str, payload: &[u8]) -> Result<Vec<u8>, Status> {
        match method {
            "Configure" => Ok(api::ConfigureResponse { events: 0 }.encode_to_vec()),
            "Synchronize" => Ok(Vec::new()),
            "StateChange" => {
                let evt = api::StateChangeEvent::decode(payload).unwrap();
                self.seen
                    .lock()
                    .unwrap()
                    .push(format!("StateChange/{}", evt.event));
                if evt.event == api::Event::StopPodSandbox as i32 {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Ok(Vec::new())
            }
            m => Err(ttrpc::status(
                ttrpc::code::UNIMPLEMENTED,
                format!("method {m}"),
            )),
        }
    }
}

#[tokio::test]
async fn nri_test_runtime_falls_back_to_state_change_and_enforces_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let mut rt = TestRuntime::listen(&socket).await.unwrap();
    rt.set_request_timeout(Duration::from_millis(200));

    let old = Arc::new(OldPlugin {
        seen: Mutex::new(Vec::new()),
    });
    let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let mut mux = Mux::new(
        stream,
        &[mux::PLUGIN_SERVICE_CONN, mux::RUNTIME_SERVICE_CONN],
    );
    let serving = {
        let conn = mux.open(mux::PLUGIN_SERVICE_CONN).unwrap();
        let old = old.clone();
        tokio::spawn(async move { ttrpc::serve(conn, nri::PLUGIN_SERVICE, old).await })
    };
    let client = Client::new(mux.open(mux::RUNTIME_SERVICE_CONN).unwrap());
    let register = nri::register_request("old-plugin", "05").encode_to_vec();
    let (reg, reply) = tokio::join!(
        rt.accept(Vec::new()),
        client.call(nri::RUNTIME_SERVICE, "RegisterPlugin", register, STEP)
    );
    reply.unwrap();
    let reg = reg.unwrap();
    assert_eq!(
        (reg.name.as_str(), reg.index.as_str(), reg.events),
        ("old-plugin", "05", 0)
    );

    // events = 0 subscribes to everything; RunPodSandbox is Unimplemented -> StateChange.
    rt.run_pod_sandbox(&pod(1, true)).await.unwrap();
    assert_eq!(rt.last_delivery().as_deref(), Some("StateChange"));
    assert_eq!(*old.seen.lock().unwrap(), ["StateChange/1"]);

    // Stop takes 500 ms > 200 ms: fatal, the runtime closes the plugin connection.
    let err = rt
        .stop_pod_sandbox(&pod(1, true))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("deadline exceeded"), "{err}");
    assert!(err.contains("connection was closed"), "{err}");
    tokio::time::timeout(Duration::from_secs(2), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn nri_settings_validation_names_the_setting() {
    let ok = NriSettings::default();
    assert_eq!(ok.socket, PathBuf::from("/var/run/nri/nri.sock"));
    assert_eq!(
        (ok.plugin_name.as_str(), ok.plugin_index.as_str()),
        ("knic", "10")
    );
    ok.validate().unwrap();

    let check = |s: NriSettings| s.validate().unwrap_err().to_string();
    for idx in ["7", "100", "1a", "", " 1", "١٢"] {
        assert_eq!(
            check(NriSettings {
                plugin_index: idx.into(),
                ..NriSettings::default()
            }),
            format!(
                "invalid setting nri-plugin-index: must be exactly two digits (00-99), got {idx:?}"
            )
        );
    }
    for idx in ["00", "99", "42"] {
        NriSettings {
            plugin_index: idx.into(),
            ..NriSettings::default()
        }
        .validate()
        .unwrap();
    }
    assert_eq!(
        check(NriSettings {
            plugin_name: "kn ic".into(),
            ..NriSettings::default()
        }),
        "invalid setting nri-plugin-name: must be one or more of the characters \
         [a-zA-Z0-9_.+-], got \"kn ic\""
    );
    for bad in ["", "knic/nri", "knïc"] {
        assert!(
            check(NriSettings {
                plugin_name: bad.into(),
                ..NriSettings::default()
            })
            .starts_with("invalid setting nri-plugin-name:")
        );
    }
    NriSettings {
        plugin_name: "knic_2.0+beta-1".into(),
        ..NriSettings::default()
    }
    .validate()
    .unwrap();
    assert_eq!(
        check(NriSettings {
            min_backoff: Duration::from_secs(10),
            ..NriSettings::default()
        }),
        "invalid setting nri-backoff: min_backoff (10s) must be above zero and at most \
         max_backoff (5s)"
    );
    assert!(
        check(NriSettings {
            min_backoff: Duration::ZERO,
            ..NriSettings::default()
        })
        .starts_with("invalid setting nri-backoff:")
    );

    // serve_once refuses before touching the socket.
    let dir = tempfile::tempdir().unwrap();
    let err = nri::serve_once(
        &NriSettings {
            plugin_index: "1".into(),
            ..settings(&dir.path().join("nri.sock"))
        },
        &Arc::new(Recorder::default()),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid setting nri-plugin-index"),
        "{err}"
    );
}
