//! The apiserver's validation of Events (`pkg/apis/core/validation/events.go`,
//! `ValidateEventCreate`), so an Event knic writes to the fake is refused where a real
//! apiserver would refuse it: `events.k8s.io/v1` creates get the strict rules (eventTime,
//! reportingController as a qualified name, reportingInstance/action/reason required and at
//! most 128 characters, the note at most 1024, the series, the deprecated fields unset); core
//! `v1` Events only the legacy ones. Field paths are the internal type's, as the apiserver
//! prints them (`message` for `note`, `involvedObject` for `regarding`).

use serde_json::Value;

const REPORTING_INSTANCE_LIMIT: usize = 128;
const ACTION_LIMIT: usize = 128;
const REASON_LIMIT: usize = 128;
const NOTE_LIMIT: usize = 1024;

fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn set(obj: &Value, pointer: &str) -> bool {
    obj.pointer(pointer).is_some_and(|v| !v.is_null())
}

/// `validation.IsQualifiedName`'s name part: 1 to 63 characters, alphanumerics with `-`, `_`,
/// `.` inside.
fn qualified_name_problems(value: &str) -> Vec<String> {
    const NAME_RULE: &str = "name part must consist of alphanumeric characters, '-', '_' or \
        '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or \
        'my.name',  or '123-abc', regex used for validation is \
        '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    let mut problems = Vec::new();
    let (prefix, name) = match value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    if value.matches('/').count() > 1 {
        problems.push(
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and \
             must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  \
             or '123-abc', regex used for validation is \
             '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix \
             and '/' (e.g. 'example.com/MyName')"
                .to_owned(),
        );
        return problems;
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            problems.push("prefix part must be non-empty".to_owned());
        } else if knic_proto::names::check_dns_subdomain(prefix).is_err() {
            problems.push(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.', and must start and end with an \
                 alphanumeric character (e.g. 'example.com', regex used for validation is \
                 '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                    .to_owned(),
            );
        }
    }
    if name.is_empty() {
        problems.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        problems.push("name part must be no more than 63 characters".to_owned());
    }
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !name.is_empty() && !ok {
        problems.push(NAME_RULE.to_owned());
    }
    problems
}

/// The field errors of creating `obj` in `namespace` through `group_version`
/// (`apis/events.k8s.io/v1` or `api/v1`).
pub fn field_errors(group_version: &str, namespace: &str, obj: &Value) -> Vec<String> {
    let strict = group_version == "apis/events.k8s.io/v1";
    // Both groups store the same object; the v1 names map onto the internal ones.
    let (involved, message) = if strict {
        ("/regarding", "/note")
    } else {
        ("/involvedObject", "/message")
    };
    let mut errors = Vec::new();
    let involved_ns = text(obj, &format!("{involved}/namespace"));
    let has_time = set(obj, "/eventTime");
    if !has_time {
        if involved_ns.is_empty() {
            if !namespace.is_empty() && namespace != "default" {
                errors.push(format!(
                    "involvedObject.namespace: Invalid value: \"{involved_ns}\": does not match event.namespace"
                ));
            }
        } else if namespace != involved_ns {
            errors.push(format!(
                "involvedObject.namespace: Invalid value: \"{involved_ns}\": does not match event.namespace"
            ));
        }
    } else {
        if involved_ns.is_empty() && namespace != "default" && namespace != "kube-system" {
            errors.push(format!(
                "involvedObject.namespace: Invalid value: \"{involved_ns}\": does not match event.namespace"
            ));
        }
        let controller = text(obj, "/reportingController");
        if controller.is_empty() {
            errors.push("reportingController: Required value".to_owned());
        }
        for problem in qualified_name_problems(controller) {
            errors.push(format!(
                "reportingController: Invalid value: \"{controller}\": {problem}"
            ));
        }
        let instance = text(obj, "/reportingInstance");
        if instance.is_empty() {
            errors.push("reportingInstance: Required value".to_owned());
        }
        if instance.len() > REPORTING_INSTANCE_LIMIT {
            errors.push(format!(
                "reportingInstance: Invalid value: \"\": can have at most {REPORTING_INSTANCE_LIMIT} characters"
            ));
        }
        for (field, limit) in [("action", ACTION_LIMIT), ("reason", REASON_LIMIT)] {
            let value = text(obj, &format!("/{field}"));
            if value.is_empty() {
                errors.push(format!("{field}: Required value"));
            }
            if value.len() > limit {
                errors.push(format!(
                    "{field}: Invalid value: \"\": can have at most {limit} characters"
                ));
            }
        }
        if text(obj, message).len() > NOTE_LIMIT {
            errors.push(format!(
                "message: Invalid value: \"\": can have at most {NOTE_LIMIT} characters"
            ));
        }
    }
    if !strict {
        return errors;
    }
    if set(obj, "/series") {
        if obj
            .pointer("/series/count")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            < 2
        {
            errors.push("series.count: Invalid value: \"\": should be at least 2".to_owned());
        }
        if !set(obj, "/series/lastObservedTime") {
            errors.push("series.lastObservedTime: Required value".to_owned());
        }
    }
    if !has_time {
        errors.push("eventTime: Required value".to_owned());
    }
    let type_ = text(obj, "/type");
    if type_ != "Normal" && type_ != "Warning" {
        errors.push(format!(
            "type: Invalid value: \"\": has invalid value: {type_}"
        ));
    }
    for (pointer, field) in [
        ("/deprecatedFirstTimestamp", "firstTimestamp"),
        ("/deprecatedLastTimestamp", "lastTimestamp"),
        ("/deprecatedCount", "count"),
        ("/deprecatedSource", "source"),
    ] {
        if set(obj, pointer) && obj.pointer(pointer) != Some(&Value::from(0)) {
            errors.push(format!("{field}: Invalid value: \"\": needs to be unset"));
        }
    }
    errors
}

/// The 422 message for a refused Event, as the apiserver writes it (`NewInvalid`).
pub fn refusal(group_version: &str, namespace: &str, name: &str, obj: &Value) -> Option<String> {
    let errors = field_errors(group_version, namespace, obj);
    if errors.is_empty() {
        return None;
    }
    let kind = if group_version == "apis/events.k8s.io/v1" {
        "Event.events.k8s.io"
    } else {
        "Event"
    };
    let detail = if errors.len() == 1 {
        errors[0].clone()
    } else {
        format!("[{}]", errors.join(", "))
    };
    Some(format!("{kind} \"{name}\" is invalid: {detail}"))
}
