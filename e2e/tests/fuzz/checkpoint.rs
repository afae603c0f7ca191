//! Fuzz target: the checkpoint file as found at start-up.

use std::collections::BTreeMap;
use std::path::Path;

use knic_driver::claims::checkpoint::{
    Attachment, Checkpoint, CheckpointStore, OpaqueConfig, PreparedClaim, PreparedDevice,
};
use knic_driver::netns::{AttachMode, AttachPlan};
use knic_e2e::fuzz::{Rng, Settings, Verdict, crc32, mutate_bytes, mutate_json, run};
use knic_proto::netconfig::{self, API_VERSION, KIND};
use serde_json::{Value, json};

use super::describe;

fn checkpoint_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let plan = |device: &str| AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
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
        ethtool: None,
        link: Default::default(),
    };
    let claim = |uid: &str, device: &str, share: Option<&str>| PreparedClaim {
        network_label: None,
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

pub(super) fn checkpoint_target(settings: &Settings) -> Result<String, String> {
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
