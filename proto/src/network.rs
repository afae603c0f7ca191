//! The `Network` custom resource (`knic.dev/v1alpha1`) and the `NetworkAddress` allocation
//! object: the JSON contracts between admins, the controller and the driver for networks as a
//! service.
//!
//! They live here rather than in the controller because three parties read them: the controller
//! reconciles Networks, the driver creates and deletes `NetworkAddress` objects when it serves a
//! claim's `ipam: {network: NAME}`, and the CRD YAML that the chart installs is generated from
//! these very types (`charts/knic/crds/`, checked by `proto/tests/crds.rs`), so the schema the
//! apiserver enforces cannot drift from what the Rust code parses.
//!
//! The spec types deny unknown fields: a misspelt field must fail, never do nothing. Addresses,
//! gateways and exclusions stay strings, like in the driver's [`NetworkConfig`], so the
//! controller's validation can report every malformed value with its path instead of failing on
//! the first. For the same reason the CRD schema carries types only, no ranges or patterns: the
//! controller's validation is the one place rules live, and it reports them in the Network's
//! `Invalid` condition with the field path and the rule, which an OpenAPI rejection at
//! `kubectl apply` time would say less precisely and in a second, possibly diverging, copy.
//!
//! [`NetworkConfig`]: crate::netconfig::NetworkConfig

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::netconfig::RouteConfig;

mod compile;
mod devices;
pub mod nad;
pub mod readiness;
mod share;
pub mod stable;
mod update;
mod validate;
mod vxlan;

pub use compile::{FRIENDLY_DEVICE_CLASS, KIND, MAX_INTERFACES_PER_POD, template_config};
pub use devices::lint_cel;
pub use update::validate_update;
pub use validate::{validate_against, validate_network};
pub use vxlan::{
    DEFAULT_VXLAN_PORT, OVERLAY_DEVICE_CLASS, OVERLAY_LABEL, OverlayEndpoint, VXLAN_OVERHEAD_V4,
    VXLAN_OVERHEAD_V6, Vxlan,
};

/// The API group of both resources: the driver name, so one string names everything knic owns.
pub const GROUP: &str = crate::DRIVER_NAME;

/// The API version of both resources; `v1alpha1` because the shape may still change, which
/// Kubernetes users read from the version alone.
pub const VERSION: &str = "v1alpha1";

/// `Ready` condition type: `True` once the Network validated and its templates were applied, so
/// `kubectl get networks` answers "can I use it" in one column.
pub const CONDITION_READY: &str = "Ready";

/// `Invalid` condition type: `True` with the reason and every problem in the message when the
/// Network breaks a rule alone or against other Networks; nothing is generated for it then.
pub const CONDITION_INVALID: &str = "Invalid";

/// `Exhausted` condition type: `True` when every allocatable address of the Network is in use.
/// While it is, new pods of the network are kept from scheduling (see [`exhaustion_selector`]);
/// running pods keep their addresses.
pub const CONDITION_EXHAUSTED: &str = "Exhausted";

/// The device attribute (in the `knic.dev` domain) listing the networks that have no free
/// address, as `,TOKEN,TOKEN,` with one [`exhaustion_token`] per network. Every node's driver
/// publishes it on its devices while some network is exhausted, and every generated claim
/// template carries [`exhaustion_selector`], so the scheduler itself stops placing new claims
/// of a full network and places them again once an address is freed: claims are immutable, but
/// slices are not, and a pending pod is retried whenever a slice changes.
///
/// Why not a DeviceTaintRule: it is alpha (off by default) in Kubernetes 1.34, the oldest
/// version knic supports, and a taint blocks a device for every claim, while a device carries
/// many networks (VLANs on one port) of which only one is full. Why not a per-network boolean
/// attribute: a device may carry at most 32 attributes and capacities, and knic already uses
/// about twenty.
pub const EXHAUSTED_ATTRIBUTE: &str = "exhaustedNetworks";

/// How many exhausted networks fit into [`EXHAUSTED_ATTRIBUTE`]: a string attribute holds at
/// most 64 bytes, and each token takes [`TOKEN_LEN`] characters plus a comma after the leading
/// one. Beyond this many at once, the oldest exhausted are listed and the others fall back to a
/// clear prepare error (documented in the README).
pub const MAX_EXHAUSTED_LISTED: usize = (64 - 1) / (TOKEN_LEN + 1);

/// Characters in an [`exhaustion_token`]: 40 bits, so two networks share one with a chance of
/// about one in a million even among a thousand networks.
pub const TOKEN_LEN: usize = 8;

/// A short stable name for a network inside [`EXHAUSTED_ATTRIBUTE`]: network names may be 253
/// characters long and the attribute only 64, so it carries an 8-character hash (FNV-1a 64
/// with murmur3's finalizer, base32 lowercase) that the controller's templates and every driver compute alike.
pub fn exhaustion_token(network: &str) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in network.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // FNV's last multiplication barely changes the low bits for names that differ in their
    // last character ("net-1", "net-2"); murmur3's finalizer spreads every input bit over all.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    (0..TOKEN_LEN)
        .map(|i| char::from(ALPHABET[((hash >> (5 * i)) & 31) as usize]))
        .collect()
}

/// The value of [`EXHAUSTED_ATTRIBUTE`] for `tokens` (at most [`MAX_EXHAUSTED_LISTED`] are
/// used, in the order given), or `None` when there is nothing to list, so a cluster without a
/// full network publishes exactly the slices it would without this feature.
pub fn exhausted_attribute<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let listed: Vec<&str> = tokens.into_iter().take(MAX_EXHAUSTED_LISTED).collect();
    if listed.is_empty() {
        return None;
    }
    Some(format!(",{},", listed.join(",")))
}

/// The selector every generated template carries: "this device does not list the network as
/// exhausted". A device without the attribute (every device while no network is full, and
/// devices of drivers too old to publish it) matches.
///
/// The attribute is read only behind `has()`: a real apiserver (1.36) refuses
/// `.?exhaustedNetworks.orValue("").contains(…)` as "too complex, exceeds cost limit", because
/// an optional read loses the attribute's 64-byte bound in the CEL cost estimate and
/// `contains` is priced by length; a guarded plain read keeps the bound and is accepted
/// (`shared/fixtures/apiserver/cel-selector-verdicts-1.36.json`).
pub fn exhaustion_selector(network: &str) -> String {
    let attrs = format!("device.attributes[\"{}\"]", crate::DRIVER_NAME);
    format!(
        "!has({attrs}.{EXHAUSTED_ATTRIBUTE}) || !{attrs}.{EXHAUSTED_ATTRIBUTE}.contains(\",{},\")",
        exhaustion_token(network)
    )
}

impl Network {
    /// The condition of type `type_`, if the controller wrote one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// Whether the condition `type_` is `True` for the current spec: a condition written for an
    /// older generation (the spec changed since) does not count, so fixing a Network takes
    /// effect without waiting for the controller. A condition without `observedGeneration`
    /// counts, as Kubernetes' own readers do.
    pub fn condition_is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| {
            c.status == "True"
                && (c.observed_generation.is_none()
                    || c.observed_generation == self.metadata.generation)
        })
    }
}

/// The label every `NetworkAddress` carries with its network's name, so counting or collecting
/// one network's allocations is a server-side filtered list instead of a scan of all of them.
pub const NETWORK_LABEL: &str = "knic.dev/network";

/// The desired state of a Network.
// Every `printcolumn(...)` repeats `type_ = "string"`, which clippy reads as a duplicated
// attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(
    CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "knic.dev",
    version = "v1alpha1",
    kind = "Network",
    plural = "networks",
    status = "NetworkStatus",
    derive = "PartialEq",
    doc = "A network as a service, defined once by an admin with the devices, VLAN and subnets \
           it uses and asked for by name from the namespaces it selects. Cluster-scoped: a \
           Network describes shared infrastructure (NICs, VLANs, subnets) that belongs to the \
           platform, not to a tenant, and the rules that keep networks apart (no two networks on \
           the same devices with the same VLAN unless both name one vlanShareGroup, no address \
           handed out twice on one segment) are \
           cluster-wide facts. A namespaced Network would let anyone with create rights in a \
           namespace claim a VLAN or a subnet and would scatter the objects that must be checked \
           against each other; cluster scope keeps creation an admin privilege while \
           spec.namespaces decides which namespaces may use it.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#,
        description = "Whether the Network is valid and its claim templates are applied"
    ),
    printcolumn(
        name = "Devices",
        type_ = "string",
        json_path = ".status.devicesSummary",
        description = "Which devices carry the network"
    ),
    printcolumn(
        name = "Addresses",
        type_ = "string",
        json_path = ".status.addressSummary",
        description = "Free and total allocatable addresses"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.availableNodes",
        description = "Nodes currently offering a free matching device",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = kubernetes_integer_formats)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    /// Which devices carry this network; empty (or absent) only with `vxlan`, whose pods get a
    /// veth on their node's overlay bridge.
    #[serde(default, skip_serializing_if = "Devices::is_empty")]
    pub devices: Devices,
    /// Makes this an overlay Network: one layer-2 segment across nodes, VXLAN-encapsulated on
    /// the nodes' underlay, without multicast (every node is told where the others' pods are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<Vxlan>,
    /// 802.1Q VLAN id (1–4094) the driver puts on top of each device; unset is untagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Lets other Networks use the same `vlan` on devices this one may use too: every Network
    /// on the VLAN must name the same group (a DNS label), so sharing a layer-2 segment is a
    /// decision both sides wrote down, never an accident of two admins picking one id. Networks
    /// of a group must agree on the MTU and keep their addresses apart (see the README).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_share_group: Option<String>,
    /// Link MTU inside the pod; unset keeps the device's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Interface name inside the pod; unset lets the driver assign `net1`, `net2`, ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// How many interfaces (devices) of this network each pod gets; unset means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces_per_pod: Option<u32>,
    /// How pods get addresses.
    pub ipam: Ipam,
    /// Whether a pod keeps its address across restarts and rescheduling, and by what identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_addresses: Option<StableAddresses>,
    /// Which namespaces get a ResourceClaimTemplate for this network.
    pub namespaces: Namespaces,
    /// Present (`{}`): every selected namespace also gets a `NetworkAttachmentDefinition`
    /// (`k8s.cni.cncf.io/v1`) of the Network's name, so Multus-based workloads (and KubeVirt
    /// VMs through Multus) can name the network; the interface still comes from the pod's
    /// claim of the generated template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_attachment_definition: Option<NadOptions>,
}

/// `networkAttachmentDefinition: {}`; an object rather than a boolean so options can be added
/// without a new field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = allow_empty_object)]
pub struct NadOptions {}

impl NetworkSpec {
    /// Interfaces per pod with the default applied, so every reader agrees on what unset means.
    pub fn interfaces_per_pod(&self) -> u32 {
        self.interfaces_per_pod.unwrap_or(1)
    }
}

/// Which devices carry the network: either a DeviceClass plus CEL selectors, for admins who
/// already have classes or need the full power of CEL, or the friendly fields, which cover the
/// common choices, compile to CEL and can be checked for overlap with other networks precisely
/// (CEL cannot be).
///
/// The two forms are exclusive; an empty `devices` is refused rather than meaning "every knic
/// device" (write `deviceClassName: knic.dev` for that).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Devices {
    /// A DeviceClass name (e.g. `vf.knic.dev`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class_name: Option<String>,
    /// CEL expressions that must all be true, as in a DRA request's `selectors[].cel`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<String>,
    /// Friendly form: whole ports (`nic`, which also matches SR-IOV PFs, like the
    /// `nic.knic.dev` class) or SR-IOV virtual functions (`vf`); unset matches either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = optional_enum_keeps_field_description)]
    pub kind: Option<DeviceKind>,
    /// Friendly form: the PCI vendor, as its id (`8086` or `0x8086`, matched against the
    /// `pciVendor` attribute) or its name exactly as `pci.ids` spells it (`Intel Corporation`,
    /// matched against `vendorName`). Four hex digits always mean an id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Friendly form: only VFs of the PF with this interface name on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_name: Option<String>,
    /// Friendly form: minimum link speed in Mb/s (the `speed` attribute); devices whose speed
    /// is unknown (no link) do not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_speed: Option<u32>,
    /// Friendly form: only devices attached to this NUMA node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Friendly form: `true` for devices with an RDMA function, `false` for devices without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<bool>,
}

impl Devices {
    /// Neither form given (allowed only for an overlay Network).
    pub fn is_empty(&self) -> bool {
        *self == Devices::default()
    }

    /// A one-line description for the `DEVICES` column of `kubectl get networks` (the
    /// controller copies it into `status.devicesSummary`, because JSONPath cannot describe
    /// either form): the class with the number of selectors, or the friendly fields that are
    /// set, e.g. `vf.knic.dev +2 selectors` or `vf vendor=8086 pf=ens1f0 speed>=25000`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(class) = &self.device_class_name {
            parts.push(class.clone());
        }
        match self.selectors.len() {
            0 => {}
            1 => parts.push("+1 selector".to_owned()),
            n => parts.push(format!("+{n} selectors")),
        }
        match self.kind {
            Some(DeviceKind::Nic) => parts.push("nic".to_owned()),
            Some(DeviceKind::Vf) => parts.push("vf".to_owned()),
            None => {}
        }
        if let Some(vendor) = &self.vendor {
            parts.push(format!("vendor={vendor}"));
        }
        if let Some(pf) = &self.pf_name {
            parts.push(format!("pf={pf}"));
        }
        if let Some(speed) = self.min_speed {
            parts.push(format!("speed>={speed}"));
        }
        if let Some(numa) = self.numa_node {
            parts.push(format!("numa={numa}"));
        }
        match self.rdma {
            Some(true) => parts.push("rdma".to_owned()),
            Some(false) => parts.push("no-rdma".to_owned()),
            None => {}
        }
        parts.join(" ")
    }
}

/// Turns the `anyOf: [enum, null]` schemars writes for an `Option` of an enum into one nullable
/// enum, keeping the field's description. kube's CRD rewriter does the same later but lets the
/// enum type's description replace the field's, and the field's is what `kubectl explain`
/// readers need.
fn optional_enum_keeps_field_description(schema: &mut schemars::Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let Some(serde_json::Value::Array(variants)) = object.get("anyOf") else {
        return;
    };
    let [
        serde_json::Value::Object(inner),
        serde_json::Value::Object(null),
    ] = variants.as_slice()
    else {
        return;
    };
    let is_null = null.get("type") == Some(&serde_json::json!("null"))
        || null.get("enum") == Some(&serde_json::json!([null]));
    if !is_null || !(inner.contains_key("enum") || inner.contains_key("oneOf")) {
        return;
    }
    let inner = inner.clone();
    object.remove("anyOf");
    for (key, value) in inner {
        if key != "description" {
            object.insert(key, value);
        }
    }
    object.insert("nullable".to_owned(), serde_json::Value::Bool(true));
}

/// The friendly device kinds; PFs count as `nic` because a PF used as a whole port is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A whole port: a physical NIC or an SR-IOV PF.
    Nic,
    /// An SR-IOV virtual function.
    Vf,
}

/// What the generated ResourceClaimTemplate's request asks for (`exactly`: class, selectors,
/// count), computed once by the controller so the reconciler and the overlap check agree. Not
/// part of the resource; it sits beside the spec because it is the spec's meaning in DRA terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// The DeviceClass of the request.
    pub device_class_name: String,
    /// CEL selectors, in order.
    pub selectors: Vec<String>,
    /// Devices per claim, i.e. interfaces per pod.
    pub count: u32,
}

/// How pods of this network get addresses: allocated by knic from `subnets`, or `static`
/// (each claim carries its own addresses in its config). Exactly one is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ipam {
    /// Subnets to allocate from; a pod gets one address per family, from the first subnet of
    /// that family with a free address (later subnets of a family extend the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<Subnet>,
    /// No allocation: addresses come from each claim.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_addresses: Option<StaticIpam>,
}

/// `static: {}`; an object rather than a boolean so options can be added without a new field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = allow_empty_object)]
pub struct StaticIpam {}

/// Rewrites the integer formats schemars writes for Rust's unsigned and small types (`uint32`,
/// `uint16`, …), which Kubernetes does not know (applying the CRD warns `unrecognized format
/// "uint32"`), into the two it does, `int32` and `int64`, keeping the type's range as
/// `minimum`/`maximum` so the apiserver still refuses what the Rust type cannot hold. Applied
/// at the top-level types; their schemas hold every nested one inline, so this reaches all.
fn kubernetes_integer_formats(schema: &mut schemars::Schema) {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                let range = match map.get("format").and_then(serde_json::Value::as_str) {
                    Some("uint8") => Some(("int32", 0, Some(u64::from(u8::MAX)))),
                    Some("uint16") => Some(("int32", 0, Some(u64::from(u16::MAX)))),
                    Some("uint32") => Some(("int64", 0, Some(u64::from(u32::MAX)))),
                    Some("uint64" | "uint") => Some(("int64", 0, None)),
                    _ => None,
                };
                if let Some((format, min, max)) = range {
                    map.insert("format".into(), format.into());
                    // A tighter bound the type's attributes set stays.
                    map.entry("minimum").or_insert(min.into());
                    if let Some(max) = max {
                        map.entry("maximum").or_insert(max.into());
                    }
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(map) = schema.as_object_mut() {
        let mut value = serde_json::Value::Object(std::mem::take(map));
        walk(&mut value);
        if let serde_json::Value::Object(rewritten) = value {
            *map = rewritten;
        }
    }
}

/// Drops the `additionalProperties: false` that `deny_unknown_fields` puts on a struct without
/// fields: Kubernetes refuses it in a CRD schema, and the apiserver prunes (and `kubectl`'s
/// strict field validation reports) unknown fields of an object without properties anyway.
fn allow_empty_object(schema: &mut schemars::Schema) {
    schema.remove("additionalProperties");
}

/// One subnet to allocate from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subnet {
    /// The subnet in network form (`192.0.2.0/24`, `2001:db8::/64`).
    pub cidr: String,
    /// The router on the subnet; never allocated, and the next hop pods use for `routes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Addresses never allocated: single addresses, ranges `FIRST-LAST`, or CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Routes installed with an address of this subnet, in the driver's route syntax (without
    /// `source`, since each pod's address differs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
}

/// Stable addresses: a pod whose allocation was released (pod deleted and recreated, or
/// rescheduled) gets the same address again when it is still free, because its allocation
/// starts from an offset derived from its identity rather than from a random one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StableAddresses {
    /// What identifies a pod across restarts: `podName`, or `label`, which the driver serves
    /// only when allowed to read pods (the chart's `driver.podLabelReads`; a claim is refused
    /// at prepare otherwise).
    pub by: StableBy,
    /// The label key whose value is the identity; required with `by: label`, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// How long an identity's address stays held after its pod's claim is gone (the
    /// allocation is kept, labelled `knic.dev/held`, and only the same identity may take it),
    /// so a pod re-created later than at once still finds its address. Unset or 0: released
    /// at once, and a returning pod gets its address only if nobody took it meanwhile. The
    /// hold also ends when the identity cannot return (namespace, StatefulSet ordinal or
    /// VirtualMachine gone). At most one year.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<u64>,
}

/// The identity a stable address follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StableBy {
    /// The pod's name: right for StatefulSets, whose pods keep their names.
    PodName,
    /// The value of a chosen label, for controllers that do not keep names. Read from the pod
    /// at prepare, so the driver needs `get` on pods (opt-in, see `by`).
    Label,
    /// The KubeVirt VirtualMachine's name, parsed from its launcher pod's name
    /// (`virt-launcher-<vm>-<5 characters>`, KubeVirt's generateName), so no pod read is
    /// needed. A pod of another name is refused at prepare.
    #[serde(rename = "kubevirtVM")]
    KubevirtVm,
}

impl StableAddresses {
    /// The identity string for a pod's `interface`-th interface, or `None` when the pod has no
    /// identity (the label is missing, or the pod is not a KubeVirt launcher: the driver
    /// refuses that case first) and gets an ordinary allocation.
    ///
    /// The namespace is part of the identity because a Network is cluster-scoped: `db-0` in two
    /// namespaces are different pods and must not compete for one address. Interfaces after the
    /// first get `#N` appended, so each interface of a pod has its own stable address.
    pub fn identity(
        &self,
        namespace: &str,
        pod_name: &str,
        pod_labels: &BTreeMap<String, String>,
        interface: u32,
    ) -> Option<String> {
        let key = match self.by {
            StableBy::PodName => pod_name,
            StableBy::Label => pod_labels.get(self.label.as_deref()?)?.as_str(),
            StableBy::KubevirtVm => stable::kubevirt_vm(pod_name)?,
        };
        Some(if interface == 0 {
            format!("{namespace}/{key}")
        } else {
            format!("{namespace}/{key}#{interface}")
        })
    }
}

/// Which namespaces get the network's ResourceClaimTemplate: a fixed list, or a label selector
/// so new namespaces of a team get it without editing the Network. Exactly one is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Namespaces {
    /// Namespace names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Namespaces whose labels match; `matchLabels: {}` selects every namespace, as in
    /// Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<NamespaceSelector>,
}

/// A label selector with `matchLabels` only: equality is what namespace selection needs, and a
/// smaller language is easier to validate exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceSelector {
    /// Every pair must be present on the namespace.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

impl Namespaces {
    /// Whether namespace `name` with `labels` gets a template, so the reconciler decides
    /// creation and removal with the same rule.
    pub fn selects(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        if let Some(selector) = &self.selector {
            return selector
                .match_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v));
        }
        self.names.iter().any(|n| n == name)
    }
}

/// What the controller observed and did for a Network: the answers to "can I use it", "where"
/// and "how full is it" without reading the controller's logs.
///
/// Unknown fields are tolerated (unlike in the spec): status is written by the controller, and
/// an older controller reading a newer one's status must not fail on it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = kubernetes_integer_formats)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// The `metadata.generation` this status describes, so a reader can tell a stale status
    /// from a current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and `Invalid`, as standard Kubernetes conditions so `kubectl describe` and
    /// `kubectl wait --for=condition=Ready` work. A map list keyed by `type`, so server-side
    /// apply merges one condition without replacing the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The ResourceClaimTemplates generated for this Network, so deselecting a namespace or
    /// deleting the Network removes exactly those, and users can see what to reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["namespace", "name"]
    ))]
    pub templates: Vec<TemplateRef>,
    /// The NetworkAttachmentDefinitions generated for this Network (with
    /// `spec.networkAttachmentDefinition`), so Multus users can see what to name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["namespace", "name"]
    ))]
    pub network_attachment_definitions: Vec<TemplateRef>,
    /// Free and total allocatable addresses over all subnets; unset for `static` IPAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<AddressCount>,
    /// `addresses` as `FREE/TOTAL` (e.g. `250/253`) for the `ADDRESSES` column, because
    /// JSONPath in printer columns cannot format two numbers into one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_summary: Option<String>,
    /// `spec.devices` in one line (e.g. `vf vendor=8086`), for the `DEVICES` column; a status
    /// field because the two device forms cannot be described by one JSONPath.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices_summary: Option<String>,
    /// How many nodes currently offer a free matching device: where (and whether) a new pod of
    /// this network can be scheduled right now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_nodes: Option<u32>,
}

/// A generated ResourceClaimTemplate.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// The template's namespace.
    pub namespace: String,
    /// The template's name.
    pub name: String,
}

/// Address usage of a Network.
///
/// Counts are decimal strings on the wire and `u128` in Rust: one IPv6 /64 holds about 1.8e19
/// addresses, more than Kubernetes' `integer` (int64) can carry and far beyond what JSON
/// readers keep exact (2^53), while every IPv4 and IPv6 subnet size fits a `u128` exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressCount {
    /// Addresses that can still be allocated.
    #[serde(with = "decimal")]
    #[schemars(schema_with = "decimal::schema")]
    pub free: u128,
    /// Allocatable addresses of all subnets (gateways and exclusions already removed).
    #[serde(with = "decimal")]
    #[schemars(schema_with = "decimal::schema")]
    pub total: u128,
    /// Of the used addresses, those held for an identity whose pod is gone
    /// (`stableAddresses.gracePeriodSeconds`): not free, but no pod has them.
    #[serde(default, with = "decimal", skip_serializing_if = "is_zero")]
    #[schemars(schema_with = "decimal::schema")]
    pub held: u128,
}

fn is_zero(n: &u128) -> bool {
    *n == 0
}

impl AddressCount {
    /// `FREE/TOTAL`, the form `status.addressSummary` carries, defined once so the column reads
    /// the same whoever writes the status.
    pub fn summary(&self) -> String {
        format!("{}/{}", self.free, self.total)
    }
}

/// A `u128` as a decimal string (see [`AddressCount`] for why).
mod decimal {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(value: &u128, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<u128, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.len() > 1 && text.starts_with('0') {
            return Err(D::Error::custom(format!(
                "{text:?} is not a decimal count (no leading zeros)"
            )));
        }
        text.parse()
            .map_err(|e| D::Error::custom(format!("{text:?} is not a decimal count: {e}")))
    }

    pub(super) fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^(0|[1-9][0-9]*)$",
        })
    }
}

/// The record that one address of a Network belongs to one claim.
///
/// **Create-by-unique-name.** The object's name is `allocation_name(network, ip)` from
/// [`crate::ipam`] (`blue-192-0-2-10`, `blue-2001-0db8-…-000a`): one name per
/// address, so the apiserver's guarantee that exactly one create of a name succeeds is what
/// makes an address unique, even with every node allocating at once. An allocator proposes an
/// address, creates its object, and on `AlreadyExists` treats the address as taken and
/// proposes another; it never reads, modifies and writes a shared object. Releasing is
/// deleting the object. The spec is immutable (a CEL rule in the CRD), because changing the
/// owner of an existing allocation would be exactly the read-modify-write this contract rules
/// out.
///
/// Cluster-scoped, like the Network, because addresses are unique per Network across all
/// namespaces. For the same reason the object has no ownerReference to its claim (a
/// cluster-scoped object cannot be owned by a namespaced one): the controller deletes
/// allocations whose claim, compared by `uid`, no longer exists. Creators label the object
/// `knic.dev/network: NETWORK` (`NETWORK_LABEL`).
// Every `printcolumn(...)` repeats `type_ = "string"`, which clippy reads as a duplicated
// attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "knic.dev",
    version = "v1alpha1",
    kind = "NetworkAddress",
    plural = "networkaddresses",
    derive = "PartialEq",
    doc = "One address of a Network allocated to one ResourceClaim. The name is the network and \
           the address (e.g. blue-192-0-2-10), so creating it is the atomic step that makes the \
           address unique: exactly one create of a name succeeds, and a loser picks another \
           address. Deleting it releases the address.",
    printcolumn(name = "Network", type_ = "string", json_path = ".spec.network"),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(
        name = "Claim-Namespace",
        type_ = "string",
        json_path = ".spec.claim.namespace"
    ),
    printcolumn(name = "Claim", type_ = "string", json_path = ".spec.claim.name"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = kubernetes_integer_formats)]
// Machine-written, so tolerant: an older controller or driver must keep reading allocations
// a newer one wrote with fields it does not know (the human-written NetworkSpec stays strict,
// where a typo must be refused).
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self == oldSelf",
    "message": "an allocation is immutable: delete it to release the address and create another"
}]))]
pub struct NetworkAddressSpec {
    /// The Network's name.
    pub network: String,
    /// The address in interface form, with the subnet's prefix length (`192.0.2.10/24`,
    /// `2001:db8::a/64`): what the driver configures, readable without the Network.
    pub address: String,
    /// The claim the address is allocated to.
    pub claim: ClaimRef,
    /// The stable identity (`namespace/pod`, `namespace/label-value`, `#N` for later
    /// interfaces) when the Network has `stableAddresses`, so a returning pod can be recognised
    /// as the owner of its former address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The node the claim was prepared on, to find a node's allocations when it goes away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// For an overlay Network: where the pod interface is, so every other node can forward to
    /// it (the object then carries the label `knic.dev/overlay: "true"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<OverlayEndpoint>,
}

/// The ResourceClaim an address belongs to (machine-written, tolerant like the allocation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's uid: a claim deleted and recreated under the same name is another claim, and
    /// the old one's allocation must be collected, not inherited.
    pub uid: String,
}

#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod validate_tests;
