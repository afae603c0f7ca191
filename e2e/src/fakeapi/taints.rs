//! The fake's copy of what a real apiserver does with device taints in ResourceSlices
//! (`DRADeviceTaints`): with the gate off it silently drops every device's `taints` on write;
//! with it on it sets the `timeAdded` of a taint that has none and refuses what
//! `validateDeviceTaint` (and the per-device count limit) refuses, with the same field paths
//! and messages (apimachinery's `IsQualifiedName` and `IsValidLabelValue`).

use serde_json::{Value, json};

/// `DeviceTaintsMaxLength` (1.35+; 1.34 allowed 4).
const MAX_TAINTS: usize = 16;
/// `validDeviceTaintEffects`, as `sets.List` prints them (sorted).
const EFFECTS: [&str; 3] = ["NoExecute", "NoSchedule", "None"];

const QUALIFIED_NAME_MESSAGE: &str = "must consist of alphanumeric characters, '-', '_' or '.', \
    and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
    '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MESSAGE: &str = "a valid label must be an empty string or consist of \
    alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric \
    character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is \
    '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const DNS_SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
    alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
    (e.g. 'example.com', regex used for validation is \
    '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

fn devices_mut(obj: &mut Value) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    obj.get_mut("spec")
        .and_then(|s| s.get_mut("devices"))
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

impl super::FakeApi {
    /// Turns the `DRADeviceTaints` gate on (the default, as in 1.36) or off: off, the fake
    /// drops every device's `taints` from every ResourceSlice written, as a 1.34/1.35
    /// apiserver does by default.
    pub fn set_device_taints(&self, enabled: bool) {
        self.store
            .device_taints
            .store(enabled, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the strategy does to a slice's taints on write: with the gate on, new taints get
/// their time; off, taints are dropped.
pub(super) fn prepare(obj: &mut Value, enabled: bool) {
    if enabled {
        stamp_time_added(obj, &super::now_rfc3339());
    } else {
        drop_taints(obj);
    }
}

/// Removes what an apiserver with `DRADeviceTaints` off drops from a slice.
pub(super) fn drop_taints(obj: &mut Value) {
    for device in devices_mut(obj) {
        device.remove("taints");
    }
}

/// Sets `timeAdded` to `now` on every taint without one, as the strategy does on create and
/// update.
pub(super) fn stamp_time_added(obj: &mut Value, now: &str) {
    for device in devices_mut(obj) {
        for taint in device
            .get_mut("taints")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            if taint.get("timeAdded").is_none_or(Value::is_null) {
                taint.insert("timeAdded".into(), json!(now));
            }
        }
    }
}

/// The part of a name or value matched by `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    })
}

/// `IsQualifiedName`'s messages for `value`.
fn qualified_name_problems(value: &str) -> Vec<String> {
    let parts: Vec<&str> = value.split('/').collect();
    let mut out = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                out.push("prefix part must be non-empty".to_owned());
            } else {
                if prefix.len() > 253 {
                    out.push("prefix part must be no more than 253 characters".to_owned());
                }
                if !is_dns_subdomain(prefix) {
                    out.push(format!("prefix part {DNS_SUBDOMAIN_MESSAGE}"));
                }
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_MESSAGE} with an optional DNS subdomain \
                 prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        out.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        out.push("name part must be no more than 63 characters".to_owned());
    }
    if !is_qualified_part(name) {
        out.push(format!("name part {QUALIFIED_NAME_MESSAGE}"));
    }
    out
}

/// `IsValidLabelValue`'s messages for a non-empty `value`.
fn label_value_problems(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    if value.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    if !is_qualified_part(value) {
        out.push(LABEL_VALUE_MESSAGE.to_owned());
    }
    out
}

/// The taint errors of device `i`, in `validateDevice`'s order: the count, then each taint's
/// key, value and effect.
pub(super) fn device_errors(i: usize, device: &Value, out: &mut Vec<String>) {
    let Some(taints) = device.get("taints").and_then(Value::as_array) else {
        return;
    };
    let path = format!("spec.devices[{i}].taints");
    if taints.len() > MAX_TAINTS {
        out.push(format!(
            "{path}: Too many: {}: must have at most {MAX_TAINTS} items",
            taints.len()
        ));
        return;
    }
    for (j, taint) in taints.iter().enumerate() {
        let path = format!("{path}[{j}]");
        let text = |key: &str| taint.get(key).and_then(Value::as_str).unwrap_or_default();
        let key = text("key");
        for problem in qualified_name_problems(key) {
            out.push(format!(
                "{path}.key: Invalid value: {}: {problem}",
                Value::String(key.into())
            ));
        }
        let value = text("value");
        if !value.is_empty() {
            for problem in label_value_problems(value) {
                out.push(format!(
                    "{path}.value: Invalid value: {}: {problem}",
                    Value::String(value.into())
                ));
            }
        }
        let effect = text("effect");
        if effect.is_empty() {
            out.push(format!("{path}.effect: Required value"));
        } else if !EFFECTS.contains(&effect) {
            let supported: Vec<String> = EFFECTS.iter().map(|e| format!("\"{e}\"")).collect();
            out.push(format!(
                "{path}.effect: Unsupported value: {}: supported values: {}",
                Value::String(effect.into()),
                supported.join(", ")
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{drop_taints, stamp_time_added};
    use crate::fakeapi::slices::refusal;

    const PREFIX: &str = "ResourceSlice.resource.k8s.io \"s\" is invalid: ";

    fn slice(taints: Value) -> Value {
        json!({"metadata": {"name": "s"}, "spec": {
            "driver": "knic.dev", "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0"}, {"name": "d1", "taints": taints}],
        }})
    }

    fn taint(key: &str, value: &str, effect: &str) -> Value {
        json!({"key": key, "value": value, "effect": effect})
    }

    fn refused(taints: Value) -> String {
        let msg = refusal("s", &slice(taints)).expect("refused");
        msg.strip_prefix(PREFIX).expect(&msg).to_owned()
    }

    #[test]
    fn knic_taints_are_accepted() {
        let taints = json!([
            taint("knic.dev/link-down", "lowerlayerdown", "NoSchedule"),
            taint("knic.dev/driver-unbound", "no-driver", "NoSchedule"),
            taint("knic.dev/gone", "vanished", "NoSchedule"),
            {"key": "example.com/x", "effect": "None"},
        ]);
        assert_eq!(refusal("s", &slice(taints)), None);
    }

    #[test]
    fn key_must_be_a_label_name() {
        assert_eq!(
            refused(json!([taint("knic.dev/link down", "down", "NoSchedule")])),
            "spec.devices[1].taints[0].key: Invalid value: \"knic.dev/link down\": name part \
             must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
             with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', \
             regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        );
        assert_eq!(
            refused(json!([taint("Knic.dev/x", "down", "NoSchedule")])),
            "spec.devices[1].taints[0].key: Invalid value: \"Knic.dev/x\": prefix part a \
             lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character (e.g. \
             'example.com', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        );
        let long = format!("knic.dev/{}", "a".repeat(64));
        assert_eq!(
            refused(json!([taint(&long, "", "NoSchedule")])),
            format!(
                "spec.devices[1].taints[0].key: Invalid value: \"{long}\": name part must be \
                 no more than 63 characters"
            )
        );
        assert!(refused(json!([{"effect": "NoSchedule"}])).starts_with(
            "[spec.devices[1].taints[0].key: Invalid value: \"\": name part must be \
                 non-empty, spec.devices[1].taints[0].key: Invalid value: \"\": name part must \
                 consist of"
        ));
    }

    #[test]
    fn value_must_be_a_label_value() {
        assert_eq!(
            refused(json!([taint(
                "knic.dev/link-down",
                "link is down",
                "NoSchedule"
            )])),
            "spec.devices[1].taints[0].value: Invalid value: \"link is down\": a valid label \
             must be an empty string or consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character (e.g. 'MyValue',  or \
             'my_value',  or '12345', regex used for validation is \
             '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        );
        let long = "a".repeat(64);
        assert_eq!(
            refused(json!([taint("knic.dev/gone", &long, "NoSchedule")])),
            format!(
                "spec.devices[1].taints[0].value: Invalid value: \"{long}\": must be no more \
                 than 63 characters"
            )
        );
    }

    #[test]
    fn effect_is_required_and_an_enum() {
        assert_eq!(
            refused(json!([taint("knic.dev/gone", "vanished", "")])),
            "spec.devices[1].taints[0].effect: Required value"
        );
        assert_eq!(
            refused(json!([taint(
                "knic.dev/gone",
                "vanished",
                "PreferNoSchedule"
            )])),
            "spec.devices[1].taints[0].effect: Unsupported value: \"PreferNoSchedule\": \
             supported values: \"NoExecute\", \"NoSchedule\", \"None\""
        );
    }

    #[test]
    fn at_most_16_taints_per_device() {
        let many: Vec<Value> = (0..17)
            .map(|i| taint(&format!("knic.dev/t{i}"), "", "NoSchedule"))
            .collect();
        assert_eq!(
            refused(json!(many)),
            "spec.devices[1].taints: Too many: 17: must have at most 16 items"
        );
        assert_eq!(refusal("s", &slice(json!(many[..16]))), None);
    }

    #[test]
    fn at_most_64_devices_when_any_is_tainted() {
        let mut devices: Vec<Value> = (0..65).map(|i| json!({"name": format!("d{i}")})).collect();
        devices[3]["taints"] = json!([taint("knic.dev/gone", "vanished", "NoSchedule")]);
        let mut obj = slice(json!([]));
        obj["spec"]["devices"] = json!(devices);
        assert_eq!(
            refusal("s", &obj).unwrap().strip_prefix(PREFIX),
            Some("spec.devices: Too many: 65: must have at most 64 items")
        );
    }

    #[test]
    fn time_added_is_set_when_missing_and_kept_when_given() {
        let mut obj = slice(json!([
            taint("knic.dev/gone", "vanished", "NoSchedule"),
            {"key": "knic.dev/link-down", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"},
        ]));
        stamp_time_added(&mut obj, "2026-11-23T10:00:00Z");
        let taints = &obj["spec"]["devices"][1]["taints"];
        assert_eq!(taints[0]["timeAdded"], "2026-11-23T10:00:00Z");
        assert_eq!(taints[1]["timeAdded"], "2026-01-01T00:00:00Z");
    }

    #[test]
    fn gate_off_drops_the_taints() {
        let mut obj = slice(json!([taint("knic.dev/gone", "vanished", "NoSchedule")]));
        drop_taints(&mut obj);
        assert_eq!(obj["spec"]["devices"][1], json!({"name": "d1"}));
    }
}
