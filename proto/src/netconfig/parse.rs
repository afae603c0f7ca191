//! [`parse`]: JSON parameters → wire form, with every structural problem reported by path.
//!
//! This walks the `serde_json::Value` by hand rather than going through serde, because serde
//! stops at the first error and its messages carry no path; an operator who misspelt two
//! fields and quoted a number should hear about all three at once, each with its location.
//! It accepts the same documents as the derived `Deserialize` of [`NetworkConfig`] (a test
//! compares the two on a full config), except that `apiVersion` and `kind` are required here.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::vf::VF_VLAN_RULE;
use super::{
    API_VERSION, BandwidthConfig, ConfigErrors, FieldError, InterfaceConfig, IpamConfig,
    IpvlanConfig, KIND, MacvlanConfig, NeighborConfig, NetworkConfig, RouteConfig, VfConfig,
    VlanConfig,
};

const CONFIG_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "interface",
    "addresses",
    "ipam",
    "routes",
    "vlan",
    "macvlan",
    "ipvlan",
    "sysctls",
    "vf",
    "deviceMode",
    "bandwidth",
    "rules",
    "sourceBasedRouting",
    "vrf",
    "ethtool",
    "neighbors",
    "addressing",
];
const NEIGHBOR_FIELDS: &[&str] = &["address", "hardwareAddress"];
const BANDWIDTH_FIELDS: &[&str] = &["egress", "burst"];
const CHILD_FIELDS: &[&str] = &["mode"];
const INTERFACE_FIELDS: &[&str] = &[
    "name",
    "mtu",
    "hardwareAddress",
    "gsoMaxSize",
    "groMaxSize",
    "gsoIpv4MaxSize",
    "groIpv4MaxSize",
];
const IPAM_FIELDS: &[&str] = &["network"];
const ROUTE_FIELDS: &[&str] = &["destination", "gateway", "source", "metric", "table"];
const VLAN_FIELDS: &[&str] = &["id"];
const VF_FIELDS: &[&str] = &[
    "mac",
    "vlan",
    "qos",
    "vlanProtocol",
    "spoofChk",
    "trust",
    "minTxRate",
    "maxTxRate",
    "linkState",
];

/// Parses one opaque parameters object (the `parameters` of one DRA config entry).
///
/// `prefix` is prepended to every path (e.g. `config[1].parameters`) so errors from a claim
/// with several config entries point at the right one; pass `""` for bare paths.
///
/// Beyond the JSON shape this only checks `apiVersion` and `kind`, which are required here
/// (every object must say what it is) and must be exactly [`API_VERSION`] and [`KIND`]. The
/// semantic rules live in [`super::validate`], which runs on the merged layers.
pub fn parse(value: &Value, prefix: &str) -> Result<NetworkConfig, ConfigErrors> {
    let mut parser = Parser::default();
    let config = parser.config(value, prefix);
    if parser.errors.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(parser.errors))
    }
}

#[derive(Default)]
struct Parser {
    errors: Vec<FieldError>,
}

/// `parent.field`, or just `field` at the root when no prefix was given.
fn child(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// Describes a JSON value for a type error: its kind, plus the value when it is short.
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

/// A present, non-null field: `null` means "not set", as with serde's `Option`.
fn field<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).filter(|v| !v.is_null())
}

impl Parser {
    fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError::new(path, message));
    }

    fn type_error(&mut self, path: &str, expected: &str, got: &Value) {
        self.error(path, format!("expected {expected}, got {}", describe(got)));
    }

    /// The object's map, after reporting every key not in `known`.
    fn object<'a>(
        &mut self,
        value: &'a Value,
        path: &str,
        known: &[&str],
    ) -> Option<&'a Map<String, Value>> {
        let Value::Object(map) = value else {
            self.type_error(path, "an object", value);
            return None;
        };
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.error(child(path, key), "unknown field");
            }
        }
        Some(map)
    }

    fn string(&mut self, value: &Value, path: &str) -> Option<String> {
        match value {
            Value::String(s) => Some(s.clone()),
            other => {
                self.type_error(path, "a string", other);
                None
            }
        }
    }

    /// An integer in `0..=max` (the wire type's range). Values outside it are reported with
    /// the field's semantic range `shown`, so `-1` or `70000` read like the validator's message
    /// for `0` or `4095` rather than like a type-system detail.
    fn integer(&mut self, value: &Value, path: &str, max: u64, shown: (u64, u64)) -> Option<u64> {
        let (lo, hi) = shown;
        self.integer_rule(value, path, max, &format!("must be between {lo} and {hi}"))
    }

    /// An integer in `0..=max`; values outside it are reported as `{rule}, got {n}`, for
    /// fields whose rule is not a plain range.
    fn integer_rule(&mut self, value: &Value, path: &str, max: u64, rule: &str) -> Option<u64> {
        let Value::Number(n) = value else {
            self.type_error(path, "an integer", value);
            return None;
        };
        if n.is_f64() {
            self.type_error(path, "an integer", value);
            return None;
        }
        match n.as_u64() {
            Some(v) if v <= max => Some(v),
            _ => {
                self.error(path, format!("{rule}, got {n}"));
                None
            }
        }
    }

    /// A `u32` field whose valid values are `lo..=hi` (checked by the validator).
    fn u32(&mut self, value: &Value, path: &str, lo: u32, hi: u32) -> Option<u32> {
        let v = self.integer(value, path, u64::from(u32::MAX), (lo.into(), hi.into()))?;
        u32::try_from(v).ok()
    }

    fn boolean(&mut self, value: &Value, path: &str) -> Option<bool> {
        match value {
            Value::Bool(b) => Some(*b),
            other => {
                self.type_error(path, "a boolean (true or false)", other);
                None
            }
        }
    }

    fn string_list(&mut self, value: &Value, path: &str) -> Option<Vec<String>> {
        let Value::Array(items) = value else {
            self.type_error(path, "a list of strings", value);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(s) = self.string(item, &format!("{path}[{i}]")) {
                out.push(s);
            }
        }
        Some(out)
    }

    fn config(&mut self, value: &Value, path: &str) -> NetworkConfig {
        let mut config = NetworkConfig::default();
        let Some(map) = self.object(value, path, CONFIG_FIELDS) else {
            return config;
        };
        config.api_version = self.identity(map, path, "apiVersion", API_VERSION);
        config.kind = self.identity(map, path, "kind", KIND);
        if let Some(v) = field(map, "interface") {
            config.interface = self.interface(v, &child(path, "interface"));
        }
        if let Some(v) = field(map, "addresses") {
            config.addresses = self.string_list(v, &child(path, "addresses"));
        }
        if let Some(v) = field(map, "ipam") {
            config.ipam = self.ipam(v, &child(path, "ipam"));
        }
        if let Some(v) = field(map, "routes") {
            config.routes = self.routes(v, &child(path, "routes"));
        }
        if let Some(v) = field(map, "vlan") {
            config.vlan = self.vlan(v, &child(path, "vlan"));
        }
        if let Some(v) = field(map, "macvlan") {
            config.macvlan = self
                .child_mode(v, &child(path, "macvlan"))
                .map(|mode| MacvlanConfig { mode });
        }
        if let Some(v) = field(map, "ipvlan") {
            config.ipvlan = self
                .child_mode(v, &child(path, "ipvlan"))
                .map(|mode| IpvlanConfig { mode });
        }
        if let Some(v) = field(map, "sysctls") {
            config.sysctls = self.sysctls(v, &child(path, "sysctls"));
        }
        if let Some(v) = field(map, "vf") {
            config.vf = self.vf(v, &child(path, "vf"));
        }
        if let Some(v) = field(map, "deviceMode") {
            config.device_mode = self.string(v, &child(path, "deviceMode"));
        }
        if let Some(v) = field(map, "bandwidth") {
            config.bandwidth = self.bandwidth(v, &child(path, "bandwidth"));
        }
        if let Some(v) = field(map, "rules") {
            config.rules = super::routing::parse_rules(v, &child(path, "rules"), &mut self.errors);
        }
        if let Some(v) = field(map, "sourceBasedRouting") {
            let path = child(path, "sourceBasedRouting");
            config.source_based_routing =
                super::routing::parse_source_routing(v, &path, &mut self.errors);
        }
        if let Some(v) = field(map, "vrf") {
            config.vrf = super::routing::parse_vrf(v, &child(path, "vrf"), &mut self.errors);
        }
        if let Some(v) = field(map, "ethtool") {
            config.ethtool =
                super::ethtool::parse_ethtool(v, &child(path, "ethtool"), &mut self.errors);
        }
        if let Some(v) = field(map, "neighbors") {
            config.neighbors = self.neighbors(v, &child(path, "neighbors"));
        }
        if let Some(v) = field(map, "addressing") {
            config.addressing =
                super::addressing::parse(v, &child(path, "addressing"), &mut self.errors);
        }
        config
    }

    /// `apiVersion` / `kind`: required, and exactly `expected`.
    fn identity(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        name: &str,
        expected: &str,
    ) -> Option<String> {
        let path = child(path, name);
        let Some(value) = field(map, name) else {
            self.error(path, format!("required; must be {expected:?}"));
            return None;
        };
        let got = self.string(value, &path)?;
        if got != expected {
            self.error(path, format!("must be {expected:?}, got {got:?}"));
        }
        Some(got)
    }

    fn interface(&mut self, value: &Value, path: &str) -> Option<InterfaceConfig> {
        let map = self.object(value, path, INTERFACE_FIELDS)?;
        let mut interface = InterfaceConfig::default();
        if let Some(v) = field(map, "name") {
            interface.name = self.string(v, &child(path, "name"));
        }
        if let Some(v) = field(map, "mtu") {
            interface.mtu = self.u32(v, &child(path, "mtu"), 68, 65535);
        }
        if let Some(v) = field(map, "hardwareAddress") {
            interface.hardware_address = self.string(v, &child(path, "hardwareAddress"));
        }
        let (lo, hi) = (
            super::sizes::MIN_OFFLOAD_SIZE,
            super::sizes::MAX_OFFLOAD_SIZE,
        );
        for (name, slot) in [
            ("gsoMaxSize", &mut interface.gso_max_size),
            ("groMaxSize", &mut interface.gro_max_size),
            ("gsoIpv4MaxSize", &mut interface.gso_ipv4_max_size),
            ("groIpv4MaxSize", &mut interface.gro_ipv4_max_size),
        ] {
            if let Some(v) = field(map, name) {
                *slot = self.u32(v, &child(path, name), lo, hi);
            }
        }
        Some(interface)
    }

    fn ipam(&mut self, value: &Value, path: &str) -> Option<IpamConfig> {
        let map = self.object(value, path, IPAM_FIELDS)?;
        let network_path = child(path, "network");
        let Some(v) = field(map, "network") else {
            self.error(network_path, "required");
            return None;
        };
        let network = self.string(v, &network_path)?;
        Some(IpamConfig { network })
    }

    fn routes(&mut self, value: &Value, path: &str) -> Option<Vec<RouteConfig>> {
        let Value::Array(items) = value else {
            self.type_error(path, "a list of routes", value);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(route) = self.route(item, &format!("{path}[{i}]")) {
                out.push(route);
            }
        }
        Some(out)
    }

    fn route(&mut self, value: &Value, path: &str) -> Option<RouteConfig> {
        let map = self.object(value, path, ROUTE_FIELDS)?;
        let destination_path = child(path, "destination");
        let destination = match field(map, "destination") {
            Some(v) => self.string(v, &destination_path),
            None => {
                self.error(destination_path, "required");
                None
            }
        };
        let mut route = RouteConfig {
            destination: destination.unwrap_or_default(),
            ..RouteConfig::default()
        };
        if let Some(v) = field(map, "gateway") {
            route.gateway = self.string(v, &child(path, "gateway"));
        }
        if let Some(v) = field(map, "source") {
            route.source = self.string(v, &child(path, "source"));
        }
        if let Some(v) = field(map, "metric") {
            route.metric = self.u32(v, &child(path, "metric"), 0, u32::MAX);
        }
        if let Some(v) = field(map, "table") {
            route.table = self.u32(v, &child(path, "table"), 1, u32::MAX);
        }
        Some(route)
    }

    /// `{mode: STRING}` of a macvlan or ipvlan child; `Some(None)` when the mode is left to
    /// the default.
    fn child_mode(&mut self, value: &Value, path: &str) -> Option<Option<String>> {
        let map = self.object(value, path, CHILD_FIELDS)?;
        Some(match field(map, "mode") {
            Some(v) => Some(self.string(v, &child(path, "mode"))?),
            None => None,
        })
    }

    fn vlan(&mut self, value: &Value, path: &str) -> Option<VlanConfig> {
        let map = self.object(value, path, VLAN_FIELDS)?;
        let id_path = child(path, "id");
        let Some(v) = field(map, "id") else {
            self.error(id_path, "required");
            return None;
        };
        let id = self.integer(v, &id_path, u64::from(u16::MAX), (1, 4094))?;
        let id = u16::try_from(id).ok()?;
        Some(VlanConfig { id })
    }

    fn vf(&mut self, value: &Value, path: &str) -> Option<VfConfig> {
        let map = self.object(value, path, VF_FIELDS)?;
        let mut vf = VfConfig::default();
        if let Some(v) = field(map, "mac") {
            vf.mac = self.string(v, &child(path, "mac"));
        }
        if let Some(v) = field(map, "vlan") {
            vf.vlan = self
                .integer_rule(v, &child(path, "vlan"), u64::from(u16::MAX), VF_VLAN_RULE)
                .and_then(|v| u16::try_from(v).ok());
        }
        if let Some(v) = field(map, "qos") {
            vf.qos = self
                .integer(v, &child(path, "qos"), u64::from(u8::MAX), (0, 7))
                .and_then(|v| u8::try_from(v).ok());
        }
        if let Some(v) = field(map, "vlanProtocol") {
            vf.vlan_protocol = self.string(v, &child(path, "vlanProtocol"));
        }
        if let Some(v) = field(map, "spoofChk") {
            vf.spoof_chk = self.boolean(v, &child(path, "spoofChk"));
        }
        if let Some(v) = field(map, "trust") {
            vf.trust = self.boolean(v, &child(path, "trust"));
        }
        if let Some(v) = field(map, "minTxRate") {
            vf.min_tx_rate = self.u32(v, &child(path, "minTxRate"), 0, u32::MAX);
        }
        if let Some(v) = field(map, "maxTxRate") {
            vf.max_tx_rate = self.u32(v, &child(path, "maxTxRate"), 0, u32::MAX);
        }
        if let Some(v) = field(map, "linkState") {
            vf.link_state = self.string(v, &child(path, "linkState"));
        }
        Some(vf)
    }

    /// `{egress, burst}`: quantity strings. A bare number is refused with a hint, because
    /// YAML turns `egress: 1000000` into one and a quantity is text.
    fn bandwidth(&mut self, value: &Value, path: &str) -> Option<BandwidthConfig> {
        let map = self.object(value, path, BANDWIDTH_FIELDS)?;
        let mut bandwidth = BandwidthConfig::default();
        let quantity = |parser: &mut Self, name: &str| {
            let v = field(map, name)?;
            let path = child(path, name);
            match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(_) => {
                    parser.error(
                        path,
                        format!(
                            "expected a quantity string like \"2G\", got {} (quote it)",
                            describe(v)
                        ),
                    );
                    None
                }
                other => {
                    parser.type_error(&path, "a quantity string like \"2G\"", other);
                    None
                }
            }
        };
        bandwidth.egress = quantity(self, "egress");
        bandwidth.burst = quantity(self, "burst");
        Some(bandwidth)
    }

    fn neighbors(&mut self, value: &Value, path: &str) -> Option<Vec<NeighborConfig>> {
        let Value::Array(items) = value else {
            self.type_error(path, "a list of neighbors", value);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let path = format!("{path}[{i}]");
            let Some(map) = self.object(item, &path, NEIGHBOR_FIELDS) else {
                continue;
            };
            let required = |parser: &mut Self, name: &str| {
                let field_path = child(&path, name);
                match field(map, name) {
                    Some(v) => parser.string(v, &field_path),
                    None => {
                        parser.error(field_path, "required");
                        None
                    }
                }
            };
            let address = required(self, "address");
            let hardware_address = required(self, "hardwareAddress");
            if let (Some(address), Some(hardware_address)) = (address, hardware_address) {
                out.push(NeighborConfig {
                    address,
                    hardware_address,
                });
            }
        }
        Some(out)
    }

    fn sysctls(&mut self, value: &Value, path: &str) -> Option<BTreeMap<String, String>> {
        let Value::Object(map) = value else {
            self.type_error(path, "a map of sysctl names to string values", value);
            return None;
        };
        let mut out = BTreeMap::new();
        for (key, v) in map {
            let key_path = format!("{path}[{key:?}]");
            match v {
                Value::String(s) => {
                    out.insert(key.clone(), s.clone());
                }
                // YAML turns `rp_filter: 1` into a number; say how to fix it.
                Value::Number(_) => self.error(
                    key_path,
                    format!("expected a string, got {} (quote it)", describe(v)),
                ),
                other => self.type_error(&key_path, "a string", other),
            }
        }
        Some(out)
    }
}
