//! The controller's API client: the one adapter both binaries share (see `knic_proto::client`):
//! watches paced, every request bounded in time and repeated by the retry policy.

pub use knic_proto::client::{connect, paced, with_policy};
