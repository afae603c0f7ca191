//! `addressing`: how the pod's interface gets its addresses — `static` (the config's
//! `addresses` or `ipam`, the default), `dhcp` (knic's DHCPv4 client, run by the driver in
//! the pod's namespace), `slaac` (IPv6 router advertisements) or `unnumbered` (no address:
//! routes through the interface only).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Cidr, FieldError, NetworkConfig, Route};

/// The wire fields of `addressing`.
pub(super) const ADDRESSING_FIELDS: &[&str] = &["mode", "timeoutSeconds", "defaultRoute", "useMtu"];

/// The modes, as the error texts list them.
pub const ADDRESSING_MODES: &[&str] = &["static", "dhcp", "slaac", "unnumbered"];

/// A DHCP lease must come within this bound by default.
pub const DEFAULT_DHCP_TIMEOUT: u32 = 10;
/// The longest a pod's start may wait for a lease or an autoconf address: the runtime's
/// sandbox hook has its own timeout, and a claim must fail with knic's reason, not that one.
pub const MAX_ADDRESSING_TIMEOUT: u32 = 60;

/// `addressing` as written; merged field by field (a class picks `dhcp`, a claim its timeout).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddressingConfig {
    /// `static` (default), `dhcp`, `slaac` or `unnumbered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `dhcp`: how long attach waits for a lease (1-60, default 10); `slaac`: how long it waits
    /// for an autoconfigured global address (0-60, default 0: not at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    /// `dhcp`: install the server's router option as the default route (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_route: Option<bool>,
    /// `dhcp`: apply the server's interface-MTU option (default false; `interface.mtu` wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_mtu: Option<bool>,
}

impl AddressingConfig {
    /// Later layer's fields win one by one.
    pub(super) fn merge_from(&mut self, other: &AddressingConfig) {
        if other.mode.is_some() {
            self.mode.clone_from(&other.mode);
        }
        if other.timeout_seconds.is_some() {
            self.timeout_seconds = other.timeout_seconds;
        }
        if other.default_route.is_some() {
            self.default_route = other.default_route;
        }
        if other.use_mtu.is_some() {
            self.use_mtu = other.use_mtu;
        }
    }
}

/// The checked mode, as the driver's plan and checkpoint carry it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "mode")]
pub enum Addressing {
    /// The config's `addresses` / `ipam`.
    #[default]
    Static,
    /// knic's DHCPv4 client.
    #[serde(rename_all = "camelCase")]
    Dhcp {
        /// Seconds attach waits for a lease, 1-60.
        timeout_seconds: u32,
        /// The router option becomes the default route.
        default_route: bool,
        /// The interface-MTU option is applied.
        use_mtu: bool,
    },
    /// IPv6 stateless autoconfiguration from router advertisements.
    #[serde(rename_all = "camelCase")]
    Slaac {
        /// Seconds attach waits for a global autoconf address; 0: it does not wait.
        timeout_seconds: u32,
    },
    /// No address; routes through the interface only.
    Unnumbered,
}

impl Addressing {
    /// Whether this is the default (omitted from checkpoints, so older ones load the same).
    pub fn is_static(&self) -> bool {
        matches!(self, Addressing::Static)
    }
}

/// Parses `addressing` (structure only), reporting every problem with its path.
pub(super) fn parse(
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<AddressingConfig> {
    let Value::Object(map) = value else {
        errors.push(FieldError::new(
            path,
            format!("expected an object, got {}", kind(value)),
        ));
        return None;
    };
    for key in map.keys() {
        if !ADDRESSING_FIELDS.contains(&key.as_str()) {
            errors.push(FieldError::new(format!("{path}.{key}"), "unknown field"));
        }
    }
    let field = |name: &str| map.get(name).filter(|v| !v.is_null());
    let mut out = AddressingConfig::default();
    if let Some(v) = field("mode") {
        match v {
            Value::String(s) => out.mode = Some(s.clone()),
            other => errors.push(FieldError::new(
                format!("{path}.mode"),
                format!("expected a string, got {}", kind(other)),
            )),
        }
    }
    if let Some(v) = field("timeoutSeconds") {
        match v.as_u64() {
            Some(n) if n <= u64::from(MAX_ADDRESSING_TIMEOUT) => {
                out.timeout_seconds = Some(n as u32)
            }
            _ if v.is_number() && !v.is_f64() => errors.push(FieldError::new(
                format!("{path}.timeoutSeconds"),
                format!("must be between 0 and {MAX_ADDRESSING_TIMEOUT}, got {v}"),
            )),
            _ => errors.push(FieldError::new(
                format!("{path}.timeoutSeconds"),
                format!("expected an integer, got {}", kind(v)),
            )),
        }
    }
    for (name, slot) in [
        ("defaultRoute", &mut out.default_route),
        ("useMtu", &mut out.use_mtu),
    ] {
        if let Some(v) = field(name) {
            match v {
                Value::Bool(b) => *slot = Some(*b),
                other => errors.push(FieldError::new(
                    format!("{path}.{name}"),
                    format!("expected a boolean (true or false), got {}", kind(other)),
                )),
            }
        }
    }
    let _: &Map<String, Value> = map;
    Some(out)
}

fn kind(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// Checks `addressing` against the rest of the config and returns the mode, with the sysctls
/// a mode implies added to `sysctls` (`slaac`: `ipv6.accept_ra` 2 — accept RAs even if the pod
/// forwards — and `ipv6.autoconf` 1; `unnumbered`: `ipv6.autoconf` 0, so no RA can give the
/// interface an address). The rules:
/// * `mode` is one of [`ADDRESSING_MODES`];
/// * `dhcp`: no `ipam`, no IPv4 `addresses` (DHCP gives the IPv4 address; static IPv6 ones may
///   stay), `timeoutSeconds` 1-60;
/// * `slaac`: no `ipv6.accept_ra: "0"`, `ipv6.autoconf: "0"` or `ipv6.disable_ipv6: "1"`, no
///   MTU below 1280;
/// * `unnumbered`: no `addresses`, no `ipam`, no route `gateway` other than an IPv6
///   link-local one (an IPv4 next hop needs a subnet on the interface), no `ipv6.autoconf: "1"`;
/// * `timeoutSeconds` only with `dhcp` and `slaac`; `defaultRoute` and `useMtu` only with `dhcp`.
pub(super) fn check(
    config: &NetworkConfig,
    addresses: &[Cidr],
    routes: &[Route],
    mtu: Option<u32>,
    sysctls: &mut BTreeMap<String, String>,
    errors: &mut Vec<FieldError>,
) -> Addressing {
    let Some(a) = &config.addressing else {
        return Addressing::Static;
    };
    let mode = a.mode.as_deref().unwrap_or("static");
    let mut error = |path: String, message: String| errors.push(FieldError::new(path, message));
    let only = |field: &str, modes: &str| {
        FieldError::new(
            format!("addressing.{field}"),
            format!("applies only to mode {modes}, not {mode}"),
        )
    };
    let mut misplaced = Vec::new();
    if a.timeout_seconds.is_some() && !matches!(mode, "dhcp" | "slaac") {
        misplaced.push(only("timeoutSeconds", "dhcp or slaac"));
    }
    if a.default_route.is_some() && mode != "dhcp" {
        misplaced.push(only("defaultRoute", "dhcp"));
    }
    if a.use_mtu.is_some() && mode != "dhcp" {
        misplaced.push(only("useMtu", "dhcp"));
    }
    let ipam = config.ipam.is_some();
    // Source-based routing writes its rules from the addresses known at prepare; a lease or an
    // autoconfigured address comes later, and an unnumbered interface has none.
    if config.source_based_routing.is_some() && matches!(mode, "dhcp" | "slaac" | "unnumbered") {
        error(
            "sourceBasedRouting".into(),
            format!(
                "cannot be combined with addressing.mode {mode}: its rules are made from the addresses known at prepare; use mode static or ipam"
            ),
        );
    }
    let chosen = match mode {
        "static" => Addressing::Static,
        "dhcp" => {
            if ipam {
                error("ipam".into(), "cannot be combined with addressing.mode dhcp; the DHCP server gives the address".into());
            }
            for (i, a) in addresses.iter().enumerate().filter(|(_, a)| a.is_ipv4()) {
                error(
                    format!("addresses[{i}]"),
                    format!(
                        "{a} is IPv4, but addressing.mode dhcp gets the IPv4 address from a DHCP server; remove it or use mode static"
                    ),
                );
            }
            // Routes are installed before the lease exists: a gateway in its subnet is not
            // reachable yet, and the kernel would refuse the route.
            for (i, r) in routes.iter().enumerate() {
                if let Some(gw @ std::net::IpAddr::V4(_)) = r.gateway {
                    error(
                        format!("routes[{i}].gateway"),
                        format!(
                            "{gw} is IPv4, but with addressing.mode dhcp the interface has no IPv4 subnet until the lease arrives; use addressing.defaultRoute for the server's router, or mode static"
                        ),
                    );
                }
            }
            // ipvlan children share the parent's MAC, which is the DHCP client identity: every
            // pod on the port would get the same lease.
            if config.ipvlan.is_some() {
                error(
                    "ipvlan".into(),
                    "cannot be combined with addressing.mode dhcp: ipvlan children share the parent's MAC, so every pod on the port would get the same lease; use macvlan".into(),
                );
            }
            let timeout_seconds = a.timeout_seconds.unwrap_or(DEFAULT_DHCP_TIMEOUT);
            if timeout_seconds == 0 {
                error(
                    "addressing.timeoutSeconds".into(),
                    format!("must be between 1 and {MAX_ADDRESSING_TIMEOUT} for mode dhcp, got 0"),
                );
            }
            Addressing::Dhcp {
                timeout_seconds,
                default_route: a.default_route.unwrap_or(true),
                use_mtu: a.use_mtu.unwrap_or(false),
            }
        }
        "slaac" => {
            for (key, bad, why) in [
                ("ipv6.accept_ra", "0", "turns router advertisements off"),
                ("ipv6.autoconf", "0", "turns autoconfiguration off"),
                ("ipv6.disable_ipv6", "1", "disables IPv6"),
            ] {
                if sysctls.get(key).map(String::as_str) == Some(bad) {
                    error(
                        format!("sysctls[{key:?}]"),
                        format!("{bad:?} {why}, which addressing.mode slaac needs"),
                    );
                }
            }
            let static_v6 = addresses.iter().any(|a| !a.is_ipv4());
            for (i, r) in routes.iter().enumerate() {
                if let Some(gw @ std::net::IpAddr::V6(v6)) = r.gateway
                    && !v6.is_unicast_link_local()
                    && !static_v6
                {
                    error(
                        format!("routes[{i}].gateway"),
                        format!(
                            "{gw} is not link-local, and with addressing.mode slaac the interface has no global IPv6 subnet until a router advertises one; use the router's link-local address"
                        ),
                    );
                }
            }
            if let Some(mtu) = mtu.filter(|m| *m < 1280) {
                error(
                    "interface.mtu".into(),
                    format!(
                        "{mtu} is below 1280, the minimum MTU for IPv6 (addressing.mode is slaac)"
                    ),
                );
            }
            sysctls
                .entry("ipv6.accept_ra".into())
                .or_insert_with(|| "2".into());
            sysctls
                .entry("ipv6.autoconf".into())
                .or_insert_with(|| "1".into());
            Addressing::Slaac {
                timeout_seconds: a.timeout_seconds.unwrap_or(0),
            }
        }
        "unnumbered" => {
            if ipam {
                error("ipam".into(), "cannot be combined with addressing.mode unnumbered, which gives the interface no address".into());
            }
            if !addresses.is_empty() {
                error("addresses".into(), "must be empty with addressing.mode unnumbered, which gives the interface no address".into());
            }
            for (i, r) in routes.iter().enumerate() {
                if let Some(gw) = r.gateway {
                    let link_local =
                        matches!(gw, std::net::IpAddr::V6(v6) if v6.is_unicast_link_local());
                    if !link_local {
                        error(
                            format!("routes[{i}].gateway"),
                            format!(
                                "{gw} cannot be reached through an unnumbered interface (it has no subnet); omit the gateway for an on-link route, or use an IPv6 link-local one"
                            ),
                        );
                    }
                }
            }
            if sysctls.get("ipv6.autoconf").map(String::as_str) == Some("1") {
                error(
                    "sysctls[\"ipv6.autoconf\"]".into(),
                    "\"1\" would give the interface addresses, but addressing.mode is unnumbered"
                        .into(),
                );
            }
            sysctls
                .entry("ipv6.autoconf".into())
                .or_insert_with(|| "0".into());
            Addressing::Unnumbered
        }
        other => {
            error(
                "addressing.mode".into(),
                format!(
                    "{other:?} is not an addressing mode; use one of {}",
                    ADDRESSING_MODES.join(", ")
                ),
            );
            Addressing::Static
        }
    };
    errors.extend(misplaced);
    chosen
}

#[cfg(test)]
#[path = "addressing_tests.rs"]
mod tests;
