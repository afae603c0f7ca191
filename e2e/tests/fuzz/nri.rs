//! Fuzz targets: the NRI multiplexer and ttrpc framing (the pure decoders) and the whole plugin
//! behind a socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use knic_driver::nri::mux::{self, Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use knic_driver::nri::{self, NriHandler, NriSettings, PodSandbox, ttrpc};
use knic_e2e::fuzz::{Rng, Settings, Verdict, mutate_bytes, run};
use prost::Message;

use super::describe;

fn pod(i: usize) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{i}"),
        name: format!("pod-{i}"),
        uid: format!("0000-{i}"),
        namespace: "default".into(),
        netns: Some(PathBuf::from(format!("/run/netns/knt-fuzz-{i}"))),
        ips: vec!["10.0.0.1".into()],
    }
}

/// Valid NRI requests as the runtime sends them on the plugin connection, one ttrpc frame each.
fn nri_request_frames() -> Vec<Vec<u8>> {
    use knic_proto::nri as api;
    let call = |id: u32, method: &str, payload: Vec<u8>| {
        let request = ttrpc::request(nri::PLUGIN_SERVICE, method, payload, Duration::from_secs(2));
        ttrpc::encode_request(id, &request).unwrap()
    };
    let configure = api::ConfigureRequest {
        runtime_name: "containerd".into(),
        runtime_version: "2.1".into(),
        ..Default::default()
    };
    let sync = api::SynchronizeRequest {
        pods: vec![pod(1).to_proto(), pod(2).to_proto()],
        more: true,
        ..Default::default()
    };
    let sync_last = api::SynchronizeRequest {
        pods: vec![pod(3).to_proto()],
        ..Default::default()
    };
    let run_pod = api::RunPodSandboxRequest {
        pod: Some(pod(1).to_proto()),
    };
    let stop_pod = api::StopPodSandboxRequest {
        pod: Some(pod(1).to_proto()),
    };
    let remove_pod = api::RemovePodSandboxRequest {
        pod: Some(pod(1).to_proto()),
    };
    let state = api::StateChangeEvent {
        event: api::Event::RunPodSandbox as i32,
        pod: Some(pod(2).to_proto()),
        ..Default::default()
    };
    vec![
        call(1, "Configure", configure.encode_to_vec()),
        call(3, "Synchronize", sync.encode_to_vec()),
        call(5, "Synchronize", sync_last.encode_to_vec()),
        call(7, "RunPodSandbox", run_pod.encode_to_vec()),
        call(9, "StopPodSandbox", stop_pod.encode_to_vec()),
        call(11, "RemovePodSandbox", remove_pod.encode_to_vec()),
        call(13, "StateChange", state.encode_to_vec()),
        call(15, "CreateContainer", Vec::new()),
        call(17, "NoSuchMethod", vec![1, 2, 3]),
    ]
}

/// A byte stream and the read sizes it arrives in (decoders must not care).
#[derive(Debug)]
struct Chunked {
    bytes: Vec<u8>,
    chunks: Vec<usize>,
}

fn chunked(rng: &mut Rng, corpus: &[Vec<u8>]) -> Chunked {
    let base = rng.pick(corpus).clone();
    let bytes = if rng.one_in(10) {
        base
    } else {
        mutate_bytes(rng, &base, corpus, 8)
    };
    let chunks = (0..rng.range(0, 6)).map(|_| rng.range(1, 4096)).collect();
    Chunked { bytes, chunks }
}

/// Splits `bytes` into the reads `chunks` describes (the rest in one piece).
fn reads(input: &Chunked) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = &input.bytes[..];
    for &n in &input.chunks {
        let (head, tail) = rest.split_at(n.min(rest.len()));
        out.push(head);
        rest = tail;
    }
    out.push(rest);
    out
}

fn mux_corpus() -> Vec<Vec<u8>> {
    let frames = nri_request_frames();
    let mut corpus = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        let mut out = Vec::new();
        let conn = [PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, 0, 7][i % 4];
        mux::encode(conn, frame, &mut out);
        corpus.push(out);
    }
    let mut all = Vec::new();
    for frame in &frames {
        // A ttrpc message split over two mux frames, as containerd does.
        let (a, b) = frame.split_at(frame.len() / 2);
        mux::encode(PLUGIN_SERVICE_CONN, a, &mut all);
        mux::encode(PLUGIN_SERVICE_CONN, b, &mut all);
    }
    corpus.push(all);
    corpus
}

pub(super) fn mux_target(settings: &Settings) -> Result<String, String> {
    let corpus = mux_corpus();
    let gen_corpus = corpus.clone();
    let summary = run(
        "mux_decoder",
        settings,
        move |rng: &mut Rng| chunked(rng, &gen_corpus),
        |input: &Chunked| {
            let mut decoder = mux::Decoder::new();
            let mut consumed = 0usize;
            let mut verdict = Verdict::Accepted;
            'reads: for read in reads(input) {
                decoder.push(read);
                loop {
                    match decoder.next_frame() {
                        Ok(Some(frame)) => {
                            if frame.payload.len() > mux::MAX_ACCEPTED_PAYLOAD {
                                return Err(format!(
                                    "frame of {} bytes over the limit",
                                    frame.payload.len()
                                ));
                            }
                            consumed += mux::HEADER_LEN + frame.payload.len();
                        }
                        Ok(None) => break,
                        Err(e) => {
                            if !e.to_string().contains("exceeds") {
                                return Err(format!("unexpected error text: {e}"));
                            }
                            verdict = Verdict::Refused;
                            break 'reads;
                        }
                    }
                }
            }
            if verdict == Verdict::Accepted && consumed + decoder.buffered() != input.bytes.len() {
                return Err(format!(
                    "bytes lost: {consumed} decoded + {} buffered != {} pushed",
                    decoder.buffered(),
                    input.bytes.len()
                ));
            }
            // Any payload survives encode + decode, whatever its size or content.
            let mut encoded = Vec::new();
            mux::encode(9, &input.bytes, &mut encoded);
            let mut round = mux::Decoder::new();
            round.push(&encoded);
            let mut back = Vec::new();
            while let Some(frame) = round.next_frame().map_err(|e| e.to_string())? {
                back.extend_from_slice(&frame.payload);
            }
            if back != input.bytes {
                return Err("encode/decode round trip changed the data".into());
            }
            Ok(verdict)
        },
    )?;
    Ok(describe(&summary))
}

fn ttrpc_corpus() -> Vec<Vec<u8>> {
    let frames = nri_request_frames();
    let mut corpus = frames.clone();
    corpus.push(frames.concat());
    let response = knic_proto::ttrpc::Response {
        status: Some(ttrpc::status(ttrpc::code::UNKNOWN, "no")),
        payload: vec![1, 2],
    };
    corpus.push(ttrpc::encode_response(1, &response).unwrap());
    corpus
}

pub(super) fn ttrpc_target(settings: &Settings) -> Result<String, String> {
    let corpus = ttrpc_corpus();
    let gen_corpus = corpus.clone();
    let summary = run(
        "ttrpc_decoder",
        settings,
        move |rng: &mut Rng| chunked(rng, &gen_corpus),
        |input: &Chunked| {
            use knic_proto::nri as api;
            let mut decoder = ttrpc::Decoder::new();
            let mut verdict = Verdict::Accepted;
            for read in reads(input) {
                decoder.push(read);
                while let Some(decoded) = decoder.next_frame() {
                    match decoded {
                        ttrpc::Decoded::Frame(frame) => {
                            if frame.data.len() > ttrpc::MAX_MESSAGE {
                                return Err(format!("{}-byte frame accepted", frame.data.len()));
                            }
                            // What the plugin and the client do with a frame's data.
                            if let Ok(request) = knic_proto::ttrpc::Request::decode(&frame.data[..])
                            {
                                let _ = api::SynchronizeRequest::decode(&request.payload[..]);
                                let _ = api::RunPodSandboxRequest::decode(&request.payload[..])
                                    .map(|r| r.pod.as_ref().map(PodSandbox::from_proto));
                                let _ = api::StateChangeEvent::decode(&request.payload[..]);
                            } else {
                                verdict = Verdict::Refused;
                            }
                            let _ = knic_proto::ttrpc::Response::decode(&frame.data[..]);
                        }
                        ttrpc::Decoded::Oversized { length, .. } => {
                            if length as usize <= ttrpc::MAX_MESSAGE {
                                return Err(format!("{length} bytes reported as oversized"));
                            }
                            verdict = Verdict::Refused;
                        }
                    }
                }
            }
            Ok(verdict)
        },
    )?;
    Ok(describe(&summary))
}

/// Counts events; never fails, so every error seen comes from decoding.
struct Quiet(AtomicU64);

impl NriHandler for Quiet {
    fn run_pod_sandbox(
        &self,
        _: PodSandbox,
    ) -> knic_driver::BoxFuture<'_, knic_driver::error::Result<()>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }
    fn stop_pod_sandbox(
        &self,
        _: PodSandbox,
    ) -> knic_driver::BoxFuture<'_, knic_driver::error::Result<()>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }
    fn remove_pod_sandbox(
        &self,
        _: PodSandbox,
    ) -> knic_driver::BoxFuture<'_, knic_driver::error::Result<()>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }
    fn synchronize(&self, _: Vec<PodSandbox>) -> knic_driver::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// What a fake runtime sends the real plugin: garbage on the plugin connection after a proper
/// registration, or a garbage answer to the registration itself.
#[derive(Debug)]
enum NriInput {
    Events(Chunked),
    Registration(Vec<u8>),
}

/// One connection of the real plugin (`nri::serve_once`) to a runtime sending `input`, then
/// closing: the plugin must end (either way) rather than hang or panic.
async fn nri_session(dir: &Path, input: &NriInput) -> Result<Verdict, String> {
    let socket = dir.join("nri.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| e.to_string())?;
    let settings = NriSettings {
        socket,
        ..Default::default()
    };
    let handler = Arc::new(Quiet(AtomicU64::new(0)));
    let plugin = tokio::spawn(async move { nri::serve_once(&settings, &handler).await });
    let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
    let mut trunk = Mux::new(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
    let plugin_conn = trunk.open(PLUGIN_SERVICE_CONN).unwrap();
    let runtime_conn = trunk.open(RUNTIME_SERVICE_CONN).unwrap();
    let (mut rx, runtime_writer) = runtime_conn.into_parts();
    // The plugin's RegisterPlugin call.
    let mut decoder = ttrpc::Decoder::new();
    let stream_id = loop {
        let bytes = rx.recv().await.ok_or("plugin closed before registering")?;
        decoder.push(&bytes);
        if let Some(ttrpc::Decoded::Frame(frame)) = decoder.next_frame() {
            break frame.stream_id;
        }
    };
    match input {
        NriInput::Registration(bytes) => {
            runtime_writer
                .send(bytes)
                .await
                .map_err(|e| e.to_string())?;
        }
        NriInput::Events(events) => {
            let ok = knic_proto::ttrpc::Response {
                status: None,
                payload: Vec::new(),
            };
            let reply = ttrpc::encode_response(stream_id, &ok).unwrap();
            runtime_writer
                .send(&reply)
                .await
                .map_err(|e| e.to_string())?;
            let writer = plugin_conn.writer();
            for read in reads(events) {
                // A Shutdown among the events ends the plugin early; later writes may fail.
                if writer.send(read).await.is_err() {
                    break;
                }
            }
        }
    }
    // Closing is how a runtime goes away; the plugin must notice and return.
    let _ = trunk.writer().shutdown().await;
    let ended = plugin.await.map_err(|e| format!("plugin task: {e}"))?;
    drop(trunk);
    Ok(match ended {
        Ok(()) => Verdict::Accepted,
        Err(e) if e.to_string().is_empty() => return Err("plugin error without text".into()),
        Err(_) => Verdict::Refused,
    })
}

pub(super) fn nri_plugin_target(settings: &Settings) -> Result<String, String> {
    let frames = nri_request_frames();
    let mut events = frames.clone();
    events.push(frames.concat());
    let replies = vec![
        ttrpc::encode_response(
            1,
            &knic_proto::ttrpc::Response {
                status: None,
                payload: Vec::new(),
            },
        )
        .unwrap(),
        ttrpc::encode_response(
            1,
            &knic_proto::ttrpc::Response {
                status: Some(ttrpc::status(ttrpc::code::INVALID_ARGUMENT, "refused")),
                payload: Vec::new(),
            },
        )
        .unwrap(),
    ];
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir_path = dir.path().to_path_buf();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let summary = run(
        "nri_plugin",
        settings,
        move |rng: &mut Rng| {
            if rng.one_in(5) {
                let base = rng.pick(&replies).clone();
                NriInput::Registration(mutate_bytes(rng, &base, &replies, 6))
            } else {
                NriInput::Events(chunked(rng, &events))
            }
        },
        move |input: &NriInput| runtime.block_on(nri_session(&dir_path, input)),
    )?;
    drop(dir);
    Ok(describe(&summary))
}
