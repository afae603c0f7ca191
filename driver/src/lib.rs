//! knic's per-node driver.
//!
//! Modules are grouped along a pod's path (ARCHITECTURE.md has the table): [`kubelet`] speaks
//! the kubelet's plugin protocols, [`claims`] decides what preparing a claim means and remembers
//! it durably, [`pods`] moves interfaces in and out through [`netns`] when [`nri`] says a
//! sandbox starts or stops; [`inventory`] finds devices and [`slices`] publishes them; every
//! API object is read or written in [`api`]. The outside world
//! (directories, sockets, the API client) always comes in as a parameter, so every part runs in
//! tests against temporary directories and fakes.

pub mod api;
pub mod bounded;
pub mod cdi;
pub mod claims;
pub mod cni;
pub mod dhcp;
pub mod error;
pub mod events;
pub mod failpoint;
pub mod http;
pub mod inventory;
pub mod kni;
pub mod kubelet;
pub mod metrics;
pub mod netns;
pub mod nri;
pub mod overlay;
pub mod pods;
pub mod sharing;
pub mod slices;
pub mod sriov;
pub mod tidy;
pub mod watches;
pub mod wiring;

pub use error::{Error, Result};

/// The future every port trait returns (claim source, address book, status sink, release):
/// one style, usable behind `dyn`, so no wiring is generic over its adapters.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Kubernetes' subdomain rule (node, pool and driver names), from the shared core.
pub use knic_proto::names::check_dns_subdomain;
