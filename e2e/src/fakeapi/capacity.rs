//! The fake's copy of what a real apiserver does with consumable capacity
//! (`DRAConsumableCapacity`): with the gate off it silently drops `allowMultipleAllocations` and
//! every capacity's `requestPolicy` on write; with it on it refuses what
//! `pkg/apis/resource/validation` (`validateDevice`, `validateRequestPolicy` and what they call)
//! refuses, with the same field paths and messages, so a driver that publishes shared devices
//! meets the same verdicts as on a cluster.
//!
//! Quantities are compared exactly (in thousandths); the apiserver's fractional-range gate
//! (`DRAFractionalCapacityRange`), its int64 overflow guards and duplicate `validValues` are not
//! copied: knic publishes whole, distinct, in-range numbers.

use serde_json::Value;

/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice`.
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// `CapacityRequestPolicyDiscreteMaxOptions`.
const MAX_VALID_VALUES: usize = 10;

/// Removes what an apiserver with `DRAConsumableCapacity` off drops from a slice.
pub(super) fn drop_consumable_fields(obj: &mut Value) {
    let Some(devices) = obj
        .get_mut("spec")
        .and_then(|s| s.get_mut("devices"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for device in devices.iter_mut().filter_map(Value::as_object_mut) {
        device.remove("allowMultipleAllocations");
        for capacity in device
            .get_mut("capacity")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|m| m.values_mut())
            .filter_map(Value::as_object_mut)
        {
            capacity.remove("requestPolicy");
        }
    }
}

/// A parsed quantity: its value in thousandths, and its canonical spelling.
#[derive(Debug, Clone)]
struct Quantity {
    milli: i128,
    text: String,
}

const DECIMAL: [(&str, i128); 6] = [
    ("k", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
];
const BINARY: [(&str, i128); 6] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("Ei", 1 << 60),
];

impl Quantity {
    /// The forms knic and its tests write: an optional sign, digits, an optional fraction and
    /// an optional `m`, SI or binary suffix. Anything else is `None` (a real apiserver would
    /// not decode the object at all).
    fn parse(text: &str) -> Option<Quantity> {
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        let split = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(split);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() || whole.len() > 24 || fraction.len() > 3 {
            return None;
        }
        let mut milli: i128 = whole.parse::<i128>().ok()? * 1000;
        if !fraction.is_empty() {
            milli += fraction.parse::<i128>().ok()? * 10i128.pow(3 - fraction.len() as u32);
        }
        let binary = BINARY.iter().find(|(s, _)| *s == suffix);
        let multiplier = match suffix {
            "" => 1000,
            "m" => 1,
            _ => match (DECIMAL.iter().find(|(s, _)| *s == suffix), binary) {
                (Some((_, m)), _) | (_, Some((_, m))) => m * 1000,
                _ => return None,
            },
        };
        // Multiplying thousandths by the suffix's thousandths-per-unit, then back.
        let milli = milli.checked_mul(multiplier)? / 1000;
        let milli = if negative { -milli } else { milli };
        Some(Quantity {
            milli,
            text: canonical(milli, binary.is_some()),
        })
    }
}

/// apimachinery's `Quantity.String()` for whole values (and thousandths): the largest suffix
/// that keeps the mantissa whole, binary suffixes only for a binary-written quantity.
fn canonical(milli: i128, binary: bool) -> String {
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let value = milli / 1000;
    if value == 0 {
        return "0".to_owned();
    }
    let table = if binary && value.abs() >= 1024 {
        &BINARY
    } else {
        &DECIMAL
    };
    for (suffix, unit) in table.iter().rev() {
        if value % unit == 0 {
            return format!("{}{suffix}", value / unit);
        }
    }
    value.to_string()
}

fn quoted(q: &Quantity) -> Value {
    Value::String(q.text.clone())
}

fn quantity(v: Option<&Value>) -> Option<Quantity> {
    Quantity::parse(v?.as_str()?)
}

/// `validateDevice`'s capacity rules for device `i`, in its order: the entry count, then each
/// capacity (in key order) under the rules for a device allocatable once or many times.
pub(super) fn device_errors(i: usize, device: &Value, out: &mut Vec<String>) {
    let path = format!("spec.devices[{i}]");
    let count = |k: &str| {
        device
            .get(k)
            .and_then(Value::as_object)
            .map_or(0, |m| m.len())
    };
    let entries = count("attributes") + count("capacity");
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES {
        out.push(format!(
            "{path}: Invalid value: {entries}: the total number of attributes and capacities \
             must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"
        ));
    }
    let multiple = device
        .get("allowMultipleAllocations")
        .and_then(Value::as_bool)
        == Some(true);
    let Some(capacities) = device.get("capacity").and_then(Value::as_object) else {
        return;
    };
    let mut keys: Vec<&String> = capacities.keys().collect();
    keys.sort();
    for key in keys {
        let capacity = &capacities[key];
        let Some(policy) = capacity.get("requestPolicy").filter(|p| !p.is_null()) else {
            continue;
        };
        let at = format!("{path}.capacity[{key}].requestPolicy");
        if !multiple {
            out.push(format!(
                "{at}: Forbidden: allowMultipleAllocations must be true"
            ));
            continue;
        }
        if let Some(value) = quantity(capacity.get("value")) {
            policy_errors(&at, &value, policy, out);
        }
    }
}

fn policy_errors(at: &str, capacity: &Quantity, policy: &Value, out: &mut Vec<String>) {
    let values = policy
        .get("validValues")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty());
    let range = policy.get("validRange").filter(|r| !r.is_null());
    let default = quantity(policy.get("default"));
    match (values, range) {
        (Some(_), Some(_)) => out.push(format!(
            "{at}: Forbidden: exactly one policy can be specified, cannot specify \
             \"validValues\" and \"validRange\" at the same time"
        )),
        (Some(values), None) => match default {
            None => out.push(format!(
                "{at}.default: Required value: required when validValues is defined"
            )),
            Some(default) => valid_values_errors(at, capacity, &default, values, out),
        },
        (None, Some(range)) => match default {
            None => out.push(format!(
                "{at}.default: Required value: required when validRange is defined"
            )),
            Some(default) => {
                range_errors(&format!("{at}.validRange"), capacity, &default, range, out)
            }
        },
        (None, None) => {}
    }
}

fn valid_values_errors(
    at: &str,
    capacity: &Quantity,
    default: &Quantity,
    values: &[Value],
    out: &mut Vec<String>,
) {
    let path = format!("{at}.validValues");
    let parsed: Vec<Option<Quantity>> = values.iter().map(|v| quantity(Some(v))).collect();
    for (i, pair) in parsed.windows(2).enumerate() {
        if let [Some(a), Some(b)] = pair
            && a.milli > b.milli
        {
            out.push(format!(
                "{path}[{}]: Invalid value: {}: values must be sorted in ascending order",
                i + 1,
                quoted(b)
            ));
        }
    }
    let mut found = false;
    if values.len() > MAX_VALID_VALUES {
        out.push(format!(
            "{path}: Too many: {}: must have at most {MAX_VALID_VALUES} items",
            values.len()
        ));
    } else {
        for (i, option) in parsed.iter().enumerate() {
            let Some(option) = option else { continue };
            if option.milli > capacity.milli {
                out.push(format!(
                    "{path}[{i}]: Invalid value: {}: option is larger than capacity value: {}",
                    quoted(option),
                    capacity.text
                ));
            }
            found |= option.milli == default.milli;
        }
    }
    if !found {
        out.push(format!(
            "{path}: Invalid value: {}: default value is not valid according to the requestPolicy",
            quoted(default)
        ));
    }
}

fn range_errors(
    at: &str,
    capacity: &Quantity,
    default: &Quantity,
    range: &Value,
    out: &mut Vec<String>,
) {
    let Some(min) = quantity(range.get("min")) else {
        out.push(format!(
            "{at}.min: Required value: required when validRange is defined"
        ));
        return;
    };
    if min.milli > capacity.milli {
        out.push(format!(
            "{at}.min: Invalid value: {}: min is larger than capacity value: {}",
            quoted(&min),
            capacity.text
        ));
    }
    if default.milli < min.milli {
        out.push(format!(
            "{at}.default: Invalid value: {}: default is less than min: {}",
            quoted(default),
            min.text
        ));
    }
    let max = quantity(range.get("max"));
    if let Some(max) = &max {
        if min.milli > max.milli {
            out.push(format!(
                "{at}.max: Invalid value: {}: min is larger than max: {}",
                quoted(&min),
                max.text
            ));
        }
        if max.milli > capacity.milli {
            out.push(format!(
                "{at}.max: Invalid value: {}: max is larger than capacity value: {}",
                quoted(max),
                capacity.text
            ));
        }
        if default.milli > max.milli {
            out.push(format!(
                "{at}.default: Invalid value: {}: default is more than max: {}",
                quoted(default),
                max.text
            ));
        }
    }
    let Some(step) = quantity(range.get("step")) else {
        return;
    };
    if step.milli <= 0 {
        out.push(format!(
            "{at}.step: Invalid value: {}: must be greater than zero",
            quoted(&step)
        ));
        return;
    }
    let one_step = min.milli + step.milli;
    if one_step > capacity.milli {
        out.push(format!(
            "{at}.step: Invalid value: {}: one step {} is larger than capacity value: {}",
            quoted(&step),
            canonical(one_step, false),
            capacity.text
        ));
    }
    for value in std::iter::once(default).chain(max.as_ref()) {
        if (value.milli - min.milli) % step.milli != 0 {
            out.push(format!(
                "{at}.step: Invalid value: {}: value is not a multiple of a given step ({}) from ({})",
                quoted(value),
                step.text,
                min.text
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::drop_consumable_fields;
    use crate::fakeapi::slices::refusal;

    fn shared(capacity: Value) -> Value {
        json!({"name": "p", "allowMultipleAllocations": true, "capacity": capacity})
    }

    fn slice(devices: Vec<Value>) -> Value {
        json!({"metadata": {"name": "s"}, "spec": {
            "driver": "knic.dev", "nodeName": "n", "devices": devices,
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
        }})
    }

    const PREFIX: &str = "ResourceSlice.resource.k8s.io \"s\" is invalid: ";

    fn verdict(device: Value) -> Option<String> {
        refusal("s", &slice(vec![device])).map(|m| m.strip_prefix(PREFIX).expect(&m).to_owned())
    }

    fn range(value: &str, default: &str, range: Value) -> Value {
        shared(json!({"bandwidth": {"value": value,
            "requestPolicy": {"default": default, "validRange": range}}}))
    }

    const AT: &str = "spec.devices[0].capacity[bandwidth].requestPolicy";

    #[test]
    fn what_knic_publishes_is_accepted() {
        let parent = shared(json!({
            "bandwidth": {"value": "25G", "requestPolicy": {"default": "100M",
                "validRange": {"min": "10M", "step": "10M"}}},
            "children": {"value": "32", "requestPolicy": {"default": "1", "validValues": ["1"]}},
        }));
        assert_eq!(verdict(parent), None);
        let plain = json!({"name": "p", "capacity": {"bandwidth": {"value": "25G"}}});
        assert_eq!(verdict(plain), None);
    }

    #[test]
    fn request_policy_needs_multiple_allocations() {
        let device = json!({"name": "p", "capacity": {"children": {"value": "4",
            "requestPolicy": {"default": "1", "validValues": ["1"]}}}});
        assert_eq!(
            verdict(device).as_deref(),
            Some(
                "spec.devices[0].capacity[children].requestPolicy: Forbidden: allowMultipleAllocations must be true"
            )
        );
    }

    #[test]
    fn at_most_32_attributes_and_capacities() {
        let attributes: serde_json::Map<String, Value> = (0..31)
            .map(|i| (format!("a{i}"), json!({"int": i})))
            .collect();
        let mut device = shared(json!({"children": {"value": "4"}, "bandwidth": {"value": "1G"}}));
        device["attributes"] = Value::Object(attributes);
        assert_eq!(
            verdict(device.clone()).as_deref(),
            Some(
                "spec.devices[0]: Invalid value: 33: the total number of attributes and capacities must not exceed 32"
            )
        );
        device["capacity"]
            .as_object_mut()
            .unwrap()
            .remove("bandwidth");
        assert_eq!(verdict(device), None);
    }

    #[test]
    fn valid_values_rules() {
        let values = |default: Option<&str>, values: Value| {
            let mut policy = json!({"validValues": values});
            if let Some(d) = default {
                policy["default"] = json!(d);
            }
            verdict(shared(
                json!({"bandwidth": {"value": "10", "requestPolicy": policy}}),
            ))
            .unwrap()
        };
        assert_eq!(
            values(None, json!(["1"])),
            format!("{AT}.default: Required value: required when validValues is defined")
        );
        assert_eq!(
            values(Some("2"), json!(["1", "4", "2"])),
            format!(
                "{AT}.validValues[2]: Invalid value: \"2\": values must be sorted in ascending order"
            )
        );
        assert_eq!(
            values(Some("1"), json!(["1", "20k"])),
            format!(
                "{AT}.validValues[1]: Invalid value: \"20k\": option is larger than capacity value: 10"
            )
        );
        assert_eq!(
            values(Some("3"), json!(["1", "2"])),
            format!(
                "{AT}.validValues: Invalid value: \"3\": default value is not valid according to the requestPolicy"
            )
        );
        let eleven: Vec<String> = (1..=11).map(|i| i.to_string()).collect();
        assert_eq!(
            values(Some("1"), json!(eleven)),
            format!(
                "[{AT}.validValues: Too many: 11: must have at most 10 items, {AT}.validValues: Invalid value: \"1\": default value is not valid according to the requestPolicy]"
            )
        );
        let both = shared(
            json!({"bandwidth": {"value": "10", "requestPolicy": {"default": "1",
            "validValues": ["1"], "validRange": {"min": "1"}}}}),
        );
        assert_eq!(
            verdict(both).unwrap(),
            format!(
                "{AT}: Forbidden: exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time"
            )
        );
    }

    #[test]
    fn valid_range_rules() {
        let r = |value, default, bounds| verdict(range(value, default, bounds)).unwrap();
        let at = format!("{AT}.validRange");
        let no_default = shared(json!({"bandwidth": {"value": "1G",
            "requestPolicy": {"validRange": {"min": "1M"}}}}));
        assert_eq!(
            verdict(no_default).unwrap(),
            format!("{AT}.default: Required value: required when validRange is defined")
        );
        assert_eq!(
            r("1G", "1M", json!({"step": "1M"})),
            format!("{at}.min: Required value: required when validRange is defined")
        );
        assert_eq!(
            r("1G", "2G", json!({"min": "2000000000"})),
            format!("{at}.min: Invalid value: \"2G\": min is larger than capacity value: 1G")
        );
        assert_eq!(
            r("1G", "1M", json!({"min": "10M"})),
            format!("{at}.default: Invalid value: \"1M\": default is less than min: 10M")
        );
        assert_eq!(
            r("1G", "10M", json!({"min": "10M", "step": "0"})),
            format!("{at}.step: Invalid value: \"0\": must be greater than zero")
        );
        assert_eq!(
            r("1G", "900M", json!({"min": "900M", "step": "200M"})),
            format!(
                "{at}.step: Invalid value: \"200M\": one step 1100M is larger than capacity value: 1G"
            )
        );
        assert_eq!(
            r("1G", "15M", json!({"min": "10M", "step": "10M"})),
            format!(
                "{at}.step: Invalid value: \"15M\": value is not a multiple of a given step (10M) from (10M)"
            )
        );
        assert_eq!(
            r("1G", "10M", json!({"min": "10M", "max": "2G"})),
            format!("{at}.max: Invalid value: \"2G\": max is larger than capacity value: 1G")
        );
        assert_eq!(
            r("1Gi", "1Mi", json!({"min": "1Mi", "max": "512Ki"})),
            format!(
                "[{at}.max: Invalid value: \"1Mi\": min is larger than max: 512Ki, {at}.default: Invalid value: \"1Mi\": default is more than max: 512Ki]"
            )
        );
    }

    #[test]
    fn gate_off_drops_the_consumable_fields() {
        let mut obj = slice(vec![shared(json!({
            "children": {"value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}},
        }))]);
        drop_consumable_fields(&mut obj);
        assert_eq!(
            obj["spec"]["devices"][0],
            json!({"name": "p", "capacity": {"children": {"value": "4"}}})
        );
        assert_eq!(refusal("s", &obj), None);
    }
}
