//! The chart's ValidatingAdmissionPolicies, evaluated: every policy in admission.yaml is
//! rendered, bound with Deny, and its matchConditions, variables, validations and
//! messageExpressions run through knic's policy CEL evaluator against allowed and forbidden
//! requests of the driver (and of other identities), the way the apiserver applies them:
//! resource rules, then match conditions, then lazily evaluated variables, then the first
//! failing validation's message. And every write the driver's RBAC allows is covered by one.

use anyhow::{Context, bail, ensure};
use knic_controller::cel::policy::{Env, Program, Val};
use libtest_mimic::Trial;
use serde_json::{Value, json};

use super::{DRIVER_SA, RELEASE_NAMESPACE, Rbac, check, objects};

const NODE: &str = "node-a";
const OTHER: &str = "node-b";
const DECLARED: &[&str] = &["request", "object", "oldObject"];
const NO_NODE: &str = "no node association found for user, this user must run in a pod on a node and ServiceAccountTokenPodNodeInfo must be enabled";

struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    operations: Vec<String>,
}

struct Validation {
    expression: String,
    program: Program,
    message: Option<String>,
    message_expression: Option<Program>,
}

struct Policy {
    name: String,
    rules: Vec<Rule>,
    conditions: Vec<Program>,
    variables: Vec<(String, Program)>,
    validations: Vec<Validation>,
}

#[derive(Debug, PartialEq)]
enum Verdict {
    /// The policy does not apply to the request (resource rules or match conditions).
    NotMatched,
    Allowed,
    Denied(String),
    /// An expression failed; with failurePolicy Fail the apiserver denies, but a test expects
    /// a decided verdict, so this is always a bug in the policy or the case.
    Error(String),
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn compile(policy: &str, what: &str, source: &str) -> anyhow::Result<Program> {
    Program::compile(source, DECLARED)
        .with_context(|| format!("policy {policy}: {what} {source:?} does not compile"))
}

/// Every policy of admission.yaml, each checked to be bound with Deny and to fail closed.
fn load() -> anyhow::Result<Vec<Policy>> {
    let all = objects(&["admission.yaml"])?;
    let of = |kind: &'static str| {
        all.iter()
            .filter(move |o| o.get("kind").and_then(Value::as_str) == Some(kind))
    };
    let mut policies = Vec::new();
    for object in of("ValidatingAdmissionPolicy") {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .context("a policy without a name")?
            .to_owned();
        let spec = object.get("spec").context("spec")?;
        ensure!(
            spec.get("failurePolicy").and_then(Value::as_str) == Some("Fail"),
            "{name}: failurePolicy must be Fail (an error must deny)"
        );
        ensure!(
            spec.get("paramKind").is_none(),
            "{name}: params are not evaluated"
        );
        ensure!(
            of("ValidatingAdmissionPolicyBinding").any(|b| {
                b.pointer("/spec/policyName").and_then(Value::as_str) == Some(&name)
                    && strings(b.pointer("/spec/validationActions")) == ["Deny"]
                    && b.pointer("/spec/paramRef").is_none()
            }),
            "{name}: no binding with validationActions [Deny]"
        );
        let rules = spec
            .pointer("/matchConstraints/resourceRules")
            .and_then(Value::as_array)
            .context("resourceRules")?
            .iter()
            .map(|r| Rule {
                groups: strings(r.get("apiGroups")),
                resources: strings(r.get("resources")),
                operations: strings(r.get("operations")),
            })
            .collect();
        let list = |key: &str| spec.get(key).and_then(Value::as_array).cloned();
        let field = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        let mut conditions = Vec::new();
        for c in list("matchConditions").into_iter().flatten() {
            let source = field(&c, "expression").context("matchCondition expression")?;
            conditions.push(compile(&name, "matchCondition", &source)?);
        }
        let mut variables = Vec::new();
        for v in list("variables").into_iter().flatten() {
            let var = field(&v, "name").context("variable name")?;
            let source = field(&v, "expression").context("variable expression")?;
            variables.push((var, compile(&name, "variable", &source)?));
        }
        let mut validations = Vec::new();
        for v in list("validations").into_iter().flatten() {
            let expression = field(&v, "expression").context("validation expression")?;
            validations.push(Validation {
                program: compile(&name, "validation", &expression)?,
                expression,
                message: field(&v, "message"),
                message_expression: field(&v, "messageExpression")
                    .map(|m| compile(&name, "messageExpression", &m))
                    .transpose()?,
            });
        }
        ensure!(!validations.is_empty(), "{name}: no validations");
        policies.push(Policy {
            name,
            rules,
            conditions,
            variables,
            validations,
        });
    }
    Ok(policies)
}

/// One admission request as a policy sees it.
struct Request {
    group: &'static str,
    /// With the subresource: `resourceclaims/status`.
    resource: &'static str,
    operation: &'static str,
    username: String,
    node: Option<&'static str>,
    /// The object's name (`request.name`).
    name: String,
    object: Value,
    old: Value,
}

impl Policy {
    fn matches(&self, r: &Request) -> bool {
        self.rules.iter().any(|rule| {
            rule.groups.iter().any(|g| g == r.group)
                && rule.resources.iter().any(|x| x == r.resource)
                && rule.operations.iter().any(|o| o == r.operation)
        })
    }

    fn admit(&self, r: &Request) -> anyhow::Result<Verdict> {
        if !self.matches(r) {
            return Ok(Verdict::NotMatched);
        }
        let mut extra = json!({});
        if let Some(node) = r.node {
            extra["authentication.kubernetes.io/node-name"] = json!([node]);
        }
        let request = json!({"operation": r.operation, "name": r.name,
            "userInfo": {"username": r.username, "extra": extra}});
        let mut env = Env::new([
            ("request".to_owned(), Val::from_json(&request)?),
            ("object".to_owned(), Val::from_json(&r.object)?),
            ("oldObject".to_owned(), Val::from_json(&r.old)?),
        ]);
        for condition in &self.conditions {
            match condition.eval_bool(&env) {
                Ok(true) => {}
                Ok(false) => return Ok(Verdict::NotMatched),
                Err(e) => return Ok(Verdict::Error(format!("matchCondition: {e}"))),
            }
        }
        for (name, program) in &self.variables {
            let value = program.eval(&env);
            env.set_variable(name, value);
        }
        for v in &self.validations {
            match v.program.eval_bool(&env) {
                Ok(true) => {}
                Ok(false) => {
                    let message = match (&v.message_expression, &v.message) {
                        (Some(m), _) => m.eval_string(&env).with_context(|| {
                            format!("{}: messageExpression of {:?}", self.name, v.expression)
                        })?,
                        (None, Some(m)) => m.clone(),
                        (None, None) => format!("failed expression: {}", v.expression),
                    };
                    return Ok(Verdict::Denied(message));
                }
                Err(e) => return Ok(Verdict::Error(format!("{}: {e}", v.expression))),
            }
        }
        Ok(Verdict::Allowed)
    }
}

fn driver_name() -> String {
    format!("system:serviceaccount:{RELEASE_NAMESPACE}:{DRIVER_SA}")
}

fn request(
    group: &'static str,
    resource: &'static str,
    operation: &'static str,
    object: Value,
    old: Value,
) -> Request {
    Request {
        group,
        resource,
        operation,
        username: driver_name(),
        node: Some(NODE),
        name: String::new(),
        object,
        old,
    }
}

fn run_cases(policy: &str, cases: Vec<(&str, Request, Verdict)>) -> anyhow::Result<()> {
    let policies = load()?;
    let policy = policies
        .iter()
        .find(|p| p.name == policy)
        .with_context(|| format!("admission.yaml has no policy {policy}"))?;
    let mut failures = Vec::new();
    let (mut allowed, mut denied) = (0, 0);
    for (what, request, want) in cases {
        let got = policy.admit(&request)?;
        match &got {
            Verdict::Allowed => allowed += 1,
            Verdict::Denied(_) => denied += 1,
            _ => {}
        }
        if got != want {
            failures.push(format!("{what}: got {got:?}, want {want:?}"));
        }
    }
    ensure!(
        failures.is_empty(),
        "policy {}:\n  {}",
        policy.name,
        failures.join("\n  ")
    );
    ensure!(
        allowed > 0 && denied > 0,
        "each policy needs allowed and denied cases"
    );
    Ok(())
}

fn denied(message: impl Into<String>) -> Verdict {
    Verdict::Denied(message.into())
}

fn slice(node: Option<&str>, driver: &str) -> Value {
    let mut spec =
        json!({"driver": driver, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}});
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        None => spec["allNodes"] = json!(true),
    }
    json!({"metadata": {"name": "s"}, "spec": spec})
}

fn slice_cases() -> anyhow::Result<()> {
    let group = "resource.k8s.io";
    let s = |op, object, old| request(group, "resourceslices", op, object, old);
    let mine = || slice(Some(NODE), "knic.dev");
    let theirs = || slice(Some(OTHER), "knic.dev");
    let on_other = format!(
        "this user running on node '{NODE}' may not modify resourceslices on node '{OTHER}'"
    );
    let gpu = "this user may only modify resourceslices of driver knic.dev, not of driver 'gpu.example.com'";
    run_cases(
        "knic-resourceslices-own-node",
        vec![
            (
                "create own",
                s("CREATE", mine(), Value::Null),
                Verdict::Allowed,
            ),
            ("update own", s("UPDATE", mine(), mine()), Verdict::Allowed),
            (
                "delete own",
                s("DELETE", Value::Null, mine()),
                Verdict::Allowed,
            ),
            (
                "another identity is not this policy's",
                Request {
                    username: "system:serviceaccount:kube-system:other".into(),
                    ..s("CREATE", theirs(), Value::Null)
                },
                Verdict::NotMatched,
            ),
            (
                "not a slice",
                request(
                    "knic.dev",
                    "networkaddresses",
                    "CREATE",
                    theirs(),
                    Value::Null,
                ),
                Verdict::NotMatched,
            ),
            (
                "token without a node",
                Request {
                    node: None,
                    ..s("CREATE", mine(), Value::Null)
                },
                denied(NO_NODE),
            ),
            (
                "create on another node",
                s("CREATE", theirs(), Value::Null),
                denied(&on_other),
            ),
            (
                "delete another node's",
                s("DELETE", Value::Null, theirs()),
                denied(&on_other),
            ),
            (
                "move another node's here",
                s("UPDATE", mine(), theirs()),
                denied(&on_other),
            ),
            (
                "a slice for all nodes",
                s("CREATE", slice(None, "knic.dev"), Value::Null),
                denied(format!(
                    "this user running on node '{NODE}' may not modify cluster resourceslices"
                )),
            ),
            (
                "another driver's slice",
                s("CREATE", slice(Some(NODE), "gpu.example.com"), Value::Null),
                denied(gpu),
            ),
            (
                "taking over another driver's slice",
                s("UPDATE", mine(), slice(Some(NODE), "gpu.example.com")),
                denied(gpu),
            ),
            (
                "deleting another driver's slice",
                s("DELETE", Value::Null, slice(Some(NODE), "gpu.example.com")),
                denied(gpu),
            ),
        ],
    )
}

/// A claim allocated by `terms` with results of `drivers`, and `devices` status entries.
fn claim(terms: Value, drivers: &[&str], devices: Value) -> Value {
    let results: Vec<Value> = drivers
        .iter()
        .enumerate()
        .map(|(i, d)| json!({"request": "r", "driver": d, "pool": NODE, "device": format!("d{i}")}))
        .collect();
    json!({"metadata": {"namespace": "ns", "name": "c"}, "spec": {},
    "status": {
        "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": terms}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        "devices": devices,
    }})
}

fn on(node: &str) -> Value {
    json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}])
}

fn claim_cases() -> anyhow::Result<()> {
    let group = "resource.k8s.io";
    let u = |object, old| request(group, "resourceclaims/status", "UPDATE", object, old);
    let ready = json!([{"driver": "knic.dev", "pool": NODE, "device": "d0",
        "conditions": [{"type": "Ready", "status": "True"}]}]);
    let gpu_entry = json!({"driver": "gpu.example.com", "pool": NODE, "device": "d1"});
    let both = |knic: bool| {
        let mut entries = vec![gpu_entry.clone()];
        if knic {
            entries.push(ready[0].clone());
        }
        Value::from(entries)
    };
    let before = claim(on(NODE), &["knic.dev"], json!([]));
    let mut moved = claim(on(NODE), &["knic.dev"], ready.clone());
    moved["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"] = on(OTHER);
    let mut unreserved = claim(on(NODE), &["knic.dev"], ready.clone());
    unreserved["status"]["reservedFor"] = json!([]);
    let mut deallocated = claim(on(NODE), &["knic.dev"], json!([]));
    deallocated["status"]
        .as_object_mut()
        .context("status")?
        .remove("allocation");
    let mut bumped_gpu = gpu_entry.clone();
    bumped_gpu["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    let prefix = format!(
        "this user running on node '{NODE}' may not write the status of ResourceClaim ns/c"
    );
    let not_one = format!("{prefix}, which is not allocated to one node");
    let only_devices = "this user may only write status.devices; status.allocation and status.reservedFor are the scheduler's";
    let two_nodes = json!([
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [OTHER]}]}]);
    let either = json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE, OTHER]}]}]);
    let by_label =
        json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]);
    run_cases(
        "knic-resourceclaim-status-own-node",
        vec![
            (
                "report Ready on a claim of this node",
                u(
                    claim(on(NODE), &["knic.dev"], ready.clone()),
                    before.clone(),
                ),
                Verdict::Allowed,
            ),
            (
                "clear its entries at unprepare",
                u(
                    before.clone(),
                    claim(on(NODE), &["knic.dev"], ready.clone()),
                ),
                Verdict::Allowed,
            ),
            (
                "its entries beside another driver's",
                u(
                    claim(on(NODE), &["knic.dev", "gpu.example.com"], both(true)),
                    claim(on(NODE), &["knic.dev", "gpu.example.com"], both(false)),
                ),
                Verdict::Allowed,
            ),
            (
                "the scheduler is not this policy's",
                Request {
                    username: "system:kube-scheduler".into(),
                    ..u(moved.clone(), before.clone())
                },
                Verdict::NotMatched,
            ),
            (
                "the claim itself is not this policy's",
                request(
                    group,
                    "resourceclaims",
                    "UPDATE",
                    before.clone(),
                    before.clone(),
                ),
                Verdict::NotMatched,
            ),
            (
                "token without a node",
                Request {
                    node: None,
                    ..u(before.clone(), before.clone())
                },
                denied(NO_NODE),
            ),
            (
                "a claim of another node",
                u(
                    claim(on(OTHER), &["knic.dev"], ready.clone()),
                    claim(on(OTHER), &["knic.dev"], json!([])),
                ),
                denied(format!("{prefix}, allocated to node '{OTHER}'")),
            ),
            (
                "a claim usable on two nodes (two terms)",
                u(
                    claim(two_nodes.clone(), &["knic.dev"], ready.clone()),
                    claim(two_nodes, &["knic.dev"], json!([])),
                ),
                denied(&not_one),
            ),
            (
                "a claim usable on two nodes (two values)",
                u(
                    claim(either.clone(), &["knic.dev"], json!([])),
                    claim(either, &["knic.dev"], json!([])),
                ),
                denied(&not_one),
            ),
            (
                "a claim selected by label",
                u(
                    claim(by_label.clone(), &["knic.dev"], json!([])),
                    claim(by_label, &["knic.dev"], json!([])),
                ),
                denied(&not_one),
            ),
            (
                "an unallocated claim",
                u(deallocated.clone(), deallocated.clone()),
                denied(&not_one),
            ),
            (
                "a claim without a knic.dev device",
                u(
                    claim(on(NODE), &["gpu.example.com"], json!([])),
                    claim(on(NODE), &["gpu.example.com"], json!([])),
                ),
                denied(
                    "this user may not write the status of ResourceClaim ns/c, which has no device \
                     of driver knic.dev",
                ),
            ),
            (
                "moving the allocation",
                u(moved, before.clone()),
                denied(only_devices),
            ),
            (
                "dropping the allocation",
                u(deallocated, before.clone()),
                denied(only_devices),
            ),
            (
                "changing the consumers",
                u(unreserved, before.clone()),
                denied(only_devices),
            ),
            (
                "changing another driver's entry",
                u(
                    claim(
                        on(NODE),
                        &["knic.dev", "gpu.example.com"],
                        json!([bumped_gpu]),
                    ),
                    claim(on(NODE), &["knic.dev", "gpu.example.com"], both(false)),
                ),
                denied("this user may only write status.devices entries of driver knic.dev"),
            ),
        ],
    )
}

fn address(node: Option<&str>) -> Value {
    let mut spec = json!({"network": "blue", "address": "192.0.2.10/24",
        "claim": {"namespace": "ns", "name": "c", "uid": "u"}});
    if let Some(n) = node {
        spec["node"] = json!(n);
    }
    json!({"metadata": {"name": "blue-192-0-2-10", "labels": {"knic.dev/network": "blue"}}, "spec": spec})
}

/// `address` marked held (`knic.dev/held=true`), as unprepare leaves a stable identity's.
fn held(mut address: Value) -> Value {
    address["metadata"]["labels"]["knic.dev/held"] = json!("true");
    address
}

fn address_cases() -> anyhow::Result<()> {
    let a = |op, object, old| request("knic.dev", "networkaddresses", op, object, old);
    run_cases(
        "knic-networkaddresses-own-node",
        vec![
            (
                "allocate on this node",
                a("CREATE", address(Some(NODE)), Value::Null),
                Verdict::Allowed,
            ),
            (
                "release this node's",
                a("DELETE", Value::Null, address(Some(NODE))),
                Verdict::Allowed,
            ),
            (
                "the controller collects any",
                Request {
                    username: format!("system:serviceaccount:{RELEASE_NAMESPACE}:knic-controller"),
                    ..a("DELETE", Value::Null, address(Some(OTHER)))
                },
                Verdict::NotMatched,
            ),
            (
                "token without a node",
                Request {
                    node: None,
                    ..a("CREATE", address(Some(NODE)), Value::Null)
                },
                denied(NO_NODE),
            ),
            (
                "take over another node's held allocation (its identity returned here)",
                a("DELETE", Value::Null, held(address(Some(OTHER)))),
                Verdict::Allowed,
            ),
            (
                "hold this node's",
                a("UPDATE", held(address(Some(NODE))), address(Some(NODE))),
                Verdict::Allowed,
            ),
            (
                "hold another node's",
                a("UPDATE", held(address(Some(OTHER))), address(Some(OTHER))),
                denied(format!(
                    "this user running on node '{NODE}' may not write NetworkAddresses of node '{OTHER}'"
                )),
            ),
            (
                "create another node's, labelled held",
                a("CREATE", held(address(Some(OTHER))), Value::Null),
                denied(format!(
                    "this user running on node '{NODE}' may not write NetworkAddresses of node '{OTHER}'"
                )),
            ),
            (
                "release another node's",
                a("DELETE", Value::Null, address(Some(OTHER))),
                denied(format!(
                    "this user running on node '{NODE}' may not delete NetworkAddresses of node '{OTHER}'"
                )),
            ),
            (
                "allocate for another node",
                a("CREATE", address(Some(OTHER)), Value::Null),
                denied(format!(
                    "this user running on node '{NODE}' may not write NetworkAddresses of node '{OTHER}'"
                )),
            ),
            (
                "an address without a node",
                a("CREATE", address(None), Value::Null),
                denied(format!(
                    "this user running on node '{NODE}' may not write NetworkAddresses without spec.node"
                )),
            ),
        ],
    )
}

fn event(instance: Option<&str>) -> Value {
    let mut e = json!({"metadata": {"generateName": "c."}, "reason": "AttachFailed",
        "reportingController": "knic.dev/driver", "action": "Attach"});
    if let Some(i) = instance {
        e["reportingInstance"] = json!(i);
    }
    e
}

fn event_cases() -> anyhow::Result<()> {
    let e = |object| request("events.k8s.io", "events", "CREATE", object, Value::Null);
    run_cases(
        "knic-events-own-node",
        vec![
            (
                "an Event as this node's driver",
                e(event(Some(&format!("knic-driver-{NODE}")))),
                Verdict::Allowed,
            ),
            (
                "the controller's Events",
                Request {
                    username: format!("system:serviceaccount:{RELEASE_NAMESPACE}:knic-controller"),
                    ..e(event(Some("knic-controller")))
                },
                Verdict::NotMatched,
            ),
            (
                "token without a node",
                Request {
                    node: None,
                    ..e(event(Some(&format!("knic-driver-{NODE}"))))
                },
                denied(NO_NODE),
            ),
            (
                "an Event as another node's driver",
                e(event(Some(&format!("knic-driver-{OTHER}")))),
                denied(format!(
                    "this user running on node '{NODE}' may only write Events with \
                     reportingInstance 'knic-driver-{NODE}'"
                )),
            ),
            (
                "an Event without a reporting instance",
                e(event(None)),
                denied(format!(
                    "this user running on node '{NODE}' may only write Events with \
                     reportingInstance 'knic-driver-{NODE}'"
                )),
            ),
        ],
    )
}

fn node_networks(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"nodeName": name}})
}

fn node_networks_cases() -> anyhow::Result<()> {
    let n = |resource: &'static str, op: &'static str, name: &str| {
        let object = node_networks(name);
        let (object, old) = match op {
            "DELETE" => (Value::Null, object),
            _ => (object, Value::Null),
        };
        Request {
            name: name.to_owned(),
            ..request("knic.dev", resource, op, object, old)
        }
    };
    run_cases(
        "knic-nodenetworks-own-node",
        vec![
            (
                "its own node's object",
                n("nodenetworks", "CREATE", NODE),
                Verdict::Allowed,
            ),
            (
                "its own node's status",
                n("nodenetworks/status", "UPDATE", NODE),
                Verdict::Allowed,
            ),
            (
                "an admin writes any",
                Request {
                    username: "kubernetes-admin".into(),
                    ..n("nodenetworks", "UPDATE", OTHER)
                },
                Verdict::NotMatched,
            ),
            (
                "token without a node",
                Request {
                    node: None,
                    ..n("nodenetworks", "CREATE", NODE)
                },
                denied(NO_NODE),
            ),
            (
                "another node's object",
                n("nodenetworks", "CREATE", OTHER),
                denied(format!(
                    "this user running on node '{NODE}' may not write the NodeNetworks of node '{OTHER}'"
                )),
            ),
            (
                "another node's status",
                n("nodenetworks/status", "UPDATE", OTHER),
                denied(format!(
                    "this user running on node '{NODE}' may not write the NodeNetworks of node '{OTHER}'"
                )),
            ),
            (
                "deleting another node's",
                n("nodenetworks", "DELETE", OTHER),
                denied(format!(
                    "this user running on node '{NODE}' may not write the NodeNetworks of node '{OTHER}'"
                )),
            ),
        ],
    )
}

/// Every write the driver's RBAC grants goes through a policy bound to its node.
fn driver_writes_are_policed() -> anyhow::Result<()> {
    let policies = load()?;
    let mut uncovered = Vec::new();
    for (group, resource, verb, _, _) in Rbac::load()?.grants(DRIVER_SA)? {
        let operation = match verb.as_str() {
            "create" => "CREATE",
            "update" | "patch" => "UPDATE",
            "delete" | "deletecollection" => "DELETE",
            // Reads, and the 1.36 synthetic authorization check (not an admission request).
            _ => continue,
        };
        let covered = policies.iter().any(|p| {
            p.rules.iter().any(|r| {
                r.groups.contains(&group)
                    && r.resources.contains(&resource)
                    && r.operations.iter().any(|o| o == operation)
            }) && p.conditions.iter().any(|c| {
                // The policy must apply to the driver's identity.
                let env = Env::new([(
                    "request".to_owned(),
                    Val::from_json(&json!({"userInfo": {"username": driver_name()}}))
                        .unwrap_or(Val::Null),
                )]);
                c.eval_bool(&env).unwrap_or(false)
            })
        });
        if !covered {
            uncovered.push(format!("{verb} {group}/{resource}"));
        }
    }
    if !uncovered.is_empty() {
        bail!(
            "the driver may write without a node policy: {}",
            uncovered.join(", ")
        );
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    vec![
        check("chart/policies_compile_and_bind_with_deny", || {
            ensure!(load()?.len() == 5, "five policies");
            Ok(())
        }),
        check("chart/policy_resourceslices_own_node", slice_cases),
        check("chart/policy_resourceclaim_status_own_node", claim_cases),
        check("chart/policy_networkaddresses_own_node", address_cases),
        check("chart/policy_events_own_node", event_cases),
        check("chart/policy_nodenetworks_own_node", node_networks_cases),
        check(
            "chart/policies_cover_every_driver_write",
            driver_writes_are_policed,
        ),
    ]
}
