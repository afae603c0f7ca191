//! The fake's copy of what a real apiserver does with ResourceSlice counters
//! (`DRAPartitionableDevices`): with the gate off it silently drops `sharedCounters`,
//! `consumesCounters`, `perDeviceNodeSelection` and the per-device node fields on write; with it
//! on it refuses what `pkg/apis/resource/validation` refuses, with the same field paths and
//! messages, so a driver that publishes PF budgets meets the same verdicts as on a cluster.

use serde_json::Value;

/// `ResourceSliceMaxDevices`.
const MAX_DEVICES: usize = 128;
/// `ResourceSliceMaxDevicesWithAdvancedFeatures`: any device with taints or counters.
const MAX_DEVICES_ADVANCED: usize = 64;
/// `ResourceSliceMaxCounterSets` (1.35+).
const MAX_COUNTER_SETS: usize = 8;
/// `ResourceSliceMaxCountersPerCounterSet`.
const MAX_COUNTERS_PER_SET: usize = 32;
/// `ResourceSliceMaxDeviceCounterConsumptionsPerDevice`.
const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// `ResourceSliceMaxCountersPerDeviceCounterConsumption`.
const MAX_COUNTERS_PER_CONSUMPTION: usize = 32;

/// apimachinery's `IsDNS1123Label` message for a value that is not one.
const DNS_LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case \
    alphanumeric characters or '-', and must start and end with an alphanumeric character \
    (e.g. 'my-name',  or '123-abc', regex used for validation is \
    '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Removes what an apiserver with `DRAPartitionableDevices` off drops from a slice.
pub(super) fn drop_partitionable_fields(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.remove("sharedCounters");
    spec.remove("perDeviceNodeSelection");
    for device in spec
        .get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        for key in ["consumesCounters", "nodeName", "nodeSelector", "allNodes"] {
            device.remove(key);
        }
    }
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// `ValidateDNS1123Label`'s field errors for `value` at `path`, as the apiserver prints them.
fn dns_label_errors(path: &str, value: &str, out: &mut Vec<String>) {
    let quoted = Value::String(value.to_owned());
    if value.len() > 63 {
        out.push(format!(
            "{path}: Invalid value: {quoted}: must be no more than 63 characters"
        ));
    }
    if !is_dns_label(value) {
        let detail = if is_dns_subdomain(value) {
            "must not contain dots"
        } else {
            DNS_LABEL_MESSAGE
        };
        out.push(format!("{path}: Invalid value: {quoted}: {detail}"));
    }
}

fn too_many(path: &str, have: usize, max: usize) -> String {
    format!("{path}: Too many: {have}: must have at most {max} items")
}

fn present(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null())
}

/// A counters map (of a set or of a consumption) at `path`: size and key names. Keys are
/// reported at the map's own path, as `validateMap` does.
fn counters_errors(path: &str, counters: Option<&Value>, max: usize, out: &mut Vec<String>) {
    match counters.and_then(Value::as_object) {
        None => out.push(format!("{path}: Required value")),
        Some(map) if map.is_empty() => out.push(format!("{path}: Required value")),
        Some(map) if map.len() > max => out.push(too_many(path, map.len(), max)),
        Some(map) => {
            for key in map.keys() {
                dns_label_errors(path, key, out);
            }
        }
    }
}

/// The field errors a real apiserver reports for a slice's counters, in its order.
fn errors(spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let devices = spec.get("devices").and_then(Value::as_array);
    let sets = spec.get("sharedCounters").and_then(Value::as_array);
    if present(spec.get("devices")) && present(spec.get("sharedCounters")) {
        out.push(
            "spec: Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed"
                .to_owned(),
        );
    }
    if let Some(devices) = devices {
        let advanced = devices.iter().any(|d| {
            ["consumesCounters", "taints"].iter().any(|k| {
                d.get(*k)
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty())
            })
        });
        let max = if advanced {
            MAX_DEVICES_ADVANCED
        } else {
            MAX_DEVICES
        };
        if devices.len() > max {
            out.push(too_many("spec.devices", devices.len(), max));
        } else {
            for (i, device) in devices.iter().enumerate() {
                super::capacity::device_errors(i, device, &mut out);
                super::taints::device_errors(i, device, &mut out);
                device_errors(i, device, &mut out);
            }
        }
    }
    if let Some(sets) = sets {
        if sets.len() > MAX_COUNTER_SETS {
            out.push(too_many(
                "spec.sharedCounters",
                sets.len(),
                MAX_COUNTER_SETS,
            ));
        } else {
            let mut seen = std::collections::BTreeSet::new();
            for (i, set) in sets.iter().enumerate() {
                let path = format!("spec.sharedCounters[{i}]");
                let name = set.get("name").and_then(Value::as_str).unwrap_or_default();
                if name.is_empty() {
                    out.push(format!("{path}.name: Required value"));
                } else {
                    dns_label_errors(&format!("{path}.name"), name, &mut out);
                }
                counters_errors(
                    &format!("{path}.counters"),
                    set.get("counters"),
                    MAX_COUNTERS_PER_SET,
                    &mut out,
                );
                if !seen.insert(name) {
                    out.push(format!(
                        "{path}: Duplicate value: {}",
                        Value::String(name.into())
                    ));
                }
            }
        }
    }
    out
}

fn device_errors(i: usize, device: &Value, out: &mut Vec<String>) {
    let Some(consumes) = device.get("consumesCounters").and_then(Value::as_array) else {
        return;
    };
    let path = format!("spec.devices[{i}].consumesCounters");
    if consumes.len() > MAX_CONSUMPTIONS_PER_DEVICE {
        out.push(too_many(&path, consumes.len(), MAX_CONSUMPTIONS_PER_DEVICE));
        return;
    }
    let mut seen = std::collections::BTreeSet::new();
    for (j, c) in consumes.iter().enumerate() {
        let set = c
            .get("counterSet")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if set.is_empty() {
            out.push(format!("{path}[{j}].counterSet: Required value"));
        } else {
            dns_label_errors(&format!("{path}[{j}].counterSet"), set, out);
        }
        counters_errors(
            &format!("{path}[{j}].counters"),
            c.get("counters"),
            MAX_COUNTERS_PER_CONSUMPTION,
            out,
        );
        if !seen.insert(set) {
            out.push(format!(
                "{path}[{j}]: Duplicate value: {}",
                Value::String(set.into())
            ));
        }
    }
}

/// The message of the 422 `Invalid` a real apiserver (gate on) answers the slice `obj` named
/// `name` with, if any: `ResourceSlice.resource.k8s.io "<name>" is invalid: <field errors>`.
pub(super) fn refusal(name: &str, obj: &Value) -> Option<String> {
    let problems = errors(obj.get("spec")?);
    if problems.is_empty() {
        return None;
    }
    let detail = if problems.len() == 1 {
        problems[0].clone()
    } else {
        format!("[{}]", problems.join(", "))
    };
    Some(format!(
        "ResourceSlice.resource.k8s.io \"{name}\" is invalid: {detail}"
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{drop_partitionable_fields, refusal};

    fn counters(n: usize) -> Value {
        (0..n)
            .map(|i| (format!("c{i}"), json!({"value": "1"})))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    fn set(name: &str) -> Value {
        json!({"name": name, "counters": {"vfs": {"value": "4"}}})
    }

    fn device(i: usize, consumes: usize) -> Value {
        let c: Vec<Value> = (0..consumes)
            .map(|j| json!({"counterSet": format!("pf-{j}"), "counters": {"vfs": {"value": "1"}}}))
            .collect();
        json!({"name": format!("dev-{i}"), "consumesCounters": c})
    }

    fn slice(spec: Value) -> Value {
        let mut spec = spec;
        spec["driver"] = json!("knic.dev");
        spec["nodeName"] = json!("n");
        spec["pool"] = json!({"name": "n", "generation": 1, "resourceSliceCount": 1});
        json!({"metadata": {"name": "s"}, "spec": spec})
    }

    const PREFIX: &str = "ResourceSlice.resource.k8s.io \"s\" is invalid: ";

    fn refused(spec: Value) -> String {
        let msg = refusal("s", &slice(spec)).expect("refused");
        msg.strip_prefix(PREFIX).expect(&msg).to_owned()
    }

    #[test]
    fn devices_and_counters_in_one_slice() {
        assert_eq!(
            refused(json!({"devices": [device(0, 1)], "sharedCounters": [set("pf-0")]})),
            "spec: Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed"
        );
    }

    #[test]
    fn too_many_counter_sets_and_counters() {
        let sets: Vec<Value> = (0..9).map(|i| set(&format!("pf-{i}"))).collect();
        assert_eq!(
            refused(json!({"sharedCounters": sets})),
            "spec.sharedCounters: Too many: 9: must have at most 8 items"
        );
        assert_eq!(
            refused(json!({"sharedCounters": [{"name": "pf-0", "counters": counters(33)}]})),
            "spec.sharedCounters[0].counters: Too many: 33: must have at most 32 items"
        );
        let eight: Vec<Value> = (0..8).map(|i| set(&format!("pf-{i}"))).collect();
        assert_eq!(refusal("s", &slice(json!({"sharedCounters": eight}))), None);
    }

    #[test]
    fn counter_set_names_are_dns_labels_unique_in_the_slice() {
        assert_eq!(
            refused(json!({"sharedCounters": [set("PF_0")]})),
            "spec.sharedCounters[0].name: Invalid value: \"PF_0\": a lowercase RFC 1123 label \
             must consist of lower case alphanumeric characters or '-', and must start and end \
             with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for \
             validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        assert_eq!(
            refused(json!({"sharedCounters": [set("pf.0")]})),
            "spec.sharedCounters[0].name: Invalid value: \"pf.0\": must not contain dots"
        );
        assert_eq!(
            refused(json!({"sharedCounters": [set("pf-0"), set("pf-0")]})),
            "spec.sharedCounters[1]: Duplicate value: \"pf-0\""
        );
    }

    #[test]
    fn at_most_two_consumptions_per_device() {
        assert_eq!(
            refused(json!({"devices": [device(0, 3)]})),
            "spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items"
        );
        assert_eq!(
            refusal("s", &slice(json!({"devices": [device(0, 2)]}))),
            None
        );
        let mut bad = device(0, 1);
        bad["consumesCounters"][0]["counterSet"] = json!("Pf-0");
        assert!(
            refused(json!({"devices": [bad]}))
                .starts_with("spec.devices[0].consumesCounters[0].counterSet: Invalid value: \"Pf-0\": a lowercase RFC 1123 label")
        );
    }

    #[test]
    fn at_most_64_devices_when_any_consumes_counters() {
        let mut devices: Vec<Value> = (0..65).map(|i| json!({"name": format!("d{i}")})).collect();
        assert_eq!(
            refusal("s", &slice(json!({"devices": devices.clone()}))),
            None,
            "65 plain devices are fine"
        );
        devices[64] = device(64, 1);
        assert_eq!(
            refused(json!({"devices": devices})),
            "spec.devices: Too many: 65: must have at most 64 items"
        );
        let many: Vec<Value> = (0..129).map(|i| json!({"name": format!("d{i}")})).collect();
        assert_eq!(
            refused(json!({"devices": many})),
            "spec.devices: Too many: 129: must have at most 128 items"
        );
    }

    #[test]
    fn several_errors_are_listed_in_brackets() {
        let msg = refused(json!({"devices": [device(0, 3)], "sharedCounters": [set("X")]}));
        assert!(
            msg.starts_with("[spec: Invalid value: \"\": only one of"),
            "{msg}"
        );
        assert!(
            msg.contains(", spec.devices[0].consumesCounters: Too many: 3"),
            "{msg}"
        );
        assert!(
            msg.contains(", spec.sharedCounters[0].name: Invalid value: \"X\""),
            "{msg}"
        );
    }

    #[test]
    fn gate_off_drops_the_partitionable_fields() {
        let mut obj = slice(json!({"devices": [device(0, 1)], "perDeviceNodeSelection": true}));
        obj["spec"]["devices"][0]["nodeName"] = json!("n");
        drop_partitionable_fields(&mut obj);
        assert_eq!(obj["spec"]["devices"][0], json!({"name": "dev-0"}));
        assert!(obj["spec"].get("perDeviceNodeSelection").is_none());
        let mut counters_only = slice(json!({"sharedCounters": [set("pf-0")]}));
        drop_partitionable_fields(&mut counters_only);
        assert!(counters_only["spec"].get("sharedCounters").is_none());
        assert_eq!(refusal("s", &counters_only), None);
    }
}
