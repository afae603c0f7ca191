//! The Helm chart against the binaries, without helm or a cluster: the templates are rendered
//! with `values.yaml` by a small renderer for the subset of Go templates they use (anything
//! else is an error, so a new construct is noticed here rather than at install time), parsed
//! into the real Kubernetes types, and checked:
//!
//! * RBAC: every (apiGroup, resource, verb[, name]) the driver and the controller call is
//!   granted to their ServiceAccount through a binding, in the right scope; and nothing is
//!   granted beyond the list below (no wildcards), so the roles stay minimal. The list says
//!   where each permission is used; keep it in step with the code.
//! * The controller Deployment: the driver's image, `knic-controller`, only flags the binary
//!   knows, identity from the pod name, the lease in the namespace its Role covers, and a
//!   container without any privilege.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use libtest_mimic::{Failed, Trial};
use serde::Deserialize;
use serde_json::Value;

#[path = "chart/policies.rs"]
mod policies;

/// The namespace the chart is rendered into.
const RELEASE_NAMESPACE: &str = "knic-system";
const DRIVER_SA: &str = "knic-driver";
const CONTROLLER_SA: &str = "knic-controller";
/// The Lease the controller elects its leader with (controller/src/main.rs).
const LEASE: &str = "knic-controller";

/// Why a permission is in the list: where the code calls it. There is no "kept just in case":
/// a grant no code uses is one a compromised node could use instead (issue 11).
#[derive(Debug, Clone, Copy)]
enum Why {
    /// Called by the code today, at the place named.
    Used(&'static str),
}

/// One permission a ServiceAccount needs.
#[derive(Debug, Clone, Copy)]
struct Need {
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    /// The object name the request carries when the rule is limited by `resourceNames`;
    /// `None` for requests RBAC sees without a name (create, list, watch) or that any name
    /// may be used with.
    name: Option<&'static str>,
    /// `Some(namespace)`: needed in that namespace only (a Role may grant it); `None`:
    /// cluster-scoped or across all namespaces (only a ClusterRoleBinding grants it).
    namespace: Option<&'static str>,
    why: Why,
}

const fn cluster(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    why: Why,
) -> Need {
    Need {
        group,
        resource,
        verbs,
        name: None,
        namespace: None,
        why,
    }
}

/// What `knic-driver run` calls.
const DRIVER: &[Need] = &[
    cluster(
        "resource.k8s.io",
        "resourceclaims",
        &["get"],
        Why::Used("driver/src/api/claims.rs KubeClaims::get: prepare reads the claim"),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaims/status",
        &["patch"],
        Why::Used(
            "driver/src/api/status.rs KubeStatus::write: server-side apply of status.devices",
        ),
    ),
    Need {
        name: Some("knic.dev"),
        ..cluster(
            "resource.k8s.io",
            "resourceclaims/driver",
            &["associated-node:patch"],
            Why::Used(
                "driver/src/api/status.rs KubeStatus::write: the same apply, authorized on 1.36+ \
                 through this synthetic subresource (shared/spec §3.6)",
            ),
        )
    },
    cluster(
        "resource.k8s.io",
        "resourceslices",
        &["list", "watch", "create", "update", "delete"],
        Why::Used(
            "driver/src/api/slices.rs: list by node and driver, watch_slices, create, \
             replace, delete",
        ),
    ),
    cluster(
        "",
        "nodes",
        &["get"],
        Why::Used("driver/src/api/slices.rs: the Node owns the slices (its uid)"),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["get"],
        Why::Used(
            "driver/src/api/addresses.rs KubeAddressBook::network: the Network of `ipam.network`",
        ),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["list", "watch"],
        Why::Used("driver/src/api/networks.rs: a reflector over Networks (exhaustion status)"),
    ),
    cluster(
        "knic.dev",
        "networkaddresses",
        &["get", "create", "list", "delete"],
        Why::Used(
            "driver/src/api/addresses.rs KubeAddressBook::{create, list, delete}, and get after \
             AlreadyExists or a delete conflict",
        ),
    ),
    cluster(
        "",
        "pods",
        &["get"],
        Why::Used(
            "driver/src/api/addresses.rs KubeAddressBook::pod_labels: stableAddresses by label",
        ),
    ),
    cluster(
        "",
        "namespaces",
        &["get"],
        Why::Used(
            "driver/src/api/addresses.rs KubeAddressBook::namespace_labels: a Network offered by \
             namespace selector",
        ),
    ),
];

/// What `knic-controller` calls.
const CONTROLLER: &[Need] = &[
    cluster(
        "knic.dev",
        "networks",
        &["list", "watch"],
        Why::Used("controller/src/reconcile.rs run: Controller::new and .watches(networks)"),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["get", "list"],
        Why::Used(
            "controller/src/reconcile.rs reconcile: re-read of a deleting Network, every \
             Network for cross-validation",
        ),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["patch"],
        Why::Used(
            "controller/src/reconcile.rs set_finalizer: merge patch guarded by resourceVersion \
             (templates' owner references set no blockOwnerDeletion, so no networks/finalizers)",
        ),
    ),
    cluster(
        "knic.dev",
        "networks/status",
        &["patch"],
        Why::Used("controller/src/reconcile.rs write_status: merge patch"),
    ),
    cluster(
        "knic.dev",
        "networkaddresses",
        &["list", "watch", "delete"],
        Why::Used(
            "controller/src/reconcile.rs: .watches(addresses), the address count, \
             collect_addresses (list, delete with uid precondition)",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["list", "watch"],
        Why::Used(
            "controller/src/reconcile.rs: .watches(templates), generate (list by name), \
             delete_templates (list by label)",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["create", "patch"],
        Why::Used(
            "controller/src/reconcile.rs generate: server-side apply is a patch, authorized as \
             a create when the template does not exist yet",
        ),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["delete"],
        Why::Used("controller/src/reconcile.rs delete_templates"),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaims",
        &["get"],
        Why::Used("controller/src/reconcile.rs collect_addresses: does the claim still exist"),
    ),
    cluster(
        "resource.k8s.io",
        "resourceclaims",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over claims (devices taken)"),
    ),
    cluster(
        "resource.k8s.io",
        "resourceslices",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over slices (devices offered)"),
    ),
    cluster(
        "resource.k8s.io",
        "deviceclasses",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over classes (their selectors)"),
    ),
    cluster(
        "knic.dev",
        "networks",
        &["list", "watch"],
        Why::Used("controller/src/availability.rs run: a reflector over Networks"),
    ),
    cluster(
        "knic.dev",
        "networks/status",
        &["patch"],
        Why::Used("controller/src/availability.rs run: merge patch of status.availableNodes"),
    ),
    cluster(
        "",
        "namespaces",
        &["list", "watch"],
        Why::Used("controller/src/reconcile.rs: .watches(namespaces), generate (selection)"),
    ),
    cluster(
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Why::Used(
            "controller/src/reconcile.rs publish: kube-runtime's Recorder creates, then merge \
             patches a series (events.k8s.io/v1 only)",
        ),
    ),
    Need {
        namespace: Some(RELEASE_NAMESPACE),
        ..cluster(
            "coordination.k8s.io",
            "leases",
            &["create"],
            Why::Used("controller/src/leader.rs attempt: the first replica creates the Lease"),
        )
    },
    Need {
        namespace: Some(RELEASE_NAMESPACE),
        name: Some(LEASE),
        ..cluster(
            "coordination.k8s.io",
            "leases",
            &["get", "update"],
            Why::Used("controller/src/leader.rs attempt and release: read, then guarded update"),
        )
    },
];

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/knic")
}

/// What a template can refer to.
#[derive(Clone)]
struct Scope {
    values: Value,
    chart: Value,
    /// `.` inside `with`.
    dot: Option<Value>,
}

impl Scope {
    fn load() -> anyhow::Result<Scope> {
        let read = |name: &str| -> anyhow::Result<Value> {
            let path = chart_dir().join(name);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
        };
        Ok(Scope {
            values: read("values.yaml")?,
            chart: read("Chart.yaml")?,
            dot: None,
        })
    }

    /// `.Values.a.b`, `.Release.Namespace`, `.Chart.AppVersion`, a string or number literal.
    fn lookup(&self, term: &str) -> anyhow::Result<Value> {
        if let Some(literal) = term.strip_prefix('"') {
            return Ok(Value::String(literal.trim_end_matches('"').to_owned()));
        }
        if let Ok(n) = term.parse::<i64>() {
            return Ok(Value::from(n));
        }
        if term == "." {
            return self.dot.clone().context("'.' outside a with block");
        }
        let missing = || anyhow::anyhow!("{term} is not defined by values.yaml / Chart.yaml");
        let path: Vec<&str> = term.trim_start_matches('.').split('.').collect();
        match path.as_slice() {
            ["Release", "Namespace"] => Ok(Value::from(RELEASE_NAMESPACE)),
            ["Release", "Name"] => Ok(Value::from("knic")),
            ["Chart", key] => {
                // Chart.yaml keys are lowerCamel, the template fields UpperCamel.
                let mut chars = key.chars();
                let key: String = chars
                    .next()
                    .map(|c| c.to_ascii_lowercase())
                    .into_iter()
                    .chain(chars)
                    .collect();
                self.chart.get(&key).cloned().ok_or_else(missing)
            }
            ["Values", rest @ ..] => rest
                .iter()
                .try_fold(&self.values, |v, k| v.get(k))
                .cloned()
                .ok_or_else(missing),
            _ => Err(missing()),
        }
    }

    /// One pipeline: `TERM`, `FUNC TERM...`, each stage's result passed as the next stage's
    /// last argument.
    fn eval(&self, expression: &str) -> anyhow::Result<Value> {
        let mut current: Option<Value> = None;
        for stage in expression.split('|') {
            let words: Vec<&str> = stage.split_whitespace().collect();
            let Some((head, args)) = words.split_first() else {
                bail!("empty pipeline stage in {{{{ {expression} }}}}");
            };
            let mut args: Vec<Value> = args
                .iter()
                .map(|a| self.lookup(a))
                .collect::<anyhow::Result<_>>()?;
            args.extend(current.take());
            let value = match *head {
                "quote" => Value::String(format!("{:?}", text(one(&args, head)?)?)),
                "toJson" => Value::String(serde_json::to_string(one(&args, head)?)?),
                // Only `%s`, the one verb the templates use.
                "printf" => {
                    let Some((format, rest)) = args.split_first() else {
                        bail!("printf without a format in {{{{ {expression} }}}}");
                    };
                    let mut pieces = text(format)?
                        .split("%s")
                        .map(str::to_owned)
                        .collect::<Vec<_>>();
                    ensure!(
                        pieces.len() == rest.len() + 1 && !pieces.iter().any(|p| p.contains('%')),
                        "printf takes one argument per %s (and no other verb) in {{{{ {expression} }}}}"
                    );
                    let mut out = pieces.remove(0);
                    for (arg, piece) in rest.iter().zip(pieces) {
                        out.push_str(&text(arg)?);
                        out.push_str(&piece);
                    }
                    Value::String(out)
                }
                // A stand-in digest (std's hasher, not SHA-256): only used as a rollout trigger
                // in an annotation, whose value no check reads.
                "sha256sum" => {
                    use std::hash::{Hash, Hasher};
                    let mut hasher = std::collections::hash_map::DefaultHasher::new();
                    text(one(&args, head)?)?.hash(&mut hasher);
                    Value::String(format!("{:064x}", hasher.finish()))
                }
                "default" => match args.as_slice() {
                    [fallback, value] if empty(value) => fallback.clone(),
                    [_, value] => value.clone(),
                    _ => bail!("default takes two arguments in {{{{ {expression} }}}}"),
                },
                term if term.starts_with('.') || term.starts_with('"') || term == "." => {
                    ensure!(
                        args.is_empty(),
                        "{term} is not a function in {{{{ {expression} }}}}"
                    );
                    self.lookup(term)?
                }
                other => bail!(
                    "the chart test does not render {other:?} (in {{{{ {expression} }}}}); \
                     extend e2e/tests/chart.rs"
                ),
            };
            current = Some(value);
        }
        current.context("empty expression")
    }
}

fn one<'a>(args: &'a [Value], function: &str) -> anyhow::Result<&'a Value> {
    match args {
        [v] => Ok(v),
        _ => bail!("{function} takes one argument, got {}", args.len()),
    }
}

/// Go template emptiness, as `default` sees it.
fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// A value as a template prints it; maps and lists would print Go syntax, never valid YAML.
fn text(v: &Value) -> anyhow::Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(_) | Value::Bool(_) => Ok(v.to_string()),
        Value::Null => bail!("a missing value would render as <no value>"),
        Value::Array(_) | Value::Object(_) => {
            bail!("a list or map would render in Go syntax; use toJson")
        }
    }
}

/// Renders one template file.
fn render(scope: &Scope, file: &str) -> anyhow::Result<String> {
    let path = chart_dir().join("templates").join(file);
    let source =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    render_text(scope, &source, file)
}

/// `{{ expression }}` with `{{-`/`-}}` whitespace trimming, and `{{ with X }}...{{ end }}`
/// (not nested): the body once with `.` = X when X is not empty, else nothing.
fn render_text(scope: &Scope, source: &str, file: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = source;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .with_context(|| format!("{file}: unclosed {{{{"))?;
        let mut inner = &after[..close];
        rest = &after[close + 2..];
        if let Some(trimmed) = inner.strip_prefix('-') {
            out.truncate(out.trim_end().len());
            inner = trimmed;
        }
        if let Some(trimmed) = inner.strip_suffix('-') {
            rest = rest.trim_start();
            inner = trimmed;
        }
        if let Some(subject) = inner.trim().strip_prefix("with ") {
            let (body, after) =
                with_body(rest).with_context(|| format!("{file}: {{{{{inner}}}}}"))?;
            rest = after;
            let value = scope.eval(subject.trim())?;
            if !empty(&value) {
                let inner_scope = Scope {
                    dot: Some(value),
                    ..scope.clone()
                };
                out.push_str(&render_text(&inner_scope, body, file)?);
            }
            continue;
        }
        let value = scope
            .eval(inner.trim())
            .and_then(|v| text(&v))
            .with_context(|| format!("{file}: {{{{{inner}}}}}"))?;
        out.push_str(&value);
    }
    out.push_str(rest);
    Ok(out)
}

/// The body of a `with` block up to its `{{ end }}` (whose `{{-` trims the body's end), and
/// the text after it (trimmed by `-}}`).
fn with_body(rest: &str) -> anyhow::Result<(&str, &str)> {
    let mut search = 0;
    while let Some(open) = rest[search..].find("{{").map(|i| i + search) {
        let close = rest[open..]
            .find("}}")
            .map(|i| i + open)
            .context("unclosed {{")?;
        let inner = &rest[open + 2..close];
        let word = inner.trim_matches('-').trim();
        if word == "end" {
            let body = if inner.starts_with('-') {
                rest[..open].trim_end()
            } else {
                &rest[..open]
            };
            let after = &rest[close + 2..];
            let after = if inner.ends_with('-') {
                after.trim_start()
            } else {
                after
            };
            return Ok((body, after));
        }
        ensure!(
            !["with ", "if ", "range "]
                .iter()
                .any(|k| word.starts_with(k)),
            "nested blocks are not rendered by the chart test"
        );
        search = close + 2;
    }
    bail!("with without end")
}

/// Every object of the rendered files, as JSON.
fn objects(files: &[&str]) -> anyhow::Result<Vec<Value>> {
    objects_with(&Scope::load()?, files)
}

fn objects_with(scope: &Scope, files: &[&str]) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    for file in files {
        let rendered = render(scope, file)?;
        for document in serde_yaml_ng::Deserializer::from_str(&rendered) {
            let value = Value::deserialize(document)
                .with_context(|| format!("{file} does not render to YAML:\n{rendered}"))?;
            if !value.is_null() {
                all.push(value);
            }
        }
    }
    Ok(all)
}

fn of_kind<T: serde::de::DeserializeOwned>(
    objects: &[Value],
    kind: &str,
) -> anyhow::Result<Vec<T>> {
    objects
        .iter()
        .filter(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
        .map(|o| {
            serde_json::from_value(o.clone())
                .with_context(|| format!("a {kind} that does not parse: {o}"))
        })
        .collect()
}

/// The RBAC objects of the chart.
struct Rbac {
    cluster_roles: Vec<ClusterRole>,
    roles: Vec<Role>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    bindings: Vec<RoleBinding>,
}

/// One thing a rule allows: group, resource, verb, name (`None`: any), namespace (`None`: all).
type Grant = (String, String, String, Option<String>, Option<String>);

impl Rbac {
    fn load() -> anyhow::Result<Rbac> {
        let objects = objects(&["rbac.yaml"])?;
        Ok(Rbac {
            cluster_roles: of_kind(&objects, "ClusterRole")?,
            roles: of_kind(&objects, "Role")?,
            cluster_bindings: of_kind(&objects, "ClusterRoleBinding")?,
            bindings: of_kind(&objects, "RoleBinding")?,
        })
    }

    /// The rules bound to ServiceAccount `account` of the release namespace, each with the
    /// namespace it applies in (`None`: every namespace and cluster-scoped objects).
    fn rules_of(&self, account: &str) -> anyhow::Result<Vec<(PolicyRule, Option<String>)>> {
        let is_ours = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
            subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == account
                    && s.namespace.as_deref() == Some(RELEASE_NAMESPACE)
            })
        };
        let cluster_role = |name: &str| -> anyhow::Result<&ClusterRole> {
            self.cluster_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .with_context(|| {
                    format!("a binding refers to ClusterRole {name}, not in the chart")
                })
        };
        let mut rules = Vec::new();
        for binding in self
            .cluster_bindings
            .iter()
            .filter(|b| is_ours(&b.subjects))
        {
            ensure!(
                binding.role_ref.kind == "ClusterRole",
                "ClusterRoleBinding {:?} refers to a {}",
                binding.metadata.name,
                binding.role_ref.kind
            );
            let role = cluster_role(&binding.role_ref.name)?;
            for rule in role.rules.iter().flatten() {
                rules.push((rule.clone(), None));
            }
        }
        for binding in self.bindings.iter().filter(|b| is_ours(&b.subjects)) {
            let namespace = binding.metadata.namespace.clone().with_context(|| {
                format!("RoleBinding {:?} has no namespace", binding.metadata.name)
            })?;
            let role_rules = match binding.role_ref.kind.as_str() {
                "ClusterRole" => cluster_role(&binding.role_ref.name)?.rules.clone(),
                "Role" => self
                    .roles
                    .iter()
                    .find(|r| {
                        r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                            && r.metadata.namespace.as_deref() == Some(namespace.as_str())
                    })
                    .with_context(|| {
                        format!(
                            "RoleBinding {:?} refers to Role {}/{}, not in the chart",
                            binding.metadata.name, namespace, binding.role_ref.name
                        )
                    })?
                    .rules
                    .clone(),
                other => bail!(
                    "RoleBinding {:?} refers to a {other}",
                    binding.metadata.name
                ),
            };
            for rule in role_rules.into_iter().flatten() {
                rules.push((rule, Some(namespace.clone())));
            }
        }
        Ok(rules)
    }

    /// Everything granted to `account`, expanded; wildcards are refused outright.
    fn grants(&self, account: &str) -> anyhow::Result<Vec<Grant>> {
        let mut grants = Vec::new();
        for (rule, namespace) in self.rules_of(account)? {
            ensure!(
                rule.non_resource_urls.as_ref().is_none_or(Vec::is_empty),
                "{account}: nonResourceURLs are not needed: {rule:?}"
            );
            let names: Vec<Option<String>> = match &rule.resource_names {
                Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
                _ => vec![None],
            };
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        ensure!(
                            [group, resource, verb].iter().all(|s| !s.contains('*')),
                            "{account}: wildcard in {rule:?}"
                        );
                        for name in &names {
                            grants.push((
                                group.clone(),
                                resource.clone(),
                                verb.clone(),
                                name.clone(),
                                namespace.clone(),
                            ));
                        }
                    }
                }
            }
        }
        Ok(grants)
    }
}

/// Whether `grant` allows the request `need` describes (with `verb`).
fn allows(grant: &Grant, need: &Need, verb: &str) -> bool {
    let (group, resource, granted_verb, name, namespace) = grant;
    group == need.group
        && resource == need.resource
        && granted_verb == verb
        // A rule limited to names never matches a request without one.
        && name.as_ref().is_none_or(|n| Some(n.as_str()) == need.name)
        && match (namespace, need.namespace) {
            (None, _) => true,
            (Some(granted), Some(wanted)) => granted == wanted,
            (Some(_), None) => false,
        }
}

fn describe(need: &Need, verb: &str) -> String {
    let group = if need.group.is_empty() {
        "core"
    } else {
        need.group
    };
    let mut s = format!("{verb} {group}/{}", need.resource);
    if let Some(name) = need.name {
        s.push_str(&format!(" named {name}"));
    }
    match need.namespace {
        Some(ns) => s.push_str(&format!(" in namespace {ns}")),
        None => s.push_str(" cluster-wide"),
    }
    let Why::Used(why) = need.why;
    let why = format!("used by {why}");
    format!("{s} ({why})")
}

/// Every permission in `needs` is granted to `account`.
fn covers(account: &str, needs: &[Need]) -> anyhow::Result<()> {
    let grants = Rbac::load()?.grants(account)?;
    let missing: Vec<String> = needs
        .iter()
        .flat_map(|need| need.verbs.iter().map(move |verb| (need, verb)))
        .filter(|(need, verb)| !grants.iter().any(|g| allows(g, need, verb)))
        .map(|(need, verb)| describe(need, verb))
        .collect();
    ensure!(
        missing.is_empty(),
        "ServiceAccount {account} lacks:\n  {}",
        missing.join("\n  ")
    );
    Ok(())
}

/// Nothing is granted to `account` that `needs` does not list: each grant is exactly a listed
/// permission (same group, resource, verb, at most as wide in names and namespaces).
fn minimal(account: &str, needs: &[Need]) -> anyhow::Result<()> {
    let grants = Rbac::load()?.grants(account)?;
    let extra: Vec<String> = grants
        .iter()
        .filter(|(group, resource, verb, name, namespace)| {
            !needs.iter().any(|need| {
                need.group == group
                    && need.resource == resource
                    && need.verbs.contains(&verb.as_str())
                    // A grant for any name is wider than a need for one name.
                    && (need.name.is_none() || name.as_deref() == need.name)
                    // A cluster-wide grant is wider than a need in one namespace.
                    && match (namespace, need.namespace) {
                        (None, None) => true,
                        (Some(granted), Some(wanted)) => granted == wanted,
                        (None, Some(_)) => false,
                        (Some(_), None) => false,
                    }
            })
        })
        .map(|(group, resource, verb, name, namespace)| {
            format!(
                "{verb} {}/{resource}{}{}",
                if group.is_empty() { "core" } else { group },
                name.as_ref()
                    .map(|n| format!(" named {n}"))
                    .unwrap_or_default(),
                namespace
                    .as_ref()
                    .map(|n| format!(" in namespace {n}"))
                    .unwrap_or_else(|| " cluster-wide".into())
            )
        })
        .collect();
    ensure!(
        extra.is_empty(),
        "ServiceAccount {account} is granted more than e2e/tests/chart.rs lists (add the use \
         to the list, or drop the grant):\n  {}",
        extra.join("\n  ")
    );
    Ok(())
}

/// The environment variables `knic-controller` reads (`env = "..."` in its argument parser).
fn controller_env_names() -> anyhow::Result<BTreeSet<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../controller/src/main.rs");
    let source = std::fs::read_to_string(&path)?;
    let names: BTreeSet<String> = source
        .split("env = \"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(str::to_owned)
        .collect();
    ensure!(
        !names.is_empty(),
        "no `env = \"...\"` found in {}",
        path.display()
    );
    Ok(names)
}

/// The `image:` line of a template, as written.
fn image_line(file: &str) -> anyhow::Result<String> {
    let path = chart_dir().join("templates").join(file);
    std::fs::read_to_string(&path)?
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("image:"))
        .map(str::to_owned)
        .with_context(|| format!("{file} has no image line"))
}

fn controller_deployment() -> anyhow::Result<()> {
    let objects = objects(&["deployment.yaml", "serviceaccount.yaml", "rbac.yaml"])?;
    let deployments: Vec<Deployment> = of_kind(&objects, "Deployment")?;
    let [deployment] = deployments.as_slice() else {
        bail!("deployment.yaml renders {} Deployments", deployments.len());
    };
    ensure!(deployment.metadata.name.as_deref() == Some("knic-controller"));
    ensure!(deployment.metadata.namespace.as_deref() == Some(RELEASE_NAMESPACE));
    let scope = Scope::load()?;
    let spec = deployment.spec.as_ref().context("spec")?;
    ensure!(
        spec.replicas == Some(2) && scope.lookup(".Values.controller.replicas")? == 2,
        "two replicas by default, got {:?}",
        spec.replicas
    );
    let selector = spec.selector.match_labels.as_ref().context("matchLabels")?;
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .context("pod labels")?;
    ensure!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the selector {selector:?} does not select the pod labels {labels:?}"
    );
    let pod = spec.template.spec.as_ref().context("pod spec")?;

    // Its own ServiceAccount, rendered in the release namespace.
    let accounts: Vec<ServiceAccount> = of_kind(&objects, "ServiceAccount")?;
    ensure!(pod.service_account_name.as_deref() == Some(CONTROLLER_SA));
    ensure!(
        accounts
            .iter()
            .any(|a| a.metadata.name.as_deref() == Some(CONTROLLER_SA)
                && a.metadata.namespace.as_deref() == Some(RELEASE_NAMESPACE)),
        "ServiceAccount {CONTROLLER_SA} is not in serviceaccount.yaml"
    );

    let [container] = pod.containers.as_slice() else {
        bail!("one container, got {}", pod.containers.len());
    };
    // The driver's image, written the same way, and the controller binary in it.
    ensure!(
        image_line("deployment.yaml")? == image_line("daemonset.yaml")?,
        "the controller must use the driver's image expression"
    );
    let app_version = scope.lookup(".Chart.AppVersion")?;
    let want = format!(
        "{}:{}",
        text(&scope.lookup(".Values.image.repository")?)?,
        text(&app_version)?
    );
    ensure!(container.image.as_deref() == Some(want.as_str()));
    ensure!(container.command.as_deref() == Some(&["knic-controller".to_owned()][..]));
    ensure!(container.args.as_ref().is_none_or(Vec::is_empty));

    // Only variables the binary reads, identity from the pod name, the lease where the Role is.
    let known = controller_env_names()?;
    let env = container.env.as_ref().context("env")?;
    for var in env {
        ensure!(
            known.contains(&var.name),
            "env {} is not read by knic-controller (it reads {known:?})",
            var.name
        );
    }
    let value = |name: &str| env.iter().find(|v| v.name == name);
    let pod_name = value("POD_NAME")
        .and_then(|v| v.value_from.as_ref())
        .and_then(|f| f.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    ensure!(
        pod_name == Some("metadata.name"),
        "POD_NAME from the downward API"
    );
    ensure!(
        value("KNIC_LEADER_ELECT").and_then(|v| v.value.as_deref()) == Some("true"),
        "leader election on"
    );
    let lease_namespace = value("KNIC_LEADER_NAMESPACE").and_then(|v| v.value.as_deref());
    ensure!(lease_namespace == Some(RELEASE_NAMESPACE));
    let roles: Vec<Role> = of_kind(&objects, "Role")?;
    ensure!(
        roles
            .iter()
            .any(|r| r.metadata.namespace.as_deref() == lease_namespace
                && r.rules.iter().flatten().any(|rule| rule
                    .resources
                    .iter()
                    .flatten()
                    .any(|res| res == "leases"))),
        "no Role for leases in the lease namespace"
    );
    for (name, path) in [
        ("KNIC_RESYNC_SECONDS", ".Values.controller.resyncSeconds"),
        ("KNIC_GC_SECONDS", ".Values.controller.gcSeconds"),
        ("KNIC_LOG_LEVEL", ".Values.controller.logLevel"),
        ("KNIC_LOG_FORMAT", ".Values.controller.logFormat"),
    ] {
        ensure!(
            value(name).and_then(|v| v.value.clone()) == Some(text(&scope.lookup(path)?)?),
            "{name} from {path}"
        );
    }
    let format = value("KNIC_LOG_FORMAT").and_then(|v| v.value.as_deref());
    ensure!(
        matches!(format, Some("text" | "json")),
        "KNIC_LOG_FORMAT {format:?} is not text or json (the controller's values)"
    );
    ensure!(
        container
            .resources
            .as_ref()
            .is_some_and(|r| r.requests.is_some()),
        "resources from values"
    );

    // No privilege: non-root, read-only root, no capability, nothing from the host.
    let pod_security = pod
        .security_context
        .as_ref()
        .context("pod securityContext")?;
    ensure!(pod_security.run_as_non_root == Some(true));
    ensure!(pod_security.run_as_user.is_some_and(|u| u != 0));
    let security = container
        .security_context
        .as_ref()
        .context("container securityContext")?;
    ensure!(security.privileged != Some(true));
    ensure!(security.allow_privilege_escalation == Some(false));
    ensure!(security.read_only_root_filesystem == Some(true));
    let caps = security.capabilities.as_ref().context("capabilities")?;
    ensure!(caps.drop.as_deref() == Some(&["ALL".to_owned()][..]));
    ensure!(caps.add.as_ref().is_none_or(Vec::is_empty));
    ensure!(pod.host_network != Some(true) && pod.host_pid != Some(true));
    ensure!(
        pod.volumes.iter().flatten().all(|v| v.host_path.is_none()),
        "no hostPath volume"
    );
    Ok(())
}

/// The driver DaemonSet: capabilities instead of `privileged`, and only the host paths it uses.
fn driver_daemonset() -> anyhow::Result<()> {
    let objects = objects(&["daemonset.yaml"])?;
    let sets: Vec<DaemonSet> = of_kind(&objects, "DaemonSet")?;
    let [set] = sets.as_slice() else {
        bail!("daemonset.yaml renders {} DaemonSets", sets.len());
    };
    let pod = set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .context("pod spec")?;
    ensure!(pod.service_account_name.as_deref() == Some(DRIVER_SA));
    // hostNetwork: the driver's own namespace is the node's, where the devices are.
    ensure!(pod.host_network == Some(true));
    ensure!(pod.host_pid != Some(true) && pod.host_ipc != Some(true));
    let [container] = pod.containers.as_slice() else {
        bail!("one container, got {}", pod.containers.len());
    };
    let security = container
        .security_context
        .as_ref()
        .context("container securityContext")?;
    ensure!(
        security.privileged == Some(false),
        "the driver must not run privileged: {security:?}"
    );
    let caps = security.capabilities.as_ref().context("capabilities")?;
    ensure!(caps.drop.as_deref() == Some(&["ALL".to_owned()][..]));
    let mut added = caps.add.clone().unwrap_or_default();
    added.sort();
    ensure!(
        added == ["NET_ADMIN", "SYS_ADMIN"],
        "exactly NET_ADMIN (rtnetlink) and SYS_ADMIN (setns), got {added:?}"
    );
    ensure!(security.read_only_root_filesystem == Some(true));
    ensure!(
        security
            .seccomp_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "RuntimeDefault")
    );
    // The apiserver refuses allowPrivilegeEscalation false together with SYS_ADMIN.
    ensure!(security.allow_privilege_escalation.is_none());

    // Host paths: exactly these, each mounted where the driver expects it.
    let scope = Scope::load()?;
    let kubelet = text(&scope.lookup(".Values.kubeletRootDir")?)?;
    let want: BTreeSet<String> = [
        format!("{kubelet}/plugins/knic.dev"),
        format!("{kubelet}/plugins_registry"),
        text(&scope.lookup(".Values.nriSocketDir")?)?,
        text(&scope.lookup(".Values.cdiDir")?)?,
        "/var/run/netns".to_owned(),
        "/proc/sys/net".to_owned(),
    ]
    .into();
    let volumes = pod.volumes.as_deref().unwrap_or_default();
    let host_paths: BTreeSet<String> = volumes
        .iter()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
        .collect();
    ensure!(
        host_paths == want,
        "host paths {host_paths:?}, want {want:?}"
    );
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .with_context(|| format!("mount of unknown volume {}", mount.name))?;
        if let Some(host) = &volume.host_path {
            // The host's /proc/sys/net sits beside the container's own, read-only /proc.
            let expected = if host.path == "/proc/sys/net" {
                "/host/proc/sys/net".to_owned()
            } else {
                host.path.clone()
            };
            ensure!(
                mount.mount_path == expected,
                "{} mounted at {}, not at its host path",
                host.path,
                mount.mount_path
            );
        }
        let propagation = mount.mount_propagation.as_deref();
        if mount.mount_path == "/var/run/netns" {
            // Namespaces the runtime creates after the driver started must appear inside.
            ensure!(propagation == Some("HostToContainer"));
        } else {
            ensure!(
                propagation.is_none(),
                "{} propagates mounts",
                mount.mount_path
            );
        }
    }
    Ok(())
}

/// With SR-IOV pools and writableSysfs in the values: the ConfigMap carries the pools as a
/// policy the driver parses to the same entries, and the DaemonSet mounts the host's /sys
/// writable at /host/sys and points the SR-IOV root there; by default neither is there
/// (checked above).
fn driver_daemonset_with_sriov_pools() -> anyhow::Result<()> {
    let mut scope = Scope::load()?;
    let pools = serde_json::json!([
        {"name": "fabric", "pfNames": ["ens1f*"], "numVfs": 8},
        {"name": "dpdk", "pciIds": ["8086:1593"], "numVfs": 4, "vfDriver": "vfio-pci"}
    ]);
    scope.values["driver"]["sriov"]["pools"] = pools.clone();
    scope.values["driver"]["sriov"]["writableSysfs"] = serde_json::json!(true);
    let rendered = objects_with(&scope, &["daemonset.yaml", "configmap.yaml"])?;
    let maps: Vec<k8s_openapi::api::core::v1::ConfigMap> = of_kind(&rendered, "ConfigMap")?;
    let policy = maps
        .iter()
        .find_map(|m| m.data.as_ref()?.get("sriov-policy.yaml"))
        .context("no sriov-policy.yaml in the ConfigMap")?;
    let parsed = knic_driver::sriov::SriovPolicy::parse(policy)?;
    let want =
        knic_driver::sriov::SriovPolicy::parse(&serde_json::json!({"pools": pools}).to_string())?;
    ensure!(parsed == want, "{policy}");
    let sets: Vec<DaemonSet> = of_kind(&rendered, "DaemonSet")?;
    let pod = sets[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .context("pod spec")?;
    let container = &pod.containers[0];
    let env: BTreeMap<String, String> = container
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    ensure!(
        env.get("KNIC_SRIOV_POLICY").map(String::as_str) == Some("/etc/knic/sriov-policy.yaml")
    );
    ensure!(env.get("KNIC_SRIOV_SYSFS_ROOT").map(String::as_str) == Some("/host"));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == "/sys"))
        .context("no /sys hostPath")?;
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .context("/sys not mounted")?;
    ensure!(
        mount.mount_path == "/host/sys" && mount.read_only != Some(true),
        "{mount:?}"
    );
    // Default values: the policy is there but empty, which provisions nothing.
    let defaults = objects(&["configmap.yaml"])?;
    let maps: Vec<k8s_openapi::api::core::v1::ConfigMap> = of_kind(&defaults, "ConfigMap")?;
    let empty = maps
        .iter()
        .find_map(|m| m.data.as_ref()?.get("sriov-policy.yaml"))
        .context("no default sriov-policy.yaml")?;
    ensure!(
        knic_driver::sriov::SriovPolicy::parse(empty)?.is_empty(),
        "{empty}"
    );
    Ok(())
}

/// The renderer itself: values resolve, pipes chain, unknown constructs are refused.
fn renderer_subset() -> anyhow::Result<()> {
    let scope = Scope::load()?;
    ensure!(scope.eval(".Release.Namespace")? == Value::from(RELEASE_NAMESPACE));
    ensure!(scope.eval(".Values.controller.gcSeconds | quote")? == Value::from("\"60\""));
    ensure!(
        scope.eval(".Values.image.tag | default .Chart.AppVersion")?
            == scope.eval(".Chart.AppVersion")?
    );
    ensure!(scope.eval("toJson .Values.controller.tolerations")? == Value::from("[]"));
    ensure!(scope.eval(".Values.controller.nope").is_err());
    ensure!(scope.eval("printf \"%s/x\" .Release.Namespace")? == Value::from("knic-system/x"));
    ensure!(scope.eval("printf \"%d\" 1").is_err());
    ensure!(
        scope
            .eval("toJson .Values.driver.filter | sha256sum")?
            .as_str()
            .map(str::len)
            == Some(64)
    );
    let with = "a:{{- with .Values.driver.nodeSelector }} x: {{ toJson . }}{{- end }}\nb: {{- with .Values.image }} {{ toJson . }}{{- end }}";
    let rendered = render_text(&scope, with, "inline")?;
    ensure!(rendered.starts_with("a:\nb: {"), "{rendered:?}");
    ensure!(
        render_text(
            &scope,
            "{{ with .Values.image }}{{ with . }}{{ end }}{{ end }}",
            "x"
        )
        .is_err()
    );
    ensure!(scope.eval("if .Values.controller.replicas").is_err());
    Ok(())
}

fn check(name: &str, f: fn() -> anyhow::Result<()>) -> Trial {
    Trial::test(name, move || {
        f().map_err(|e| Failed::from(format!("{e:#}")))
    })
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let mut trials = vec![
        check("chart/renderer_handles_the_subset_used", renderer_subset),
        check("chart/rbac_driver_covers_its_calls", || {
            covers(DRIVER_SA, DRIVER)
        }),
        check("chart/rbac_controller_covers_its_calls", || {
            covers(CONTROLLER_SA, CONTROLLER)
        }),
        check("chart/rbac_driver_is_minimal", || {
            minimal(DRIVER_SA, DRIVER)
        }),
        check("chart/rbac_controller_is_minimal", || {
            minimal(CONTROLLER_SA, CONTROLLER)
        }),
        check("chart/controller_deployment", controller_deployment),
        check("chart/driver_daemonset", driver_daemonset),
        check(
            "chart/driver_daemonset_with_sriov_pools",
            driver_daemonset_with_sriov_pools,
        ),
    ];
    trials.extend(policies::trials());
    libtest_mimic::run(&args, trials).exit();
}
