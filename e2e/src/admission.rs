//! The fake API's copy of the real apiserver's validation of CEL device selectors: a selector
//! a v1.36 apiserver refuses for its cost is refused here with the same status and message, so
//! an e2e run sees what a real cluster would (knic once generated such a selector for every
//! template, and only a real apiserver noticed).

use serde_json::Value;

use knic_controller::cel::{COST_LIMIT_MESSAGE, exceeds_cost_limit};

/// The message of the 422 `Invalid` a real apiserver answers `obj` in `resource` with, if any,
/// as the apiserver writes it (`NewInvalid`: qualified kind, name, field errors):
/// `ResourceClaimTemplate.resource.k8s.io "x" is invalid: spec.spec.devices.requests[0].exactly.
/// selectors[1].cel.expression: Forbidden: too complex, exceeds cost limit`. (kubectl shows the
/// same as `The ResourceClaimTemplate "x" is invalid: …`, the form the verdict file recorded.)
pub fn refusal(resource: &str, obj: &Value) -> Option<String> {
    let (kind, selector_lists) = match resource {
        "resourceclaimtemplates" => ("ResourceClaimTemplate", request_selectors(obj, "spec.spec")),
        "resourceclaims" => ("ResourceClaim", request_selectors(obj, "spec")),
        "deviceclasses" => (
            "DeviceClass",
            vec![("spec.selectors".to_owned(), obj.pointer("/spec/selectors"))],
        ),
        _ => return None,
    };
    let problems: Vec<String> = selector_lists
        .into_iter()
        .flat_map(|(path, list)| {
            list.and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .filter_map(move |(j, s)| {
                    let expression = s.pointer("/cel/expression")?.as_str()?;
                    (exceeds_cost_limit(expression) == Ok(true))
                        .then(|| format!("{path}[{j}].cel.expression: {COST_LIMIT_MESSAGE}"))
                })
        })
        .collect();
    if problems.is_empty() {
        return None;
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // The apiserver lists several field errors in brackets.
    let detail = if problems.len() == 1 {
        problems[0].clone()
    } else {
        format!("[{}]", problems.join(", "))
    };
    Some(format!(
        "{kind}.resource.k8s.io \"{name}\" is invalid: {detail}"
    ))
}

/// The refusal of a claim status write whose `status.devices` name a device that is not
/// allocated to the claim, or one device twice, as `validateDeviceStatus` words it. A share of
/// a device (consumable capacity) is its own allocated device: `(driver, pool, device,
/// shareID)`, printed `driver/pool/device/shareID` (`structured.SharedDeviceID`), so an entry
/// without the allocation's shareID is refused; that is what lets shared devices be reported at
/// all.
pub fn claim_status_refusal(obj: &Value) -> Option<String> {
    let id = |v: &Value| {
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
        let mut id = format!("{}/{}/{}", text("driver"), text("pool"), text("device"));
        if let Some(share) = v.get("shareID").and_then(Value::as_str) {
            id = format!("{id}/{share}");
        }
        id
    };
    let allocated: std::collections::BTreeSet<String> = obj
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(id)
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut problems = Vec::new();
    for (i, entry) in obj
        .pointer("/status/devices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let device = id(entry);
        if !allocated.contains(&device) {
            problems.push(format!(
                "status.devices[{i}]: Invalid value: {device}: must be an allocated device in \
                 the claim"
            ));
        }
        if !seen.insert(device.clone()) {
            problems.push(format!("status.devices[{i}]: Duplicate value: {device}"));
        }
    }
    if problems.is_empty() {
        return None;
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let detail = if problems.len() == 1 {
        problems[0].clone()
    } else {
        format!("[{}]", problems.join(", "))
    };
    Some(format!(
        "ResourceClaim.resource.k8s.io \"{name}\" is invalid: {detail}"
    ))
}

/// Every selector list of a claim spec at `prefix`: each request's `exactly.selectors` and
/// each `firstAvailable[k].selectors`.
fn request_selectors<'a>(obj: &'a Value, prefix: &str) -> Vec<(String, Option<&'a Value>)> {
    let pointer = format!("/{}/devices/requests", prefix.replace('.', "/"));
    let mut out = Vec::new();
    for (i, request) in obj
        .pointer(&pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        out.push((
            format!("{prefix}.devices.requests[{i}].exactly.selectors"),
            request.pointer("/exactly/selectors"),
        ));
        for (k, sub) in request
            .get("firstAvailable")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            out.push((
                format!("{prefix}.devices.requests[{i}].firstAvailable[{k}].selectors"),
                sub.get("selectors"),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{claim_status_refusal, refusal};

    #[test]
    fn a_status_entry_must_name_an_allocated_device_and_its_share() {
        let claim = |entries: serde_json::Value| {
            json!({"metadata": {"name": "c"}, "status": {
                "allocation": {"devices": {"results": [
                    {"request": "a", "driver": "knic.dev", "pool": "n", "device": "eth1"},
                    {"request": "b", "driver": "knic.dev", "pool": "n", "device": "ens1f0",
                     "shareID": "7c0e3f0a-1b2c-4d5e-8f90-a1b2c3d4e5f6"}]}},
                "devices": entries}})
        };
        let ok = claim(json!([
            {"driver": "knic.dev", "pool": "n", "device": "eth1"},
            {"driver": "knic.dev", "pool": "n", "device": "ens1f0",
             "shareID": "7c0e3f0a-1b2c-4d5e-8f90-a1b2c3d4e5f6"}]));
        assert_eq!(claim_status_refusal(&ok), None);
        let unshared = claim(json!([{"driver": "knic.dev", "pool": "n", "device": "ens1f0"}]));
        assert_eq!(
            claim_status_refusal(&unshared).as_deref(),
            Some(
                "ResourceClaim.resource.k8s.io \"c\" is invalid: status.devices[0]: Invalid \
                 value: knic.dev/n/ens1f0: must be an allocated device in the claim"
            )
        );
        let twice = claim(json!([
            {"driver": "knic.dev", "pool": "n", "device": "eth1"},
            {"driver": "knic.dev", "pool": "n", "device": "eth1"}]));
        assert_eq!(
            claim_status_refusal(&twice).as_deref(),
            Some(
                "ResourceClaim.resource.k8s.io \"c\" is invalid: status.devices[1]: Duplicate \
                 value: knic.dev/n/eth1"
            )
        );
    }

    const REFUSED: &str =
        r#"!device.attributes["knic.dev"].?exhaustedNetworks.orValue("").contains(",ab12cd34,")"#;

    #[test]
    fn message_matches_the_real_apiserver() {
        let template = json!({"metadata": {"name": "verdict-0"}, "spec": {"spec": {"devices": {
            "requests": [{"name": "r", "exactly": {"deviceClassName": "knic.dev",
                "selectors": [{"cel": {"expression": REFUSED}}]}}]}}}});
        // The verdict file's message (kubectl's rendering), with the API's own prefix.
        let recorded = "The ResourceClaimTemplate \"verdict-0\" is invalid: spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: Forbidden: too complex, exceeds cost limit";
        let got = refusal("resourceclaimtemplates", &template).unwrap_or_default();
        assert_eq!(
            got.strip_prefix("ResourceClaimTemplate.resource.k8s.io "),
            recorded.strip_prefix("The ResourceClaimTemplate "),
            "{got}"
        );
        let claim = json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"selectors": [{"cel": {"expression": "true"}}]}},
            {"name": "b", "firstAvailable": [{"selectors": [
                {"cel": {"expression": "true"}}, {"cel": {"expression": REFUSED}}]}]}]}}});
        assert_eq!(
            refusal("resourceclaims", &claim).as_deref(),
            Some(
                "ResourceClaim.resource.k8s.io \"c\" is invalid: spec.devices.requests[1].firstAvailable[0].selectors[1].cel.expression: Forbidden: too complex, exceeds cost limit"
            )
        );
        let class = json!({"metadata": {"name": "k"}, "spec": {"selectors": [
            {"cel": {"expression": REFUSED}}, {"cel": {"expression": REFUSED}}]}});
        assert!(refusal("deviceclasses", &class).is_some_and(|m| {
            m.starts_with("DeviceClass.resource.k8s.io \"k\" is invalid: [spec.selectors[0]")
        }));
        let fine =
            json!({"spec": {"selectors": [{"cel": {"expression": "device.driver == \"x\""}}]}});
        assert_eq!(refusal("deviceclasses", &fine), None);
        assert_eq!(refusal("pods", &template), None);
    }
}
