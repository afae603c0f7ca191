//! The driver's one door to the Kubernetes API: every adapter that reads or writes API objects
//! lives here, behind the ports the domain modules define ([`crate::claims::ClaimSource`],
//! [`crate::pods::StatusSink`], [`crate::claims::ipam::AddressBook`]), so the domain is tested with
//! in-memory doubles and this is the only place that knows the API's shapes and quirks.

pub mod addresses;
pub mod catalog;
pub mod claims;
pub mod client;
pub mod events;
pub mod networks;
pub mod nodenetworks;
pub mod overlay;
pub mod slices;
pub mod status;

pub use addresses::KubeAddressBook;
pub use claims::KubeClaims;
pub use status::{KubeStatus, status_patch};
