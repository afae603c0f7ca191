//! [`validate_network`] (one Network alone) and [`validate_against`] (against the others).

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::netconfig::{
    self, Cidr, ConfigErrors, FieldError, NetworkConfig, RouteConfig, check_not_reserved,
    is_dns_label, parse_ip,
};

use super::devices::{self, DeviceSet};
use super::share;
use super::vxlan;
use super::{MAX_INTERFACES_PER_POD, NetworkSpec, StableBy, Subnet, template_config};
use crate::ipam::{Exclusion, Pool, check_exclusion, check_gateway, check_subnet, family};

/// RFC 8200: the kernel disables IPv6 on a link below this MTU.
const MIN_IPV6_MTU: u32 = 1280;

/// Selectors knic adds to the generated template: the exhaustion selector when it allocates.
pub(super) fn exhaustion_selectors(spec: &NetworkSpec) -> usize {
    usize::from(!spec.ipam.subnets.is_empty())
}

/// Checks every rule a Network must meet on its own and reports all problems at once, each
/// with its path (`spec.ipam.subnets[1].gateway`), so the `Invalid` condition tells the admin
/// everything to fix in one round.
///
/// The interface name, MTU and VLAN are checked by the driver's own
/// [`netconfig::validate`], run on the exact config the template will carry
/// ([`template_config`]), and routes by the same function, so the controller never accepts what
/// the driver would refuse. On top of that:
/// * `metadata.name` is a DNS label (it names allocation objects and `ipam.network`);
/// * `spec.devices`: one form only; a DNS-subdomain class; at most 32 selectors, each passing
///   [`devices::lint_cel`] (full CEL compilation happens in the apiserver when the template is
///   applied); friendly fields well-formed (`vendor` an id or a name of at most 64 bytes,
///   `pfName` an interface name and only without `kind: nic`, `minSpeed` at least 1);
/// * `spec.vlanShareGroup` a DNS label, and only with `spec.vlan`;
/// * `spec.interfacesPerPod` in 1..=32, and no fixed `interfaceName` with more than one;
/// * `spec.mtu` at least 1280 when a subnet is IPv6;
/// * `spec.ipam`: `subnets` or `static`; each subnet a network-form CIDR that
///   [`check_subnet`] accepts (not `/0`, no loopback, multicast, class E, IPv4-mapped,
///   unspecified or limited broadcast address in it) and not overlapping another of the
///   Network's subnets, a gateway that [`check_gateway`] accepts (a unicast next hop inside the
///   subnet, not its network, broadcast or subnet-router anycast address), exclusions (address,
///   `a-b` range, CIDR) inside it, at least one allocatable address left; routes of the
///   subnet's family (destinations and gateways by the driver's rules), gateways on-link
///   (inside the subnet, or IPv6 link-local), not a reserved address of the subnet and not
///   allocatable, no `source`;
/// * `spec.stableAddresses`: a label key exactly when `by: label`; needs `subnets`;
/// * `spec.namespaces`: `names` (DNS labels, no duplicates) or `selector.matchLabels` (valid
///   label keys and values);
/// * `spec.vxlan` (an overlay Network): VNI of 24 bits, port not 0, no devices, VLAN or VLAN
///   share group, one interface per pod, `ipam.subnets` (announcements ride on the allocation
///   objects), MTU from 576 (1280 with an IPv6 subnet) to 65485; without it, `spec.devices`
///   must not name the overlay class.
pub fn validate_network(name: &str, spec: &NetworkSpec) -> Result<(), ConfigErrors> {
    let mut v = Validator::default();
    v.name_and_template(name, spec);
    // An overlay names no devices and no VLAN: `vxlan::check` refuses those fields outright,
    // so their finer rules would only add noise.
    if spec.vxlan.is_none() {
        share::check_field(spec, &mut v.errors);
        devices::check(&spec.devices, exhaustion_selectors(spec), &mut v.errors);
    }
    v.interfaces(spec);
    let subnets = v.ipam(spec);
    if spec.vxlan.is_none() {
        v.ipv6_mtu(spec, &subnets);
    }
    vxlan::check(spec, &subnets, &mut v.errors);
    v.stable_addresses(spec);
    v.namespaces(spec);
    if v.errors.is_empty() {
        return Ok(());
    }
    // Spec order, so messages read top to bottom like the YAML; the sort is stable, so
    // problems inside one field keep the order they were found in.
    v.errors.sort_by_key(|e| section(&e.path));
    Err(ConfigErrors(v.errors))
}

fn section(path: &str) -> usize {
    const ORDER: &[&str] = &[
        "metadata.name",
        "spec.devices",
        "spec.vxlan",
        "spec.vlan",
        "spec.mtu",
        "spec.interfaceName",
        "spec.interfacesPerPod",
        "spec.ipam",
        "spec.stableAddresses",
        "spec.namespaces",
    ];
    ORDER
        .iter()
        .position(|p| path.starts_with(p))
        .unwrap_or(ORDER.len())
}

/// Checks a Network against every other Network and returns the conflicts, with paths into
/// this Network's spec:
/// * the same VXLAN VNI (`spec.vxlan.vni`): one layer-2 segment, whatever the devices;
/// * the same VLAN id on devices both may use (`spec.vlan`, `spec.vlanShareGroup`), unless both
///   name the same `vlanShareGroup`: an id picked twice by accident would join two networks'
///   broadcast domains;
/// * overlapping subnets on devices both may use with the same VLAN, or both untagged
///   (`spec.ipam.subnets[i].cidr`): two allocators would hand out the same addresses on one
///   segment;
/// * for Networks sharing a VLAN on purpose, what one segment needs (see `share`): one MTU,
///   subnets disjoint or identical, and an identical subnet split so that no address is
///   allocatable by both and neither's gateway by the other.
///
/// "Devices both may use" is decided conservatively, in the sense that a rejection is always
/// backed by a reason that can be shown: two friendly forms (or a built-in knic DeviceClass
/// without selectors, which is one) overlap unless a field (kind, vendor, pfName, numaNode,
/// rdma) separates them; otherwise two Networks overlap when they name the same DeviceClass
/// and one's selectors are a subset of the other's. Arbitrary CEL cannot be compared without
/// evaluating it, so two different selector sets (or different classes) are treated as
/// disjoint; an admin who writes raw selectors keeps such Networks apart with distinct VLANs
/// or subnets.
///
/// `others` are the Networks this one must not conflict with; entries named `name` are
/// skipped, so the full list can be passed. The caller decides who wins a conflict by what it
/// passes (e.g. only Networks created earlier, so a new Network can never invalidate an
/// established one). Others' fields that do not parse are skipped: their own validation
/// reports them. Results are ordered by the other Network's name, so status messages do not
/// churn between reconciles.
pub fn validate_against(
    name: &str,
    spec: &NetworkSpec,
    others: &[(String, NetworkSpec)],
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut others: Vec<&(String, NetworkSpec)> =
        others.iter().filter(|(n, _)| n != name).collect();
    others.sort_by(|a, b| a.0.cmp(&b.0));
    vxlan::against(spec, &others, &mut errors);
    let Some(mine) = DeviceSet::of(&spec.devices) else {
        return errors;
    };
    let my_subnets = parsed_subnets(spec);
    for (other_name, other) in others {
        let Some(theirs) = DeviceSet::of(&other.devices) else {
            continue;
        };
        if !mine.may_share(&theirs) || spec.vlan != other.vlan {
            continue;
        }
        if let Some(vlan) = spec.vlan
            && let Some(group) = share::group(vlan, spec, other_name, other, &mut errors)
        {
            share::check_shared(
                vlan,
                group,
                (spec, &my_subnets),
                (other_name, other, &parsed_subnets(other)),
                &mut errors,
            );
            continue;
        }
        let segment = match spec.vlan {
            Some(vlan) => format!("VLAN {vlan}"),
            None => "untagged".to_owned(),
        };
        for (i, subnet) in &my_subnets {
            for (_, theirs) in parsed_subnets(other) {
                if overlaps(*subnet, theirs) {
                    errors.push(FieldError::new(
                        format!("spec.ipam.subnets[{i}].cidr"),
                        format!(
                            "{subnet} overlaps {theirs} of network {other_name:?} on overlapping devices and the same VLAN ({segment})"
                        ),
                    ));
                }
            }
        }
    }
    errors
}

/// Subnets that parse and are in network form, with their index.
fn parsed_subnets(spec: &NetworkSpec) -> Vec<(usize, Cidr)> {
    spec.ipam
        .subnets
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let cidr: Cidr = s.cidr.parse().ok()?;
            check_subnet(cidr).ok()?;
            Some((i, cidr))
        })
        .collect()
}

/// Two CIDRs overlap exactly when one contains the other's network address.
pub(super) fn overlaps(a: Cidr, b: Cidr) -> bool {
    a.contains(b.network().addr) || b.contains(a.network().addr)
}

#[derive(Default)]
struct Validator {
    errors: Vec<FieldError>,
}

impl Validator {
    fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError::new(path, message));
    }

    /// Runs the driver's validation on the generated config and moves its findings to the
    /// Network's own paths.
    fn name_and_template(&mut self, name: &str, spec: &NetworkSpec) {
        if !is_dns_label(name) {
            self.error(
                "metadata.name",
                format!(
                    "{name:?} is not a DNS label (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
                ),
            );
        }
        let Err(ConfigErrors(found)) = netconfig::validate(&template_config(name, spec)) else {
            return;
        };
        for e in found {
            let path = match e.path.as_str() {
                // Already reported above, with the same rule and message.
                "ipam.network" => continue,
                "interface.name" => "spec.interfaceName".to_owned(),
                "interface.mtu" => "spec.mtu".to_owned(),
                "vlan.id" => "spec.vlan".to_owned(),
                // Fields the template never sets; kept visible rather than dropped.
                other => format!("spec (generated NetworkConfig {other})"),
            };
            self.error(path, e.message);
        }
    }

    fn interfaces(&mut self, spec: &NetworkSpec) {
        let count = spec.interfaces_per_pod();
        if !(1..=MAX_INTERFACES_PER_POD).contains(&count) {
            self.error(
                "spec.interfacesPerPod",
                format!(
                    "must be between 1 and {MAX_INTERFACES_PER_POD} (a ResourceClaim holds at most {MAX_INTERFACES_PER_POD} devices), got {count}"
                ),
            );
        } else if count > 1 && spec.interface_name.is_some() {
            self.error(
                "spec.interfaceName",
                format!(
                    "cannot be set when interfacesPerPod is {count}: every interface would get the same name"
                ),
            );
        }
    }

    /// Checks `spec.ipam` and returns each subnet's CIDR where it is valid.
    fn ipam(&mut self, spec: &NetworkSpec) -> Vec<Option<Cidr>> {
        let ipam = &spec.ipam;
        match (ipam.subnets.is_empty(), ipam.static_addresses.is_some()) {
            (false, true) => {
                self.error("spec.ipam", "set either subnets or static, not both");
            }
            (true, false) => self.error(
                "spec.ipam",
                "set subnets (addresses allocated by knic) or static: {} (addresses given in each claim)",
            ),
            _ => {}
        }
        let mut cidrs: Vec<Option<Cidr>> = Vec::with_capacity(ipam.subnets.len());
        for (i, subnet) in ipam.subnets.iter().enumerate() {
            let cidr = self.subnet(&format!("spec.ipam.subnets[{i}]"), subnet, &cidrs);
            cidrs.push(cidr);
        }
        cidrs
    }

    fn subnet(&mut self, path: &str, subnet: &Subnet, earlier: &[Option<Cidr>]) -> Option<Cidr> {
        let cidr = match subnet.cidr.parse::<Cidr>() {
            Ok(cidr) => cidr,
            Err(e) => {
                self.error(format!("{path}.cidr"), e.to_string());
                return None;
            }
        };
        if let Err(e) = check_subnet(cidr) {
            self.error(format!("{path}.cidr"), e.to_string());
            return None;
        }
        let mut ok = true;
        if let Some((j, other)) = earlier
            .iter()
            .enumerate()
            .find_map(|(j, c)| c.filter(|c| overlaps(cidr, *c)).map(|c| (j, c)))
        {
            self.error(
                format!("{path}.cidr"),
                format!("{cidr} overlaps subnets[{j}] ({other})"),
            );
            ok = false;
        }
        let gateway = match subnet.gateway.as_deref().map(parse_ip) {
            None => None,
            Some(Ok(gateway)) => match check_gateway(cidr, gateway) {
                Ok(()) => Some(gateway),
                Err(e) => {
                    self.error(format!("{path}.gateway"), e.to_string());
                    ok = false;
                    None
                }
            },
            Some(Err(e)) => {
                self.error(format!("{path}.gateway"), e.to_string());
                ok = false;
                None
            }
        };
        let mut exclusions = Vec::with_capacity(subnet.exclude.len());
        for (j, text) in subnet.exclude.iter().enumerate() {
            let checked = text
                .parse::<Exclusion>()
                .and_then(|e| check_exclusion(cidr, &e).map(|()| e));
            match checked {
                Ok(e) => exclusions.push(e),
                Err(e) => {
                    self.error(format!("{path}.exclude[{j}]"), e.to_string());
                    ok = false;
                }
            }
        }
        // Only a pool built from a fully valid subnet says anything true about what is left.
        let pool = if ok {
            match Pool::new(cidr, gateway, &exclusions) {
                Ok(pool) => Some(pool),
                Err(crate::Error::Invalid(message)) => {
                    self.error(path, message);
                    None
                }
                Err(e) => {
                    self.error(path, e.to_string());
                    None
                }
            }
        } else {
            None
        };
        self.routes(path, subnet, cidr, pool.as_ref());
        ok.then_some(cidr)
    }

    fn routes(&mut self, path: &str, subnet: &Subnet, cidr: Cidr, pool: Option<&Pool>) {
        if subnet.routes.is_empty() {
            return;
        }
        // `source` is refused below with a Network-specific reason; the driver's check would
        // only say it is not a static address.
        let routes = subnet
            .routes
            .iter()
            .map(|r| RouteConfig {
                source: None,
                ..r.clone()
            })
            .collect();
        let config = NetworkConfig {
            routes: Some(routes),
            ..NetworkConfig::default()
        };
        let mut reported = std::collections::BTreeSet::new();
        if let Err(ConfigErrors(found)) = netconfig::validate(&config) {
            for e in found {
                let full = format!("{path}.{}", e.path);
                reported.insert(full.clone());
                self.error(full, e.message);
            }
        }
        for (j, route) in subnet.routes.iter().enumerate() {
            let path = format!("{path}.routes[{j}]");
            if route.source.is_some() {
                self.error(
                    format!("{path}.source"),
                    "cannot be set on a Network: every pod gets its own address, so there is no fixed source",
                );
            }
            if let Ok(destination) = route.destination.parse::<Cidr>()
                && destination.is_ipv4() != cidr.is_ipv4()
            {
                self.error(
                    format!("{path}.destination"),
                    format!(
                        "{destination} is {} but subnet {cidr} is {}",
                        family(destination.addr),
                        family(cidr.addr)
                    ),
                );
                continue;
            }
            let Some(Ok(gateway)) = route.gateway.as_deref().map(parse_ip) else {
                continue;
            };
            if reported.contains(&format!("{path}.gateway")) {
                continue;
            }
            if gateway.is_ipv4() != cidr.is_ipv4() {
                // The driver's check above already reports a family mismatch with the
                // destination; one with the subnet alone is reported here.
                if route.destination.parse::<Cidr>().is_err() {
                    self.error(
                        format!("{path}.gateway"),
                        format!(
                            "{gateway} is {} but subnet {cidr} is {}",
                            family(gateway),
                            family(cidr.addr)
                        ),
                    );
                }
                continue;
            }
            let link_local = matches!(gateway, IpAddr::V6(v6) if v6.is_unicast_link_local());
            if !link_local && !cidr.contains(gateway) {
                self.error(
                    format!("{path}.gateway"),
                    format!("{gateway} is not inside subnet {cidr}, so pods cannot reach it"),
                );
            } else if let Err(e) = check_not_reserved(cidr, gateway) {
                // Never allocatable, so the check below would let it through; the kernel would
                // refuse it as a next hop (the subnet's broadcast route).
                self.error(format!("{path}.gateway"), e.to_string());
            } else if pool.is_some_and(|p| p.contains_usable(gateway)) {
                self.error(
                    format!("{path}.gateway"),
                    format!(
                        "{gateway} could be allocated to a pod; make it the subnet's gateway or list it in exclude"
                    ),
                );
            }
        }
    }

    fn ipv6_mtu(&mut self, spec: &NetworkSpec, subnets: &[Option<Cidr>]) {
        if let Some(mtu) = spec.mtu
            && (68..MIN_IPV6_MTU).contains(&mtu)
            && let Some(i) = subnets.iter().position(|c| c.is_some_and(|c| c.is_ipv6()))
        {
            self.error(
                "spec.mtu",
                format!(
                    "{mtu} is below {MIN_IPV6_MTU}, the minimum MTU for IPv6 (spec.ipam.subnets[{i}] is IPv6)"
                ),
            );
        }
    }

    fn stable_addresses(&mut self, spec: &NetworkSpec) {
        let Some(stable) = &spec.stable_addresses else {
            return;
        };
        match (stable.by, &stable.label) {
            (StableBy::Label, None) => {
                self.error("spec.stableAddresses.label", "is required when by is label");
            }
            (StableBy::Label, Some(key)) if !is_label_key(key) => {
                self.error("spec.stableAddresses.label", label_key_message(key))
            }
            (StableBy::PodName | StableBy::KubevirtVm, Some(_)) => {
                self.error(
                    "spec.stableAddresses.label",
                    "only applies when by is label",
                );
            }
            _ => {}
        }
        let grace = stable.grace();
        if grace > super::stable::MAX_GRACE_PERIOD_SECONDS {
            self.error(
                "spec.stableAddresses.gracePeriodSeconds",
                format!(
                    "must be at most {} (one year), got {grace}",
                    super::stable::MAX_GRACE_PERIOD_SECONDS
                ),
            );
        }
        if spec.ipam.subnets.is_empty() && spec.ipam.static_addresses.is_some() {
            self.error(
                "spec.stableAddresses",
                "requires subnets; with static addresses every claim already fixes its address",
            );
        }
    }

    fn namespaces(&mut self, spec: &NetworkSpec) {
        let ns = &spec.namespaces;
        match (ns.names.is_empty(), &ns.selector) {
            (false, Some(_)) => {
                self.error("spec.namespaces", "set either names or selector, not both");
            }
            (true, None) => self.error(
                "spec.namespaces",
                "set names or selector; a Network with neither is usable in no namespace",
            ),
            _ => {}
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, name) in ns.names.iter().enumerate() {
            let path = format!("spec.namespaces.names[{i}]");
            if !is_dns_label(name) {
                self.error(
                    path,
                    format!(
                        "{name:?} is not a namespace name (a DNS label: 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
                    ),
                );
            } else if let Some(j) = seen.get(name.as_str()) {
                self.error(path, format!("{name:?} is already listed at names[{j}]"));
            } else {
                seen.insert(name, i);
            }
        }
        if let Some(selector) = &ns.selector {
            for (key, value) in &selector.match_labels {
                let path = format!("spec.namespaces.selector.matchLabels[{key:?}]");
                if !is_label_key(key) {
                    self.error(path, label_key_message(key));
                } else if !is_label_value(value) {
                    self.error(
                        path,
                        format!(
                            "{value:?} is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, or empty)"
                        ),
                    );
                }
            }
        }
    }
}

fn label_key_message(key: &str) -> String {
    format!(
        "{key:?} is not a label key (an optional DNS subdomain prefix and '/', then 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
    )
}

/// Kubernetes' qualified name: the rule for label keys.
fn is_label_key(key: &str) -> bool {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if !devices::is_dns_subdomain(prefix) {
                return false;
            }
            name
        }
        None => key,
    };
    !name.is_empty() && is_label_value(name)
}

/// Kubernetes' label value: empty, or up to 63 characters of `[A-Za-z0-9_.-]` with
/// alphanumerics at both ends.
fn is_label_value(value: &str) -> bool {
    let b = value.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    b.is_empty()
        || (b.len() <= 63
            && b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
            && b.iter().all(|c| edge(c) || matches!(c, b'-' | b'_' | b'.')))
}
