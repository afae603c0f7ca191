//! End-to-end test support for knic: a test kubelet, the driver as a real process, and the API
//! the tests run against (an in-process fake in CI, a real cluster when `KNIC_E2E_KUBECONFIG`
//! is set).

pub mod admission;
pub mod bench;
pub mod cluster;
pub mod driver;
pub mod fakeapi;
pub mod fuzz;
pub mod gates;
pub mod grpcwire;
pub mod harness;
pub mod helm;
pub mod image;
pub mod kni;
pub mod kubelet;
pub mod nodeauth;
pub mod real_node;
