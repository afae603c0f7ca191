//! The `Network` resource (`knic.dev/v1alpha1`, kind `Network`): a network as a service.
//!
//! An admin defines a Network once, with the administrative knowledge — which devices, which
//! VLAN, which subnets — and application developers ask for it by name through the
//! ResourceClaimTemplate the controller generates in each selected namespace.
//!
//! The resource's types (spec, status, the `NetworkAddress` allocation object) are the CRD's
//! contract and live in [`knic_proto::network`], from which the chart's CRD YAML is generated;
//! they are re-exported here so the controller reads as one module. The scope decision (cluster,
//! with `spec.namespaces` choosing where it is usable) is documented on
//! [`knic_proto::network::Network`].
//!
//! This module holds what needs controller logic: validation ([`validate_network`],
//! [`validate_against`]) and the translations the reconciler needs
//! ([`DeviceRequestOf::device_request`], [`template_config`]; a subnet's pool is
//! `knic_proto::network::Subnet::pool`, shared with the driver); the pure
//! data helpers ([`Namespaces::selects`], [`StableAddresses::identity`]) moved with the types.
//! Addresses, gateways and exclusions stay strings in the spec, like in the driver's
//! `NetworkConfig`, so validation can report every malformed value with its path instead of
//! failing on the first.

mod devices;
mod validate;

#[cfg(test)]
mod tests;

use knic_proto::netconfig::{self, InterfaceConfig, IpamConfig, NetworkConfig, VlanConfig};

pub use devices::lint_cel;
pub use validate::{validate_against, validate_network};

/// The kind of the resource, next to [`netconfig::API_VERSION`] which it shares with the
/// driver's config: one API group, one version.
pub const KIND: &str = "Network";

/// The DeviceClass a friendly device description compiles against: the class that selects
/// every knic device, so the generated CEL expression alone decides, and is complete enough
/// to read in the template.
pub const FRIENDLY_DEVICE_CLASS: &str = knic_proto::DRIVER_NAME;

/// At most this many devices per ResourceClaim (`AllocationResultsMaxSize`), which bounds how
/// many interfaces one pod can ask for through one claim.
pub const MAX_INTERFACES_PER_POD: u32 = 32;

pub use knic_proto::network::*;

/// The DRA request a [`NetworkSpec`] compiles to. An extension trait because the spec types
/// live in `knic-proto` (they are the CRD's contract) while compiling the friendly device form
/// into CEL is controller logic.
pub trait DeviceRequestOf {
    /// The device request of the generated claim template: the given class and selectors, or
    /// the friendly fields compiled into one CEL expression against [`FRIENDLY_DEVICE_CLASS`].
    /// Fails with the same errors [`validate_network`] reports for `spec.devices`.
    fn device_request(&self) -> std::result::Result<DeviceRequest, netconfig::ConfigErrors>;
}

impl DeviceRequestOf for NetworkSpec {
    fn device_request(&self) -> std::result::Result<DeviceRequest, netconfig::ConfigErrors> {
        let mut errors = Vec::new();
        match devices::check(
            &self.devices,
            validate::exhaustion_selectors(self),
            &mut errors,
        ) {
            Some((device_class_name, selectors)) if errors.is_empty() => Ok(DeviceRequest {
                device_class_name,
                selectors,
                count: self.interfaces_per_pod(),
            }),
            _ => Err(netconfig::ConfigErrors(errors)),
        }
    }
}

/// The opaque `NetworkConfig` the generated claim template carries for the driver: interface
/// name and MTU, VLAN, and `ipam: {network: NAME}` when knic allocates. Validation runs the
/// driver's own [`netconfig::validate`] on exactly this object, so a Network that validates
/// produces a config the driver accepts.
pub fn template_config(name: &str, spec: &NetworkSpec) -> NetworkConfig {
    let interface =
        (spec.interface_name.is_some() || spec.mtu.is_some()).then(|| InterfaceConfig {
            name: spec.interface_name.clone(),
            mtu: spec.mtu,
            hardware_address: None,
        });
    NetworkConfig {
        api_version: Some(netconfig::API_VERSION.to_owned()),
        kind: Some(netconfig::KIND.to_owned()),
        interface,
        ipam: (!spec.ipam.subnets.is_empty()).then(|| IpamConfig {
            network: name.to_owned(),
        }),
        vlan: spec.vlan.map(|id| VlanConfig { id }),
        ..NetworkConfig::default()
    }
}
