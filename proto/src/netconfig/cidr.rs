//! [`Cidr`]: an IP address with a prefix length, shared by the config contract and the
//! controller's IPAM so both agree on one parser and one set of subnet rules.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Error;

/// An address with a prefix length, in either of the two forms the contract uses: interface
/// form (`192.0.2.10/24`, host bits kept, because the address *and* its on-link subnet both
/// matter) or network form (`192.0.2.0/24`, see [`Cidr::network`]).
///
/// Parsing is strict on purpose, since the controller's IPAM reuses this type and a lenient
/// parser there hands out the wrong addresses: a prefix length is required, IPv4 octets with
/// leading zeros are rejected (other tools read `010` as octal), zone ids (`%eth0`) are
/// rejected (they mean nothing inside another network namespace), and the prefix length must
/// fit the family. The field order (address, then length) makes the derived ordering sort by
/// address first, which is what an IPAM free list wants.
///
/// Serialized as its `addr/len` string so checkpoints and logs read like the operator's YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    /// The address; in interface form it may have host bits set.
    pub addr: IpAddr,
    /// Prefix length, `0..=32` for IPv4 and `0..=128` for IPv6. [`Cidr::new`] and parsing
    /// enforce this; the methods clamp a hand-built out-of-range value instead of panicking.
    pub prefix_len: u8,
}

/// Why a string is not a [`Cidr`]; the text is written for operators and names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CidrError(String);

impl Cidr {
    /// Builds a `Cidr` from parts, refusing a prefix length the family cannot have, so code
    /// that computes CIDRs (IPAM) cannot create one the parser would reject.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Result<Self, CidrError> {
        let max = max_prefix_len(addr);
        if prefix_len > max {
            return Err(CidrError(format!(
                "prefix length {prefix_len} is out of range for {} (0-{max})",
                family(addr)
            )));
        }
        Ok(Cidr { addr, prefix_len })
    }

    /// True for IPv4, so callers can pair addresses, gateways and routes by family.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// True for IPv6; the counterpart of [`Cidr::is_ipv4`].
    pub fn is_ipv6(&self) -> bool {
        self.addr.is_ipv6()
    }

    /// 32 or 128: the family's address width, which bounds the prefix length.
    pub fn max_prefix_len(&self) -> u8 {
        max_prefix_len(self.addr)
    }

    /// The subnet this address lives in (host bits cleared), e.g. `192.0.2.10/24` →
    /// `192.0.2.0/24`; used to check that a route destination is written in network form and
    /// that a gateway is on-link.
    pub fn network(&self) -> Cidr {
        let prefix_len = self.prefix_len.min(self.max_prefix_len());
        let addr = match self.addr {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask_v4(prefix_len))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask_v6(prefix_len))),
        };
        Cidr { addr, prefix_len }
    }

    /// Whether `ip` is inside this subnet; always false across families, because an IPv4
    /// gateway can never be reached through an IPv6 subnet (IPv4-mapped IPv6 included).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let prefix_len = self.prefix_len.min(self.max_prefix_len());
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask_v4(prefix_len);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask_v6(prefix_len);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

fn max_prefix_len(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn family(addr: IpAddr) -> &'static str {
    if addr.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn mask_v4(prefix_len: u8) -> u32 {
    // `checked_shl` refuses a shift by the full width; that case is /0, whose mask is empty.
    // An over-long prefix saturates to a shift of 0, the full mask, i.e. it is clamped.
    u32::MAX
        .checked_shl(32_u32.saturating_sub(prefix_len.into()))
        .unwrap_or(0)
}

fn mask_v6(prefix_len: u8) -> u128 {
    u128::MAX
        .checked_shl(128_u32.saturating_sub(prefix_len.into()))
        .unwrap_or(0)
}

/// Parses a plain IP address the same strict way [`Cidr`] parses its address part, so a
/// gateway and an address are held to one standard. Messages name the value.
pub fn parse_ip(s: &str) -> crate::Result<IpAddr> {
    parse_ip_expecting(s, "a valid IPv4 or IPv6 address")
}

/// [`parse_ip`] for a field that takes other spellings too (an IPAM exclusion is also a range
/// or a CIDR): `expected` finishes "VALUE is not …", so text that is no address at all is told
/// what the field accepts, while zone ids and prefix lengths get the same words everywhere.
pub(crate) fn parse_ip_expecting(s: &str, expected: &str) -> crate::Result<IpAddr> {
    if s.contains('%') {
        return Err(Error::Rule(format!(
            "{s:?} has a zone id (%...); zone ids are not allowed"
        )));
    }
    if s.contains('/') {
        return Err(Error::Rule(format!(
            "{s:?} is not an IP address (write the address without a prefix length)"
        )));
    }
    s.parse::<IpAddr>()
        .map_err(|_| Error::Rule(format!("{s:?} is not {expected}")))
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(CidrError(
                "empty string is not a CIDR; write ADDRESS/PREFIX-LENGTH, e.g. 192.0.2.10/24"
                    .to_owned(),
            ));
        }
        if s.contains('%') {
            return Err(CidrError(format!(
                "{s:?} has a zone id (%...); zone ids are not allowed"
            )));
        }
        let Some((addr_text, len_text)) = s.split_once('/') else {
            return Err(CidrError(match s.parse::<IpAddr>() {
                Ok(ip) => format!(
                    "{ip} has no prefix length; CIDR form is required, e.g. {ip}/{}",
                    if ip.is_ipv4() { 24 } else { 64 }
                ),
                Err(_) => {
                    format!("{s:?} is not in CIDR form (ADDRESS/PREFIX-LENGTH, e.g. 192.0.2.10/24)")
                }
            }));
        };
        let addr = addr_text
            .parse::<IpAddr>()
            .map_err(|_| CidrError(format!("{addr_text:?} is not a valid IPv4 or IPv6 address")))?;
        let canonical_digits = !len_text.is_empty()
            && len_text.bytes().all(|b| b.is_ascii_digit())
            && (len_text == "0" || !len_text.starts_with('0'));
        if !canonical_digits {
            return Err(CidrError(format!(
                "prefix length {len_text:?} is not a decimal number without sign or leading zeros"
            )));
        }
        let max = max_prefix_len(addr);
        match len_text.parse::<u8>() {
            Ok(prefix_len) if prefix_len <= max => Ok(Cidr { addr, prefix_len }),
            _ => Err(CidrError(format!(
                "prefix length {len_text} is out of range for {} (0-{max})",
                family(addr)
            ))),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
