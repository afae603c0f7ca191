//! Fuzz target: NetworkConfig parameters as a claim carries them (parse, merge, validate).

use knic_e2e::fuzz::{Rng, Settings, Verdict, mutate_json, run};
use knic_proto::netconfig::{self, API_VERSION, KIND};
use serde_json::{Value, json};

use super::describe;

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
        json!({ "apiVersion": API_VERSION, "kind": KIND, "interface": { "name": "data0" },
                "addresses": ["192.0.2.10/24"],
                "rules": [{ "from": "10.0.0.0/8", "to": "10.1.0.0/16", "iif": "data0",
                            "oif": "lo", "fwmark": 16, "fwmask": 255, "table": 100,
                            "priority": 100, "family": "ipv4" },
                          { "table": 254 }],
                "sourceBasedRouting": { "table": 101, "priority": 50 } }),
        json!({ "apiVersion": API_VERSION, "kind": KIND, "vrf": { "name": "blue", "table": 10 },
                "routes": [{ "destination": "0.0.0.0/0", "table": 10 }] }),
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
    "rules",
    "from",
    "to",
    "iif",
    "oif",
    "fwmark",
    "fwmask",
    "priority",
    "family",
    "sourceBasedRouting",
    "vrf",
];

/// Layers as a claim carries them: class entries then claim entries, each parsed with its own
/// path prefix, merged, validated.
pub(super) fn netconfig_target(settings: &Settings) -> Result<String, String> {
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
