//! Which addresses and ranges an interface, a next hop, a route and an address pool may use.
//!
//! One function per rule, shared by `NetworkConfig` validation (prepare), Network validation and
//! [`crate::ipam::Pool`], so a value one of them accepts is never refused by another, and never
//! by the kernel for a reason these checks could have known. Every function returns the bare
//! rule as [`Error::Rule`]; the caller puts the field path in front.
//!
//! The classes refused, and why they cannot work on a pod's link:
//! * unspecified (`0.0.0.0`, `::`): means "no address"; the kernel refuses it on an interface
//!   (IPv6) or uses it as a wildcard (IPv4);
//! * loopback (`127.0.0.0/8`, `::1`): never leaves a host; the kernel refuses `::1` on any
//!   device but `lo` and drops `127/8` arriving on a real link as martian;
//! * multicast (`224.0.0.0/4`, `ff00::/8`): names a group, not a host;
//! * limited broadcast (`255.255.255.255`): every host on the link;
//! * class E (`240.0.0.0/4`, reserved by RFC 1112): Linux accepts it, but most routers and
//!   other hosts drop it, so it fails far from where it was configured;
//! * IPv4-mapped IPv6 (`::ffff:0:0/96`): RFC 4291 §2.5.5.2 keeps them off the wire; the kernel
//!   sends such traffic as IPv4 and refuses them as an IPv6 next hop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Cidr;
use crate::{Error, Result};

/// An address class no interface, next hop or pool may use (see the module documentation for
/// why each one cannot work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialClass {
    /// `0.0.0.0` or `::`.
    Unspecified,
    /// `127.0.0.0/8` or `::1`.
    Loopback,
    /// `224.0.0.0/4` or `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    LimitedBroadcast,
    /// `240.0.0.0/4` other than the limited broadcast address.
    ClassE,
    /// `::ffff:0:0/96`.
    Ipv4Mapped,
}

impl SpecialClass {
    /// Completes "ADDRESS …" for one address.
    fn address_text(self) -> &'static str {
        match self {
            SpecialClass::Unspecified => "is the unspecified address",
            SpecialClass::Loopback => "is a loopback address, which never leaves a host",
            SpecialClass::Multicast => "is a multicast address",
            SpecialClass::LimitedBroadcast => "is the limited broadcast address",
            SpecialClass::ClassE => {
                "is a reserved class E address (240.0.0.0/4), which hosts and routers drop"
            }
            SpecialClass::Ipv4Mapped => {
                "is an IPv4-mapped IPv6 address; write the IPv4 address instead"
            }
        }
    }

    /// Completes "SUBNET …" for a subnet lying inside this class's range.
    fn range_text(self) -> &'static str {
        match self {
            SpecialClass::Unspecified => "is the unspecified address",
            SpecialClass::Loopback => "is a loopback range, which never leaves a host",
            SpecialClass::Multicast => "is a multicast range; pods need unicast addresses",
            SpecialClass::LimitedBroadcast => "is the limited broadcast address",
            SpecialClass::ClassE => {
                "is in the reserved class E range 240.0.0.0/4, which hosts and routers drop"
            }
            SpecialClass::Ipv4Mapped => {
                "is an IPv4-mapped IPv6 range; write the IPv4 subnet instead"
            }
        }
    }

    /// Completes "SUBNET contains …" for a subnet reaching over this class's range, which is
    /// `range`.
    fn contained_text(self, range: Cidr) -> String {
        match self {
            SpecialClass::Unspecified => format!("the unspecified address {}", range.addr),
            SpecialClass::Loopback => {
                format!("the loopback range {range}, which never leaves a host")
            }
            SpecialClass::Multicast => {
                format!("the multicast range {range}; pods need unicast addresses")
            }
            SpecialClass::LimitedBroadcast => {
                format!("the limited broadcast address {}", range.addr)
            }
            SpecialClass::ClassE => {
                format!("the reserved class E range {range}, which hosts and routers drop")
            }
            SpecialClass::Ipv4Mapped => {
                format!("the IPv4-mapped range {range}, which never appears on the wire")
            }
        }
    }

    /// Whether addresses of this class are unicast at all; the others are reported as "not a
    /// unicast address" where a next hop is expected.
    fn is_unicast(self) -> bool {
        !matches!(
            self,
            SpecialClass::Unspecified | SpecialClass::Multicast | SpecialClass::LimitedBroadcast
        )
    }
}

/// The class of `ip`, or `None` for an address an interface or next hop may use.
pub fn special_class(ip: IpAddr) -> Option<SpecialClass> {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some(SpecialClass::Unspecified),
        IpAddr::V4(v4) if v4.is_loopback() => Some(SpecialClass::Loopback),
        IpAddr::V4(v4) if v4.is_multicast() => Some(SpecialClass::Multicast),
        IpAddr::V4(v4) if v4.is_broadcast() => Some(SpecialClass::LimitedBroadcast),
        IpAddr::V4(v4) if v4.octets()[0] >= 240 => Some(SpecialClass::ClassE),
        IpAddr::V6(v6) if v6.is_unspecified() => Some(SpecialClass::Unspecified),
        IpAddr::V6(v6) if v6.is_loopback() => Some(SpecialClass::Loopback),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Some(SpecialClass::Ipv4Mapped),
        IpAddr::V6(v6) if v6.is_multicast() => Some(SpecialClass::Multicast),
        _ => None,
    }
}

/// The classes' ranges of `ip`'s family, most specific first, so a subnet inside two of them
/// (`255.255.255.255/32` is also class E) is described by the narrower one.
fn special_ranges(ip: IpAddr) -> Vec<(SpecialClass, Cidr)> {
    let v4 = |a, b, c, d, len| Cidr {
        addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
        prefix_len: len,
    };
    let v6 = |addr: Ipv6Addr, len| Cidr {
        addr: IpAddr::V6(addr),
        prefix_len: len,
    };
    if ip.is_ipv4() {
        vec![
            (SpecialClass::Unspecified, v4(0, 0, 0, 0, 32)),
            (SpecialClass::LimitedBroadcast, v4(255, 255, 255, 255, 32)),
            (SpecialClass::Loopback, v4(127, 0, 0, 0, 8)),
            (SpecialClass::Multicast, v4(224, 0, 0, 0, 4)),
            (SpecialClass::ClassE, v4(240, 0, 0, 0, 4)),
        ]
    } else {
        vec![
            (SpecialClass::Unspecified, v6(Ipv6Addr::UNSPECIFIED, 128)),
            (SpecialClass::Loopback, v6(Ipv6Addr::LOCALHOST, 128)),
            (
                SpecialClass::Ipv4Mapped,
                v6(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96),
            ),
            (
                SpecialClass::Multicast,
                v6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
            ),
        ]
    }
}

/// Whether every address of `inner` is inside `outer` (same family).
fn within(inner: Cidr, outer: Cidr) -> bool {
    inner.prefix_len >= outer.prefix_len && outer.contains(inner.network().addr)
}

/// The rule for an address assigned to a pod's interface (`addresses[i]` in interface form):
/// none of the special classes, and, where the prefix length reserves them, not the network,
/// broadcast or subnet-router anycast address of its own subnet (see [`reserved_role`]).
///
/// The kernel accepts an IPv4 network or broadcast address on an interface, but the
/// interface then cannot talk to its neighbours (they treat it as broadcast), so it is refused
/// here; `/31` (RFC 3021) and `/32` have no such addresses. An IPv6 address whose host part is
/// all zeros is the subnet-router anycast address, which every router on the link answers, and
/// which knic's own pools never hand out.
pub fn check_interface_address(cidr: Cidr) -> Result<()> {
    if let Some(class) = special_class(cidr.addr) {
        return Err(Error::Rule(format!("{cidr} {}", class.address_text())));
    }
    check_not_reserved(cidr.network(), cidr.addr)
}

/// The address-class rule for a next hop (a route's `gateway`, a subnet's `gateway`): a
/// unicast address that is not loopback, class E or IPv4-mapped. The kernel refuses loopback,
/// multicast, broadcast and IPv4-mapped IPv6 next hops (`EINVAL`), so they fail here first.
/// Where the next hop sits inside a subnet, callers also apply [`check_not_reserved`].
pub fn check_next_hop(ip: IpAddr) -> Result<()> {
    match special_class(ip) {
        None => Ok(()),
        Some(class) if !class.is_unicast() => {
            Err(Error::Rule(format!("{ip} is not a unicast address")))
        }
        Some(class) => Err(Error::Rule(format!("{ip} {}", class.address_text()))),
    }
}

/// The rule for a range that addresses are taken from (a Network's subnet, through
/// [`crate::ipam::check_subnet`]): no address of it, reserved or not, may be of a special
/// class. Checking the whole range, not just the addresses a pool hands out, also refuses a
/// subnet whose network address is `0.0.0.0` or whose broadcast address is
/// `255.255.255.255`: the kernel's own prefix and broadcast routes for it would cover those.
/// The prefix length `0` is refused by the caller before this, with its own reason.
pub fn check_address_range(subnet: Cidr) -> Result<()> {
    let ranges = special_ranges(subnet.addr);
    if let Some((class, _)) = ranges.iter().find(|(_, r)| within(subnet, *r)) {
        return Err(Error::Rule(format!("{subnet} {}", class.range_text())));
    }
    // Reaching over several: name the lowest, the one an operator meets first reading up.
    if let Some((class, range)) = ranges
        .iter()
        .filter(|(_, r)| within(*r, subnet))
        .min_by_key(|(_, r)| r.addr)
    {
        return Err(Error::Rule(format!(
            "{subnet} contains {}",
            class.contained_text(*range)
        )));
    }
    Ok(())
}

/// The rule for a route's destination (network form). `0.0.0.0/0` and `::/0` are default
/// routes and stay allowed, as do ranges that merely contain a special range (`0.0.0.0/1`, as
/// VPNs split the default route). Multicast destinations (`224.0.0.0/4` through an interface
/// is how multicast is sent out of a chosen link) and class E destinations (some networks use
/// 240/4 internally, and the kernel routes it) are allowed too. Refused: a destination inside
/// the loopback range, which the kernel's local table always takes first so the route would
/// never be used, and one inside `::ffff:0:0/96`, whose traffic the kernel sends as IPv4.
pub fn check_route_destination(destination: Cidr) -> Result<()> {
    let refused = special_ranges(destination.addr)
        .into_iter()
        .find(|(class, range)| {
            matches!(class, SpecialClass::Loopback | SpecialClass::Ipv4Mapped)
                && within(destination, *range)
        });
    match refused {
        Some((SpecialClass::Loopback, _)) => Err(Error::Rule(format!(
            "{destination} is a loopback range; the kernel's local routes always take it, so this route would never be used"
        ))),
        Some(_) => Err(Error::Rule(format!(
            "{destination} is an IPv4-mapped IPv6 range, which the kernel sends as IPv4; write an IPv4 route instead"
        ))),
        None => Ok(()),
    }
}

/// Which end addresses of `subnet` are reserved (first, last), decided by prefix length
/// because that is what hosts on the link assume:
/// * IPv4 up to /30: the network and the broadcast address;
/// * IPv4 /31 (RFC 3021) and /32: none;
/// * IPv6 up to /126: the subnet-router anycast address (RFC 4291 §2.6.1), the first; IPv6 has
///   no broadcast;
/// * IPv6 /127 (RFC 6164) and /128: none.
///
/// [`crate::ipam::Pool`] never hands these out, and [`check_not_reserved`] refuses them where
/// an interface address or a next hop is expected, from this one definition.
pub fn reserved_ends(subnet: Cidr) -> (bool, bool) {
    if subnet.is_ipv4() {
        let reserves = subnet.prefix_len <= 30;
        (reserves, reserves)
    } else {
        (subnet.prefix_len <= 126, false)
    }
}

/// What `ip` is in `subnet` if it is one of the addresses [`reserved_ends`] reserves:
/// "network address", "broadcast address" or "subnet-router anycast address".
pub fn reserved_role(subnet: Cidr, ip: IpAddr) -> Option<&'static str> {
    if !subnet.contains(ip) {
        return None;
    }
    let network = subnet.network();
    let (first, last) = reserved_ends(network);
    if first && ip == network.addr {
        return Some(if network.is_ipv4() {
            "network address"
        } else {
            "subnet-router anycast address"
        });
    }
    if last && ip == broadcast(network) {
        return Some("broadcast address");
    }
    None
}

/// Refuses `ip` when [`reserved_role`] says it is reserved in `subnet`: an interface cannot
/// use it, and a next hop there is the kernel's broadcast route (`EINVAL`) or any router.
pub fn check_not_reserved(subnet: Cidr, ip: IpAddr) -> Result<()> {
    match reserved_role(subnet, ip) {
        Some(role) => Err(Error::Rule(format!(
            "{ip} is the {role} of {}",
            subnet.network()
        ))),
        None => Ok(()),
    }
}

/// The last address of `network` (IPv4 only is ever asked; IPv6 computes the same way).
fn broadcast(network: Cidr) -> IpAddr {
    let host_bits = u32::from(network.max_prefix_len() - network.prefix_len);
    match network.addr {
        IpAddr::V4(v4) => {
            let hosts = u32::MAX.checked_shr(32 - host_bits).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) | hosts))
        }
        IpAddr::V6(v6) => {
            let hosts = u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) | hosts))
        }
    }
}
