//! IPAM: the pure part of handing out addresses from a `Network`'s subnets.
//!
//! Three pieces, each independent of where allocation finally runs (driver at prepare time or
//! controller) and of the API objects that record it:
//!
//! * [`Pool`]: which addresses of a subnet are usable, numbered `0..size()`, with O(log n)
//!   conversion between number and address. Nothing is ever enumerated, so a /16 and a /64
//!   cost the same few bytes plus the exclusions.
//! * [`choose`] / [`allocate`]: propose a free address, starting at a per-allocator hint
//!   ([`stable_offset`]) so concurrent allocators rarely propose the same one.
//! * [`allocation_name`]: the one-to-one name of the object that records an allocation. Creating
//!   that object is the atomic step: the apiserver accepts exactly one create per name, so two
//!   allocators can never both own an address, whatever they proposed. A loser treats
//!   `AlreadyExists` as "taken" and chooses again.
//!
//! Gateway rule: a subnet's gateway is never handed out. A /24 with a gateway therefore has 253
//! allocatable addresses, without one 254 (network and broadcast addresses are never usable,
//! see [`Pool`] for every prefix length).

mod alloc;
mod pool;

#[cfg(test)]
mod tests;

pub use alloc::{
    allocate, allocation_name, choose, overlay_mac, parse_allocation_name, stable_offset,
};
pub use pool::{Exclusion, Pool};

pub use pool::{check_exclusion, check_gateway, check_subnet, family};

use crate::network::Subnet;
use crate::{Error, Result};

impl Subnet {
    /// The allocation pool of this subnet; the error is the first problem Network validation
    /// would report (validate first to get all of them with paths). Both binaries compute
    /// pools from the same spec, so the controller's counts and the driver's allocations
    /// always agree.
    pub fn pool(&self) -> Result<Pool> {
        let cidr: crate::netconfig::Cidr = self
            .cidr
            .parse()
            .map_err(|e| Error::Invalid(format!("{e}")))?;
        let gateway = self
            .gateway
            .as_deref()
            .map(crate::netconfig::parse_ip)
            .transpose()
            .map_err(pool::invalid)?;
        let exclude = self
            .exclude
            .iter()
            .map(|e| e.parse::<Exclusion>())
            .collect::<Result<Vec<_>>>()
            .map_err(pool::invalid)?;
        Pool::new(cidr, gateway, &exclude)
    }
}
