//! [`validate`]: the semantic rules of `NetworkConfig`, each reported with its path.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::addr::{
    check_interface_address, check_next_hop, check_not_reserved, check_route_destination,
};
use super::cidr::parse_ip;
use super::{
    API_VERSION, Cidr, ConfigErrors, FieldError, KIND, NetworkConfig, Route, RouteConfig,
    ValidConfig,
};
use crate::{Error, Result};

/// Linux's `IFNAMSIZ` is 16 including the terminating NUL.
const MAX_INTERFACE_NAME_BYTES: usize = 15;

/// IPv4 needs 68 bytes (RFC 791) and the kernel drops IPv4 from a device below it; 65535 is
/// `ETH_MAX_MTU`, the largest MTU the kernel lets an Ethernet-type device take.
const MIN_MTU: u32 = 68;
const MAX_MTU: u32 = 65535;
/// RFC 8200: below this the kernel disables IPv6 on the device, so IPv6 addresses would vanish.
const MIN_IPV6_MTU: u32 = 1280;

/// The main routing table (`RT_TABLE_MAIN`), which an unset `table` means.
const MAIN_TABLE: u32 = 254;

/// Per-interface sysctls a pod may set, as short keys (`ipv4.<name>` for
/// `net.ipv4.conf.<ifname>.<name>`, `ipv6.<name>` likewise) with their allowed values.
///
/// The short form is the contract because the interface's final name is only known once the
/// driver assigns it, and because a full name would invite setting sysctls of *other*
/// interfaces. The allowlist holds only settings that affect this one interface and are safe
/// in a pod; anything else is rejected by name. `arp_ignore` allows 0-3 and 8: the kernel
/// documents 4-7 as reserved.
///
/// The ARP/ND settings (issue 27) exist per interface on every kernel knic supports (6.1 and
/// later; `arp_evict_nocarrier` came in 5.16, `ndisc_evict_nocarrier` in 5.18,
/// `accept_untracked_na` in 5.19): `arp_accept` 2 (learn only from the same subnet) came in
/// 6.0; `accept_dad` 2 also disables IPv6 on a MAC-based duplicate; `dad_transmits` is
/// bounded at 10 (each probe delays a new address by a second).
const SYSCTLS: &[(&str, &[u32])] = &[
    ("ipv4.arp_accept", &[0, 1, 2]),
    ("ipv4.arp_announce", &[0, 1, 2]),
    ("ipv4.arp_evict_nocarrier", &[0, 1]),
    ("ipv4.arp_filter", &[0, 1]),
    ("ipv4.arp_ignore", &[0, 1, 2, 3, 8]),
    ("ipv4.arp_notify", &[0, 1]),
    ("ipv4.drop_gratuitous_arp", &[0, 1]),
    ("ipv4.drop_unicast_in_l2_multicast", &[0, 1]),
    ("ipv4.forwarding", &[0, 1]),
    ("ipv4.proxy_arp", &[0, 1]),
    ("ipv4.proxy_arp_pvlan", &[0, 1]),
    ("ipv4.rp_filter", &[0, 1, 2]),
    ("ipv6.accept_dad", &[0, 1, 2]),
    ("ipv6.accept_ra", &[0, 1, 2]),
    ("ipv6.accept_untracked_na", &[0, 1]),
    ("ipv6.autoconf", &[0, 1]),
    ("ipv6.dad_transmits", &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
    ("ipv6.disable_ipv6", &[0, 1]),
    ("ipv6.drop_unicast_in_l2_multicast", &[0, 1]),
    ("ipv6.drop_unsolicited_na", &[0, 1]),
    ("ipv6.ndisc_evict_nocarrier", &[0, 1]),
    ("ipv6.ndisc_notify", &[0, 1]),
    ("ipv6.proxy_ndp", &[0, 1]),
];

/// Checks that `name` is a name the kernel will accept for a device (`dev_valid_name`), so a
/// bad name fails at admission instead of as an `EINVAL` while a pod is starting. Shared with
/// the driver, which also checks names it assigns and clashes inside a pod.
///
/// The kernel's rules: 1 to 15 bytes, not `.` or `..`, no `/`, `:` or whitespace (the kernel's
/// `isspace`, which includes byte 0xA0). knic is a little stricter, because these names also
/// reach logs, sysctl paths and netlink: no `%` (the kernel treats it as a `eth%d` template and
/// would pick a different name), no control characters (including NUL, which would truncate
/// the name on the wire), and no Unicode whitespace. Nor the invisible characters that make
/// one name look like another in `ip link`, logs and YAML: zero-width characters (U+200B to
/// U+200D, U+2060, U+FEFF) and bidirectional controls (U+202A to U+202E, U+2066 to U+2069,
/// U+200E, U+200F, U+061C), which can also reorder what a terminal shows around them.
pub fn check_interface_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Rule("interface name must not be empty".to_owned()));
    }
    if name.len() > MAX_INTERFACE_NAME_BYTES {
        return Err(Error::Rule(format!(
            "interface name {name:?} is {} bytes; Linux allows at most {MAX_INTERFACE_NAME_BYTES}",
            name.len()
        )));
    }
    if name == "." || name == ".." {
        return Err(Error::Rule(format!(
            "interface name {name:?} is not allowed by Linux"
        )));
    }
    for c in ['/', ':', '%'] {
        if name.contains(c) {
            return Err(Error::Rule(format!(
                "interface name {name:?} must not contain {c:?}"
            )));
        }
    }
    // Before the whitespace rule: U+2060 is E2 81 A0 in UTF-8, kernel whitespace by its last
    // byte, but the rule an operator needs to hear is the invisible character.
    if let Some(c) = name.chars().find(|c| ZERO_WIDTH.contains(c)) {
        return Err(Error::Rule(format!(
            "interface name {name:?} must not contain zero-width characters (U+{:04X} found)",
            u32::from(c)
        )));
    }
    if let Some(c) = name.chars().find(|c| BIDI_CONTROLS.contains(c)) {
        return Err(Error::Rule(format!(
            "interface name {name:?} must not contain bidirectional control characters (U+{:04X} found)",
            u32::from(c)
        )));
    }
    if name.bytes().any(|b| b == 0xa0) || name.chars().any(char::is_whitespace) {
        return Err(Error::Rule(format!(
            "interface name {name:?} must not contain whitespace"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::Rule(format!(
            "interface name {name:?} must not contain control characters"
        )));
    }
    Ok(())
}

/// Characters that take no space: U+200B (zero width space), U+200C (non-joiner), U+200D
/// (joiner), U+2060 (word joiner) and U+FEFF (byte order mark / zero width no-break space).
const ZERO_WIDTH: &[char] = &['\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}'];

/// Unicode's bidirectional controls (the "Trojan Source" characters): the embeddings and
/// overrides U+202A..U+202E, the isolates U+2066..U+2069, and the marks U+200E, U+200F and
/// U+061C.
const BIDI_CONTROLS: &[char] = &[
    '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}',
    '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
];

/// The `/proc/sys` file for an allowlisted short sysctl key on `interface`, or `None` if the
/// key is not allowlisted or the name is not a valid interface name. The driver should build
/// the path only through here: the checks keep a key or name from escaping into another
/// interface's (or the host's) settings, and the path form avoids the dotted form's ambiguity
/// with VLAN names such as `eth0.100`.
pub fn sysctl_path(key: &str, interface: &str) -> Option<String> {
    SYSCTLS.iter().find(|(k, _)| *k == key)?;
    check_interface_name(interface).ok()?;
    let (family, name) = key.split_once('.')?;
    Some(format!("/proc/sys/net/{family}/conf/{interface}/{name}"))
}

/// Checks every rule on a (usually merged) config and returns the typed form, or every
/// problem found so the operator fixes them all in one round.
///
/// Paths are relative to the config (`interface.mtu`, `routes[1].gateway`) because a merged
/// value may come from any layer. `apiVersion` and `kind` are checked only when present:
/// [`super::parse`] already required them on every object.
///
/// Rules beyond the plain type ranges, all documented in the error texts:
/// * `interface.mtu` in 68..=65535, and at least 1280 when any static address is IPv6 (with
///   `ipam`, the driver checks this once the family is known);
/// * `interface.hardwareAddress` is a unicast, non-zero MAC;
/// * `addresses` are interface CIDRs passing [`super::check_interface_address`] (not
///   unspecified, loopback, multicast, limited broadcast, class E or IPv4-mapped, and not the
///   network or broadcast address of an IPv4 subnet up to /30 nor the subnet-router anycast
///   address of an IPv6 subnet up to /126), each IP listed once; `ipam` cannot be combined
///   with a non-empty `addresses`;
/// * a route's `destination` has no host bits and passes [`super::check_route_destination`]
///   (defaults, multicast and class E allowed; loopback and IPv4-mapped refused); `gateway`
///   and `source` are its family; `gateway` passes [`super::check_next_hop`], is not one of
///   the addresses and, when static addresses are given, inside the subnet of one of them
///   (IPv6 link-local gateways, as routers advertise them, are always on-link and exempt) and
///   not a reserved address of any of those subnets; `source` is one of the static
///   addresses (so it cannot be used with `ipam`); `table` is not 0 (unspecified) or one of
///   the kernel's 252 (compat), 253 (default) and 255 (local), while 254 (main) is allowed
///   and equals unset; no two routes share destination, table and metric (an unset metric is
///   the kernel default, 0 for IPv4 and 1024 for IPv6), as the kernel would refuse the second;
/// * `vlan.id` in 1..=4094;
/// * `sysctls` keys (short form, for `net.ipv{4,6}.conf.<ifname>.<name>`) from the allowlist
///   `ipv4.arp_announce` (0-2), `ipv4.arp_ignore` (0-3 or 8; 4-7 are reserved),
///   `ipv4.forwarding` (0/1), `ipv4.proxy_arp` (0/1), `ipv4.rp_filter` (0-2),
///   `ipv6.accept_ra` (0-2), `ipv6.autoconf` (0/1), `ipv6.disable_ipv6` (0/1), and the ARP/ND
///   settings listed on `SYSCTLS`, as decimal
///   strings; `ipv6.disable_ipv6: "1"` is refused alongside IPv6 addresses;
/// * `vf.mac` is a unicast, non-zero MAC, equal to `interface.hardwareAddress` when both are
///   set; `vf.vlan` in 1..=4094, or 0 for "no VLAN" (untagged; how a claim turns a class's VLAN
///   off); `vf.qos` in 0..=7 and, when not 0, only with a VLAN; `vf.vlanProtocol` is `802.1Q`
///   or `802.1ad`, the latter only with a VLAN; `vf.minTxRate` ≤ `vf.maxTxRate` unless the cap
///   is 0 (none); `vf.linkState` is `auto`, `enable` or `disable`. Whether the device is a VF
///   and the rates fit its link are checked by the driver at prepare;
/// * `bandwidth.egress` is a whole quantity of bit/s, at least 8 (the kernel counts whole bytes
///   per second); `bandwidth.burst` a whole quantity of bytes in 1..=4294967295; neither
///   negative, fractional beyond the unit, or longer than 64 characters;
/// * `ethtool.features` keys are kernel feature names or ethtool aliases (two names for one
///   kernel feature must agree); `ethtool.rings.*` in 1..=65536, `ethtool.channels.*` in
///   0..=4096 leaving an RX and a TX channel, `ethtool.coalesce.*` counts in 0..=1000000.
pub fn validate(config: &NetworkConfig) -> Result<ValidConfig, ConfigErrors> {
    let mut v = Validator::default();
    let valid = v.config(config);
    if v.errors.is_empty() {
        Ok(valid)
    } else {
        Err(ConfigErrors(v.errors))
    }
}

#[derive(Default)]
struct Validator {
    errors: Vec<FieldError>,
}

fn family_name(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

pub use crate::names::is_dns_label;

pub(super) fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let malformed = || {
        Error::Rule(format!(
            "{s:?} is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"
        ))
    };
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for octet in &mut mac {
        let part = parts.next().ok_or_else(malformed)?;
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        *octet = u8::from_str_radix(part, 16).map_err(|_| malformed())?;
    }
    if parts.next().is_some() {
        return Err(malformed());
    }
    Ok(mac)
}

pub(super) fn format_mac(mac: &[u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

/// A parsed MAC the kernel will accept as a device address (`is_valid_ether_addr`).
pub(super) fn check_mac(text: &str) -> Result<[u8; 6]> {
    let mac = parse_mac(text)?;
    if mac[0] & 1 == 1 {
        return Err(Error::Rule(format!(
            "{} is a multicast address; a unicast address is required (the low bit of the first octet must be 0)",
            format_mac(&mac)
        )));
    }
    if mac == [0; 6] {
        return Err(Error::Rule(
            "00:00:00:00:00:00 is all zeros, which is not a usable address".to_owned(),
        ));
    }
    Ok(mac)
}

/// Serde adapter storing a MAC as its readable `aa:bb:cc:dd:ee:ff` string.
pub(super) mod mac_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        mac: &Option<[u8; 6]>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match mac {
            Some(mac) => serializer.serialize_str(&super::format_mac(mac)),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<[u8; 6]>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|s| super::parse_mac(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl Validator {
    fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError::new(path, message));
    }

    fn config(&mut self, config: &NetworkConfig) -> ValidConfig {
        let mut out = ValidConfig::default();
        if let Some(api_version) = &config.api_version
            && api_version != API_VERSION
        {
            self.error(
                "apiVersion",
                format!("must be {API_VERSION:?}, got {api_version:?}"),
            );
        }
        if let Some(kind) = &config.kind
            && kind != KIND
        {
            self.error("kind", format!("must be {KIND:?}, got {kind:?}"));
        }

        let interface = config.interface.clone().unwrap_or_default();
        if let Some(name) = &interface.name {
            match check_interface_name(name) {
                Ok(()) => out.interface_name = Some(name.clone()),
                Err(e) => self.error("interface.name", e.to_string()),
            }
        }
        if let Some(mtu) = interface.mtu {
            if (MIN_MTU..=MAX_MTU).contains(&mtu) {
                out.mtu = Some(mtu);
            } else {
                self.error(
                    "interface.mtu",
                    format!("must be between {MIN_MTU} and {MAX_MTU}, got {mtu}"),
                );
            }
        }
        if let Some(mac) = &interface.hardware_address {
            match check_mac(mac) {
                Ok(mac) => out.hardware_address = Some(mac),
                Err(e) => self.error("interface.hardwareAddress", e.to_string()),
            }
        }

        out.offload_sizes = super::sizes::validate_sizes(
            [
                ("gsoMaxSize", interface.gso_max_size),
                ("groMaxSize", interface.gro_max_size),
                ("gsoIpv4MaxSize", interface.gso_ipv4_max_size),
                ("groIpv4MaxSize", interface.gro_ipv4_max_size),
            ],
            &mut self.errors,
        );

        let (addresses, addresses_ok) = self.addresses(config.addresses.as_deref().unwrap_or(&[]));
        if let Some(mtu) = out.mtu
            && mtu < MIN_IPV6_MTU
            && let Some(i) = addresses.iter().position(Cidr::is_ipv6)
        {
            self.error(
                "interface.mtu",
                format!(
                    "{mtu} is below {MIN_IPV6_MTU}, the minimum MTU for IPv6 (addresses[{i}] is IPv6)"
                ),
            );
        }

        if let Some(ipam) = &config.ipam {
            if config.addresses.as_ref().is_some_and(|a| !a.is_empty()) {
                self.error(
                    "ipam",
                    "cannot be combined with addresses; use static addresses or IPAM, not both",
                );
            }
            if is_dns_label(&ipam.network) {
                out.ipam_network = Some(ipam.network.clone());
            } else {
                self.error(
                    "ipam.network",
                    format!(
                        "{:?} is not a DNS label (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)",
                        ipam.network
                    ),
                );
            }
        }

        let static_addresses = if addresses_ok {
            Some(&addresses[..])
        } else {
            None
        };
        out.routes = self.routes(config.routes.as_deref().unwrap_or(&[]), static_addresses);
        if let Some(neighbors) = &config.neighbors {
            out.neighbors =
                super::neighbor::validate_neighbors(neighbors, static_addresses, &mut self.errors);
        }
        out.addresses = addresses;
        out.routing = super::routing::validate_routing(
            config,
            &super::routing::Context {
                interface_name: out.interface_name.as_deref(),
                routes: &out.routes,
            },
            &mut self.errors,
        );

        if let Some(vlan) = &config.vlan {
            if (1..=4094).contains(&vlan.id) {
                out.vlan = Some(vlan.id);
            } else {
                self.error(
                    "vlan.id",
                    format!("must be between 1 and 4094, got {}", vlan.id),
                );
            }
        }

        let (child, errors) = super::child::check(config);
        out.child = child;
        self.errors.extend(errors);

        if let Some(sysctls) = &config.sysctls {
            out.sysctls = self.sysctls(sysctls, &out.addresses);
        }
        if let Some(vf) = &config.vf {
            out.vf = super::vf::validate_vf(vf, out.hardware_address, &mut self.errors);
        }
        if let Some(bandwidth) = &config.bandwidth {
            out.bandwidth = super::bandwidth::validate_bandwidth(bandwidth, &mut self.errors);
        }
        if let Some(ethtool) = &config.ethtool {
            out.ethtool = super::ethtool::validate_ethtool(ethtool, &mut self.errors);
        }
        out.addressing = super::addressing::check(
            config,
            &out.addresses,
            &out.routes,
            out.mtu,
            &mut out.sysctls,
            &mut self.errors,
        );
        let (mode, errors) = super::mode::check(config);
        out.device_mode = mode;
        self.errors.extend(errors);
        out
    }

    /// Every address that parsed, and whether all did (so later checks against the address
    /// list do not pile spurious errors onto a typo).
    fn addresses(&mut self, texts: &[String]) -> (Vec<Cidr>, bool) {
        let mut out: Vec<Cidr> = Vec::with_capacity(texts.len());
        // One IP with two prefix lengths: IPv6 refuses the second (EEXIST) and for IPv4 it
        // leaves "which subnet is on-link?" to chance, so each IP may appear once.
        let mut first_index: BTreeMap<IpAddr, usize> = BTreeMap::new();
        let mut all_ok = true;
        for (i, text) in texts.iter().enumerate() {
            let path = format!("addresses[{i}]");
            let cidr = match text.parse::<Cidr>() {
                Ok(cidr) => cidr,
                Err(e) => {
                    self.error(path, e.to_string());
                    all_ok = false;
                    continue;
                }
            };
            if let Err(e) = check_interface_address(cidr) {
                self.error(path, e.to_string());
                all_ok = false;
                continue;
            }
            if let Some(j) = first_index.get(&cidr.addr) {
                self.error(
                    path,
                    format!("{} is already listed at addresses[{j}]", cidr.addr),
                );
                all_ok = false;
                continue;
            }
            first_index.insert(cidr.addr, i);
            out.push(cidr);
        }
        (out, all_ok)
    }

    /// `static_addresses` is `None` when some address was invalid: checks against the list
    /// are skipped then rather than reported against a list the operator must fix anyway.
    fn routes(&mut self, routes: &[RouteConfig], static_addresses: Option<&[Cidr]>) -> Vec<Route> {
        let mut out = Vec::with_capacity(routes.len());
        // (destination, effective table, effective metric) → index, for duplicates.
        let mut seen: BTreeMap<(Cidr, u32, u32), usize> = BTreeMap::new();
        for (i, route) in routes.iter().enumerate() {
            let path = format!("routes[{i}]");
            let errors_before = self.errors.len();

            let destination = match route.destination.parse::<Cidr>() {
                Ok(cidr) if cidr.network() != cidr => {
                    self.error(
                        format!("{path}.destination"),
                        format!("{cidr} has host bits set; did you mean {}?", cidr.network()),
                    );
                    None
                }
                Ok(cidr) => match check_route_destination(cidr) {
                    Ok(()) => Some(cidr),
                    Err(e) => {
                        self.error(format!("{path}.destination"), e.to_string());
                        None
                    }
                },
                Err(e) => {
                    self.error(format!("{path}.destination"), e.to_string());
                    None
                }
            };

            let gateway = route
                .gateway
                .as_deref()
                .and_then(|text| self.gateway(text, &path, destination, static_addresses));
            let source = route
                .source
                .as_deref()
                .and_then(|text| self.source(text, &path, destination, static_addresses));

            if let Some(table) = route.table {
                let reserved = match table {
                    0 => Some(
                        "0 is not a table id; omit table (or use 254) for the main table"
                            .to_owned(),
                    ),
                    252 | 253 | 255 => {
                        let name = match table {
                            252 => "compat",
                            253 => "default",
                            _ => "local",
                        };
                        Some(format!(
                            "{table} is reserved for the kernel's \"{name}\" table; use 254 (main) or an id of your own"
                        ))
                    }
                    _ => None,
                };
                if let Some(message) = reserved {
                    self.error(format!("{path}.table"), message);
                }
            }

            let Some(destination) = destination else {
                continue;
            };
            let default_metric = if destination.is_ipv4() { 0 } else { 1024 };
            let key = (
                destination,
                route.table.unwrap_or(MAIN_TABLE),
                route.metric.unwrap_or(default_metric),
            );
            if let Some(j) = seen.get(&key) {
                self.error(
                    path,
                    format!("same destination, table and metric as routes[{j}]"),
                );
                continue;
            }
            seen.insert(key, i);
            if self.errors.len() == errors_before {
                out.push(Route {
                    destination,
                    gateway,
                    source,
                    metric: route.metric,
                    table: route.table,
                });
            }
        }
        out
    }

    /// A route's gateway or source: an IP address of the destination's family.
    fn route_ip(&mut self, text: &str, path: &str, destination: Option<Cidr>) -> Option<IpAddr> {
        let ip = match parse_ip(text) {
            Ok(ip) => ip,
            Err(e) => {
                self.error(path, e.to_string());
                return None;
            }
        };
        if let Some(destination) = destination
            && destination.is_ipv4() != ip.is_ipv4()
        {
            self.error(
                path,
                format!(
                    "{ip} is {} but destination {destination} is {}",
                    family_name(ip),
                    family_name(destination.addr)
                ),
            );
            return None;
        }
        Some(ip)
    }

    fn gateway(
        &mut self,
        text: &str,
        path: &str,
        destination: Option<Cidr>,
        static_addresses: Option<&[Cidr]>,
    ) -> Option<IpAddr> {
        let path = format!("{path}.gateway");
        let gateway = self.route_ip(text, &path, destination)?;
        if let Err(e) = check_next_hop(gateway) {
            self.error(path, e.to_string());
            return None;
        }
        let Some(addresses) = static_addresses.filter(|a| !a.is_empty()) else {
            return Some(gateway);
        };
        if addresses.iter().any(|a| a.addr == gateway) {
            self.error(
                path,
                format!("{gateway} is one of this interface's own addresses"),
            );
            return None;
        }
        let link_local = matches!(gateway, IpAddr::V6(v6) if v6.is_unicast_link_local());
        if !link_local && !addresses.iter().any(|a| a.contains(gateway)) {
            self.error(
                path,
                format!("{gateway} is not inside any address's subnet"),
            );
            return None;
        }
        // Reserved in any subnet it is in: the kernel installs that subnet's broadcast route,
        // which a next hop cannot be.
        if let Some(e) = addresses
            .iter()
            .find_map(|a| check_not_reserved(a.network(), gateway).err())
        {
            self.error(path, e.to_string());
            return None;
        }
        Some(gateway)
    }

    fn source(
        &mut self,
        text: &str,
        path: &str,
        destination: Option<Cidr>,
        static_addresses: Option<&[Cidr]>,
    ) -> Option<IpAddr> {
        let path = format!("{path}.source");
        let source = self.route_ip(text, &path, destination)?;
        let addresses = static_addresses?;
        if !addresses.iter().any(|a| a.addr == source) {
            self.error(
                path,
                format!("{source} is not one of this interface's static addresses"),
            );
            return None;
        }
        Some(source)
    }

    fn sysctls(
        &mut self,
        sysctls: &BTreeMap<String, String>,
        addresses: &[Cidr],
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (key, value) in sysctls {
            let path = format!("sysctls[{key:?}]");
            let Some((_, allowed)) = SYSCTLS.iter().find(|(k, _)| k == key) else {
                let keys: Vec<&str> = SYSCTLS.iter().map(|(k, _)| *k).collect();
                self.error(
                    path,
                    format!("unknown sysctl; allowed: {}", keys.join(", ")),
                );
                continue;
            };
            let number = Some(value)
                .filter(|v| !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|n| allowed.contains(n));
            let Some(number) = number else {
                let allowed: Vec<String> = allowed.iter().map(u32::to_string).collect();
                self.error(
                    path,
                    format!(
                        "{value:?} is not allowed; allowed values: {}",
                        allowed.join(", ")
                    ),
                );
                continue;
            };
            if key == "ipv6.disable_ipv6"
                && number == 1
                && let Some(i) = addresses.iter().position(Cidr::is_ipv6)
            {
                self.error(
                    path,
                    format!("\"1\" disables IPv6, but addresses[{i}] is IPv6"),
                );
                continue;
            }
            out.insert(key.clone(), number.to_string());
        }
        out
    }
}
