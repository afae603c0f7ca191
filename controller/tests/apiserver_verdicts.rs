//! Every CEL selector knic generates, ships or documents must be of a form a real
//! kube-apiserver accepted (`tests/fixtures/apiserver/cel-selector-verdicts-1.36.json`).
//!
//! Forms are compared clause by clause (top-level `&&` operands, literals abstracted by
//! [`clause_forms`]): the apiserver's cost estimate of a conjunction is the sum of its
//! operands', so a conjunction of accepted clauses stays within the limit, while one refused
//! clause (an unbounded string function) refuses the whole selector — as the verdict file's
//! combined example shows.

use std::collections::BTreeSet;
use std::path::Path;

use knic_controller::cel::{clause_forms, exceeds_cost_limit};
use knic_controller::reconcile::template_spec;
use knic_proto::network::{NetworkSpec, exhaustion_selector};
use serde_json::{Value, json};

const VERDICTS: &str = include_str!("fixtures/apiserver/cel-selector-verdicts-1.36.json");

/// Forms not in the verdict file but accepted by every apiserver because the Kubernetes API
/// reference itself uses them (CELDeviceSelector.expression: "The device.driver field can be
/// used to check for a specific driver"); `device.driver` is a bounded plain string.
const UPSTREAM_FORMS: [&str; 1] = ["device . driver == S"];

struct Verdicts {
    accepted: BTreeSet<String>,
    refused: Vec<(String, String)>,
}

fn verdicts() -> Verdicts {
    let file: Value = serde_json::from_str(VERDICTS).expect("verdict JSON");
    let mut accepted = BTreeSet::new();
    let mut refused = Vec::new();
    for v in file["verdicts"].as_array().expect("verdicts") {
        let expression = v["expression"].as_str().expect("expression");
        match v["verdict"].as_str() {
            Some("accepted") => {
                accepted.extend(clause_forms(expression).expect("verdict lexes"));
            }
            Some("refused") => refused.push((
                expression.to_owned(),
                v["message"].as_str().unwrap_or("").to_owned(),
            )),
            other => panic!("unknown verdict {other:?}"),
        }
    }
    accepted.extend(UPSTREAM_FORMS.iter().map(|f| f.to_string()));
    Verdicts { accepted, refused }
}

/// The clauses of `expression` no verdict shows as accepted.
fn unaccepted(v: &Verdicts, expression: &str) -> Vec<String> {
    clause_forms(expression)
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
        .into_iter()
        .filter(|form| !v.accepted.contains(form))
        .collect()
}

fn assert_all_accepted(v: &Verdicts, origin: &str, expressions: &[String]) {
    assert!(
        !expressions.is_empty(),
        "{origin}: found no selectors to check"
    );
    for e in expressions {
        let bad = unaccepted(v, e);
        assert!(
            bad.is_empty(),
            "{origin}: selector {e:?} has clauses of forms a real apiserver is not known to accept: {bad:?}"
        );
        assert_eq!(exceeds_cost_limit(e), Ok(false), "{origin}: {e}");
    }
}

#[test]
fn the_rule_agrees_with_every_recorded_verdict() {
    let file: Value = serde_json::from_str(VERDICTS).expect("verdict JSON");
    for v in file["verdicts"].as_array().expect("verdicts") {
        let expression = v["expression"].as_str().expect("expression");
        let refused = v["verdict"] == "refused";
        assert_eq!(exceeds_cost_limit(expression), Ok(refused), "{expression}");
        if refused {
            assert!(
                v["message"]
                    .as_str()
                    .is_some_and(|m| m.ends_with(knic_controller::cel::COST_LIMIT_MESSAGE)),
                "{v}"
            );
        }
    }
}

#[test]
fn generated_templates_carry_only_accepted_forms() {
    let v = verdicts();
    let mut checked = 0;
    let kinds = [None, Some("nic"), Some("vf")];
    let vendors = [None, Some("8086"), Some("Mellanox Technologies")];
    let flags = [None, Some(true), Some(false)];
    for kind in kinds {
        for vendor in vendors {
            for pf in [None, Some("ens1f0")] {
                for speed in [None, Some(25000)] {
                    for numa in [None, Some(1)] {
                        for rdma in flags {
                            let mut devices = serde_json::Map::new();
                            let mut put = |k: &str, val: Option<Value>| {
                                if let Some(val) = val {
                                    devices.insert(k.into(), val);
                                }
                            };
                            put("kind", kind.map(|k| json!(k)));
                            put("vendor", vendor.map(|x| json!(x)));
                            put("pfName", pf.map(|x| json!(x)));
                            put("minSpeed", speed.map(|x| json!(x)));
                            put("numaNode", numa.map(|x| json!(x)));
                            put("rdma", rdma.map(|x| json!(x)));
                            if devices.is_empty() {
                                continue;
                            }
                            let spec: NetworkSpec = serde_json::from_value(json!({
                                "devices": devices,
                                "ipam": {"subnets": [{"cidr": "192.0.2.0/24", "gateway": "192.0.2.1"}]},
                                "namespaces": {"names": ["team-a"]},
                            }))
                            .expect("spec");
                            // Combinations the validation refuses (pfName without kind: vf, …)
                            // generate nothing.
                            let Ok(template) = template_spec("blue", &spec) else {
                                continue;
                            };
                            let expressions: Vec<String> = template
                                .spec
                                .devices
                                .as_ref()
                                .and_then(|d| d.requests.as_ref())
                                .into_iter()
                                .flatten()
                                .filter_map(|r| r.exactly.as_ref()?.selectors.clone())
                                .flatten()
                                .filter_map(|s| Some(s.cel?.expression))
                                .collect();
                            assert_eq!(
                                expressions.len(),
                                2,
                                "friendly + exhaustion: {expressions:?}"
                            );
                            assert_all_accepted(
                                &v,
                                &format!("template for {devices:?}"),
                                &expressions,
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(
        checked >= 100,
        "only {checked} valid combinations generated"
    );
    // Network names of every shape give one form.
    let many: Vec<String> = ["a", "blue", "net-1", &"x".repeat(63)]
        .iter()
        .map(|n| exhaustion_selector(n))
        .collect();
    assert_all_accepted(&v, "exhaustion selector", &many);
}

fn shipped_class_expressions(path: &Path) -> Vec<String> {
    let yaml = std::fs::read_to_string(path).expect("DeviceClasses");
    let mut out = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&yaml) {
        let class: serde_yaml_ng::Value = serde::Deserialize::deserialize(document).expect("YAML");
        for s in class["spec"]["selectors"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            out.push(
                s["cel"]["expression"]
                    .as_str()
                    .expect("expression")
                    .to_owned(),
            );
        }
    }
    out
}

/// Every `cel.expression` anywhere in a YAML value.
fn cel_expressions(value: &serde_yaml_ng::Value, out: &mut Vec<String>) {
    match value {
        serde_yaml_ng::Value::Mapping(map) => {
            if let Some(e) = value["cel"]["expression"].as_str() {
                out.push(e.to_owned());
            }
            for v in map.values() {
                cel_expressions(v, out);
            }
        }
        serde_yaml_ng::Value::Sequence(items) => {
            for v in items {
                cel_expressions(v, out);
            }
        }
        _ => {}
    }
}

#[test]
fn shipped_device_classes_carry_only_accepted_forms() {
    let v = verdicts();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for file in [
        "deviceclasses/knic.yaml",
        "charts/knic/files/deviceclasses.yaml",
        "deviceclasses/sriov.yaml",
        "deviceclasses/shared.yaml",
    ] {
        assert_all_accepted(&v, file, &shipped_class_expressions(&root.join(file)));
    }
}

/// The selectors of the example claim templates in `deviceclasses/examples/` (copied by users
/// as they are): every request's `exactly` and `firstAvailable` selectors.
#[test]
fn example_claims_carry_only_accepted_forms() {
    let v = verdicts();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deviceclasses/examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    let mut expressions = Vec::new();
    for file in &files {
        let yaml = std::fs::read_to_string(file).expect("example");
        for document in serde_yaml_ng::Deserializer::from_str(&yaml) {
            let doc: serde_yaml_ng::Value =
                serde::Deserialize::deserialize(document).expect("YAML");
            let requests = &doc["spec"]["spec"]["devices"]["requests"];
            for request in requests.as_sequence().into_iter().flatten() {
                let lists = std::iter::once(&request["exactly"]["selectors"]).chain(
                    request["firstAvailable"]
                        .as_sequence()
                        .into_iter()
                        .flatten()
                        .map(|sub| &sub["selectors"]),
                );
                for s in lists.filter_map(|l| l.as_sequence()).flatten() {
                    expressions.push(
                        s["cel"]["expression"]
                            .as_str()
                            .expect("expression")
                            .to_owned(),
                    );
                }
            }
        }
    }
    assert_all_accepted(&v, "deviceclasses/examples", &expressions);
}

/// Inline code in the README that is a whole selector (CEL text that tokenises, a test rather
/// than a bare attribute read, and not only knic's evaluable subset: `matches` counts too) is an example users copy, so it is held to the same rule.
#[test]
fn readme_examples_carry_only_accepted_forms() {
    let v = verdicts();
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README");
    // Fenced blocks are YAML, not inline selectors; their three backticks would also shift
    // which spans count as inline code.
    let mut inline = String::new();
    let mut yaml_blocks: Vec<String> = Vec::new();
    let mut fence: Option<String> = None;
    for line in readme.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            match fence.take() {
                Some(block) => yaml_blocks.push(block),
                None => {
                    fence = Some(if info == "yaml" {
                        String::new()
                    } else {
                        "-".into()
                    })
                }
            }
        } else if let Some(block) = fence.as_mut() {
            block.push_str(line);
            block.push('\n');
        } else {
            inline.push_str(line);
            inline.push('\n');
        }
    }
    // Selectors in the README's YAML examples (classes, claims, templates) too.
    let mut fenced = Vec::new();
    for block in yaml_blocks.iter().filter(|b| !b.starts_with('-')) {
        for document in serde_yaml_ng::Deserializer::from_str(block) {
            let value: serde_yaml_ng::Value =
                serde::Deserialize::deserialize(document).expect("README YAML example");
            cel_expressions(&value, &mut fenced);
        }
    }
    assert!(
        fenced.len() >= 2,
        "the README's YAML examples hold selectors: {fenced:?}"
    );
    assert_all_accepted(&v, "README YAML", &fenced);
    let examples: Vec<String> = inline
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.contains("device."))
        .filter(|span| {
            ["==", "!=", ">=", "<=", " in ", "(", "!"]
                .iter()
                .any(|op| span.contains(op))
        })
        .filter(|span| knic_controller::cel::syntax_problem(span).is_none())
        .map(str::to_owned)
        .collect();
    assert_all_accepted(&v, "README", &examples);
}

/// The verdicts the test reads are the shared fixture's, when the shared folder is beside the
/// repository (as on developer machines and in CI).
#[test]
fn fixture_copy_matches_the_shared_original() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/apiserver/cel-selector-verdicts-1.36.json");
    match std::fs::read_to_string(&shared) {
        Ok(original) => assert_eq!(
            original,
            VERDICTS,
            "{} changed: copy it again",
            shared.display()
        ),
        Err(e) => eprintln!("skipped: no shared fixture at {} ({e})", shared.display()),
    }
}

#[test]
fn refused_verdicts_are_recognised_as_refused_forms() {
    // Guards the comparison itself: a refused form must never be in the accepted set.
    let v = verdicts();
    for (expression, message) in &v.refused {
        assert!(
            !unaccepted(&v, expression).is_empty(),
            "refused {expression} ({message}) has only accepted clause forms"
        );
        assert_eq!(exceeds_cost_limit(expression), Ok(true), "{expression}");
    }
}
