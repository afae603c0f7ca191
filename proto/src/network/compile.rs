//! What a Network compiles to: the device request and the `NetworkConfig` of the claim template
//! the controller generates for it. Here, next to validation, because a Network that validates
//! must compile, and the driver's own [`netconfig::validate`] must accept the config.

use super::{DeviceRequest, NetworkSpec, validate};
use super::{devices, vxlan};
use crate::netconfig::{self, InterfaceConfig, IpamConfig, NetworkConfig, VlanConfig};

/// The kind of the resource, next to [`netconfig::API_VERSION`] which it shares with the
/// driver's config: one API group, one version.
pub const KIND: &str = "Network";

/// The DeviceClass a friendly device description compiles against: the class that selects
/// every knic device, so the generated CEL expression alone decides, and is complete enough
/// to read in the template.
pub const FRIENDLY_DEVICE_CLASS: &str = crate::DRIVER_NAME;

/// At most this many devices per ResourceClaim (`AllocationResultsMaxSize`), which bounds how
/// many interfaces one pod can ask for through one claim.
pub const MAX_INTERFACES_PER_POD: u32 = 32;

impl NetworkSpec {
    /// The device request of the generated claim template: the given class and selectors, or
    /// the friendly fields compiled into one CEL expression against [`FRIENDLY_DEVICE_CLASS`].
    /// Fails with the same errors [`validate_network`] reports for `spec.devices`.
    ///
    /// [`validate_network`]: super::validate_network
    pub fn device_request(&self) -> std::result::Result<DeviceRequest, netconfig::ConfigErrors> {
        let mut errors = Vec::new();
        if self.vxlan.is_some() {
            // The node's one overlay device; which segment is the driver's to read from the
            // Network (never from a claim, which could name another tenant's VNI).
            vxlan::check(self, &[], &mut errors);
            errors.retain(|e| e.path == "spec.devices");
            if !errors.is_empty() {
                return Err(netconfig::ConfigErrors(errors));
            }
            return Ok(DeviceRequest {
                device_class_name: vxlan::OVERLAY_DEVICE_CLASS.to_owned(),
                selectors: Vec::new(),
                count: self.interfaces_per_pod(),
            });
        }
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
            ..InterfaceConfig::default()
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
