//! From a prepared claim to attach plans: a pure function, so every configuration rule is
//! tested without a kernel or an API, and the NRI hook only executes decisions made (and
//! checkpointed) at prepare time.

use std::collections::{BTreeMap, BTreeSet};

use knic_proto::netconfig::{self, ConfigErrors, FieldError, NetworkConfig};

use crate::claims::checkpoint::{PreparedClaim, PreparedDevice};
use crate::claims::ipam::Addressing;
use crate::netns::{AttachPlan, DeviceIdentity};

mod bandwidth;
mod link;
pub mod overlay;
pub mod routing;
pub mod shared;
mod vf;

pub use bandwidth::resolve_bandwidth;

/// RFC 8200: the kernel disables IPv6 on a link below this MTU, so an IPAM address of that
/// family would silently never work.
const MIN_IPV6_MTU: u32 = 1280;

/// What IPAM allocated, by index of the device in [`PreparedClaim::devices`].
pub type IpamAddresses = BTreeMap<usize, Addressing>;

fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// Whether a config entry with `requests` applies to the allocation result `request`
/// (`req` or `req/sub`): empty means all; `req` covers its subrequests.
fn applies(requests: &[String], request: &str) -> bool {
    requests.is_empty()
        || requests
            .iter()
            .any(|r| r == request || r == base_request(request))
}

/// Computes one plan per device of `claim` from its [`configure`]d configs. `taken` are the pod-side interface names already
/// planned for the same pod by other claims (the defaults `net1`, `net2`… skip them, and an
/// explicit name that collides is an error). Returns every problem found, each with its field
/// path.
///
/// `ipam` holds the addresses prepare allocated for the devices whose config says
/// `ipam: {network}` (see [`ipam_requests`]); they become the device's addresses, with the
/// subnets' routes ahead of the config's own, and the whole is validated again as if it had
/// been written statically, so an IPAM address meets every rule a static one does.
pub fn plans(
    claim: &PreparedClaim,
    configs: &DeviceConfigs,
    taken: &BTreeSet<String>,
    ipam: &IpamAddresses,
) -> Result<Vec<AttachPlan>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut used = taken.clone();
    let mut out = Vec::new();
    let mut wanted = Vec::new();
    for ((index, device), config) in claim.devices.iter().enumerate().zip(&configs.0) {
        errors.extend(config.parse_errors.iter().cloned());
        let merged = &config.merged;
        let mut valid = match &config.valid {
            Ok(v) => v.clone(),
            Err(e) => {
                errors.extend(e.0.iter().map(|f| FieldError {
                    path: format!("request {}: {}", device.request, f.path),
                    message: f.message.clone(),
                }));
                continue;
            }
        };
        let is_overlay = overlay::is_overlay(device);
        // The overlay device is shared too, with refusals of its own (see below).
        let is_shared = !is_overlay && shared::is_shared(device);
        if is_shared {
            let refused = shared::refusals(device, &valid);
            if !refused.is_empty() {
                errors.extend(refused);
                continue;
            }
        }
        // A vfio-pci function has no netdev to attach: prepare binds it (claims::functions).
        if valid.device_mode == netconfig::DeviceMode::VfioPci {
            continue;
        }
        // Before `with_ipam`, which replaces the `ipam` section by the addresses it gave.
        let network = valid.ipam_network.clone();
        if let Some(network) = &network {
            match with_ipam(merged, &valid, &device.request, network, ipam.get(&index)) {
                Ok(v) => valid = v,
                Err(e) => {
                    errors.extend(e);
                    continue;
                }
            }
        }
        let host_ifname = device
            .published
            .as_ref()
            .and_then(|d| d.attributes.as_ref())
            .and_then(|a| a.get("ifName"))
            .and_then(|a| a.string.clone());
        let Some(host_ifname) = host_ifname else {
            errors.push(FieldError {
                path: format!("device {}/{}", device.pool, device.device),
                message:
                    "has no network interface on the host (bound to vfio-pci, or not discovered \
                          on this node): knic attaches netdevs"
                        .into(),
            });
            continue;
        };
        let overlay_mode = if is_overlay {
            match overlay::plan(
                device,
                &valid,
                ipam.get(&index),
                &host_ifname,
                &claim.uid,
                index,
            ) {
                Ok(p) => {
                    valid.mtu = Some(p.mtu);
                    valid.hardware_address = Some(p.mac);
                    Some(p.mode)
                }
                Err(e) => {
                    errors.extend(e);
                    continue;
                }
            }
        } else {
            None
        };
        let vf = match &valid.vf {
            Some(settings) => match vf::vf_plan(device, settings) {
                Ok(plan) => Some(plan),
                Err(e) => {
                    errors.extend(e);
                    continue;
                }
            },
            None => None,
        };
        // The allocation's consumed capacity is not passed yet (None): shared parents with
        // consumable `bandwidth` capacity pass `consumedCapacity.bandwidth` here.
        let bandwidth = match resolve_bandwidth(
            &device.request,
            valid.bandwidth.as_ref(),
            device.consumed.get("bandwidth").map(String::as_str),
        ) {
            Ok(b) => b,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if let Some(name) = &valid.interface_name
            && !used.insert(name.clone())
        {
            errors.push(FieldError {
                path: format!("request {}: interface.name", device.request),
                message: format!("{name} is already used by another device of this pod"),
            });
            continue;
        }
        wanted.push((
            device,
            valid,
            host_ifname,
            vf,
            bandwidth,
            is_shared,
            network,
            overlay_mode,
        ));
    }
    for (device, valid, host_ifname, vf, bandwidth, is_shared, network, overlay_mode) in wanted {
        let mode = overlay_mode.unwrap_or_else(|| shared::mode(&valid, is_shared, &host_ifname));
        let pod_ifname = match valid.interface_name {
            Some(n) => n,
            None => {
                let n = (1..)
                    .map(|i| format!("net{i}"))
                    .find(|n| !used.contains(n))
                    .unwrap_or_default();
                used.insert(n.clone());
                n
            }
        };
        // Source-based routing and a VRF move the routes into their table and add rules
        // from the final addresses (static or IPAM).
        let (routes, routing) =
            crate::netns::routing::plan(&valid.routing, &valid.addresses, &valid.routes);
        out.push(AttachPlan {
            routing,
            network: claim.network_label.clone().or(network),
            from_template: claim.network_label.is_some(),
            addressing: valid.addressing,
            pool: device.pool.clone(),
            device: device.device.clone(),
            request: device.request.clone(),
            host_ifname,
            mode,
            pod_ifname,
            mtu: valid.mtu,
            // A MAC set through the PF is also the netdev's: the VF's driver may only adopt it
            // on its next reset, and the pod must see the address the PF enforces.
            mac: valid
                .hardware_address
                .or(vf.as_ref().and_then(|v| v.settings.mac)),
            addresses: valid.addresses,
            routes,
            sysctls: valid.sysctls,
            identity: identity(device),
            vf,
            bandwidth,
            ethtool: valid.ethtool,
            link: crate::netns::LinkSettings {
                neighbors: valid.neighbors,
                sizes: valid.offload_sizes,
            },
        });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// One device's configuration: its config entries parsed and merged, and the merge validated.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    merged: NetworkConfig,
    parse_errors: Vec<FieldError>,
    valid: Result<netconfig::ValidConfig, ConfigErrors>,
}

/// Every device's configuration, in the claim's device order: computed once per prepare and
/// read by both IPAM ([`ipam_requests`]) and the plans ([`plans`]).
#[derive(Debug, Clone)]
pub struct DeviceConfigs(Vec<DeviceConfig>);

/// Parses, merges (class entries, then claim entries) and validates each device's config.
pub fn configure(claim: &PreparedClaim) -> DeviceConfigs {
    DeviceConfigs(
        claim
            .devices
            .iter()
            .map(|device| {
                let mut parse_errors = Vec::new();
                let merged = merged_config(claim, device, &mut parse_errors);
                let valid = netconfig::validate(&merged);
                DeviceConfig {
                    merged,
                    parse_errors,
                    valid,
                }
            })
            .collect(),
    )
}

impl DeviceConfigs {
    /// The mode of the `index`th device's valid config (`netdev` when invalid: plans reports it).
    pub fn device_mode(&self, index: usize) -> netconfig::DeviceMode {
        self.0
            .get(index)
            .and_then(|c| c.valid.as_ref().ok())
            .map(|v| v.device_mode)
            .unwrap_or_default()
    }
}

/// The devices whose valid config asks for IPAM, with the network name: what prepare must
/// allocate before [`plans`]. Invalid configs are skipped, as `plans` reports them anyway and
/// nothing should be allocated for a claim that cannot be prepared.
pub fn ipam_requests(configs: &DeviceConfigs) -> Vec<(usize, String)> {
    configs
        .0
        .iter()
        .enumerate()
        .filter_map(|(index, c)| Some((index, c.valid.as_ref().ok()?.ipam_network.clone()?)))
        .collect()
}

/// Class entries, then claim entries, that apply to `device`, merged; parse errors are
/// collected with their paths.
fn merged_config(
    claim: &PreparedClaim,
    device: &PreparedDevice,
    errors: &mut Vec<FieldError>,
) -> NetworkConfig {
    let mut layers: Vec<NetworkConfig> = Vec::new();
    for (i, config) in claim.configs.iter().enumerate() {
        if !applies(&config.requests, &device.request) {
            continue;
        }
        match netconfig::parse(&config.parameters, &format!("config[{i}].parameters")) {
            Ok(c) => layers.push(c),
            Err(e) => errors.extend(e.0),
        }
    }
    netconfig::merge(&layers)
}

/// The device's config with IPAM's addresses in place of `ipam`, validated as a static one
/// would be (routes' gateways on-link, no duplicate routes), plus the IPv6 MTU floor that
/// validation could not check before the family was known.
fn with_ipam(
    merged: &NetworkConfig,
    valid: &netconfig::ValidConfig,
    request: &str,
    network: &str,
    given: Option<&Addressing>,
) -> Result<netconfig::ValidConfig, Vec<FieldError>> {
    let Some(given) = given.filter(|g| !g.allocations.is_empty()) else {
        return Err(vec![FieldError::new(
            format!("request {request}: ipam.network"),
            format!("no address was allocated from network {network:?}"),
        )]);
    };
    let addresses = given.addresses();
    let listed: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    if let Some(mtu) = valid.mtu
        && mtu < MIN_IPV6_MTU
        && let Some(v6) = addresses.iter().find(|a| a.is_ipv6())
    {
        return Err(vec![FieldError::new(
            format!("request {request}: interface.mtu"),
            format!(
                "{mtu} is below {MIN_IPV6_MTU}, the minimum MTU for IPv6 (network {network:?} \
                 gave {v6})"
            ),
        )]);
    }
    let mut config = merged.clone();
    config.ipam = None;
    config.addresses = Some(listed.clone());
    config.routes = Some(
        given
            .routes
            .iter()
            .cloned()
            .chain(merged.routes.clone().unwrap_or_default())
            .collect(),
    );
    netconfig::validate(&config).map_err(|e| {
        e.0.into_iter()
            .map(|f| FieldError {
                path: format!(
                    "request {request}: network {network:?} gave {}: {}",
                    listed.join(", "),
                    f.path
                ),
                message: f.message,
            })
            .collect()
    })
}

/// What the device was when published (see [`DeviceIdentity`]): its PCI function, else its
/// MAC. `None` when discovery knew neither, which only a device without a MAC can be.
fn identity(device: &PreparedDevice) -> Option<DeviceIdentity> {
    let attributes = device.published.as_ref()?.attributes.as_ref()?;
    let text = |key: &str| attributes.get(key).and_then(|a| a.string.clone());
    let mac = text("mac").and_then(|mac| {
        let bytes: Vec<u8> = mac
            .split(':')
            .map(|b| u8::from_str_radix(b, 16))
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        <[u8; 6]>::try_from(bytes).ok()
    });
    if let Some(address) = text("pciAddress") {
        return Some(DeviceIdentity::Pci { address, mac });
    }
    Some(DeviceIdentity::Mac { address: mac? })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;
    use crate::claims::checkpoint::{OpaqueConfig, PreparedDevice};
    use crate::netns::AttachMode;

    pub(super) fn device(request: &str, name: &str, ifname: Option<&str>) -> PreparedDevice {
        let published = ifname.map(|i| {
            serde_json::from_value(json!({"name": name, "attributes": {"ifName": {"string": i}}}))
                .unwrap()
        });
        PreparedDevice {
            request: request.into(),
            pool: "node-a".into(),
            device: name.into(),
            share_id: None,
            consumed: Default::default(),
            published,
        }
    }

    pub(super) fn config(source: &str, requests: &[&str], body: serde_json::Value) -> OpaqueConfig {
        let mut parameters = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
        parameters
            .as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        OpaqueConfig {
            source: source.into(),
            requests: requests.iter().map(|s| s.to_string()).collect(),
            parameters,
        }
    }

    pub(super) fn claim(devices: Vec<PreparedDevice>, configs: Vec<OpaqueConfig>) -> PreparedClaim {
        PreparedClaim {
            network_label: None,
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
            pod_uid: "p".into(),
            pod_name: "pod".into(),
            devices,
            configs,
            prepared_at: 0,
            attachments: vec![],
            allocations: vec![],
            functions: vec![],
        }
    }

    #[test]
    fn the_plan_records_what_identifies_the_device() {
        let published = |attributes: serde_json::Value| {
            let mut d = device("a", "d0", None);
            d.published = Some(
                serde_json::from_value(json!({"name": "d0", "attributes": attributes}))
                    .expect("device"),
            );
            d
        };
        let pci = published(json!({
            "ifName": {"string": "ens1f0"},
            "pciAddress": {"string": "0000:a2:00.0"},
            "mac": {"string": "aa:bb:cc:dd:ee:01"}
        }));
        let veth = published(json!({
            "ifName": {"string": "veth9"},
            "mac": {"string": "aa:bb:cc:dd:ee:02"}
        }));
        let nothing = published(json!({"ifName": {"string": "lo9"}}));
        let c = claim(vec![pci, veth, nothing], vec![]);
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).unwrap();
        let identities: Vec<_> = p.iter().map(|p| p.identity.clone()).collect();
        assert_eq!(
            identities,
            [
                Some(DeviceIdentity::Pci {
                    address: "0000:a2:00.0".into(),
                    mac: Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x01]),
                }),
                Some(DeviceIdentity::Mac {
                    address: [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x02]
                }),
                None,
            ]
        );
    }

    #[test]
    fn defaults_are_net1_net2_in_request_order_skipping_taken_names() {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b", "d1", Some("eth2")),
            ],
            vec![],
        );
        let taken: BTreeSet<String> = ["net1".to_string()].into();
        let p = plans(&c, &configure(&c), &taken, &IpamAddresses::new()).unwrap();
        let names: Vec<_> = p.iter().map(|p| p.pod_ifname.as_str()).collect();
        assert_eq!(names, ["net2", "net3"]);
        assert_eq!(p[0].host_ifname, "eth1");
        assert_eq!(p[0].mode, AttachMode::Move);
    }

    #[test]
    fn claim_config_overrides_class_config_per_request() {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b/fast", "d1", Some("eth2")),
            ],
            vec![
                config(
                    "FromClass",
                    &[],
                    json!({"interface": {"mtu": 9000}, "addresses": ["192.0.2.1/24"]}),
                ),
                config(
                    "FromClaim",
                    &["b"],
                    json!({"interface": {"name": "fast0"}, "addresses": ["198.51.100.1/24"], "vlan": {"id": 42}}),
                ),
            ],
        );
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).unwrap();
        assert_eq!((p[0].pod_ifname.as_str(), p[0].mtu), ("net1", Some(9000)));
        assert_eq!(p[0].addresses[0].to_string(), "192.0.2.1/24");
        assert_eq!(
            (p[1].pod_ifname.as_str(), p[1].mtu),
            ("fast0", Some(9000)),
            "subrequest b/fast matches b"
        );
        assert_eq!(p[1].addresses[0].to_string(), "198.51.100.1/24");
        assert_eq!(p[1].mode, AttachMode::Vlan { id: 42 });
    }

    #[test]
    fn a_macvlan_or_ipvlan_config_plans_a_child_in_the_pod() {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b", "d1", Some("eth2")),
            ],
            vec![
                config("FromClass", &["a"], json!({"macvlan": {"mode": "private"}})),
                config("FromClaim", &["b"], json!({"ipvlan": {}})),
            ],
        );
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).unwrap();
        assert_eq!(
            p[0].mode,
            AttachMode::Child {
                child: knic_proto::netconfig::ChildKind::Macvlan("private".into()),
                uplink: None,
            }
        );
        assert_eq!(
            p[1].mode,
            AttachMode::Child {
                child: knic_proto::netconfig::ChildKind::Ipvlan("l2".into()),
                uplink: None,
            }
        );
        // The parent is the device's host interface; the child gets the pod's name.
        assert_eq!(
            (p[0].host_ifname.as_str(), p[0].pod_ifname.as_str()),
            ("eth1", "net1")
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b", "d1", None),
                device("c", "d2", Some("eth3")),
            ],
            vec![
                config("FromClaim", &["a"], json!({"interface": {"mtuu": 1}})),
                config("FromClaim", &["c"], json!({"ipam": {"network": "blue"}})),
            ],
        );
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("config[0].parameters.interface.mtuu: unknown field"),
            "{err}"
        );
        assert!(
            err.contains("device node-a/d1: has no network interface on the host"),
            "{err}"
        );
        assert!(
            err.contains("request c: ipam.network: no address was allocated from network \"blue\""),
            "{err}"
        );
    }

    fn addressing(addresses: &[&str], routes: serde_json::Value) -> Addressing {
        Addressing {
            allocations: addresses
                .iter()
                .map(|a| crate::claims::ipam::Allocation {
                    network: "blue".into(),
                    name: format!("blue-{a}"),
                    uid: "uid".into(),
                    address: a.parse().unwrap(),
                    identity: None,
                })
                .collect(),
            routes: serde_json::from_value(routes).unwrap(),
            overlay: None,
        }
    }

    #[test]
    fn ipam_addresses_and_subnet_routes_go_into_the_plan() {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b", "d1", Some("eth2")),
            ],
            vec![
                config(
                    "FromClass",
                    &[],
                    json!({"ipam": {"network": "blue"}, "interface": {"mtu": 9000}}),
                ),
                config(
                    "FromClaim",
                    &["a"],
                    json!({"routes": [{"destination": "10.9.0.0/16", "gateway": "192.0.2.254"}]}),
                ),
            ],
        );
        assert_eq!(
            ipam_requests(&configure(&c)),
            [(0, "blue".to_string()), (1, "blue".to_string())]
        );
        let ipam = IpamAddresses::from([
            (
                0,
                addressing(
                    &["192.0.2.10/24", "2001:db8::a/64"],
                    json!([{"destination": "198.51.100.0/24", "gateway": "192.0.2.1"}]),
                ),
            ),
            (1, addressing(&["192.0.2.11/24"], json!([]))),
        ]);
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &ipam).unwrap();
        let addresses: Vec<String> = p[0].addresses.iter().map(ToString::to_string).collect();
        assert_eq!(addresses, ["192.0.2.10/24", "2001:db8::a/64"]);
        let routes: Vec<String> = p[0]
            .routes
            .iter()
            .map(|r| format!("{} via {:?}", r.destination, r.gateway))
            .collect();
        assert_eq!(
            routes,
            [
                "198.51.100.0/24 via Some(192.0.2.1)",
                "10.9.0.0/16 via Some(192.0.2.254)"
            ]
        );
        assert_eq!(p[0].mtu, Some(9000));
        assert_eq!(p[1].addresses[0].to_string(), "192.0.2.11/24");
    }

    /// G1: the plan names its Network: the claim's `knic.dev/network` label (a claim made from
    /// the Network's template, whose MTU is then the Network's), else the config's
    /// `ipam.network` (a hand-written claim), else none.
    #[test]
    fn the_plan_knows_its_network_and_whether_it_came_from_the_template() {
        let ipam_config = || config("FromClaim", &[], json!({"ipam": {"network": "blue"}}));
        let ipam = IpamAddresses::from([(0, addressing(&["192.0.2.10/24"], json!([])))]);
        let mut c = claim(vec![device("a", "d0", Some("eth1"))], vec![ipam_config()]);
        let by_config = plans(&c, &configure(&c), &BTreeSet::new(), &ipam).unwrap();
        assert_eq!(
            (by_config[0].network.as_deref(), by_config[0].from_template),
            (Some("blue"), false)
        );
        c.network_label = Some("blue-template".into());
        let by_label = plans(&c, &configure(&c), &BTreeSet::new(), &ipam).unwrap();
        assert_eq!(
            (by_label[0].network.as_deref(), by_label[0].from_template),
            (Some("blue-template"), true),
            "the label wins over the config"
        );
        let hand = claim(vec![device("a", "d0", Some("eth1"))], vec![]);
        let none = plans(
            &hand,
            &configure(&hand),
            &BTreeSet::new(),
            &IpamAddresses::new(),
        )
        .unwrap();
        assert_eq!(
            (none[0].network.as_deref(), none[0].from_template),
            (None, false)
        );
        // Checkpoints stay small and old ones load: both fields are left out when unset.
        let stored = serde_json::to_value(&none[0]).unwrap();
        assert!(stored.get("network").is_none() && stored.get("fromTemplate").is_none());
        let loaded: AttachPlan = serde_json::from_value(stored).unwrap();
        assert_eq!(loaded, none[0]);
        let stored = serde_json::to_value(&by_label[0]).unwrap();
        assert_eq!(
            (&stored["network"], &stored["fromTemplate"]),
            (&json!("blue-template"), &json!(true))
        );
        assert_eq!(
            serde_json::from_value::<AttachPlan>(stored).unwrap(),
            by_label[0]
        );
    }

    #[test]
    fn ipam_rules_are_checked_once_the_addresses_are_known() {
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"ipam": {"network": "blue"}, "interface": {"mtu": 1200}}),
            )],
        );
        let ipam = IpamAddresses::from([(0, addressing(&["2001:db8::a/64"], json!([])))]);
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &ipam)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "request a: interface.mtu: 1200 is below 1280, the minimum MTU for IPv6 (network \
             \"blue\" gave 2001:db8::a/64)"
        );
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"ipam": {"network": "blue"}, "routes": [{"destination": "10.9.0.0/16", "gateway": "10.0.0.1"}]}),
            )],
        );
        let ipam = IpamAddresses::from([(0, addressing(&["192.0.2.10/24"], json!([])))]);
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &ipam)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "request a: network \"blue\" gave 192.0.2.10/24: routes[0].gateway: 10.0.0.1 is not \
             inside any address's subnet"
        );
    }

    #[test]
    fn explicit_name_clash_with_another_claim_of_the_pod() {
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"interface": {"name": "net1"}}),
            )],
        );
        let taken: BTreeSet<String> = ["net1".to_string()].into();
        let err = plans(&c, &configure(&c), &taken, &IpamAddresses::new())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "request a: interface.name: net1 is already used by another device of this pod"
        );
    }

    #[test]
    fn invalid_merged_config_is_rejected_with_request_prefix() {
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"addresses": ["192.0.2.10/24"], "routes": [{"destination": "203.0.113.0/24", "gateway": "198.51.100.1"}]}),
            )],
        );
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "request a: routes[0].gateway: 198.51.100.1 is not inside any address's subnet"
            ),
            "{err}"
        );
    }
}
