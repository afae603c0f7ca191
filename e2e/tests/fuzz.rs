//! Bounded fuzzing of everything knic decodes from outside: NetworkConfig parameters (parse,
//! merge, validate), the NRI multiplexer and ttrpc framing (the pure decoders and the whole
//! plugin behind a socket), the checkpoint file, CEL selectors (the shared tokenizer, syntax
//! and cost checks, the controller's compiler and evaluator) and discovery over generated sysfs
//! trees (random devices, symlink cycles and escapes, missing files, garbage contents, FIFOs,
//! deep nesting).
//!
//! Each target runs for `KNIC_FUZZ_SECONDS` (default 2 s) with seeded mutations of valid
//! inputs (`knic_e2e::fuzz`); any panic, violated property or input slower than
//! `KNIC_FUZZ_INPUT_MS` (default 2000) fails it with the input and the command that replays
//! it. Longer runs: `KNIC_FUZZ_SECONDS=300 cargo test -p knic-e2e --test fuzz --release`.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use knic_controller::cel::{Device, Selector, Value as CelValue};
use knic_driver::claims::checkpoint::{
    Attachment, Checkpoint, CheckpointStore, OpaqueConfig, PreparedClaim, PreparedDevice,
};
use knic_driver::inventory::fixture::{materialise, synthetic_sriov};
use knic_driver::inventory::{Filter, Sources, Sysfs, discover_in};
use knic_driver::netns::{AttachMode, AttachPlan};
use knic_driver::nri::mux::{self, Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use knic_driver::nri::{self, NriHandler, NriSettings, PodSandbox, ttrpc};
use knic_e2e::fuzz::{Rng, Settings, Verdict, crc32, mutate_bytes, mutate_json, mutate_text, run};
use knic_proto::netconfig::{self, API_VERSION, KIND};
use libtest_mimic::{Failed, Trial};
use prost::Message;
use serde_json::{Value, json};

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    eprintln!(
        "fuzz: run seed {:#x} (KNIC_FUZZ_SEED to repeat the run), {:?} per target, {:?} per input",
        settings.seed, settings.budget, settings.per_input
    );
    type Target = fn(&Settings) -> Result<String, String>;
    let targets: [(&str, Target); 8] = [
        ("netconfig", netconfig_target),
        ("cel", cel_target),
        ("mux_decoder", mux_target),
        ("ttrpc_decoder", ttrpc_target),
        ("nri_plugin", nri_plugin_target),
        ("checkpoint", checkpoint_target),
        ("discovery", discovery_target),
        ("fixture_confinement", fixture_confinement),
    ];
    let trials = targets
        .into_iter()
        .map(|(name, target)| {
            let settings = settings.clone();
            Trial::test(name, move || {
                let summary = target(&settings).map_err(Failed::from)?;
                eprintln!("fuzz {name}: {summary}");
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

fn describe(s: &knic_e2e::fuzz::Summary) -> String {
    format!(
        "{} inputs, {} accepted, slowest {:?}",
        s.inputs, s.accepted, s.slowest
    )
}

// ---------------------------------------------------------------------------------------------
// NetworkConfig

fn netconfig_corpus() -> Vec<Value> {
    vec![
        json!({ "apiVersion": API_VERSION, "kind": KIND }),
        json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "interface": { "name": "net1", "mtu": 9000, "hardwareAddress": "02:00:00:00:00:01" },
            "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
            "routes": [
                { "destination": "203.0.113.0/24", "gateway": "192.0.2.1", "metric": 100 },
                { "destination": "0.0.0.0/0", "gateway": "192.0.2.1", "table": 100,
                  "source": "192.0.2.10" },
                { "destination": "2001:db8:1::/48", "gateway": "2001:db8::1" }
            ],
            "vlan": { "id": 100 },
            "sysctls": { "ipv4.rp_filter": "0", "ipv6.accept_ra": "0" }
        }),
        json!({ "apiVersion": API_VERSION, "kind": KIND, "ipam": { "network": "pods" },
                "interface": { "name": "eth1" } }),
        json!({ "apiVersion": API_VERSION, "kind": KIND, "interface": { "mtu": 1280 },
                "vlan": { "id": 4094 } }),
        json!({ "apiVersion": API_VERSION, "kind": KIND, "deviceMode": "vfio-pci" }),
        json!({ "apiVersion": API_VERSION, "kind": KIND, "macvlan": { "mode": "bridge" } }),
        json!({ "apiVersion": API_VERSION, "kind": KIND, "ipvlan": { "mode": "l3s" } }),
        json!({ "apiVersion": API_VERSION, "kind": KIND, "macvlan": {},
                "bandwidth": { "egress": "1.5G", "burst": "256Ki" } }),
    ]
}

const NETCONFIG_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "interface",
    "name",
    "mtu",
    "hardwareAddress",
    "addresses",
    "ipam",
    "network",
    "routes",
    "destination",
    "gateway",
    "source",
    "metric",
    "table",
    "vlan",
    "id",
    "sysctls",
    "deviceMode",
    "macvlan",
    "ipvlan",
    "mode",
    "bandwidth",
    "egress",
    "burst",
];

/// Layers as a claim carries them: class entries then claim entries, each parsed with its own
/// path prefix, merged, validated.
fn netconfig_target(settings: &Settings) -> Result<String, String> {
    let corpus = netconfig_corpus();
    let gen_corpus = corpus.clone();
    let summary = run(
        "netconfig",
        settings,
        move |rng: &mut Rng| {
            let layers = rng.range(1, 3);
            (0..layers)
                .map(|_| {
                    let base = rng.pick(&gen_corpus).clone();
                    if rng.one_in(8) {
                        base
                    } else {
                        mutate_json(rng, &base, &gen_corpus, NETCONFIG_KEYS, 6)
                    }
                })
                .collect::<Vec<Value>>()
        },
        |layers: &Vec<Value>| {
            let mut parsed = Vec::new();
            let mut refused = false;
            for (i, layer) in layers.iter().enumerate() {
                match netconfig::parse(layer, &format!("config[{i}].parameters")) {
                    Ok(config) => {
                        // Each layer alone, as a Network's template config is checked.
                        if let Err(errors) = netconfig::validate(&config) {
                            check_errors(&errors)?;
                        }
                        parsed.push(config);
                    }
                    Err(errors) => {
                        check_errors(&errors)?;
                        refused = true;
                    }
                }
            }
            let merged = netconfig::merge(&parsed);
            match netconfig::validate(&merged) {
                Ok(_) if !refused => Ok(Verdict::Accepted),
                Ok(_) => Ok(Verdict::Refused),
                Err(errors) => {
                    check_errors(&errors)?;
                    Ok(Verdict::Refused)
                }
            }
        },
    )?;
    Ok(describe(&summary))
}

/// A refusal names at least one problem, each with text.
fn check_errors(errors: &netconfig::ConfigErrors) -> Result<(), String> {
    if errors.0.is_empty() {
        return Err("refused with an empty error list".into());
    }
    for e in &errors.0 {
        if e.to_string().trim().is_empty() {
            return Err(format!("an error without text: {e:?}"));
        }
    }
    let _ = errors.to_string();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// CEL

fn cel_corpus() -> Vec<String> {
    [
        r#"device.driver == "knic.dev""#,
        r#"device.attributes["knic.dev"].kind == "pf""#,
        r#"device.attributes["knic.dev"].kind in ["pf", "vf"] && device.attributes["knic.dev"].speed >= 25000"#,
        r#"device.attributes["knic.dev"].?vlanCapable.orValue(false)"#,
        r#"has(device.attributes["knic.dev"].pciAddress) && device.attributes["knic.dev"].pciAddress.startsWith("0000:3b")"#,
        r#"!(device.attributes["knic.dev"]["ifName"].endsWith("v0")) || device.attributes["knic.dev"].numaNode == -1"#,
        r#"device.attributes["resource.kubernetes.io"].pcieRoot == 'pci0000:00' // root"#,
        r#"device.attributes["knic.dev"][?"exhausted"].hasValue() == false"#,
        r#"device.attributes["knic.dev"].ifName.contains(r"eth\d") || device.attributes["knic.dev"].firmware == "1.2.3""#,
        r#"device.attributes["knic.dev"].speed > 0x10 && device.attributes["knic.dev"].kind != "\x41\u00e9\101""#,
        r#"(device.driver == "knic.dev") == true"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

const CEL_TOKENS: &[&str] = &[
    "device",
    ".driver",
    ".attributes",
    "[\"knic.dev\"]",
    ".?",
    "[?",
    ".orValue(",
    ".hasValue()",
    ".value()",
    "has(",
    "(",
    ")",
    "[",
    "]",
    ",",
    "!",
    "-",
    "&&",
    "||",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    " in ",
    "?",
    ":",
    "\"",
    "'",
    "r\"",
    "\"\"\"",
    "\\",
    "\\u",
    "\\U0010ffff",
    "\\x",
    "\\777",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "0x",
    "0xffffffffffffffff",
    "1.5",
    "1e400",
    "1u",
    "true",
    "false",
    "null",
    "size(",
    ".matches(",
    ".startsWith(",
    ".endsWith(",
    ".contains(",
    "//",
    "/*",
    "\n",
    "\u{0}",
    "\u{202e}",
    "é",
    "{",
    "}",
    "b\"",
    "@",
    "`",
];

fn cel_devices() -> Vec<Device> {
    let mut knic = BTreeMap::new();
    knic.insert("kind".to_owned(), CelValue::String("pf".into()));
    knic.insert("speed".to_owned(), CelValue::Int(25000));
    knic.insert("numaNode".to_owned(), CelValue::Int(i64::MIN));
    knic.insert("vlanCapable".to_owned(), CelValue::Bool(true));
    knic.insert("ifName".to_owned(), CelValue::String("eth\u{0}é".into()));
    knic.insert("firmware".to_owned(), CelValue::Version("1.2.3+b".into()));
    let mut k8s = BTreeMap::new();
    k8s.insert("pcieRoot".to_owned(), CelValue::String("pci0000:00".into()));
    vec![
        Device {
            driver: "knic.dev".into(),
            attributes: BTreeMap::from([
                ("knic.dev".to_owned(), knic),
                ("resource.kubernetes.io".to_owned(), k8s),
            ]),
        },
        Device {
            driver: "knic.dev".into(),
            attributes: BTreeMap::new(),
        },
        Device {
            driver: String::new(),
            attributes: BTreeMap::from([("".to_owned(), BTreeMap::new())]),
        },
    ]
}

fn cel_target(settings: &Settings) -> Result<String, String> {
    let corpus = cel_corpus();
    let gen_corpus = corpus.clone();
    let devices = cel_devices();
    let summary = run(
        "cel",
        settings,
        move |rng: &mut Rng| {
            let base = rng.pick(&gen_corpus).clone();
            mutate_text(rng, &base, &gen_corpus, CEL_TOKENS, 6)
        },
        move |source: &String| {
            let (tokens, error) = knic_proto::cel::lexer::scan(source);
            let lexed = knic_proto::cel::lexer::lex(source);
            // `lex` is `scan` minus what the evaluator does not support.
            let unsupported = tokens
                .iter()
                .any(|t| matches!(t.tok, knic_proto::cel::lexer::Tok::Unsupported(_)));
            if lexed.is_ok() != (error.is_none() && !unsupported) {
                return Err(format!(
                    "lex and scan disagree: lex {lexed:?}, scan error {error:?}"
                ));
            }
            let mut last = 0;
            for t in &tokens {
                if t.at > source.len() || t.at < last {
                    return Err(format!(
                        "token at byte {} out of order or past the end",
                        t.at
                    ));
                }
                last = t.at;
                let _ = t.tok.describe();
            }
            let _ = knic_proto::cel::syntax_problem(source);
            let _ = knic_proto::cel::exceeds_cost_limit(source);
            let _ = knic_proto::cel::clause_forms(source);
            match Selector::compile(source) {
                Ok(selector) => {
                    for device in &devices {
                        let _ = selector.matches(device);
                    }
                    Ok(Verdict::Accepted)
                }
                Err(e) => {
                    if e.to_string().is_empty() {
                        return Err("compile error without text".into());
                    }
                    Ok(Verdict::Refused)
                }
            }
        },
    )?;
    Ok(describe(&summary))
}

// ---------------------------------------------------------------------------------------------
// NRI mux and ttrpc

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

fn mux_target(settings: &Settings) -> Result<String, String> {
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

fn ttrpc_target(settings: &Settings) -> Result<String, String> {
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

fn nri_plugin_target(settings: &Settings) -> Result<String, String> {
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

// ---------------------------------------------------------------------------------------------
// Checkpoint

fn checkpoint_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let plan = |device: &str| AttachPlan {
        pool: "node-a".into(),
        device: device.into(),
        request: "nic".into(),
        host_ifname: "eth1".into(),
        mode: AttachMode::Move,
        pod_ifname: "net1".into(),
        mtu: Some(9000),
        mac: None,
        addresses: vec!["192.0.2.10/24".parse().unwrap()],
        routes: Vec::new(),
        sysctls: BTreeMap::from([("ipv4.rp_filter".to_owned(), "0".to_owned())]),
        identity: None,
        vf: None,
        // Shared devices carry an egress limit (their consumed bandwidth capacity).
        bandwidth: (device == "shared").then_some(netconfig::Bandwidth {
            egress: 2_000_000_000,
            burst: Some(262_144),
        }),
    };
    let claim = |uid: &str, device: &str, share: Option<&str>| PreparedClaim {
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
        pod_uid: format!("pod-{uid}"),
        pod_name: "web".into(),
        devices: vec![PreparedDevice {
            request: "nic".into(),
            pool: "node-a".into(),
            device: device.into(),
            share_id: share.map(str::to_owned),
            consumed: Default::default(),
            published: None,
        }],
        configs: vec![OpaqueConfig {
            source: "FromClaim".into(),
            requests: vec!["nic".into()],
            parameters: json!({ "apiVersion": API_VERSION, "kind": KIND,
                                "interface": { "name": "net1" } }),
        }],
        prepared_at: 1_700_000_000,
        attachments: vec![Attachment::planned(plan(device))],
        allocations: Vec::new(),
        functions: Vec::new(),
    };
    let checkpoints = [
        Checkpoint::default(),
        Checkpoint {
            claims: BTreeMap::from([
                ("uid-1".to_owned(), claim("uid-1", "pci-0000-3b-00-0", None)),
                ("uid-2".to_owned(), claim("uid-2", "pci-0000-3b-00-1", None)),
            ]),
        },
        Checkpoint {
            claims: BTreeMap::from([
                ("uid-3".to_owned(), claim("uid-3", "shared", Some("a"))),
                ("uid-4".to_owned(), claim("uid-4", "shared", Some("b"))),
            ]),
        },
    ];
    let store = CheckpointStore::new(dir.join("corpus"));
    checkpoints
        .iter()
        .map(|c| {
            store.save(c).unwrap();
            std::fs::read(store.path()).unwrap()
        })
        .collect()
}

/// A checkpoint file as found at start-up.
#[derive(Debug)]
enum CheckpointInput {
    /// Bytes as they are (the checksum usually no longer matches).
    Raw(Vec<u8>),
    /// A mutated body in a correct envelope, so it reaches decoding and the consistency rules.
    Body(String),
    /// A FIFO where the file should be.
    Fifo,
}

fn checkpoint_target(settings: &Settings) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let corpus = checkpoint_corpus(dir.path());
    let bodies: Vec<Value> = corpus
        .iter()
        .map(|file| serde_json::from_slice::<Value>(file).unwrap()["data"].clone())
        .collect();
    let keys = [
        "claims",
        "namespace",
        "name",
        "uid",
        "podUid",
        "podName",
        "devices",
        "configs",
        "preparedAt",
        "attachments",
        "allocations",
        "request",
        "pool",
        "device",
        "shareId",
        "published",
        "source",
        "requests",
        "parameters",
        "plan",
        "restore",
        "netns",
        "attached",
        "uid-1",
        "uid-2",
    ];
    let work = dir.path().join("work");
    let summary = run(
        "checkpoint",
        settings,
        move |rng: &mut Rng| match rng.below(20) {
            0 => CheckpointInput::Fifo,
            1..=8 => {
                let base = rng.pick(&corpus).clone();
                CheckpointInput::Raw(mutate_bytes(rng, &base, &corpus, 6))
            }
            _ => {
                let base = rng.pick(&bodies).clone();
                let body = mutate_json(rng, &base, &bodies, &keys, 6);
                CheckpointInput::Body(serde_json::to_string(&body).unwrap())
            }
        },
        move |input: &CheckpointInput| {
            let _ = std::fs::remove_dir_all(&work);
            std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
            let path = work.join(knic_driver::claims::checkpoint::CHECKPOINT_FILE);
            match input {
                CheckpointInput::Raw(bytes) => std::fs::write(&path, bytes),
                CheckpointInput::Body(body) => std::fs::write(
                    &path,
                    format!(
                        "{{\"version\":1,\"crc32\":\"{:08x}\",\"data\":{body}}}",
                        crc32(body.as_bytes())
                    ),
                ),
                CheckpointInput::Fifo => {
                    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                        .map_err(std::io::Error::from)
                }
            }
            .map_err(|e| e.to_string())?;
            let store = CheckpointStore::new(&work);
            match store.load() {
                Ok(checkpoint) => {
                    // What loads must save and load back unchanged.
                    store
                        .save(&checkpoint)
                        .map_err(|e| format!("re-saving: {e}"))?;
                    let again = store.load().map_err(|e| format!("reloading: {e}"))?;
                    if again != checkpoint {
                        return Err("save + load changed a loaded checkpoint".into());
                    }
                    Ok(Verdict::Accepted)
                }
                Err(e) => {
                    // serde's decode errors quote whole values (see the report of issue 11
                    // item 9), so the bound is "no amplification", not a fixed size.
                    let text = e.to_string();
                    let input_len = match input {
                        CheckpointInput::Raw(bytes) => bytes.len(),
                        CheckpointInput::Body(body) => body.len(),
                        CheckpointInput::Fifo => 0,
                    };
                    if text.is_empty() || text.len() > 1024 + input_len {
                        return Err(format!("error text of {} bytes: {text:.300}", text.len()));
                    }
                    Ok(Verdict::Refused)
                }
            }
        },
    )?;
    drop(dir);
    Ok(describe(&summary))
}

// ---------------------------------------------------------------------------------------------
// Discovery over generated sysfs trees

fn sysfs_corpus() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../driver/tests/fixtures/sysfs");
    let mut corpus: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(".real.txt") || name.ends_with(".derived.txt")
        })
        .filter(|p| !p.to_string_lossy().contains("ethtool"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    corpus.sort();
    corpus.push(synthetic_sriov(1, 3));
    corpus
}

const ODD_VALUES: &[&str] = &[
    "",
    "-1",
    "0",
    "0x",
    "0xffffffffffffffff",
    "99999999999999999999999",
    "4294967296",
    "nan",
    "ff:ff:ff:ff:ff:ff",
    "zz:zz",
    "0000:00:00.0",
    "../../..",
    "eth0 eth1",
    "\u{1b}[31mred\u{1b}[0m",
    "\u{202e}0ht\u{200b}e",
    "DEVTYPE=vlan",
    "INTERFACE=",
    "PCI_SLOT_NAME=../../../etc",
];

const ODD_LINKS: &[&str] = &[
    ".",
    "..",
    "../../../../../../../../../../../../../../../..",
    "/",
    "/dev/zero",
    "/dev/stdin",
    "/proc/self/fd/0",
    "/etc",
    "nonexistent",
    "../nonexistent/deeper",
    "../../devices/virtual/net/lo",
    "../../bus/pci/drivers/ice",
];

/// One line of a fixture's text with its kind.
fn mutate_fixture(rng: &mut Rng, base: &str, corpus: &[String]) -> String {
    let mut lines: Vec<String> = base
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    for _ in 0..rng.small(8) {
        let n = lines.len().max(1);
        match rng.below(9) {
            0 => {
                // Missing files.
                for _ in 0..rng.range(1, n / 8 + 1) {
                    if !lines.is_empty() {
                        let i = rng.below(lines.len());
                        lines.remove(i);
                    }
                }
            }
            1 => {
                // Garbage attribute contents.
                let values: Vec<usize> = (0..lines.len())
                    .filter(|&i| lines[i].contains(" = ") && !lines[i].ends_with("<<EOF"))
                    .collect();
                if !values.is_empty() {
                    let i = *rng.pick(&values);
                    let path = lines[i].split(" = ").next().unwrap_or("").to_owned();
                    let value = if rng.one_in(6) {
                        "A".repeat(rng.range(4096, 70_000))
                    } else {
                        (*rng.pick(ODD_VALUES)).to_owned()
                    };
                    lines[i] = format!("{path} = {value}");
                }
            }
            2 => {
                // Links anywhere: self, cycles, escapes, absolute, dangling.
                let links: Vec<usize> = (0..lines.len())
                    .filter(|&i| lines[i].contains(" -> "))
                    .collect();
                if !links.is_empty() {
                    let i = *rng.pick(&links);
                    let path = lines[i].split(" -> ").next().unwrap_or("").to_owned();
                    let own = path.rsplit('/').next().unwrap_or("").to_owned();
                    let target = match rng.below(3) {
                        0 => own,
                        1 => "../".repeat(rng.range(1, 400)),
                        _ => (*rng.pick(ODD_LINKS)).to_owned(),
                    };
                    lines[i] = format!("{path} -> {target}");
                }
            }
            3 => {
                // A two-link cycle and a device link pointing at itself.
                let a = rng.below(1000);
                lines.push(format!("sys/class/net/cyc{a}a -> cyc{a}b"));
                lines.push(format!("sys/class/net/cyc{a}b -> cyc{a}a"));
                lines.push(format!("sys/devices/virtual/net/self{a}/ifindex = {a}"));
                lines.push(format!(
                    "sys/devices/virtual/net/self{a}/device -> ../self{a}"
                ));
                lines.push(format!(
                    "sys/class/net/self{a} -> ../../devices/virtual/net/self{a}"
                ));
            }
            4 => {
                // A random extra device: a copy of an existing one under a new (odd) name.
                let links: Vec<(String, String)> = lines
                    .iter()
                    .filter_map(|l| l.strip_prefix("sys/class/net/"))
                    .filter_map(|l| l.split_once(" -> "))
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .collect();
                if !links.is_empty() {
                    let (name, target) = rng.pick(&links).clone();
                    let Some(real) = target.strip_prefix("../../") else {
                        continue;
                    };
                    let real = format!("sys/{real}");
                    let new = match rng.below(4) {
                        0 => format!("{name}x"),
                        1 => "n".repeat(rng.range(16, 300)),
                        2 => format!("{name}\u{7}é"),
                        _ => format!("d{}", rng.below(1_000_000)),
                    };
                    let new_real = match real.rsplit_once('/') {
                        Some((parent, _)) => format!("{parent}/{new}"),
                        None => continue,
                    };
                    let copies: Vec<String> = lines
                        .iter()
                        .filter_map(|l| l.strip_prefix(&format!("{real}/")))
                        .map(|rest| format!("{new_real}/{rest}"))
                        .collect();
                    lines.extend(copies);
                    let up = "../".repeat(new_real.matches('/').count() - 1);
                    let to = new_real.strip_prefix("sys/").unwrap_or(&new_real);
                    lines.push(format!("sys/class/net/{new} -> {up}{to}"));
                }
            }
            5 => {
                // Deep nesting below a PCI root.
                let depth = *rng.pick(&[8usize, 40, 120, 300]);
                let mut path = String::from("sys/devices/pci0000:00");
                for i in 0..depth {
                    path.push_str(&format!("/0000:{:02x}:00.0", i % 256));
                }
                let name = format!("deep{}", rng.below(100));
                lines.push(format!("{path}/vendor = 0x8086"));
                lines.push(format!("{path}/device = 0x1572"));
                lines.push(format!("{path}/net/{name}/ifindex = 77"));
                lines.push(format!("{path}/net/{name}/type = 1"));
                lines.push(format!("{path}/net/{name}/address = 02:00:00:00:00:77"));
                lines.push(format!("{path}/net/{name}/device -> ../.."));
                let to = path.strip_prefix("sys/").unwrap_or(&path);
                lines.push(format!("sys/class/net/{name} -> ../../{to}/net/{name}"));
            }
            6 => {
                // Lines of another fixture.
                let other: Vec<&str> = rng
                    .pick(corpus)
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .collect();
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = rng.range(a, (a + 60).min(other.len() - 1));
                    let at = rng.below(lines.len() + 1);
                    lines.splice(at..at, other[a..=b].iter().map(|s| (*s).to_owned()));
                }
            }
            7 => {
                // A multi-line uevent with odd keys.
                let dirs: Vec<String> = lines
                    .iter()
                    .filter_map(|l| l.split_once("/ifindex = ").map(|(d, _)| d.to_owned()))
                    .collect();
                if !dirs.is_empty() {
                    let d = rng.pick(&dirs).clone();
                    lines.push(format!("{d}/uevent = <<EOF"));
                    for _ in 0..rng.range(0, 5) {
                        lines.push(format!(
                            "{}={}",
                            rng.pick(&["INTERFACE", "DEVTYPE", "IFINDEX", "", "="]),
                            rng.pick(ODD_VALUES)
                        ));
                    }
                    lines.push("EOF".into());
                }
            }
            _ => {
                // Shuffle two lines (a link may now come before its target exists, or after).
                if lines.len() > 1 {
                    let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
                    lines.swap(a, b);
                }
            }
        }
    }
    lines.join("\n") + "\n"
}

/// A generated tree: fixture text, then files (by index in a sorted walk) turned into FIFOs
/// or given raw, non-UTF-8 content, and sometimes a filter.
#[derive(Debug)]
struct TreeInput {
    fixture: String,
    fifos: Vec<usize>,
    raw: Vec<(usize, Vec<u8>)>,
    filter: Option<(String, String)>,
}

/// Regular files below `dir`, sorted, never following a link.
fn regular_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => regular_files(&p, out),
            Ok(m) if m.is_file() => out.push(p),
            _ => {}
        }
    }
}

fn discovery_target(settings: &Settings) -> Result<String, String> {
    let corpus = sysfs_corpus();
    let gen_corpus = corpus.clone();
    let globs = [
        "*",
        "eth*",
        "pci-*",
        "",
        "[",
        "**",
        "kind=pf",
        "vendor=0x8086",
        "é*",
        "\u{0}",
    ];
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let work = dir.path().join("tree");
    let summary = run(
        "discovery",
        settings,
        move |rng: &mut Rng| {
            let base = rng.pick(&gen_corpus).clone();
            let fixture = mutate_fixture(rng, &base, &gen_corpus);
            let fifos = (0..rng.range(0, 2)).map(|_| rng.below(10_000)).collect();
            let raw = (0..rng.range(0, 3))
                .map(|_| {
                    let n = rng.range(0, 64);
                    (rng.below(10_000), rng.bytes(n))
                })
                .collect();
            let filter = rng.one_in(4).then(|| {
                let include = (0..rng.range(0, 2))
                    .map(|_| *rng.pick(&globs))
                    .collect::<Vec<_>>();
                let exclude = (0..rng.range(0, 2))
                    .map(|_| *rng.pick(&globs))
                    .collect::<Vec<_>>();
                (include.join(","), exclude.join(","))
            });
            TreeInput {
                fixture,
                fifos,
                raw,
                filter,
            }
        },
        move |input: &TreeInput| {
            let _ = std::fs::remove_dir_all(&work);
            std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
            // A line the loader refuses ends the tree there: what exists is still a tree.
            let faults = materialise(&input.fixture, &work).unwrap_or_default();
            let mut files = Vec::new();
            regular_files(&work, &mut files);
            if !files.is_empty() {
                for &i in &input.fifos {
                    let f = &files[i % files.len()];
                    let _ = std::fs::remove_file(f);
                    let _ = nix::unistd::mkfifo(f, nix::sys::stat::Mode::from_bits_truncate(0o600));
                }
                for (i, bytes) in &input.raw {
                    let f = &files[i % files.len()];
                    if std::fs::symlink_metadata(f).is_ok_and(|m| m.is_file()) {
                        let _ = std::fs::write(f, bytes);
                    }
                }
            }
            let filter = match &input.filter {
                Some((include, exclude)) => match Filter::parse_lists(include, exclude) {
                    Ok(f) => f,
                    Err(e) if e.to_string().is_empty() => {
                        return Err("filter error without text".into());
                    }
                    Err(_) => Filter::default(),
                },
                None => Filter::default(),
            };
            let sysfs = Sysfs::new(&work).with_faults(faults);
            let inventory = discover_in(&sysfs, &Sources::sysfs_only(), &BTreeSet::new(), &filter);
            // Published names become ResourceSlice device names: unique DNS labels.
            let mut seen = BTreeSet::new();
            for device in &inventory.devices {
                if !knic_proto::names::is_dns_label(&device.name) {
                    return Err(format!("device name {:?} is not a DNS label", device.name));
                }
                if !seen.insert(device.name.clone()) {
                    return Err(format!("device name {:?} published twice", device.name));
                }
            }
            let _ = knic_driver::inventory::table::render_table(&inventory, "node-a");
            Ok(if inventory.devices.is_empty() {
                Verdict::Refused
            } else {
                Verdict::Accepted
            })
        },
    )?;
    drop(dir);
    Ok(describe(&summary))
}

/// The generator writes links as root; this pins that the loader never writes through one
/// (the bug the fuzzer would otherwise hit on the host's filesystem): a regression test for
/// `materialise`, run here too because the fuzz targets rely on it.
fn fixture_confinement(_: &Settings) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).map_err(|e| e.to_string())?;
    let err = materialise("sys/a -> ../../outside\nsys/a/f = 1\n", &root)
        .err()
        .ok_or("a file below a link to outside the root was written")?;
    let text = err.to_string();
    if !text.contains("goes through the symlink \"sys/a\"") {
        return Err(format!("error text: {text}"));
    }
    if outside.join("f").exists() {
        return Err("wrote outside the root".into());
    }
    Ok("refused".into())
}
