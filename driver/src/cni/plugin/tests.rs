use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;

use serde_json::{Value, json};

use super::*;
use crate::cni::no_claim_message;
use crate::cni::result::{Attached, Ip};

const CONFIG: &str = r#"{"cniVersion":"1.0.0","name":"blue","type":"knic","network":"blue"}"#;

fn env(command: &str) -> BTreeMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "abc"),
        ("CNI_NETNS", "/var/run/netns/cni-1"),
        ("CNI_IFNAME", "net1"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=app-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
        ),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn error_of(env: &BTreeMap<String, String>, stdin: &str) -> CniError {
    parse(env, stdin.as_bytes()).expect_err("must be refused")
}

#[test]
fn add_is_parsed_into_the_door_request() {
    let call = parse(&env("ADD"), CONFIG.as_bytes()).expect("parses");
    assert_eq!(call.command, Command::Add);
    assert_eq!(call.version, "1.0.0");
    assert_eq!(
        call.request,
        Some(DoorRequest {
            command: Command::Add,
            pod_uid: "u-1".into(),
            pod: "team-a/app-1".into(),
            netns: "/var/run/netns/cni-1".into(),
            ifname: "net1".into(),
            network: "blue".into(),
        })
    );
    assert_eq!(
        serde_json::to_value(call.request.expect("request")).expect("json"),
        json!({"command": "ADD", "podUid": "u-1", "pod": "team-a/app-1",
               "netns": "/var/run/netns/cni-1", "ifname": "net1", "network": "blue"})
    );
}

#[test]
fn the_network_defaults_to_the_config_name() {
    let call = parse(
        &env("CHECK"),
        br#"{"cniVersion":"0.4.0","name":"red","type":"knic","prevResult":{}}"#,
    )
    .expect("parses");
    assert_eq!(call.request.expect("request").network, "red");
}

#[test]
fn bad_environment_is_refused_naming_the_variable() {
    let mut e = env("ADD");
    e.remove("CNI_COMMAND");
    assert_eq!(error_of(&e, CONFIG).msg, "CNI_COMMAND is not set");
    let e = env("ATTACH");
    let err = error_of(&e, CONFIG);
    assert_eq!(
        (err.code, err.msg.as_str()),
        (
            4,
            "CNI_COMMAND \"ATTACH\" is not one of ADD, DEL, CHECK, STATUS, GC, VERSION"
        )
    );
    for var in ["CNI_NETNS", "CNI_IFNAME"] {
        let mut e = env("ADD");
        e.insert(var.into(), String::new());
        let err = error_of(&e, CONFIG);
        assert_eq!((err.code, err.msg), (4, format!("{var} is not set")));
    }
    let mut e = env("ADD");
    e.insert("CNI_ARGS".into(), "K8S_POD_NAME=x".into());
    let err = error_of(&e, CONFIG);
    assert_eq!(
        (err.code, err.msg.as_str()),
        (4, "CNI_ARGS has no K8S_POD_UID")
    );
    e.insert("CNI_ARGS".into(), "K8S_POD_UID=u;oops".into());
    assert_eq!(
        error_of(&e, CONFIG).msg,
        "CNI_ARGS entry \"oops\" is not KEY=VALUE"
    );
}

#[test]
fn bad_config_is_refused_naming_the_field() {
    let err = error_of(&env("ADD"), "not json");
    assert_eq!(err.code, 6);
    assert!(
        err.msg
            .starts_with("the network configuration on stdin is not valid: "),
        "{}",
        err.msg
    );
    let err = error_of(&env("ADD"), r#"{"name":"blue","type":"knic"}"#);
    assert!(
        err.msg.contains("missing field `cniVersion`"),
        "{}",
        err.msg
    );
    let err = error_of(
        &env("ADD"),
        r#"{"cniVersion":"0.2.0","name":"blue","type":"knic"}"#,
    );
    assert_eq!(
        (err.code, err.msg.as_str()),
        (1, "cniVersion \"0.2.0\" is not supported")
    );
    let err = error_of(
        &env("ADD"),
        r#"{"cniVersion":"1.0.0","name":"","type":"knic"}"#,
    );
    assert_eq!(
        (err.code, err.msg.as_str()),
        (7, "network configuration: name (or network) is empty")
    );
}

fn missing_socket() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("knt-cni-none-{}.sock", std::process::id()))
}

#[test]
fn version_del_gc_need_no_driver_status_does() {
    let socket = missing_socket();
    let (out, ok) = run(&env("VERSION"), b"", &socket);
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).expect("json"),
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
    for command in ["DEL", "GC"] {
        assert_eq!(
            run(&env(command), CONFIG.as_bytes(), &socket),
            (String::new(), true)
        );
    }
    let (out, ok) = run(&env("STATUS"), CONFIG.as_bytes(), &socket);
    assert!(!ok);
    let err: CniError = serde_json::from_str(&out).expect("a CNI error");
    assert_eq!((err.code, err.cni_version.as_str()), (50, "1.0.0"));
}

#[test]
fn add_without_a_driver_says_try_again_later() {
    let (out, ok) = run(&env("ADD"), CONFIG.as_bytes(), &missing_socket());
    assert!(!ok);
    let err: CniError = serde_json::from_str(&out).expect("a CNI error");
    assert_eq!(err.code, 11);
    assert!(err.msg.contains("cannot be reached"), "{}", err.msg);
    assert!(
        err.details.contains("driver.cni.enabled"),
        "{}",
        err.details
    );
}

/// A driver stand-in answering one request with `answer`, returning what it was asked.
fn door(
    answer: DoorAnswer,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::thread::JoinHandle<DoorRequest>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cni.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).expect("read");
        let mut out = serde_json::to_vec(&answer).expect("json");
        out.push(b'\n');
        stream.write_all(&out).expect("write");
        serde_json::from_str(&line).expect("a door request")
    });
    (dir, path, handle)
}

#[test]
fn add_prints_the_result_of_the_requested_version() {
    let attached = Attached {
        interface: "net1".into(),
        mac: Some("02:00:00:00:00:01".into()),
        mtu: Some(1500),
        ips: vec![Ip {
            address: "192.0.2.10/24".into(),
            gateway: Some("192.0.2.1".into()),
        }],
        routes: Vec::new(),
    };
    let (_dir, socket, asked) = door(DoorAnswer::Attached(attached));
    let config = r#"{"cniVersion":"0.3.1","name":"blue","type":"knic"}"#;
    let (out, ok) = run(&env("ADD"), config.as_bytes(), &socket);
    assert!(ok, "{out}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).expect("json"),
        json!({"cniVersion": "0.3.1",
               "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": "/var/run/netns/cni-1"}],
               "ips": [{"version": "4", "interface": 0, "address": "192.0.2.10/24", "gateway": "192.0.2.1"}],
               "routes": [], "dns": {}})
    );
    let asked = asked.join().expect("door thread");
    assert_eq!(
        (asked.pod_uid.as_str(), asked.network.as_str()),
        ("u-1", "blue")
    );
}

#[test]
fn a_refusal_of_the_driver_is_printed_as_a_cni_error() {
    let message = no_claim_message("team-a/app-1", "blue");
    let (_dir, socket, _asked) = door(DoorAnswer::Failed(CniError::new(11, message.clone(), "")));
    let (out, ok) = run(&env("ADD"), CONFIG.as_bytes(), &socket);
    assert!(!ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).expect("json"),
        json!({"cniVersion": "1.0.0", "code": 11, "msg": message})
    );
    assert_eq!(
        message,
        "pod team-a/app-1 has no prepared knic claim of Network \"blue\": add resourceClaims: [{name: blue, resourceClaimTemplateName: blue}] to the pod"
    );
}
