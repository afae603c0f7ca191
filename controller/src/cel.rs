//! The CEL knic evaluates, from the shared core: the controller counts the nodes offering a
//! free matching device with the same evaluator the driver uses for its own node (see
//! `knic_proto::cel`), and the admission-policy expressions are checked with its `policy`.

pub use knic_proto::cel::*;
