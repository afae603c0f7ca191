//! SR-IOV and PCI function handling beyond netdevs: binding functions to `vfio-pci` for
//! DPDK/KubeVirt pods ([`vfio`], with a simulated kernel for fixture trees in
//! [`fixture_kernel`]) and the RDMA side of a function ([`rdma`]: its character devices and
//! the RDMA netlink messages that move an RDMA device between network namespaces).

pub mod fixture_kernel;
pub mod rdma;
pub mod vfio;
