//! NRI wire compatibility, checked against every frame a real containerd 2.3.4 (NRI 0.12)
//! exchanged with a plugin (`fixtures/nri/`): the multiplexer and ttrpc decoders reassemble the
//! stream, each message decodes with knic's `.proto` types into the values containerd sent, knic
//! encodes the same bytes where it says the same thing, and a live knic plugin fed containerd's
//! bytes answers with exactly the bytes the real plugin answered with.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knic_driver::BoxFuture;
use knic_driver::nri::mux::{self, Mux};
use knic_driver::nri::ttrpc::{self, Decoded};
use knic_driver::nri::{self, NriHandler, NriSettings, PodSandbox};
use knic_proto::nri as api;
use knic_proto::ttrpc::{Request, Response, Status};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TRANSCRIPT: &str = include_str!("fixtures/nri/containerd-2.3.4-nri-0.12-transcript.txt");
const RUN_UID: &str = "80120ff0-7872-4d62-aaa0-9f1b9013ec47";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToRuntime,
    ToPlugin,
}

#[derive(Debug)]
struct Line {
    dir: Dir,
    conn: u32,
    payload: Vec<u8>,
}

impl Line {
    /// The mux frame as it crossed the socket.
    fn frame(&self) -> Vec<u8> {
        let mut out = self.conn.to_be_bytes().to_vec();
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.payload);
        out
    }
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn transcript() -> Vec<Line> {
    TRANSCRIPT
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(parts.len(), 4, "{l}");
            let dir = match parts[0] {
                "plugin->runtime" => Dir::ToRuntime,
                "runtime->plugin" => Dir::ToPlugin,
                other => panic!("direction {other}"),
            };
            let conn = parts[1].strip_prefix("conn=").unwrap().parse().unwrap();
            let len: usize = parts[2].strip_prefix("len=").unwrap().parse().unwrap();
            let payload = hex(parts[3]);
            assert_eq!(payload.len(), len, "{l}");
            Line { dir, conn, payload }
        })
        .collect()
}

/// One decoded ttrpc frame with where it came from.
struct Msg {
    dir: Dir,
    conn: u32,
    frame: ttrpc::Frame,
    /// How many mux frames carried it (counting the one that completed it).
    mux_frames: usize,
}

/// Feeds each direction's bytes through the mux decoder and each (direction, conn) stream through
/// its own ttrpc decoder, exactly as the plugin's reader does.
fn decode_all(lines: &[Line]) -> Vec<Msg> {
    let mut mux_dec = [mux::Decoder::new(), mux::Decoder::new()];
    let mut streams: Vec<((Dir, u32), ttrpc::Decoder, usize)> = Vec::new();
    let mut out = Vec::new();
    for line in lines {
        let d = &mut mux_dec[line.dir as usize];
        d.push(&line.frame());
        let frame = d.next_frame().unwrap().unwrap();
        assert!(d.next_frame().unwrap().is_none());
        assert_eq!((frame.conn, &frame.payload), (line.conn, &line.payload));
        let key = (line.dir, frame.conn);
        let idx = match streams.iter().position(|(k, _, _)| *k == key) {
            Some(i) => i,
            None => {
                streams.push((key, ttrpc::Decoder::new(), 0));
                streams.len() - 1
            }
        };
        let (_, dec, pending) = &mut streams[idx];
        dec.push(&frame.payload);
        *pending += 1;
        while let Some(decoded) = dec.next_frame() {
            let Decoded::Frame(f) = decoded else {
                panic!("oversized frame in transcript")
            };
            out.push(Msg {
                dir: line.dir,
                conn: line.conn,
                frame: f,
                mux_frames: *pending,
            });
            *pending = 0;
        }
    }
    for (key, dec, pending) in &mut streams {
        assert!(dec.next_frame().is_none(), "{key:?}");
        assert_eq!(*pending, 0, "{key:?} ends with a partial message");
    }
    out
}

fn request(msg: &Msg) -> Request {
    assert_eq!(msg.frame.kind, ttrpc::TYPE_REQUEST);
    Request::decode(msg.frame.data.as_slice()).unwrap()
}

fn response(msg: &Msg) -> Response {
    assert_eq!(msg.frame.kind, ttrpc::TYPE_RESPONSE);
    Response::decode(msg.frame.data.as_slice()).unwrap()
}

fn event_pod(req: &Request) -> PodSandbox {
    let pod = match req.method.as_str() {
        "RunPodSandbox" => {
            api::RunPodSandboxRequest::decode(req.payload.as_slice())
                .unwrap()
                .pod
        }
        "StopPodSandbox" => {
            api::StopPodSandboxRequest::decode(req.payload.as_slice())
                .unwrap()
                .pod
        }
        "RemovePodSandbox" => {
            api::RemovePodSandboxRequest::decode(req.payload.as_slice())
                .unwrap()
                .pod
        }
        other => panic!("{other}"),
    };
    PodSandbox::from_proto(&pod.unwrap())
}

#[test]
fn nri_transcript_decodes_every_message() {
    let lines = transcript();
    assert_eq!(lines.len(), 13);
    let msgs = decode_all(&lines);
    assert_eq!(msgs.len(), 12, "6 calls, 6 answers");

    // --- conn 2: the plugin's RegisterPlugin call and containerd's answer.
    let on = |dir, conn| -> Vec<&Msg> {
        msgs.iter()
            .filter(|m| m.dir == dir && m.conn == conn)
            .collect()
    };
    let reg = on(Dir::ToRuntime, 2);
    assert_eq!(reg.len(), 1);
    assert_eq!(reg[0].frame.stream_id, 1);
    let req = request(reg[0]);
    assert_eq!(req.service, nri::RUNTIME_SERVICE);
    assert_eq!(req.method, "RegisterPlugin");
    assert!(req.timeout_nano > 4_000_000_000 && req.timeout_nano <= 5_000_000_000);
    let r = api::RegisterPluginRequest::decode(req.payload.as_slice()).unwrap();
    assert_eq!(
        (
            r.plugin_name.as_str(),
            r.plugin_idx.as_str(),
            r.nri_version.as_str()
        ),
        ("harness-echo", "10", "v0.12.0")
    );
    let reg_reply = on(Dir::ToPlugin, 2);
    assert_eq!(reg_reply.len(), 1);
    assert_eq!(reg_reply[0].frame.stream_id, 1);
    assert!(
        reg_reply[0].frame.data.is_empty(),
        "success = no status, empty payload"
    );
    let resp = response(reg_reply[0]);
    assert_eq!(resp.status, None);
    api::Empty::decode(resp.payload.as_slice()).unwrap();

    // --- conn 1: containerd's calls, in order, on odd stream ids.
    let calls = on(Dir::ToPlugin, 1);
    let methods: Vec<String> = calls.iter().map(|m| request(m).method).collect();
    assert_eq!(
        methods,
        [
            "Configure",
            "Synchronize",
            "RunPodSandbox",
            "StopPodSandbox",
            "RemovePodSandbox"
        ]
    );
    let ids: Vec<u32> = calls.iter().map(|m| m.frame.stream_id).collect();
    assert_eq!(ids, [1, 3, 5, 7, 9]);
    for call in &calls {
        let req = request(call);
        assert_eq!(req.service, nri::PLUGIN_SERVICE);
        assert!(
            req.timeout_nano > 0 && req.timeout_nano <= 2_000_000_000,
            "{}",
            req.method
        );
    }

    let cfg = api::ConfigureRequest::decode(request(calls[0]).payload.as_slice()).unwrap();
    assert_eq!(cfg.runtime_name, "containerd");
    assert_eq!(cfg.runtime_version, "v2.3.4");
    assert_eq!(cfg.registration_timeout, 5000);
    assert_eq!(cfg.request_timeout, 2000);
    assert_eq!(cfg.nri_version, "v0.12.0");
    assert_eq!(cfg.config, "");

    // Synchronize: 17,860 bytes of ttrpc data + header, reassembled from two mux frames.
    assert_eq!(calls[1].frame.data.len(), 17_860);
    assert_eq!(calls[1].mux_frames, 2);
    assert_eq!(lines[4].payload.len(), 4096);
    assert_eq!(lines[5].payload.len(), 13_774);
    let sync = api::SynchronizeRequest::decode(request(calls[1]).payload.as_slice()).unwrap();
    assert_eq!(sync.pods.len(), 14);
    assert!(sync.containers.is_empty());
    assert!(!sync.more);
    let pods: Vec<PodSandbox> = sync.pods.iter().map(PodSandbox::from_proto).collect();
    for pod in &pods {
        assert_eq!(pod.netns, None, "stopped sandbox {} has no netns", pod.name);
        assert_eq!(pod.namespace, "default");
        assert_eq!(pod.uid.len(), 36);
        assert_eq!(pod.id.len(), 64);
    }
    assert_eq!(pods[0].name, "base-7");
    assert_eq!(pods[0].uid, "f6602c18-5500-4bed-aa83-c434a4943ffb");
    assert_eq!(pods.iter().filter(|p| p.name == "dra-pod-netns").count(), 6);
    // The non-network namespaces are there, just no "network" one.
    let kinds: Vec<&str> = sync.pods[0]
        .linux
        .as_ref()
        .unwrap()
        .namespaces
        .iter()
        .map(|n| n.r#type.as_str())
        .collect();
    assert_eq!(kinds, ["pid", "ipc", "uts", "mount"]);

    let run = event_pod(&request(calls[2]));
    let netns = run.netns.clone().unwrap();
    assert!(
        netns.to_str().unwrap().starts_with("/var/run/netns/cni-"),
        "{netns:?}"
    );
    assert_eq!(
        netns,
        PathBuf::from("/var/run/netns/cni-e5725692-600a-9c4c-66f2-3b7b77d01b8a")
    );
    assert_eq!(run.ips, ["192.0.2.2"]);
    assert_eq!(run.uid, RUN_UID);
    assert_eq!(
        (run.name.as_str(), run.namespace.as_str()),
        ("dra-pod-netns", "default")
    );
    assert_eq!(
        run.id,
        "4f99753cccb9c6274a5b25c6620d18ecee0cea23615c1f2ac49c664d0e5e7302"
    );
    let run_req = request(calls[2]);
    assert_eq!(run_req.metadata.len(), 1);
    assert_eq!(
        (
            run_req.metadata[0].key.as_str(),
            run_req.metadata[0].value.as_str()
        ),
        ("containerd-namespace-ttrpc", "k8s.io")
    );

    let stop = event_pod(&request(calls[3]));
    assert_eq!(stop.uid, RUN_UID);
    assert_eq!(
        stop.netns, run.netns,
        "StopPodSandbox still carries the netns"
    );

    let remove = event_pod(&request(calls[4]));
    assert_eq!(remove.uid, RUN_UID);
    assert_eq!(remove.netns, None, "RemovePodSandbox carries no netns");
    assert_eq!(remove.ips, ["192.0.2.2"]);

    // --- conn 1: the plugin's answers, same stream ids.
    let answers = on(Dir::ToRuntime, 1);
    let ids: Vec<u32> = answers.iter().map(|m| m.frame.stream_id).collect();
    assert_eq!(ids, [1, 3, 5, 7, 9]);
    let answers: Vec<Response> = answers.iter().map(|m| response(m)).collect();
    assert!(answers.iter().all(|r| r.status.is_none()));
    let cfg_reply = api::ConfigureResponse::decode(answers[0].payload.as_slice()).unwrap();
    assert_eq!(cfg_reply.events, 7);
    assert_eq!(cfg_reply.events, nri::SUBSCRIBED_EVENTS);
    let sync_reply = api::SynchronizeResponse::decode(answers[1].payload.as_slice()).unwrap();
    assert!(!sync_reply.more);
    for r in &answers[1..] {
        assert!(r.payload.is_empty());
        api::Empty::decode(r.payload.as_slice()).unwrap();
    }
}

#[test]
fn nri_transcript_bytes_match_knic_encoding() {
    let lines = transcript();
    let msgs = decode_all(&lines);

    // The RegisterPlugin call knic would make as "harness-echo"/"10", with the deadline the Go
    // plugin happened to have left.
    let request = ttrpc::request(
        nri::RUNTIME_SERVICE,
        "RegisterPlugin",
        nri::register_request("harness-echo", "10").encode_to_vec(),
        Duration::from_nanos(4_999_524_130),
    );
    let mut ours = Vec::new();
    mux::encode(
        mux::RUNTIME_SERVICE_CONN,
        &ttrpc::encode_request(1, &request).unwrap(),
        &mut ours,
    );
    assert_eq!(ours, lines[0].frame(), "RegisterPlugin request");

    // containerd's empty success answer, as knic's server encodes success.
    let mut ours = Vec::new();
    mux::encode(
        2,
        &ttrpc::encode_response(1, &Response::default()).unwrap(),
        &mut ours,
    );
    assert_eq!(ours, lines[1].frame(), "RegisterPlugin response");

    // knic's Configure answer: events = 7 in field 2, no status.
    let reply = Response {
        status: None,
        payload: api::ConfigureResponse {
            events: nri::SUBSCRIBED_EVENTS,
        }
        .encode_to_vec(),
    };
    let mut ours = Vec::new();
    mux::encode(
        mux::PLUGIN_SERVICE_CONN,
        &ttrpc::encode_response(1, &reply).unwrap(),
        &mut ours,
    );
    assert_eq!(ours, lines[3].frame(), "Configure response");

    // Every decoded message re-encodes to the identical ttrpc frame (no field lost or renumbered
    // in the envelopes).
    for m in &msgs {
        let data = if m.frame.kind == ttrpc::TYPE_REQUEST {
            Request::decode(m.frame.data.as_slice())
                .unwrap()
                .encode_to_vec()
        } else {
            Response::decode(m.frame.data.as_slice())
                .unwrap()
                .encode_to_vec()
        };
        assert_eq!(data, m.frame.data, "stream {}", m.frame.stream_id);
    }
    // The knic-side view of Configure round-trips too.
    let cfg = msgs
        .iter()
        .find(|m| m.dir == Dir::ToPlugin && m.conn == 1)
        .unwrap();
    let req = Request::decode(cfg.frame.data.as_slice()).unwrap();
    assert_eq!(
        api::ConfigureRequest::decode(req.payload.as_slice())
            .unwrap()
            .encode_to_vec(),
        req.payload
    );
}

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<(&'static str, PodSandbox)>>,
    syncs: Mutex<Vec<Vec<PodSandbox>>>,
}

impl NriHandler for Recorder {
    fn run_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        self.events.lock().unwrap().push(("run", pod));
        Box::pin(async { Ok(()) })
    }
    fn stop_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        self.events.lock().unwrap().push(("stop", pod));
        Box::pin(async { Ok(()) })
    }
    fn remove_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        self.events.lock().unwrap().push(("remove", pod));
        Box::pin(async { Ok(()) })
    }
    fn synchronize(&self, pods: Vec<PodSandbox>) -> BoxFuture<'_, ()> {
        self.syncs.lock().unwrap().push(pods);
        Box::pin(async {})
    }
}

async fn read_mux_frame(stream: &mut tokio::net::UnixStream) -> Vec<u8> {
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).await.unwrap();
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let mut frame = header.to_vec();
    frame.resize(8 + len, 0);
    stream.read_exact(&mut frame[8..]).await.unwrap();
    frame
}

/// A live knic plugin, fed containerd's exact bytes (including the 4096 + 13774 split), answers
/// with exactly the bytes the real plugin sent, and its handler sees what containerd meant.
#[tokio::test]
async fn nri_transcript_replayed_against_knic_plugin() {
    let lines = transcript();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let settings = NriSettings {
        socket: socket.clone(),
        plugin_name: "harness-echo".into(),
        plugin_index: "10".into(),
        ..NriSettings::default()
    };
    let handler = Arc::new(Recorder::default());
    let plugin = {
        let handler = handler.clone();
        tokio::spawn(async move { nri::serve_once(&settings, &handler).await })
    };
    let (mut stream, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
        .await
        .unwrap()
        .unwrap();

    let replay = async {
        for (i, line) in lines.iter().enumerate() {
            match line.dir {
                Dir::ToPlugin => stream.write_all(&line.frame()).await.unwrap(),
                Dir::ToRuntime if i == 0 => {
                    // Same call as the Go plugin's, except for the deadline it had left.
                    let frame = read_mux_frame(&mut stream).await;
                    assert_eq!(&frame[..4], &[0, 0, 0, 2]);
                    let mut dec = ttrpc::Decoder::new();
                    dec.push(&frame[8..]);
                    let Some(Decoded::Frame(f)) = dec.next_frame() else {
                        panic!("no ttrpc frame")
                    };
                    assert_eq!((f.stream_id, f.kind), (1, ttrpc::TYPE_REQUEST));
                    let mut ours = Request::decode(f.data.as_slice()).unwrap();
                    let theirs = Request::decode(&line.payload[10..]).unwrap();
                    assert_eq!(ours.timeout_nano, 5_000_000_000);
                    ours.timeout_nano = theirs.timeout_nano;
                    assert_eq!(ours, theirs);
                }
                Dir::ToRuntime => {
                    let frame = read_mux_frame(&mut stream).await;
                    assert_eq!(
                        frame,
                        line.frame(),
                        "plugin answer on transcript line {}",
                        i + 1
                    );
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), replay)
        .await
        .unwrap();
    drop(stream);
    let ended = tokio::time::timeout(Duration::from_secs(5), plugin)
        .await
        .unwrap()
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");

    let syncs = handler.syncs.lock().unwrap();
    assert_eq!(syncs.len(), 1);
    assert_eq!(syncs[0].len(), 14);
    assert!(syncs[0].iter().all(|p| p.netns.is_none()));
    let events = handler.events.lock().unwrap();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["run", "stop", "remove"]);
    assert!(events.iter().all(|(_, p)| p.uid == RUN_UID));
    assert!(events[0].1.netns.is_some());
    assert_eq!(events[1].1.netns, events[0].1.netns);
    assert_eq!(events[2].1.netns, None);
}

// ---------------------------------------------------------------------------------------------
// Multiplexer.

/// Answers every call with its own payload, and "Fail" with an error.
struct Echo;

impl ttrpc::Service for Echo {
    async fn call(&self, method: &str, payload: &[u8]) -> Result<Vec<u8>, Status> {
        match method {
            "Echo" => Ok(payload.to_vec()),
            m => Err(ttrpc::status(
                ttrpc::code::UNIMPLEMENTED,
                format!("method {m}"),
            )),
        }
    }
}

/// A ttrpc request split across mux frames at arbitrary points, with frames for unknown
/// connections (0 and 9) interleaved, is reassembled and answered.
#[tokio::test]
async fn nri_mux_reassembles_split_messages_and_drops_unknown_conns() {
    let (ours, mut raw) = tokio::io::duplex(64 * 1024);
    let mut mux = Mux::new(ours, &[1, 2]);
    let conn = mux.open(1).unwrap();
    let server = tokio::spawn(async move { ttrpc::serve(conn, "svc", Arc::new(Echo)).await });

    let payload: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let req = ttrpc::request("svc", "Echo", payload.clone(), Duration::from_secs(1));
    let bytes = ttrpc::encode_request(3, &req).unwrap();
    let cuts = [0, 1, 11, 4096, 9000, bytes.len()];
    for (n, w) in cuts.windows(2).enumerate() {
        let mut out = Vec::new();
        mux::encode(1, &bytes[w[0]..w[1]], &mut out);
        // Junk for connections nobody opened must not reach conn 1.
        mux::encode(
            if n % 2 == 0 { 9 } else { 0 },
            b"\x00\x00\x00\x05junk!",
            &mut out,
        );
        raw.write_all(&out).await.unwrap();
    }

    let mut dec = mux::Decoder::new();
    let mut tt = ttrpc::Decoder::new();
    let mut buf = vec![0u8; 4096];
    let frame = loop {
        if let Some(Decoded::Frame(f)) = tt.next_frame() {
            break f;
        }
        let n = raw.read(&mut buf).await.unwrap();
        assert!(n > 0);
        dec.push(&buf[..n]);
        while let Some(f) = dec.next_frame().unwrap() {
            assert_eq!(f.conn, 1);
            tt.push(&f.payload);
        }
    };
    assert_eq!((frame.stream_id, frame.kind), (3, ttrpc::TYPE_RESPONSE));
    let resp = Response::decode(frame.data.as_slice()).unwrap();
    assert_eq!(resp.status, None);
    assert_eq!(resp.payload, payload);

    // Unknown method on the same connection: Unimplemented (12), stream still usable after.
    let req = ttrpc::request("svc", "Nope", Vec::new(), Duration::from_secs(1));
    let mut out = Vec::new();
    mux::encode(1, &ttrpc::encode_request(5, &req).unwrap(), &mut out);
    raw.write_all(&out).await.unwrap();
    let frame = loop {
        if let Some(Decoded::Frame(f)) = tt.next_frame() {
            break f;
        }
        let n = raw.read(&mut buf).await.unwrap();
        dec.push(&buf[..n]);
        while let Some(f) = dec.next_frame().unwrap() {
            tt.push(&f.payload);
        }
    };
    assert_eq!(frame.stream_id, 5);
    let status = Response::decode(frame.data.as_slice())
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.code, ttrpc::code::UNIMPLEMENTED);
    assert_eq!(status.message, "method Nope");

    drop(raw);
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// A write larger than 4 MiB leaves as several frames of at most 4 MiB, which reassemble to the
/// original bytes.
#[tokio::test]
async fn nri_mux_splits_writes_larger_than_4mib() {
    let (ours, mut raw) = tokio::io::duplex(256 * 1024);
    let mut mux = Mux::new(ours, &[1, 2]);
    let conn = mux.open(2).unwrap();
    let data: Vec<u8> = (0..(9 << 20) + 3).map(|i: usize| (i % 253) as u8).collect();
    let expected = data.clone();
    let writer = tokio::spawn(async move { conn.writer().send(&data).await });

    let mut dec = mux::Decoder::new();
    let mut sizes = Vec::new();
    let mut joined = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while joined.len() < expected.len() {
        let n = raw.read(&mut buf).await.unwrap();
        assert!(n > 0);
        dec.push(&buf[..n]);
        while let Some(f) = dec.next_frame().unwrap() {
            assert_eq!(f.conn, 2);
            sizes.push(f.payload.len());
            joined.extend_from_slice(&f.payload);
        }
    }
    writer.await.unwrap().unwrap();
    assert_eq!(sizes, [4 << 20, 4 << 20, (1 << 20) + 3]);
    assert!(sizes.iter().all(|&s| s <= mux::MAX_FRAME_PAYLOAD));
    assert!(joined == expected);
}

/// Frames for ids nobody opened vanish; the opened connection sees only its own bytes, in order,
/// and end-of-stream when the trunk closes.
#[tokio::test]
async fn nri_mux_delivers_per_connection_and_drops_unknown_ids() {
    let (ours, mut raw) = tokio::io::duplex(64 * 1024);
    let mut mux = Mux::new(ours, &[1, 2]);
    let mut one = mux.open(1).unwrap();
    let mut two = mux.open(2).unwrap();
    assert!(mux.open(1).is_none(), "a connection can be taken once");
    let mut out = Vec::new();
    mux::encode(7, b"nobody", &mut out);
    mux::encode(1, b"a1", &mut out);
    mux::encode(2, b"b1", &mut out);
    mux::encode(0, b"reserved", &mut out);
    mux::encode(1, b"a2", &mut out);
    raw.write_all(&out).await.unwrap();
    drop(raw);
    let mut got_one = Vec::new();
    while let Some(chunk) = one.recv().await {
        got_one.push(chunk);
    }
    let mut got_two = Vec::new();
    while let Some(chunk) = two.recv().await {
        got_two.push(chunk);
    }
    assert_eq!(got_one, [b"a1".to_vec(), b"a2".to_vec()]);
    assert_eq!(got_two, [b"b1".to_vec()]);
    mux.close().await.unwrap();
}
