//! [`Pool`]: the usable addresses of one subnet as integer offsets, and [`Exclusion`], how an
//! admin takes addresses out of it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::netconfig::{
    Cidr, check_address_range, check_next_hop, check_not_reserved, parse_ip_expecting,
    reserved_ends,
};

use crate::{Error, Result};

/// Addresses an admin keeps out of a subnet (routers, VIPs, hosts configured by hand), in the
/// three spellings admins use: one address, an inclusive range `a-b`, or a CIDR.
///
/// Written as a string in the `Network` spec (`"192.0.2.1"`, `"192.0.2.10-192.0.2.19"`,
/// `"192.0.2.64/26"`) so one list holds all three; [`FromStr`] and [`fmt::Display`] round-trip.
/// IPv6 addresses never contain `-`, so the range separator is unambiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Exclusion {
    /// One address.
    Address(IpAddr),
    /// An inclusive range; both ends are the same family and `start <= end`.
    Range {
        /// First excluded address.
        start: IpAddr,
        /// Last excluded address (included).
        end: IpAddr,
    },
    /// Every address of a CIDR in network form (host bits zero).
    Cidr(Cidr),
}

impl Exclusion {
    /// First and last excluded address, so every spelling reduces to one interval.
    pub fn bounds(&self) -> (IpAddr, IpAddr) {
        match *self {
            Exclusion::Address(ip) => (ip, ip),
            Exclusion::Range { start, end } => (start, end),
            Exclusion::Cidr(cidr) => {
                let (lo, hi) = cidr_bounds(cidr);
                (to_ip(cidr.addr, lo), to_ip(cidr.addr, hi))
            }
        }
    }
}

impl FromStr for Exclusion {
    type Err = Error;

    /// Parses with the same strictness as [`Cidr`]: a CIDR must be in network form, because
    /// `192.0.2.10/30` could mean "the /30 around .10" or be a typo for one address.
    fn from_str(s: &str) -> Result<Self> {
        if s.contains('/') {
            let cidr: Cidr = s.parse().map_err(|e| Error::Rule(format!("{e}")))?;
            if cidr.network() != cidr {
                return Err(Error::Rule(format!(
                    "{cidr} has host bits set; did you mean {}?",
                    cidr.network()
                )));
            }
            return Ok(Exclusion::Cidr(cidr));
        }
        if let Some((a, b)) = s.split_once('-') {
            let start = parse_ip(a.trim())?;
            let end = parse_ip(b.trim())?;
            if start.is_ipv4() != end.is_ipv4() {
                return Err(Error::Rule(format!(
                    "range {s:?} mixes {} and {}",
                    family(start),
                    family(end)
                )));
            }
            if to_u128(start) > to_u128(end) {
                return Err(Error::Rule(format!(
                    "range start {start} is after its end {end}"
                )));
            }
            return Ok(Exclusion::Range { start, end });
        }
        parse_ip(s).map(Exclusion::Address)
    }
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusion::Address(ip) => write!(f, "{ip}"),
            Exclusion::Range { start, end } => write!(f, "{start}-{end}"),
            Exclusion::Cidr(cidr) => write!(f, "{cidr}"),
        }
    }
}

/// One address of an exclusion, parsed like every other address in the contract; text that is
/// no address is told the three spellings an exclusion accepts.
fn parse_ip(s: &str) -> Result<IpAddr> {
    parse_ip_expecting(
        s,
        "an IP address, a range (FIRST-LAST) or a CIDR (ADDRESS/PREFIX-LENGTH)",
    )
}

/// The usable addresses of one subnet: the subnet minus its reserved addresses, its gateway
/// and its exclusions.
///
/// Everything is integer arithmetic on offsets from the network address (`u128`, so one code
/// path serves IPv4 and IPv6): memory is proportional to the number of exclusions, never to the
/// subnet, so a /64 costs the same as a /30. Usable addresses are numbered `0..size()` in
/// address order; [`Pool::nth`] and [`Pool::index_of`] convert both ways in O(log exclusions).
///
/// Reserved addresses, decided by prefix length because that is what hosts on the link assume:
/// * IPv4 up to /30: the network address (offset 0) and the broadcast address (the last) are
///   never handed out, as every IPv4 host treats them specially.
/// * IPv4 /31: both addresses are usable (RFC 3021 point-to-point links have no broadcast).
/// * IPv4 /32: the one address is usable (a host route; the gateway must then be elsewhere,
///   which this pool does not model, so a /32 has no gateway here).
/// * IPv6 up to /126: offset 0, the subnet-router anycast address (RFC 4291 §2.6.1), is never
///   handed out, since routers on the link answer it. There is no broadcast in IPv6, so the
///   last address is usable. The RFC 2526 reserved anycast identifiers (the top 128 of a /64)
///   are not excluded: nothing in a pod network uses them, and an admin can list them in
///   `exclude` if their routers do.
/// * IPv6 /127 and /128: every address is usable (RFC 6164 point-to-point links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    subnet: Cidr,
    gateway: Option<IpAddr>,
    /// The network address as an integer; offsets are relative to it.
    base: u128,
    /// First and last offsets that are not reserved (inclusive).
    first: u128,
    last: u128,
    /// Gateway and exclusions clipped to `first..=last`, merged, sorted, disjoint and
    /// non-adjacent, each with the count of excluded offsets up to and including it.
    holes: Vec<Hole>,
    size: u128,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hole {
    lo: u128,
    hi: u128,
    /// Excluded offsets in this hole and every hole before it.
    excluded_through: u128,
}

impl Hole {
    fn excluded_before(&self) -> u128 {
        self.excluded_through - (self.hi - self.lo + 1)
    }
}

impl Pool {
    /// Builds the pool, refusing anything that would make allocation hand out an address hosts
    /// cannot use: a subnet [`check_subnet`] refuses (host bits set, `/0`, a special range), a
    /// gateway [`check_gateway`] refuses (outside the subnet, one of its reserved addresses,
    /// not a usable next hop), an exclusion not inside the subnet, or no usable address left.
    /// The messages are the ones `validate_network` reports, without the field path.
    pub fn new(subnet: Cidr, gateway: Option<IpAddr>, exclude: &[Exclusion]) -> Result<Pool> {
        check_subnet(subnet).map_err(invalid)?;
        if let Some(gateway) = gateway {
            check_gateway(subnet, gateway).map_err(invalid)?;
        }
        for exclusion in exclude {
            check_exclusion(subnet, exclusion).map_err(invalid)?;
        }
        let (base, _) = cidr_bounds(subnet);
        let (first, last) = usable_offsets(subnet);
        let mut intervals: Vec<(u128, u128)> = exclude
            .iter()
            .map(Exclusion::bounds)
            .chain(gateway.map(|g| (g, g)))
            .filter_map(|(lo, hi)| {
                let lo = (to_u128(lo) - base).max(first);
                let hi = (to_u128(hi) - base).min(last);
                (lo <= hi).then_some((lo, hi))
            })
            .collect();
        intervals.sort_unstable();
        let mut holes: Vec<Hole> = Vec::with_capacity(intervals.len());
        let mut excluded = 0u128;
        for (lo, hi) in intervals {
            match holes.last_mut() {
                Some(prev) if lo <= prev.hi.saturating_add(1) => {
                    if hi > prev.hi {
                        excluded += hi - prev.hi;
                        prev.hi = hi;
                        prev.excluded_through = excluded;
                    }
                }
                _ => {
                    excluded += hi - lo + 1;
                    holes.push(Hole {
                        lo,
                        hi,
                        excluded_through: excluded,
                    });
                }
            }
        }
        // `last - first + 1` cannot overflow: `first` is 1 whenever the span reaches u128::MAX.
        let size = (last - first + 1) - excluded;
        if size == 0 {
            return Err(Error::Invalid(format!(
                "{subnet} has no address left to allocate after removing the gateway and exclusions"
            )));
        }
        Ok(Pool {
            subnet,
            gateway,
            base,
            first,
            last,
            holes,
            size,
        })
    }

    /// The subnet, for messages and for pairing an address with its prefix length.
    pub fn subnet(&self) -> Cidr {
        self.subnet
    }

    /// The gateway, which is never handed out; pods get it as their default route's next hop.
    pub fn gateway(&self) -> Option<IpAddr> {
        self.gateway
    }

    /// How many addresses can be allocated, so status can show free/total and exhaustion can
    /// be detected without probing.
    pub fn size(&self) -> u128 {
        self.size
    }

    /// The `k`-th usable address in address order (`k < size()`), skipping the gateway and
    /// exclusions by interval arithmetic: O(log exclusions), whatever the subnet's size.
    pub fn nth(&self, k: u128) -> Option<IpAddr> {
        if k >= self.size {
            return None;
        }
        // Holes that start at or before the k-th usable address: exactly those with fewer than
        // or equal to k usable addresses in front of them.
        let m = self
            .holes
            .partition_point(|h| (h.lo - self.first) - h.excluded_before() <= k);
        let skipped = m
            .checked_sub(1)
            .and_then(|i| self.holes.get(i))
            .map_or(0, |h| h.excluded_through);
        Some(self.address(self.first + k + skipped))
    }

    /// The inverse of [`Pool::nth`]: which usable address `ip` is, or `None` if it is not one
    /// (other family, outside the subnet, reserved, the gateway or excluded), so an address
    /// found in an allocation object can be checked against the current spec.
    pub fn index_of(&self, ip: IpAddr) -> Option<u128> {
        if !self.subnet.contains(ip) {
            return None;
        }
        let offset = to_u128(ip) - self.base;
        if offset < self.first || offset > self.last {
            return None;
        }
        let m = self.holes.partition_point(|h| h.lo <= offset);
        let excluded = match m.checked_sub(1).and_then(|i| self.holes.get(i)) {
            Some(h) if offset <= h.hi => return None,
            Some(h) => h.excluded_through,
            None => 0,
        };
        Some(offset - self.first - excluded)
    }

    /// Whether `ip` may be allocated from this pool.
    pub fn contains_usable(&self, ip: IpAddr) -> bool {
        self.index_of(ip).is_some()
    }

    /// The addresses both pools may hand out: the first of them and how many there are, or
    /// `None` when no address is usable in both. Two Networks that split one subnet of a shared
    /// segment record their allocations under names of their own (`allocation_name` includes
    /// the network), so only disjoint pools keep them from giving one address to two pods.
    /// Interval arithmetic over the holes, so a /64 costs what a /30 does.
    pub fn common(&self, other: &Pool) -> Option<(IpAddr, u128)> {
        if self.subnet.is_ipv4() != other.subnet.is_ipv4() {
            return None;
        }
        let (mine, theirs) = (self.ranges(), other.ranges());
        let (mut i, mut j) = (0, 0);
        let mut first = None;
        let mut count = 0u128;
        while let (Some(&(a_lo, a_hi)), Some(&(b_lo, b_hi))) = (mine.get(i), theirs.get(j)) {
            let (lo, hi) = (a_lo.max(b_lo), a_hi.min(b_hi));
            if lo <= hi {
                first.get_or_insert(lo);
                count += hi - lo + 1;
            }
            if a_hi < b_hi {
                i += 1;
            } else {
                j += 1;
            }
        }
        first.map(|lo| (to_ip(self.subnet.addr, lo), count))
    }

    /// The usable addresses as disjoint inclusive ranges of integers, in address order.
    fn ranges(&self) -> Vec<(u128, u128)> {
        let mut ranges = Vec::with_capacity(self.holes.len() + 1);
        let mut next = self.first;
        for hole in &self.holes {
            if hole.lo > next {
                ranges.push((self.base + next, self.base + hole.lo - 1));
            }
            // Holes end at or before `last`, an offset inside a subnet that is never `/0`, so
            // this cannot overflow.
            next = hole.hi + 1;
        }
        if next <= self.last {
            ranges.push((self.base + next, self.base + self.last));
        }
        ranges
    }

    /// The exhaustion error for this pool, so every caller reports it with the same numbers
    /// and wording.
    pub fn exhausted(&self, network: &str, in_use: u128) -> Error {
        Error::Exhausted {
            network: network.to_owned(),
            subnet: self.subnet,
            in_use,
            size: self.size,
        }
    }

    /// Number of unreserved offsets, holes included: the space stable offsets are hashed into,
    /// so adding an exclusion does not move every other pod's stable address.
    pub(crate) fn span(&self) -> u128 {
        self.last - self.first + 1
    }

    /// Usable index of the first usable address at or after unreserved offset
    /// `first + position` (`position < span()`), wrapping to 0 past the end.
    pub(crate) fn index_at_or_after(&self, position: u128) -> u128 {
        let offset = self.first + position;
        let m = self.holes.partition_point(|h| h.lo <= offset);
        let index = match m.checked_sub(1).and_then(|i| self.holes.get(i)) {
            // A hole reaching the end: wrap around to the first usable address.
            Some(h) if offset <= h.hi && h.hi == self.last => 0,
            // Inside a hole: the next usable address is right after it.
            Some(h) if offset <= h.hi => (h.hi + 1 - self.first) - h.excluded_through,
            Some(h) => offset - self.first - h.excluded_through,
            None => offset - self.first,
        };
        if index >= self.size { 0 } else { index }
    }

    fn address(&self, offset: u128) -> IpAddr {
        to_ip(self.subnet.addr, self.base + offset)
    }
}

/// Rules a subnet must meet before it can be a pool; shared with `validate_network` so the
/// spec and the allocator can never disagree: network form, not `/0`, and no address of a
/// special class ([`check_address_range`]: loopback, multicast, class E, IPv4-mapped, or the
/// unspecified or limited broadcast address), reserved or not.
///
/// `/0` gets its own reason before the range rule would refuse it anyway: it is what a default
/// route is written as, so a subnet of `0.0.0.0/0` is almost always a route pasted into the
/// wrong field, and would put every address of the family on-link.
pub fn check_subnet(subnet: Cidr) -> Result<()> {
    if subnet.network() != subnet {
        return Err(Error::Rule(format!(
            "{subnet} has host bits set; did you mean {}?",
            subnet.network()
        )));
    }
    if subnet.prefix_len == 0 {
        return Err(Error::Rule(format!(
            "{subnet} is every {} address, not a subnet (0.0.0.0/0 and ::/0 are how a default route is written); write the link's own subnet",
            family(subnet.addr)
        )));
    }
    check_address_range(subnet)
}

/// Rules for a subnet's gateway (see [`Pool`] for which addresses are reserved and why): a
/// next hop of the kind the kernel accepts ([`check_next_hop`]), of the subnet's family,
/// inside it and not one of its reserved addresses ([`check_not_reserved`]). The IPv6
/// subnet-router anycast address is refused although routers answer it: the pool reserves it,
/// and a gateway must name one router rather than whichever answers.
pub fn check_gateway(subnet: Cidr, gateway: IpAddr) -> Result<()> {
    check_next_hop(gateway)?;
    if gateway.is_ipv4() != subnet.is_ipv4() {
        return Err(Error::Rule(format!(
            "{gateway} is {} but subnet {subnet} is {}",
            family(gateway),
            family(subnet.addr)
        )));
    }
    if !subnet.contains(gateway) {
        return Err(Error::Rule(format!(
            "{gateway} is not inside subnet {subnet}"
        )));
    }
    check_not_reserved(subnet, gateway)
}

/// An exclusion must lie wholly inside its subnet: one that reaches outside is almost always a
/// typo (a wrong octet), and silently clipping it would hide that.
pub fn check_exclusion(subnet: Cidr, exclusion: &Exclusion) -> Result<()> {
    let (start, end) = exclusion.bounds();
    if start.is_ipv4() != subnet.is_ipv4() {
        return Err(Error::Rule(format!(
            "{exclusion} is {} but subnet {subnet} is {}",
            family(start),
            family(subnet.addr)
        )));
    }
    if !subnet.contains(start) || !subnet.contains(end) {
        return Err(Error::Rule(format!(
            "{exclusion} is not inside subnet {subnet}"
        )));
    }
    Ok(())
}

/// A rule a pool's subnet, gateway or exclusion breaks, as the error of a pool that cannot be
/// built: callers asked for a whole Network's pool, not for one value checked.
pub(super) fn invalid(e: Error) -> Error {
    match e {
        Error::Rule(message) => Error::Invalid(message),
        other => other,
    }
}

/// "IPv4" or "IPv6", for messages.
pub fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// The address as an integer; IPv4 in the low 32 bits.
pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The integer `value` as an address of `family_of`'s family. IPv4 values come from offsets
/// inside an IPv4 subnet, so they always fit; the truncation is never reached.
fn to_ip(family_of: IpAddr, value: u128) -> IpAddr {
    match family_of {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(value as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// First and last address of a CIDR as integers.
fn cidr_bounds(cidr: Cidr) -> (u128, u128) {
    let network = to_u128(cidr.network().addr);
    (network, network + host_max(cidr))
}

/// The largest offset inside the subnet (its address count minus one), which always fits.
fn host_max(cidr: Cidr) -> u128 {
    let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len.min(cidr.max_prefix_len()));
    u128::MAX.checked_shr(128 - host_bits).unwrap_or(0)
}

/// The first and last offsets that are not reserved (see [`Pool`] and [`reserved_ends`], the
/// one definition shared with the checks of interface addresses and gateways).
fn usable_offsets(cidr: Cidr) -> (u128, u128) {
    let max = host_max(cidr);
    let (first, last) = reserved_ends(cidr);
    (u128::from(first), max - u128::from(last))
}
