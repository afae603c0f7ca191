//! The ttrpc server: reads requests off one logical connection and answers them, several at a
//! time where the service allows it.
//!
//! Why concurrent at all: attaching a device takes milliseconds (the kernel's netns move alone
//! waits for an RCU grace period), so a server that answers one call at a time makes 16 pods
//! that start together wait for each other's attaches. ttrpc answers carry their stream id, so
//! answering out of order is legal, and the Go client matches answers by id.
//!
//! How much that buys depends on the runtime. containerd (`internal/nri/nri.go`: every hook
//! takes `local`'s mutex) and CRI-O (`internal/nri/nri.go`, the same design) serialise all NRI
//! calls node-wide, and the shared adaptation library does it again
//! (`containerd/nri` `pkg/adaptation`: `RunPodSandbox`, `StopPodSandbox`, `RemovePodSandbox` and
//! `StateChange` each hold the `Adaptation` mutex for the whole call to every plugin). Per-pod
//! locking was proposed (containerd/nri#165, open; PR #244, an opt-in `podLocker`, closed
//! without merge), so with today's runtimes at most one pod event reaches knic at a time and
//! knic's own latency per call is what pod start-up waits for. The concurrency here costs
//! nothing with them and pays off with a runtime that lets pods through in parallel.
//!
//! The order that matters is fixed when a request is read, never by task scheduling: each
//! request is classified by [`Service::order`]; requests with the same key go into one queue
//! that a single worker task drains in arrival order (and exits when it is empty), requests with
//! different keys run at once, and an [`Order::Exclusive`] request waits until nothing else is
//! in flight and holds back everything read after it until it is answered.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Mutex};

use knic_proto::ttrpc::{Request, Response, Status};
use prost::Message;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::{
    Decoded, Decoder, MAX_MESSAGE, Service, TYPE_REQUEST, code, encode_response, error_response,
    lock, status,
};
use crate::nri::mux::{ConnWriter, MuxConn};

/// Most requests read and not yet answered on one connection (queued ones included). When it is
/// reached the server stops reading, so a runtime that floods the connection is held back by the
/// socket instead of growing knic's memory. 64 is far above what a node starts at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// How a request may run relative to the others on its connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// Alone: after every earlier request is answered, and before any later one starts. For
    /// calls that change the connection's state (NRI's Configure, Synchronize, Shutdown).
    Exclusive,
    /// After every earlier request with the same key is answered, concurrently with requests
    /// with other keys (NRI: one pod's events, keyed by pod UID).
    Keyed(String),
    /// Whenever: no ordering against anything (calls that only acknowledge).
    Free,
}

/// Serves `service` (fully qualified name `service_name`) on a logical connection until the
/// connection closes or the service reports [`Service::finished`] after an exclusive call, with
/// at most [`MAX_IN_FLIGHT`] requests in flight. See the module documentation for the order.
///
/// When the connection closes, `serve` waits for the calls still running before it returns:
/// a pod event that was half-way through an attach finishes it, and whatever the caller does
/// next (reconnect, Synchronize) does not overlap it.
pub async fn serve<S: Service + 'static>(
    conn: MuxConn,
    service_name: &str,
    service: Arc<S>,
) -> io::Result<()> {
    serve_with_limit(conn, service_name, service, MAX_IN_FLIGHT).await
}

/// [`serve`] with another bound on the requests in flight (at least 1).
pub async fn serve_with_limit<S: Service + 'static>(
    conn: MuxConn,
    service_name: &str,
    service: Arc<S>,
    limit: usize,
) -> io::Result<()> {
    let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
    let all = u32::try_from(limit).unwrap_or(u32::MAX);
    let (mut rx, writer) = conn.into_parts();
    let shared = Arc::new(Shared {
        service,
        writer,
        queues: Mutex::new(HashMap::new()),
        write_error: Mutex::new(None),
        write_failed: Notify::new(),
    });
    let slots = Arc::new(Semaphore::new(limit));
    let mut decoder = Decoder::new();
    let ended = 'read: loop {
        let bytes = tokio::select! {
            bytes = rx.recv() => bytes,
            () = shared.write_failed.notified() => break 'read Ok(()),
        };
        let Some(bytes) = bytes else {
            break Ok(());
        };
        decoder.push(&bytes);
        while let Some(decoded) = decoder.next_frame() {
            let frame = match decoded {
                Decoded::Oversized {
                    stream_id,
                    kind,
                    length,
                } => {
                    if kind == TYPE_REQUEST {
                        let message = format!(
                            "message length {length} exceeds maximum message size of {MAX_MESSAGE}"
                        );
                        let answer = error_response(code::RESOURCE_EXHAUSTED, message);
                        shared.write(stream_id, &answer).await;
                    }
                    continue;
                }
                Decoded::Frame(frame) if frame.kind == TYPE_REQUEST => frame,
                Decoded::Frame(frame) => {
                    tracing::debug!(
                        stream = frame.stream_id,
                        kind = frame.kind,
                        "ignoring non-request ttrpc frame"
                    );
                    continue;
                }
            };
            let request = match Request::decode(frame.data.as_slice()) {
                Ok(request) if request.service == service_name => request,
                Ok(request) => {
                    let answer =
                        error_response(code::UNIMPLEMENTED, format!("service {}", request.service));
                    shared.write(frame.stream_id, &answer).await;
                    continue;
                }
                Err(e) => {
                    let answer =
                        error_response(code::INVALID_ARGUMENT, format!("bad request: {e}"));
                    shared.write(frame.stream_id, &answer).await;
                    continue;
                }
            };
            let order = shared.service.order(&request.method, &request.payload);
            if order == Order::Exclusive {
                // Every slot: waits for all calls in flight, and nothing starts meanwhile.
                let Ok(_all_slots) = slots.clone().acquire_many_owned(all).await else {
                    break 'read Ok(());
                };
                let answer = call(&shared.service, request).await;
                shared.write(frame.stream_id, &answer).await;
                if shared.service.finished() {
                    break 'read Ok(());
                }
                continue;
            }
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break 'read Ok(());
            };
            let job = Job {
                stream_id: frame.stream_id,
                request,
                _slot: slot,
            };
            match order {
                Order::Keyed(key) => shared.enqueue(key, job),
                _ => {
                    let shared = shared.clone();
                    tokio::spawn(async move { shared.run(job).await });
                }
            }
        }
    };
    // Let the calls in flight finish (their answers may no longer reach anyone).
    let _ = slots.acquire_many(all).await;
    match lock(&shared.write_error).take() {
        Some(e) => Err(e),
        None => ended,
    }
}

/// One request between being read and being answered; its slot is freed with it.
struct Job {
    stream_id: u32,
    request: Request,
    _slot: OwnedSemaphorePermit,
}

struct Shared<S> {
    service: Arc<S>,
    writer: ConnWriter,
    /// One entry per key with a worker running: the requests waiting behind its current one.
    queues: Mutex<HashMap<String, VecDeque<Job>>>,
    write_error: Mutex<Option<io::Error>>,
    write_failed: Notify,
}

impl<S: Service + 'static> Shared<S> {
    /// Appends `job` to its key's queue, starting the key's worker if none runs. Called by the
    /// reader only, so a key's jobs queue in the order they were read.
    fn enqueue(self: &Arc<Self>, key: String, job: Job) {
        let mut queues = lock(&self.queues);
        if let Some(queue) = queues.get_mut(&key) {
            queue.push_back(job);
            return;
        }
        queues.insert(key.clone(), VecDeque::from([job]));
        drop(queues);
        let shared = self.clone();
        tokio::spawn(async move { shared.drain(key).await });
    }

    /// A key's worker: runs its jobs one after the other; removes the key (under the same lock
    /// `enqueue` takes) when nothing is left, so a job is never stranded.
    async fn drain(self: Arc<Self>, key: String) {
        loop {
            let job = {
                let mut queues = lock(&self.queues);
                let Some(queue) = queues.get_mut(&key) else {
                    return;
                };
                match queue.pop_front() {
                    Some(job) => job,
                    None => {
                        queues.remove(&key);
                        return;
                    }
                }
            };
            self.run(job).await;
        }
    }

    async fn run(&self, job: Job) {
        let answer = call(&self.service, job.request).await;
        self.write(job.stream_id, &answer).await;
    }

    /// Writes one answer (a single write, so concurrent answers never interleave mid-frame). A
    /// failed write means the trunk is broken: remembered for `serve` to return, and the reader
    /// is woken to stop.
    async fn write(&self, stream_id: u32, response: &Response) {
        let bytes = match encode_response(stream_id, response) {
            Some(bytes) => bytes,
            None => encode_response(
                stream_id,
                &error_response(code::RESOURCE_EXHAUSTED, "response too large"),
            )
            .unwrap_or_default(),
        };
        if let Err(e) = self.writer.send(&bytes).await {
            let mut slot = lock(&self.write_error);
            if slot.is_none() {
                *slot = Some(e);
            }
            drop(slot);
            self.write_failed.notify_one();
        }
    }
}

/// Runs one call in a task of its own, so a panicking handler fails only its own call: it is
/// answered with Internal and the connection keeps serving.
async fn call<S: Service + 'static>(service: &Arc<S>, request: Request) -> Response {
    let method = request.method.clone();
    let service = service.clone();
    let outcome =
        tokio::spawn(async move { service.call(&request.method, &request.payload).await }).await;
    let result = match outcome {
        Ok(result) => result,
        Err(e) => {
            let why = if e.is_panic() {
                let payload = e.into_panic();
                let text = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".to_owned());
                format!("{method}: the handler panicked: {text}")
            } else {
                format!("{method}: the handler was cancelled")
            };
            tracing::error!(method = %method, error = %why, "ttrpc call failed");
            Err(status(code::INTERNAL, why))
        }
    };
    match result {
        // Success carries no status at all, exactly as containerd's replies in the transcript.
        Ok(payload) => Response {
            status: None,
            payload,
        },
        Err(status) => error_status(status),
    }
}

fn error_status(status: Status) -> Response {
    Response {
        status: Some(status),
        payload: Vec::new(),
    }
}
