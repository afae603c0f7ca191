//! Overlay networks across nodes (issue 26): which forwarding entries each of this node's VXLAN
//! segments must hold, computed from what the cluster knows of every overlay pod (its VNI, MAC
//! and node's tunnel endpoint). Pure, so the rules are tested without a kernel or an API; the
//! sync loop applies the difference.

pub mod fdb;
