//! knic's per-node driver.
//!
//! Modules are named by domain: [`claims`] decides what preparing a claim means, [`checkpoint`]
//! remembers it durably, [`kubelet`] speaks the kubelet's plugin protocols. The outside world
//! (directories, sockets, the API client) always comes in as a parameter, so every part runs in
//! tests against temporary directories and fakes.

pub mod checkpoint;
pub mod claims;
pub mod error;
pub mod exhaustion;
pub mod failpoint;
pub mod health;
pub mod inventory;
pub mod ipam;
pub mod kubelet;
pub mod netlink;
pub mod netns;
pub mod node;
pub mod nri;
pub mod plan;
pub mod pods;
pub mod slices;

pub use error::{Error, Result};

/// Checks a Kubernetes DNS subdomain (RFC 1123): node names, pool names and driver names must be
/// one, and a bad one should fail at start-up rather than in every later API write.
pub fn check_dns_subdomain(value: &str) -> std::result::Result<(), String> {
    if value.is_empty() || value.len() > 253 {
        return Err(format!("must be 1 to 253 characters, got {}", value.len()));
    }
    for label in value.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "{value:?} is not a DNS subdomain: lower-case letters, digits, '-' and '.', each \
                 part starting and ending with a letter or digit"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_dns_subdomain;

    #[test]
    fn dns_subdomain_rules() {
        assert!(check_dns_subdomain("node-1.example").is_ok());
        assert!(
            check_dns_subdomain("")
                .unwrap_err()
                .contains("must be 1 to 253 characters, got 0")
        );
        for bad in ["Node1", "node_1", "-node", "node-", "a..b"] {
            let err = check_dns_subdomain(bad).unwrap_err();
            assert!(err.contains("is not a DNS subdomain"), "{bad}: {err}");
        }
    }
}
