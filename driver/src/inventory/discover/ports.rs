//! Port names and MACs as sysfs spells them.

/// `p0`, `p1`: a PF uplink port.
pub(super) fn is_uplink_port(name: &str) -> bool {
    name.strip_prefix('p').is_some_and(all_digits)
}

/// Representor `phys_port_name`s: `pf0vf1`, `pf0sf2`, `c1pf0vf1`, `c1pf0` (host PF on a DPU),
/// `pf0hpf`, and ice's legacy `pf0vfr1`.
pub(super) fn is_representor_port(name: &str) -> bool {
    let mut rest = name;
    if let Some(after_c) = rest.strip_prefix('c') {
        let (digits, tail) = split_digits(after_c);
        if digits.is_empty() {
            return false;
        }
        rest = tail;
    }
    let Some(after_pf) = rest.strip_prefix("pf") else {
        return false;
    };
    let (digits, tail) = split_digits(after_pf);
    if digits.is_empty() {
        return false;
    }
    if tail.is_empty() {
        return name.starts_with('c');
    }
    if tail == "hpf" {
        return true;
    }
    ["vfr", "vf", "sf"]
        .iter()
        .any(|p| tail.strip_prefix(p).is_some_and(all_digits))
}

pub(super) fn split_digits(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.split_at(end)
}

pub(super) fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

pub(super) fn is_zero_mac(mac: &str) -> bool {
    mac.bytes().all(|b| b == b'0' || b == b':')
}
