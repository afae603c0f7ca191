//! Device names for the ResourceSlice pool.
//!
//! A device name must be a DNS label, unique in the pool and stable across reboots and
//! interface renames, because claims and the scheduler refer to devices by it.
//!
//! * A PCI function is named by its address: `pci-<domain>-<bus>-<dev>-<fn>`
//!   (`0000:a2:01.0` → `pci-0000-a2-01-0`); a second, third… port of one function (mlx4
//!   dual-port, `dev_port` N > 0) gets `-p<N>`. The address survives reboots and renames.
//! * Any other netdev (virtual, or physical without a PCI parent) has only its interface name.
//!   If that name already is a DNS label and does not start with `pci-` or `net-`, it is used
//!   as is (`veth0`, `br0`, `lo`); otherwise it is `net-` plus the lowercase RFC 4648 base32 of
//!   the name without padding (`eth0.100` → `net-mv2gqmbogeyda`). The two prefixes are reserved,
//!   so the three forms can never collide, and base32 is injective, so distinct interface names
//!   give distinct device names. Interface names are at most 15 bytes, so the encoded form is
//!   at most 4 + 24 characters.

/// The device name of a PCI function with address `bdf` (`DDDD:BB:DD.F`, any domain width);
/// `None` if `bdf` is not a PCI address.
pub fn pci_device_name(bdf: &str) -> Option<String> {
    let (domain, rest) = bdf.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let parts = [domain, bus, dev, func];
    if parts
        .iter()
        .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return None;
    }
    Some(format!("pci-{}", parts.join("-")).to_ascii_lowercase())
}

/// The device name of a netdev known only by its interface name (see the module docs).
pub fn netdev_device_name(if_name: &str) -> String {
    if is_dns_label(if_name) && !if_name.starts_with("pci-") && !if_name.starts_with("net-") {
        if_name.to_owned()
    } else {
        format!("net-{}", base32_lower(if_name.as_bytes()))
    }
}

/// RFC 1123 label: device names must be one; the contract crate's rule, shared by all crates.
pub use knic_proto::netconfig::is_dns_label;

/// RFC 4648 base32, lowercase alphabet, no padding.
pub fn base32_lower(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    let mut buffer: u32 = 0;
    let mut bits = 0;
    for &byte in data {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 0x1f) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(
            ALPHABET[((buffer << (5 - bits)) & 0x1f) as usize],
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_names_pci() {
        assert_eq!(
            pci_device_name("0000:a2:01.0").as_deref(),
            Some("pci-0000-a2-01-0")
        );
        assert_eq!(
            pci_device_name("10000:E1:00.7").as_deref(),
            Some("pci-10000-e1-00-7")
        );
        assert_eq!(pci_device_name("virtio2"), None);
        assert_eq!(pci_device_name("0000:zz:00.0"), None);
        assert_eq!(pci_device_name("0000::00.0"), None);
    }

    #[test]
    fn inventory_names_netdev() {
        assert_eq!(netdev_device_name("veth0"), "veth0");
        assert_eq!(netdev_device_name("lo"), "lo");
        // Not labels: upper case, dots, underscores, leading/trailing dash.
        assert_eq!(netdev_device_name("eth0.100"), "net-mv2gqmbogeyda");
        assert_eq!(netdev_device_name("Eth0"), "net-iv2gqma");
        assert_eq!(netdev_device_name("my_if"), "net-nv4v62lg");
        assert_eq!(netdev_device_name("-x"), "net-fv4a");
        // Reserved prefixes are always encoded, so they cannot collide with other forms.
        assert_eq!(
            netdev_device_name("pci-0000-a2-01-0"),
            "net-obrwsljqgaydallbgiwtamjnga"
        );
        assert_eq!(netdev_device_name("net-abc"), "net-nzsxillbmjrq");
        // 15 bytes, the kernel maximum, stays a label.
        let longest = netdev_device_name("ABCDEFGHIJKLMNO");
        assert!(is_dns_label(&longest), "{longest}");
        assert_eq!(longest.len(), 28);
    }

    #[test]
    fn inventory_names_base32_rfc4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "my"),
            ("fo", "mzxq"),
            ("foo", "mzxw6"),
            ("foob", "mzxw6yq"),
            ("fooba", "mzxw6ytb"),
            ("foobar", "mzxw6ytboi"),
        ] {
            assert_eq!(base32_lower(input.as_bytes()), want, "{input}");
        }
    }

    #[test]
    fn inventory_names_dns_label() {
        assert!(is_dns_label("a"));
        assert!(is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label("a.b"));
    }
}
