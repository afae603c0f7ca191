//! Picking an address for a new allocation, stable addresses, and allocation object names.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Pool;
use crate::Result;
use crate::netconfig::is_dns_label;

/// Proposes a free address of `pool`, probing from usable index `hint % size` and walking
/// forward (wrapping) until `is_taken` says no; `None` when every usable address is taken.
///
/// This function only picks a *candidate*. Uniqueness is not its job and cannot be: two
/// allocators on two nodes may both see an address as free. The caller makes the address its
/// own by creating the allocation object named [`allocation_name`] — the apiserver's
/// create-by-unique-name succeeds for exactly one of them — and on `AlreadyExists` marks the
/// address taken and calls again. Nothing is ever read, modified and written back.
///
/// The hint is what keeps racing allocators apart: each starts where its own hint points
/// (a hash of its claim via [`stable_offset`], or the stable offset of a pod's identity), so
/// they rarely propose the same address, and a loser's next candidate is usually the next
/// address along. Cost: O(t + 1) probes, t being the number of taken addresses met on the way,
/// each O(log exclusions); a full scan only happens when the pool is in fact exhausted, and
/// then it is bounded by `size()` probes (cheap for the IPv4 subnets that can fill up; an IPv6
/// /64 is never full in practice).
pub fn choose(pool: &Pool, mut is_taken: impl FnMut(IpAddr) -> bool, hint: u128) -> Option<IpAddr> {
    let size = pool.size();
    if size == 0 {
        return None;
    }
    let mut k = hint % size;
    let mut probes = 0u128;
    loop {
        let ip = pool.nth(k)?;
        if !is_taken(ip) {
            return Some(ip);
        }
        probes += 1;
        if probes == size {
            return None;
        }
        k = if k + 1 == size { 0 } else { k + 1 };
    }
}

/// [`choose`], with exhaustion turned into the error operators see
/// (`network blue: subnet 192.0.2.0/24 has no free address (253 in use of 253)`): when
/// `choose` gives up it has found every usable address taken, so the in-use count is the size.
pub fn allocate(
    network: &str,
    pool: &Pool,
    is_taken: impl FnMut(IpAddr) -> bool,
    hint: u128,
) -> Result<IpAddr> {
    choose(pool, is_taken, hint).ok_or_else(|| pool.exhausted(network, pool.size()))
}

/// The usable index where `identity` of `network` starts probing: a deterministic hash, so a
/// pod (`namespace/name` of a StatefulSet pod, or a chosen label's value) gets the same address
/// again after its allocation was released, as long as nobody else took it meanwhile.
///
/// The hash picks a position among the subnet's unreserved addresses *including* the gateway
/// and exclusions and then moves to the first usable address at or after it (wrapping), so
/// adding an exclusion only moves the identities whose address it excludes, not everyone's.
/// The network name is part of the hash, so one pod does not land on the same offset in every
/// network, and two networks' allocators do not start in lock-step.
///
/// Also the hint for allocations without a stable identity: pass the claim's UID, which spreads
/// concurrent allocators over the subnet.
///
/// The hash (FNV-1a 128 with a multiply-xorshift finalizer) is part of the contract: changing
/// it moves every stable address on upgrade, so tests pin its values.
pub fn stable_offset(network: &str, identity: &str, pool: &Pool) -> u128 {
    let position = identity_hash(network, identity) % pool.span();
    pool.index_at_or_after(position)
}

/// The MAC of an overlay pod interface: `02` (locally administered, unicast) and 5 bytes of the
/// same hash as [`stable_offset`] over the Network and `key` (the stable identity, else the
/// claim UID with `#i` for later interfaces). Computed, not random, so a returning stable pod
/// keeps its MAC and other nodes' forwarding entries and pods' ARP caches stay right; part of
/// the contract like the offset (tests pin its values).
pub fn overlay_mac(network: &str, key: &str) -> [u8; 6] {
    let h = identity_hash(network, key).to_be_bytes();
    [0x02, h[0], h[1], h[2], h[3], h[4]]
}

/// FNV-1a 128 over `network`, a 0xff separator (never part of UTF-8, so `("ab", "c")` and
/// `("a", "bc")` differ) and `identity`, then mixed so nearby inputs (`db-0`, `db-1`) land far
/// apart in every bit.
fn identity_hash(network: &str, identity: &str) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    let bytes = network
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(identity.bytes());
    for b in bytes {
        h ^= u128::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h ^= h >> 71;
    h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
    h ^= h >> 67;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9_4d2a_3b1c_6f7e_8d95);
    h ^= h >> 64;
    h
}

/// The name of the object that records "`ip` of `network` is allocated": the key of the
/// create-by-unique-name that makes an address unique, so it must be one-to-one with
/// (network, address) and a valid object name (DNS subdomain: lowercase letters, digits and
/// `-`, starting and ending with a letter or digit, at most 253 bytes).
///
/// * IPv4: `<network>-<a>-<b>-<c>-<d>`, decimal octets: `blue-192-0-2-10`;
/// * IPv6: `<network>-` and the eight groups fully expanded to four hex digits:
///   `blue-2001-0db8-0000-0000-0000-0000-0000-0010`.
///
/// Why expanded: RFC 5952's `::` would become `--` and could end the name with `-` (`2001:db8::`),
/// which is invalid. And why it is unambiguous even though network names contain `-` and
/// digits: an IPv4 octet is 1–3 digits, an IPv6 group exactly 4, so the last token's length
/// tells the family, the family fixes the number of address tokens, and what precedes them is
/// the network ([`parse_allocation_name`] inverts it). Without that, network `a-1-2-3-4` with
/// 5.6.7.8 and network `a` with 1:2:3:4:5:6:7:8 would share a name.
///
/// `network` must be a DNS label (validated Network names are); the result is then at most
/// 63 + 40 bytes.
pub fn allocation_name(network: &str, ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            format!("{network}-{a}-{b}-{c}-{d}")
        }
        IpAddr::V6(v6) => {
            let [a, b, c, d, e, f, g, h] = v6.segments();
            format!("{network}-{a:04x}-{b:04x}-{c:04x}-{d:04x}-{e:04x}-{f:04x}-{g:04x}-{h:04x}")
        }
    }
}

/// The network and address an allocation object's name stands for, or `None` if the name is
/// not one [`allocation_name`] produces; lets garbage collection and status counting work from
/// names alone, and ignore foreign objects.
pub fn parse_allocation_name(name: &str) -> Option<(&str, IpAddr)> {
    let last = name.rsplit('-').next()?;
    let (tokens, ip) = if last.len() == 4 {
        let mut groups = [0u16; 8];
        let mut parts = name.rsplitn(9, '-');
        for group in groups.iter_mut().rev() {
            let part = parts.next()?;
            if part.len() != 4
                || !part
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return None;
            }
            *group = u16::from_str_radix(part, 16).ok()?;
        }
        (parts.next()?, IpAddr::V6(Ipv6Addr::from(groups)))
    } else {
        let mut octets = [0u8; 4];
        let mut parts = name.rsplitn(5, '-');
        for octet in octets.iter_mut().rev() {
            let part = parts.next()?;
            let canonical = !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part == "0" || !part.starts_with('0'));
            if !canonical {
                return None;
            }
            *octet = part.parse().ok()?;
        }
        (parts.next()?, IpAddr::V4(Ipv4Addr::from(octets)))
    };
    is_dns_label(tokens).then_some((tokens, ip))
}
