//! Kubernetes' name rules, once for every crate, so the driver, the controller and the
//! contracts agree on what a node, a device, a Network or a DeviceClass may be called.

use crate::{Error, Result};

/// RFC 1123 label (`IsDNS1123Label`): object names such as Networks and device names.
pub fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    let edge_ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|&b| edge_ok(b) || b == b'-')
        && bytes.first().copied().is_some_and(edge_ok)
        && bytes.last().copied().is_some_and(edge_ok)
}

/// RFC 1123 subdomain (`IsDNS1123Subdomain`): node, pool, driver and DeviceClass names.
pub fn is_dns_subdomain(s: &str) -> bool {
    check_dns_subdomain(s).is_ok()
}

/// Like [`is_dns_subdomain`], with the rule a bad value breaks, for start-up errors and
/// validation messages.
pub fn check_dns_subdomain(value: &str) -> Result<()> {
    if value.is_empty() || value.len() > 253 {
        return Err(Error::Rule(format!(
            "must be 1 to 253 characters, got {}",
            value.len()
        )));
    }
    for label in value.split('.') {
        // Kubernetes' IsDNS1123Subdomain has no per-label length limit, only the total.
        let ok = !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(Error::Rule(format!(
                "{value:?} is not a DNS subdomain: lower-case letters, digits, '-' and '.', each \
                 part starting and ending with a letter or digit"
            )));
        }
    }
    Ok(())
}

/// How a prepared claim made through the driver's KNI socket (an attach outside DRA) is told
/// from a ResourceClaim: its UID starts with this. A Kubernetes UID is a UUID (hex digits and
/// dashes), so a UID with a dot can never be one. The driver keeps such claims out of what
/// asks the API about claims (orphans, NRI's sync of pods), and the controller does not collect
/// their `NetworkAddress` objects while their node exists.
pub const SANDBOX_CLAIM_UID_PREFIX: &str = "kni.";

/// Whether `uid` is a KNI attachment's (see [`SANDBOX_CLAIM_UID_PREFIX`]).
pub fn is_sandbox_claim_uid(uid: &str) -> bool {
    uid.starts_with(SANDBOX_CLAIM_UID_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_subdomain_rules() {
        assert!(check_dns_subdomain("node-1.example").is_ok());
        assert!(is_dns_subdomain("knic.dev") && !is_dns_subdomain("VF_class"));
        assert!(
            check_dns_subdomain("")
                .unwrap_err()
                .to_string()
                .contains("must be 1 to 253 characters, got 0")
        );
        for bad in ["Node1", "node_1", "-node", "node-", "a..b"] {
            let err = check_dns_subdomain(bad).unwrap_err().to_string();
            assert!(err.contains("is not a DNS subdomain"), "{bad}: {err}");
        }
    }

    #[test]
    fn dns_label_rules() {
        assert!(is_dns_label("blue-1") && is_dns_label(&"a".repeat(63)));
        for bad in ["", "Blue", "a.b", "-a", "a-", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }
}
