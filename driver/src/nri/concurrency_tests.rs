//! The plugin service answering calls concurrently: the real `PluginService` behind the real
//! `ttrpc::serve`, fed raw frames (several per write, so the arrival order is exact) over an
//! in-memory trunk, with a handler whose calls can be held, slowed or made to panic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knic_proto::nri as api;
use knic_proto::ttrpc::Response;
use prost::Message;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use super::mux::{ConnWriter, Mux, PLUGIN_SERVICE_CONN};
use super::ttrpc::{self, Decoded, Decoder, MAX_IN_FLIGHT, code};
use super::{NriHandler, PLUGIN_SERVICE, PluginService, PodSandbox};
use crate::BoxFuture;
use crate::error::Result;

const STEP: Duration = Duration::from_secs(5);

/// Every call of pods named `held-*` waits for a permit of `gate`, of `slow-*` takes 200 ms;
/// `panic-*` panic in RunPodSandbox; every call logs its start and end.
struct Handler {
    log: Mutex<Vec<String>>,
    gate: Semaphore,
    started: AtomicUsize,
}

impl Default for Handler {
    fn default() -> Self {
        Handler {
            log: Mutex::default(),
            gate: Semaphore::new(0),
            started: AtomicUsize::new(0),
        }
    }
}

impl Handler {
    async fn event(&self, kind: &str, pod: PodSandbox) -> Result<()> {
        self.note(format!("start {kind} {}", pod.uid));
        self.started.fetch_add(1, Ordering::SeqCst);
        if pod.uid.starts_with("held-") {
            if let Ok(permit) = self.gate.acquire().await {
                permit.forget();
            }
        } else if pod.uid.starts_with("slow-") {
            tokio::time::sleep(Duration::from_millis(200)).await;
        } else if pod.uid.starts_with("panic-") && kind == "run" {
            panic!("no device for {}", pod.uid);
        }
        self.note(format!("end {kind} {}", pod.uid));
        Ok(())
    }

    fn note(&self, line: String) {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl NriHandler for Handler {
    fn run_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.event("run", pod))
    }
    fn stop_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.event("stop", pod))
    }
    fn remove_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.event("remove", pod))
    }
    fn synchronize(&self, pods: Vec<PodSandbox>) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.note(format!("sync {}", pods.len())) })
    }
}

/// The runtime's end of an in-memory trunk to a served plugin.
struct Peer {
    writer: ConnWriter,
    answers: mpsc::UnboundedReceiver<(u32, Response)>,
    next_stream: u32,
    handler: Arc<Handler>,
    served: JoinHandle<std::io::Result<()>>,
    _muxes: (Mux, Mux),
}

impl Peer {
    fn start() -> Peer {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut plugin_mux = Mux::new(a, &[PLUGIN_SERVICE_CONN]);
        let mut runtime_mux = Mux::new(b, &[PLUGIN_SERVICE_CONN]);
        let handler = Arc::new(Handler::default());
        let service = Arc::new(PluginService::new(handler.clone()));
        let plugin_conn = plugin_mux.open(PLUGIN_SERVICE_CONN).expect("plugin conn");
        let served =
            tokio::spawn(async move { ttrpc::serve(plugin_conn, PLUGIN_SERVICE, service).await });
        let (mut rx, writer) = runtime_mux
            .open(PLUGIN_SERVICE_CONN)
            .expect("runtime conn")
            .into_parts();
        let (tx, answers) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut decoder = Decoder::new();
            while let Some(bytes) = rx.recv().await {
                decoder.push(&bytes);
                while let Some(Decoded::Frame(frame)) = decoder.next_frame() {
                    let response = Response::decode(frame.data.as_slice()).expect("response");
                    let _ = tx.send((frame.stream_id, response));
                }
            }
        });
        Peer {
            writer,
            answers,
            next_stream: 1,
            handler,
            served,
            _muxes: (plugin_mux, runtime_mux),
        }
    }

    /// Sends the calls in one write, in this order; returns their stream ids.
    async fn send(&mut self, calls: Vec<(&str, Vec<u8>)>) -> Vec<u32> {
        let mut bytes = Vec::new();
        let mut ids = Vec::new();
        for (method, payload) in calls {
            let request = ttrpc::request(PLUGIN_SERVICE, method, payload, STEP);
            let id = self.next_stream;
            self.next_stream += 2;
            bytes.extend(ttrpc::encode_request(id, &request).expect("frame"));
            ids.push(id);
        }
        self.writer.send(&bytes).await.expect("send");
        ids
    }

    async fn answer(&mut self) -> (u32, Response) {
        tokio::time::timeout(STEP, self.answers.recv())
            .await
            .expect("an answer in time")
            .expect("connection open")
    }

    async fn no_answer_for(&mut self, wait: Duration) {
        if let Ok(answer) = tokio::time::timeout(wait, self.answers.recv()).await {
            panic!("unexpected answer {answer:?}");
        }
    }
}

fn pod(uid: &str) -> Option<api::PodSandbox> {
    Some(
        PodSandbox {
            id: format!("sandbox-{uid}"),
            uid: uid.to_owned(),
            name: uid.to_owned(),
            namespace: "default".into(),
            netns: Some(format!("/var/run/netns/{uid}").into()),
            ips: Vec::new(),
        }
        .to_proto(),
    )
}

fn run(uid: &str) -> (&'static str, Vec<u8>) {
    let req = api::RunPodSandboxRequest { pod: pod(uid) };
    ("RunPodSandbox", req.encode_to_vec())
}

fn stop_via_state_change(uid: &str) -> (&'static str, Vec<u8>) {
    let evt = api::StateChangeEvent {
        event: api::Event::StopPodSandbox as i32,
        pod: pod(uid),
        container: None,
    };
    ("StateChange", evt.encode_to_vec())
}

fn remove(uid: &str) -> (&'static str, Vec<u8>) {
    let req = api::RemovePodSandboxRequest { pod: pod(uid) };
    ("RemovePodSandbox", req.encode_to_vec())
}

fn ok(response: &Response) -> bool {
    response.status.as_ref().is_none_or(|s| s.code == code::OK)
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + STEP;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_second_pod_is_answered_while_the_first_is_held() {
    let mut peer = Peer::start();
    let ids = peer.send(vec![run("held-1"), run("b-2")]).await;
    let (id, answer) = peer.answer().await;
    assert_eq!(id, ids[1], "pod b-2 answered first");
    assert!(ok(&answer), "{answer:?}");
    until("held-1 started", || {
        peer.handler.started.load(Ordering::SeqCst) == 2
    })
    .await;
    let mut log = peer.handler.log();
    log.sort();
    assert_eq!(
        log,
        ["end run b-2", "start run b-2", "start run held-1"],
        "held-1 still running when b-2 was answered"
    );
    peer.handler.gate.add_permits(1);
    let (id, answer) = peer.answer().await;
    assert_eq!(id, ids[0]);
    assert!(ok(&answer), "{answer:?}");
    assert_eq!(peer.handler.log().last().unwrap(), "end run held-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_one_pods_run_stop_remove_stay_in_order_when_run_is_slow() {
    let mut peer = Peer::start();
    // Stop comes through StateChange: same pod, same queue, whichever RPC carried it. Another
    // pod's Run read after them is not held back by the slow one.
    let ids = peer
        .send(vec![
            run("held-1"),
            stop_via_state_change("held-1"),
            remove("held-1"),
            run("other-2"),
        ])
        .await;
    let (id, answer) = peer.answer().await;
    assert_eq!(id, ids[3], "other-2 answered while held-1's Run is held");
    assert!(ok(&answer), "{answer:?}");
    // held-1's Stop and Remove wait behind its Run, however long it takes.
    peer.no_answer_for(Duration::from_millis(100)).await;
    assert!(
        !peer
            .handler
            .log()
            .iter()
            .any(|l| l.starts_with("start stop")),
        "{:?}",
        peer.handler.log()
    );
    // One permit per event: a held pod's Stop and Remove wait at the gate too.
    peer.handler.gate.add_permits(3);
    let mut order = Vec::new();
    for _ in 0..3 {
        let (id, answer) = peer.answer().await;
        assert!(ok(&answer), "{answer:?}");
        order.push(id);
    }
    assert_eq!(order, ids[..3]);
    let held: Vec<String> = peer
        .handler
        .log()
        .into_iter()
        .filter(|l| l.ends_with("held-1"))
        .collect();
    assert_eq!(
        held,
        [
            "start run held-1",
            "end run held-1",
            "start stop held-1",
            "end stop held-1",
            "start remove held-1",
            "end remove held-1",
        ]
    );

    // A merely slow Run (no gate) keeps the order too.
    let ids = peer
        .send(vec![
            run("slow-3"),
            stop_via_state_change("slow-3"),
            remove("slow-3"),
        ])
        .await;
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(peer.answer().await.0);
    }
    assert_eq!(order, ids);
    let slow: Vec<String> = peer
        .handler
        .log()
        .into_iter()
        .filter(|l| l.ends_with("slow-3"))
        .collect();
    assert_eq!(
        slow,
        [
            "start run slow-3",
            "end run slow-3",
            "start stop slow-3",
            "end stop slow-3",
            "start remove slow-3",
            "end remove slow-3",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_requests_in_flight_are_bounded() {
    let mut peer = Peer::start();
    let calls = (0..=MAX_IN_FLIGHT)
        .map(|i| run(&format!("held-{i}")))
        .collect();
    let ids = peer.send(calls).await;
    let started = || peer.handler.started.load(Ordering::SeqCst);
    until("64 calls started", || started() == MAX_IN_FLIGHT).await;
    // The 65th is not even read while 64 are unanswered.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(peer.handler.started.load(Ordering::SeqCst), MAX_IN_FLIGHT);
    assert!(
        !peer
            .handler
            .log()
            .contains(&format!("start run held-{MAX_IN_FLIGHT}"))
    );
    peer.no_answer_for(Duration::from_millis(10)).await;
    // One answered frees one slot: the 65th starts.
    peer.handler.gate.add_permits(1);
    assert!(ok(&peer.answer().await.1));
    until("the 65th call started", || {
        peer.handler.started.load(Ordering::SeqCst) == MAX_IN_FLIGHT + 1
    })
    .await;
    peer.handler.gate.add_permits(MAX_IN_FLIGHT);
    let mut answered = vec![false; ids.len()];
    for _ in 0..MAX_IN_FLIGHT {
        let (id, answer) = peer.answer().await;
        assert!(ok(&answer), "{answer:?}");
        answered[ids.iter().position(|&i| i == id).unwrap()] = true;
    }
    assert_eq!(answered.iter().filter(|a| **a).count(), MAX_IN_FLIGHT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_a_panicking_call_is_answered_with_an_error_and_the_next_works() {
    let mut peer = Peer::start();
    let ids = peer.send(vec![run("panic-1")]).await;
    let (id, answer) = peer.answer().await;
    assert_eq!(id, ids[0]);
    let status = answer.status.expect("an error status");
    assert_eq!(status.code, code::INTERNAL);
    assert_eq!(
        status.message,
        "RunPodSandbox: the handler panicked: no device for panic-1"
    );
    // The same pod's queue and the connection both survive.
    let ids = peer.send(vec![run("ok-2"), remove("panic-1")]).await;
    let mut seen = HashMap::new();
    for _ in 0..2 {
        let (id, answer) = peer.answer().await;
        seen.insert(id, ok(&answer));
    }
    assert_eq!(seen, HashMap::from([(ids[0], true), (ids[1], true)]));
    assert!(!peer.served.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_synchronize_waits_for_earlier_events_and_holds_back_later_ones() {
    let mut peer = Peer::start();
    let sync = api::SynchronizeRequest {
        pods: vec![pod("a-9").unwrap_or_default()],
        containers: Vec::new(),
        more: false,
    };
    let ids = peer
        .send(vec![
            run("held-1"),
            ("Synchronize", sync.encode_to_vec()),
            run("b-2"),
        ])
        .await;
    // b-2 is another pod, yet it waits: it was read after Synchronize.
    until("held-1 started", || {
        peer.handler.started.load(Ordering::SeqCst) == 1
    })
    .await;
    peer.no_answer_for(Duration::from_millis(150)).await;
    assert_eq!(peer.handler.log(), ["start run held-1"]);
    peer.handler.gate.add_permits(1);
    let mut order = Vec::new();
    for _ in 0..3 {
        let (id, answer) = peer.answer().await;
        assert!(ok(&answer), "{answer:?}");
        order.push(id);
    }
    assert_eq!(order, ids);
    assert_eq!(
        peer.handler.log(),
        [
            "start run held-1",
            "end run held-1",
            "sync 1",
            "start run b-2",
            "end run b-2"
        ]
    );
}
