//! IPv4 per-interface sysctls sent as netlink attributes: `IFLA_AF_SPEC` → `AF_INET` →
//! `IFLA_INET_CONF`, a nested list of (`IPV4_DEVCONF_*` id, u32 value), carried by the move
//! request itself, so a plan's IPv4 sysctls cost no request and no file write in the pod.
//! Only a move: a child's creation with `IFLA_AF_SPEC` fails (EAFNOSUPPORT on 6.1 and
//! 6.18), so a child keeps file writes.
//!
//! The kernel applies `IFLA_AF_SPEC` last in `do_setlink`: after the namespace change (so to
//! the device's new `in_device`, whose defaults the move reset to the pod's) and after the
//! admin-state flags, so a request carrying them must not bring the link up (the move never
//! does; the link goes up in a later request, with the sysctls in place).
//!
//! The netlink path sets the value (and marks it as set, as a file write does) but skips the
//! proc handler's side effects: a route cache flush for `accept_local`, `route_localnet`,
//! `bc_forwarding`, `disable_policy` and `disable_xfrm`, and the netconf notification for
//! `rp_filter`, `proxy_arp` and `ignore_routes_with_linkdown`. Neither matters for a device
//! that has just arrived in the pod, down, with no route or cached route through it yet.
//! Kept as file writes: `forwarding` (its proc handler also runs `dev_forward_change`:
//! LRO off, all-routers multicast group), `mc_forwarding` (read-only as a file; netlink would
//! set it silently), every IPv6 sysctl, a name without a devconf id and a value that is not
//! an integer (the file write gives their error, as before).

use std::collections::BTreeMap;

/// The smallest MTU at which a device keeps IPv4 (and its devconf): the kernel's
/// `inetdev_valid_mtu`.
pub const MIN_IPV4_MTU: u32 = 68;

/// `IFLA_INET_CONF` inside the `AF_INET` entry of `IFLA_AF_SPEC`.
const IFLA_INET_CONF: u16 = 1;
/// `AF_INET`: the entry's type inside `IFLA_AF_SPEC`.
const AF_INET: u16 = 2;

/// File names under `/proc/sys/net/ipv4/conf/<if>/` with their `IPV4_DEVCONF_*` ids
/// (include/uapi/linux/ip.h: devconf array index + 1). Some file names differ from the ids'
/// (`arp_filter` is `ARPFILTER`, `disable_xfrm` is `NOXFRM`, `disable_policy` is `NOPOLICY`,
/// `src_valid_mark` is `SRC_VMARK`).
const DEVCONF: &[(&str, u16)] = &[
    // 1 forwarding and 2 mc_forwarding: kept as files (see the module doc).
    ("proxy_arp", 3),
    ("accept_redirects", 4),
    ("secure_redirects", 5),
    ("send_redirects", 6),
    ("shared_media", 7),
    ("rp_filter", 8),
    ("accept_source_route", 9),
    ("bootp_relay", 10),
    ("log_martians", 11),
    ("tag", 12),
    ("arp_filter", 13),
    ("medium_id", 14),
    ("disable_xfrm", 15),
    ("disable_policy", 16),
    ("force_igmp_version", 17),
    ("arp_announce", 18),
    ("arp_ignore", 19),
    ("promote_secondaries", 20),
    ("arp_accept", 21),
    ("arp_notify", 22),
    ("accept_local", 23),
    ("src_valid_mark", 24),
    ("proxy_arp_pvlan", 25),
    ("route_localnet", 26),
    ("igmpv2_unsolicited_report_interval", 27),
    ("igmpv3_unsolicited_report_interval", 28),
    ("ignore_routes_with_linkdown", 29),
    ("drop_unicast_in_l2_multicast", 30),
    ("drop_gratuitous_arp", 31),
    ("bc_forwarding", 32),
    ("arp_evict_nocarrier", 33),
];

/// The `IPV4_DEVCONF_*` id of an IPv4 per-interface sysctl file name.
pub fn devconf_id(leaf: &str) -> Option<u16> {
    DEVCONF.iter().find(|(n, _)| *n == leaf).map(|(_, id)| *id)
}

/// The file name of an `IPV4_DEVCONF_*` id this module sends.
pub fn devconf_name(id: u16) -> Option<&'static str> {
    DEVCONF.iter().find(|(_, i)| *i == id).map(|(n, _)| *n)
}

/// A plan's sysctls split by how they are set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// IPv4 devconf (id, value) pairs for the link request, in id order.
    pub ipv4_conf: Vec<(u16, u32)>,
    /// The rest, written as files in the pod as before.
    pub files: BTreeMap<String, String>,
}

/// Splits `sysctls` (`ipv4.arp_ignore` or `net.ipv4.conf.<if>.arp_ignore` spellings, as the
/// file writer accepts them) into devconf attributes and file writes.
pub fn split(sysctls: &BTreeMap<String, String>) -> Split {
    let mut out = Split::default();
    // Two spellings of one sysctl: the one written last as a file would win, so the later
    // key (in map order) wins here too, and each id is sent once.
    let mut conf = BTreeMap::new();
    for (key, value) in sysctls {
        match as_devconf(key, value) {
            Some((id, value)) => {
                conf.insert(id, value);
            }
            None => {
                out.files.insert(key.clone(), value.clone());
            }
        }
    }
    out.ipv4_conf = conf.into_iter().collect();
    out
}

/// The family (the first `ipv4`/`ipv6` part) and the leaf (the last part) of a per-interface
/// sysctl, in either accepted spelling (`ipv4.arp_ignore`, `net.ipv4.conf.<if>.arp_ignore`):
/// the file path and the devconf id are both read from these.
pub fn family_and_leaf(key: &str) -> Option<(&str, &str)> {
    let mut parts = key.split('.');
    let family = parts.clone().find(|p| *p == "ipv4" || *p == "ipv6")?;
    Some((family, parts.next_back()?))
}

fn as_devconf(key: &str, value: &str) -> Option<(u16, u32)> {
    let (family, leaf) = family_and_leaf(key)?;
    if family != "ipv4" {
        return None;
    }
    let id = devconf_id(leaf)?;
    // The kernel stores an int; a proc write of "-1" stores the same bits.
    let value: i32 = value.trim().parse().ok()?;
    Some((id, value.cast_unsigned()))
}

/// The value of `IFLA_AF_SPEC` carrying `conf`: one `AF_INET` entry holding `IFLA_INET_CONF`,
/// which holds one 4-byte attribute per id (host byte order, as `nla_get_u32` reads it).
/// Lengths are small and fixed (8 bytes an entry), so nothing here can overflow a u16 for any
/// list of distinct ids.
pub fn af_spec(conf: &[(u16, u32)]) -> Vec<u8> {
    let inner_len = 8 * conf.len();
    let conf_len = 4 + inner_len;
    let inet_len = 4 + conf_len;
    let mut out = Vec::with_capacity(inet_len);
    push_header(&mut out, inet_len, AF_INET);
    push_header(&mut out, conf_len, IFLA_INET_CONF);
    for (id, value) in conf {
        push_header(&mut out, 8, *id);
        out.extend_from_slice(&value.to_ne_bytes());
    }
    out
}

fn push_header(out: &mut Vec<u8>, len: usize, kind: u16) {
    let len = u16::try_from(len).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn ipv4_devconf_names_go_to_netlink_and_the_rest_to_files() {
        let s = split(&map(&[
            ("ipv4.arp_ignore", "1"),
            ("net.ipv4.conf.net1.rp_filter", " 2\n"),
            ("ipv4.medium_id", "-1"),
            ("ipv4.forwarding", "1"),
            ("ipv4.mc_forwarding", "1"),
            ("ipv6.accept_ra", "0"),
            ("ipv4.no_such_thing", "1"),
            ("ipv4.arp_announce", "two"),
            ("arp_ignore", "1"),
        ]));
        assert_eq!(s.ipv4_conf, vec![(8, 2), (14, u32::MAX), (19, 1)]);
        assert_eq!(
            s.files.keys().map(String::as_str).collect::<Vec<_>>(),
            vec![
                "arp_ignore",
                "ipv4.arp_announce",
                "ipv4.forwarding",
                "ipv4.mc_forwarding",
                "ipv4.no_such_thing",
                "ipv6.accept_ra",
            ]
        );
    }

    #[test]
    fn two_spellings_of_one_sysctl_send_one_id_and_the_later_key_wins() {
        // `ipv4.arp_ignore` sorts before `net.ipv4.conf.net1.arp_ignore`: the file writer
        // would write the latter last.
        let s = split(&map(&[
            ("ipv4.arp_ignore", "1"),
            ("net.ipv4.conf.net1.arp_ignore", "2"),
        ]));
        assert_eq!(s.ipv4_conf, vec![(19, 2)]);
        assert!(s.files.is_empty(), "{:?}", s.files);
    }

    #[test]
    fn ids_match_the_kernel_header() {
        // include/uapi/linux/ip.h
        assert_eq!(devconf_id("arp_ignore"), Some(19));
        assert_eq!(devconf_id("arp_filter"), Some(13));
        assert_eq!(devconf_id("disable_policy"), Some(16));
        assert_eq!(devconf_id("bc_forwarding"), Some(32));
        assert_eq!(devconf_id("forwarding"), None);
        assert_eq!(devconf_name(19), Some("arp_ignore"));
        let mut ids: Vec<u16> = DEVCONF.iter().map(|(_, id)| *id).collect();
        ids.dedup();
        assert_eq!(ids, (3..=33).collect::<Vec<_>>());
    }

    #[test]
    fn af_spec_nests_af_inet_then_inet_conf_then_one_u32_per_id() {
        let bytes = af_spec(&[(19, 1), (8, 2)]);
        let mut want = Vec::new();
        for (len, kind) in [(24u16, 2u16), (20, 1), (8, 19)] {
            want.extend_from_slice(&len.to_ne_bytes());
            want.extend_from_slice(&kind.to_ne_bytes());
            if kind == 19 {
                want.extend_from_slice(&1u32.to_ne_bytes());
            }
        }
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(bytes, want);
    }
}
