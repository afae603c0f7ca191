//! Policy routing of the pod's interface: `rules` (`ip rule`), `sourceBasedRouting` (the CNI
//! `sbr` plugin in one line) and `vrf` (the CNI `vrf` plugin). Wire form, parsing, merge,
//! validation and the expansion into the routes and rules the driver installs live here, so
//! the other netconfig files only carry one hook each.
//!
//! Tables are numbers only: a pod has no `/etc/iproute2/rt_tables`, and a name that means a
//! number only on some nodes would route differently from node to node. `254` is `main`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::validate::check_interface_name;
use super::{Cidr, FieldError, Route};

/// The main table; routes without `table` go there.
pub const MAIN_TABLE: u32 = 254;
/// `sourceBasedRouting.table` when unset: the first table the `sbr` plugin tries.
pub const DEFAULT_SBR_TABLE: u32 = 100;
/// `priority` of a rule (and of the source rules of `sourceBasedRouting`) when unset. Fixed
/// rather than left to the kernel (which picks one below the first non-zero rule), so a
/// repeated attach finds the rule it made and detach deletes exactly that rule; below 32766
/// (`main`) so the rule is consulted before the main table.
pub const DEFAULT_RULE_PRIORITY: u32 = 10000;

/// Priorities of the kernel's own rules, refused so a pod cannot shadow or duplicate them.
const RESERVED_PRIORITIES: &[(u32, &str)] = &[(0, "local"), (32766, "main"), (32767, "default")];

pub(super) const RULE_FIELDS: &[&str] = &[
    "family", "from", "to", "iif", "oif", "fwmark", "fwmask", "table", "priority",
];
pub(super) const SBR_FIELDS: &[&str] = &["table", "priority"];
pub(super) const VRF_FIELDS: &[&str] = &["name", "table"];

/// One `ip rule` as written; strings stay strings so every bad value is reported with its path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleConfig {
    /// `ipv4` or `ipv6`; required only to restrict a rule without `from`/`to` to one family
    /// (such a rule is otherwise installed for both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// Source prefix, network form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Destination prefix, network form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Incoming interface: this interface (`interface.name`), the `vrf` or `lo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    /// Outgoing interface (sockets bound to it), same names as `iif`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oif: Option<String>,
    /// Firewall mark to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmark: Option<u32>,
    /// Mask applied to the mark before comparing; only with `fwmark`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmask: Option<u32>,
    /// Table to look up; required (a rule without one would do nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Order among rules, lower first; [`DEFAULT_RULE_PRIORITY`] when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
}

/// `sourceBasedRouting`: a table for this interface and a rule per address sending traffic
/// from it there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceRoutingConfig {
    /// The interface's table; [`DEFAULT_SBR_TABLE`] when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Priority of the `from <address>` rules; [`DEFAULT_RULE_PRIORITY`] when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
}

/// `vrf`: a VRF device in the pod that the interface is enslaved to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VrfConfig {
    /// The VRF device's name in the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its routing table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
}

/// An address family of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `AF_INET`.
    Ipv4,
    /// `AF_INET6`.
    Ipv6,
}

impl Family {
    fn of(ip: IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        }
    }

    fn text(self) -> &'static str {
        match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        }
    }
}

/// One checked rule of one family, as installed (and, on detach, deleted) in the pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Its family (`from`/`to` are of it).
    pub family: Family,
    /// Source prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Cidr>,
    /// Destination prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Cidr>,
    /// Incoming interface name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    /// Outgoing interface name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oif: Option<String>,
    /// Mark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmark: Option<u32>,
    /// Mark mask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmask: Option<u32>,
    /// Table looked up.
    pub table: u32,
    /// Priority (always set: see [`DEFAULT_RULE_PRIORITY`]).
    pub priority: u32,
}

/// Checked source-based routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceRouting {
    /// The interface's table.
    pub table: u32,
    /// Priority of its rules.
    pub priority: u32,
}

/// A checked VRF.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Vrf {
    /// Device name in the pod.
    pub name: String,
    /// Its table.
    pub table: u32,
}

/// The checked policy routing of one interface, as [`super::ValidConfig`] and the driver's
/// attach plan carry it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingSettings {
    /// Rules, in the order given, one per family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// Source-based routing, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_routing: Option<SourceRouting>,
    /// The VRF, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<Vrf>,
}

impl RoutingSettings {
    /// Nothing asked for (skipped in checkpoints, so older ones load and new ones stay short).
    pub fn is_empty(&self) -> bool {
        *self == RoutingSettings::default()
    }

    /// What the driver installs for an interface with `addresses` (static or from IPAM) and
    /// `routes`: the routes, each in its table (a route without one goes to the VRF's or the
    /// source-routing table instead of main, as the `sbr` plugin moves them), plus for source
    /// routing each address's subnet route in that table (the kernel puts connected routes
    /// only into main, or the VRF's table); and the rules: the `from <address>` rule of each
    /// address, then the config's own.
    pub fn expand(&self, addresses: &[Cidr], routes: &[Route]) -> (Vec<Route>, Vec<Rule>) {
        let table = self
            .vrf
            .as_ref()
            .map(|v| v.table)
            .or(self.source_routing.map(|s| s.table));
        let mut out_routes: Vec<Route> = routes
            .iter()
            .map(|r| Route {
                table: r.table.or(table),
                ..*r
            })
            .collect();
        let mut rules = Vec::new();
        if let Some(sbr) = self.source_routing {
            for address in addresses {
                let subnet = Route {
                    destination: address.network(),
                    gateway: None,
                    source: Some(address.addr),
                    metric: None,
                    table: Some(sbr.table),
                };
                if !out_routes
                    .iter()
                    .any(|r| r.destination == subnet.destination && r.table == subnet.table)
                {
                    out_routes.push(subnet);
                }
                let host = Cidr {
                    addr: address.addr,
                    prefix_len: address.max_prefix_len(),
                };
                rules.push(Rule {
                    family: Family::of(address.addr),
                    from: Some(host),
                    to: None,
                    iif: None,
                    oif: None,
                    fwmark: None,
                    fwmask: None,
                    table: sbr.table,
                    priority: sbr.priority,
                });
            }
        }
        rules.extend(self.rules.iter().cloned());
        (out_routes, rules)
    }
}

/// `path.field`, or `field` at the root.
fn child(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// The parsing half: the same conventions as `parse.rs` (unknown fields and wrong types
/// reported by path, `null` is unset), on a plain error list.
struct Parse<'e>(&'e mut Vec<FieldError>);

impl Parse<'_> {
    fn object<'a>(
        &mut self,
        value: &'a Value,
        path: &str,
        known: &[&str],
    ) -> Option<&'a Map<String, Value>> {
        let Value::Object(map) = value else {
            self.0.push(FieldError::new(
                path,
                format!("expected an object, got {}", describe(value)),
            ));
            return None;
        };
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.0
                    .push(FieldError::new(child(path, key), "unknown field"));
            }
        }
        Some(map)
    }

    fn string(&mut self, map: &Map<String, Value>, path: &str, name: &str) -> Option<String> {
        match map.get(name).filter(|v| !v.is_null())? {
            Value::String(s) => Some(s.clone()),
            other => {
                self.0.push(FieldError::new(
                    child(path, name),
                    format!("expected a string, got {}", describe(other)),
                ));
                None
            }
        }
    }

    /// A `u32`; anything else is reported as "`rule`, got N".
    fn u32(&mut self, map: &Map<String, Value>, path: &str, name: &str, rule: &str) -> Option<u32> {
        let value = map.get(name).filter(|v| !v.is_null())?;
        let path = child(path, name);
        let Value::Number(n) = value else {
            self.0.push(FieldError::new(
                path,
                format!("expected an integer, got {}", describe(value)),
            ));
            return None;
        };
        match n.as_u64().map(u32::try_from) {
            Some(Ok(v)) if !n.is_f64() => Some(v),
            _ if n.is_f64() => {
                self.0.push(FieldError::new(
                    path,
                    format!("expected an integer, got {}", describe(value)),
                ));
                None
            }
            _ => {
                self.0
                    .push(FieldError::new(path, format!("{rule}, got {n}")));
                None
            }
        }
    }
}

const U32_RULE: &str = "must be between 0 and 4294967295";

/// Parses `rules` (a list) at `path`.
pub(super) fn parse_rules(
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<Vec<RuleConfig>> {
    let mut p = Parse(errors);
    let Value::Array(items) = value else {
        p.0.push(FieldError::new(
            path,
            format!("expected a list of rules, got {}", describe(value)),
        ));
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let Some(map) = p.object(item, &path, RULE_FIELDS) else {
            continue;
        };
        out.push(RuleConfig {
            family: p.string(map, &path, "family"),
            from: p.string(map, &path, "from"),
            to: p.string(map, &path, "to"),
            iif: p.string(map, &path, "iif"),
            oif: p.string(map, &path, "oif"),
            fwmark: p.u32(map, &path, "fwmark", U32_RULE),
            fwmask: p.u32(map, &path, "fwmask", U32_RULE),
            table: p.u32(map, &path, "table", "must be between 1 and 4294967295"),
            priority: p.u32(map, &path, "priority", "must be between 1 and 4294967295"),
        });
    }
    Some(out)
}

/// Parses `sourceBasedRouting` at `path`.
pub(super) fn parse_source_routing(
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<SourceRoutingConfig> {
    let mut p = Parse(errors);
    let map = p.object(value, path, SBR_FIELDS)?;
    Some(SourceRoutingConfig {
        table: p.u32(map, path, "table", "must be between 1 and 4294967295"),
        priority: p.u32(map, path, "priority", "must be between 1 and 4294967295"),
    })
}

/// Parses `vrf` at `path`.
pub(super) fn parse_vrf(
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<VrfConfig> {
    let mut p = Parse(errors);
    let map = p.object(value, path, VRF_FIELDS)?;
    Some(VrfConfig {
        name: p.string(map, path, "name"),
        table: p.u32(map, path, "table", "must be between 1 and 4294967295"),
    })
}

/// Why `table` cannot be used by a rule, a route table of `sourceBasedRouting` or a VRF
/// (`main_ok`: whether 254 is allowed, as for a rule that looks up main).
fn table_problem(table: u32, main_ok: bool) -> Option<String> {
    match table {
        0 => Some("0 is not a table id (RT_TABLE_UNSPEC)".to_owned()),
        252 => Some("252 is reserved for the kernel's \"compat\" table".to_owned()),
        253 => Some("253 is reserved for the kernel's \"default\" table".to_owned()),
        255 => Some("255 is reserved for the kernel's \"local\" table".to_owned()),
        254 if !main_ok => {
            Some("254 is the main table; this needs a table of its own (e.g. 100)".to_owned())
        }
        _ => None,
    }
}

fn priority_problem(priority: u32) -> Option<String> {
    RESERVED_PRIORITIES
        .iter()
        .find(|(p, _)| *p == priority)
        .map(|(p, name)| {
            format!(
                "{p} is the priority of the kernel's \"{name}\" rule; use another (1-32765 or above 32767)"
            )
        })
}

/// The inputs validation needs from the rest of the config.
pub(super) struct Context<'a> {
    /// `interface.name`, when given (the only way a rule can name this interface).
    pub interface_name: Option<&'a str>,
    /// The checked routes (their tables are checked against the VRF's).
    pub routes: &'a [Route],
}

/// Checks `rules`, `sourceBasedRouting` and `vrf` of `config`, pushing every problem.
pub(super) fn validate_routing(
    config: &super::NetworkConfig,
    context: &Context<'_>,
    errors: &mut Vec<FieldError>,
) -> RoutingSettings {
    let mut out = RoutingSettings::default();
    if let Some(vrf) = &config.vrf {
        out.vrf = validate_vrf(vrf, context, errors);
    }
    if let Some(sbr) = &config.source_based_routing {
        let mut ok = true;
        let table = sbr.table.unwrap_or(DEFAULT_SBR_TABLE);
        if let Some(problem) = table_problem(table, false) {
            errors.push(FieldError::new("sourceBasedRouting.table", problem));
            ok = false;
        }
        let priority = sbr.priority.unwrap_or(DEFAULT_RULE_PRIORITY);
        if let Some(problem) = priority_problem(priority) {
            errors.push(FieldError::new("sourceBasedRouting.priority", problem));
            ok = false;
        }
        if config.vrf.is_some() {
            errors.push(FieldError::new(
                "sourceBasedRouting",
                "cannot be combined with vrf; the VRF's table already holds this interface's routes",
            ));
            ok = false;
        }
        if ok {
            out.source_routing = Some(SourceRouting { table, priority });
        }
    }
    let names = Names {
        interface: context.interface_name,
        vrf: out.vrf.as_ref().map(|v| v.name.as_str()),
    };
    let mut seen: BTreeMap<Rule, usize> = BTreeMap::new();
    for (i, rule) in config.rules.iter().flatten().enumerate() {
        for valid in validate_rule(rule, &format!("rules[{i}]"), &names, errors) {
            if let Some(j) = seen.get(&valid) {
                errors.push(FieldError::new(
                    format!("rules[{i}]"),
                    format!("same rule as rules[{j}]"),
                ));
                break;
            }
            seen.insert(valid.clone(), i);
            out.rules.push(valid);
        }
    }
    out
}

fn validate_vrf(
    vrf: &VrfConfig,
    context: &Context<'_>,
    errors: &mut Vec<FieldError>,
) -> Option<Vrf> {
    let before = errors.len();
    let name = match &vrf.name {
        None => {
            errors.push(FieldError::new("vrf.name", "required"));
            None
        }
        Some(name) => match check_interface_name(name) {
            Err(e) => {
                errors.push(FieldError::new("vrf.name", e.to_string()));
                None
            }
            Ok(()) if Some(name.as_str()) == context.interface_name => {
                errors.push(FieldError::new(
                    "vrf.name",
                    format!("{name:?} is the interface's own name (interface.name); the VRF device needs another"),
                ));
                None
            }
            Ok(()) if name == "lo" => {
                errors.push(FieldError::new(
                    "vrf.name",
                    "\"lo\" is the pod's loopback device",
                ));
                None
            }
            Ok(()) => Some(name.clone()),
        },
    };
    let table = match vrf.table {
        None => {
            errors.push(FieldError::new("vrf.table", "required"));
            None
        }
        Some(t) => match table_problem(t, false) {
            Some(problem) => {
                errors.push(FieldError::new("vrf.table", problem));
                None
            }
            None => Some(t),
        },
    };
    if let Some(table) = table {
        for (i, route) in context.routes.iter().enumerate() {
            if let Some(t) = route.table
                && t != table
                && t != MAIN_TABLE
            {
                errors.push(FieldError::new(
                    format!("routes[{i}].table"),
                    format!(
                        "{t} is not the VRF's table {table}; leave table unset to route in the VRF"
                    ),
                ));
            }
        }
    }
    if errors.len() != before {
        return None;
    }
    Some(Vrf {
        name: name?,
        table: table?,
    })
}

/// The interface names a rule may use.
struct Names<'a> {
    interface: Option<&'a str>,
    vrf: Option<&'a str>,
}

impl Names<'_> {
    fn check(&self, name: &str) -> Option<String> {
        if name == "lo" || Some(name) == self.interface || Some(name) == self.vrf {
            return None;
        }
        let mut known = vec!["\"lo\"".to_owned()];
        if let Some(n) = self.interface {
            known.push(format!("{n:?} (interface.name)"));
        }
        if let Some(v) = self.vrf {
            known.push(format!("{v:?} (vrf.name)"));
        }
        let hint = if self.interface.is_none() {
            "; set interface.name to name this interface"
        } else {
            ""
        };
        Some(format!(
            "{name:?} is not an interface of this claim in the pod; allowed: {}{hint}",
            known.join(", ")
        ))
    }
}

/// One rule, expanded to both families when it names neither a prefix nor a family.
fn validate_rule(
    rule: &RuleConfig,
    path: &str,
    names: &Names<'_>,
    errors: &mut Vec<FieldError>,
) -> Vec<Rule> {
    let before = errors.len();
    let family = match rule.family.as_deref() {
        None => None,
        Some("ipv4") => Some(Family::Ipv4),
        Some("ipv6") => Some(Family::Ipv6),
        Some(other) => {
            errors.push(FieldError::new(
                child(path, "family"),
                format!("{other:?} is not a family; use \"ipv4\" or \"ipv6\""),
            ));
            None
        }
    };
    let prefix = |field: &str, text: &Option<String>, errors: &mut Vec<FieldError>| {
        let text = text.as_ref()?;
        match text.parse::<Cidr>() {
            Ok(cidr) if cidr.network() != cidr => {
                errors.push(FieldError::new(
                    child(path, field),
                    format!("{cidr} has host bits set; did you mean {}?", cidr.network()),
                ));
                None
            }
            Ok(cidr) => Some(cidr),
            Err(e) => {
                errors.push(FieldError::new(child(path, field), e.to_string()));
                None
            }
        }
    };
    let from = prefix("from", &rule.from, errors);
    let to = prefix("to", &rule.to, errors);
    if let (Some(from), Some(to)) = (from, to)
        && from.is_ipv4() != to.is_ipv4()
    {
        errors.push(FieldError::new(
            child(path, "to"),
            format!(
                "{to} is {} but from {from} is {}",
                Family::of(to.addr).text(),
                Family::of(from.addr).text()
            ),
        ));
    }
    if let Some(family) = family {
        for (field, cidr) in [("from", from), ("to", to)] {
            if let Some(cidr) = cidr
                && Family::of(cidr.addr) != family
            {
                errors.push(FieldError::new(
                    child(path, field),
                    format!(
                        "{cidr} is {} but family is {:?}",
                        Family::of(cidr.addr).text(),
                        rule.family.as_deref().unwrap_or_default()
                    ),
                ));
            }
        }
    }
    for (field, name) in [("iif", &rule.iif), ("oif", &rule.oif)] {
        if let Some(name) = name
            && let Some(problem) = names.check(name)
        {
            errors.push(FieldError::new(child(path, field), problem));
        }
    }
    if rule.fwmask.is_some() && rule.fwmark.is_none() {
        errors.push(FieldError::new(
            child(path, "fwmask"),
            "requires fwmark (the mask applies to the mark being matched)",
        ));
    }
    let table = match rule.table {
        None => {
            errors.push(FieldError::new(
                child(path, "table"),
                "required; the table this rule sends matching traffic to",
            ));
            None
        }
        Some(t) => match table_problem(t, true) {
            Some(problem) => {
                errors.push(FieldError::new(child(path, "table"), problem));
                None
            }
            None => Some(t),
        },
    };
    let priority = rule.priority.unwrap_or(DEFAULT_RULE_PRIORITY);
    if let Some(problem) = priority_problem(priority) {
        errors.push(FieldError::new(child(path, "priority"), problem));
    }
    let (Some(table), true) = (table, errors.len() == before) else {
        return Vec::new();
    };
    let families = match from.or(to).map(|c| Family::of(c.addr)).or(family) {
        Some(f) => vec![f],
        None => vec![Family::Ipv4, Family::Ipv6],
    };
    families
        .into_iter()
        .map(|family| Rule {
            family,
            from,
            to,
            iif: rule.iif.clone(),
            oif: rule.oif.clone(),
            fwmark: rule.fwmark,
            fwmask: rule.fwmask,
            table,
            priority,
        })
        .collect()
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
