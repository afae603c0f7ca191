//! knic's cluster controller.
//!
//! The `Network` reconciler, generated ResourceClaimTemplates and IPAM arrive with the
//! networks-as-a-service work; this crate exists now so the workspace layout is the final one
//! and the controller shares the driver's contracts from `knic-proto` from day one.

/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Network or generated object that breaks a rule; the message names field and rule.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias so every fallible function names the crate's one error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The field manager the controller's server-side applies use, so its fields never fight the
/// driver's.
pub const FIELD_MANAGER: &str = "knic-controller";

#[cfg(test)]
mod tests {
    #[test]
    fn field_manager_differs_from_driver() {
        assert_ne!(super::FIELD_MANAGER, knic_proto::DRIVER_NAME);
    }
}
