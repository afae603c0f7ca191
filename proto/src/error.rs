//! knic-proto's one error type.

use crate::netconfig::Cidr;

/// What the shared domain can refuse. Messages name the field or the numbers, because both
/// binaries show them to operators unchanged (a Network's status, a claim's prepare error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A Network's addressing breaks a rule; the message names field and rule.
    #[error("{0}")]
    Invalid(String),
    /// One value breaks a rule, and the message says which without saying where: the same
    /// check serves a Network's fields, a claim's config and a start-up flag, so only the
    /// caller knows the field path (or flag) to put in front of it. Displayed as the bare
    /// message so every caller words its field errors the same way.
    #[error("{0}")]
    Rule(String),
    /// A start-up setting both binaries share (`--log-level`) is refused, or what it sets up
    /// failed; the message names the flag, its environment variable and the rule.
    #[error("{0}")]
    Setting(String),
    /// Every usable address of a subnet is allocated. A variant of its own, because callers
    /// react differently (report it in the Network's status and keep new pods from scheduling)
    /// than to an invalid Network, and the operator needs the numbers to size the subnet.
    #[error("network {network}: subnet {subnet} has no free address ({in_use} in use of {size})")]
    Exhausted {
        /// The Network's name.
        network: String,
        /// The subnet that ran out.
        subnet: Cidr,
        /// Addresses found taken while looking for a free one.
        in_use: u128,
        /// Usable addresses of the subnet (gateway and exclusions already removed).
        size: u128,
    },
}

/// Result alias over [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes on one line, each cause once: several errors (kube's kubeconfig
/// errors, I/O wrappers) already embed their source in their own text, and printing the chain
/// would repeat it. Both binaries report fatal errors this way.
pub fn chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(text.as_str()) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading /etc/knic/filter.yaml: {0}")]
    struct Embeds(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("loading the filter")]
    struct Wraps(#[source] Embeds);

    #[test]
    fn each_cause_is_named_once() {
        let error = Wraps(Embeds(std::io::Error::other("No such file")));
        assert_eq!(
            chain_text(&error),
            "loading the filter: reading /etc/knic/filter.yaml: No such file"
        );
    }
}
