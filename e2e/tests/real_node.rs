//! Real twins on a real node (only with `KNIC_E2E_KUBECONFIG`, as root): the real
//! `knic-driver` registered with the cluster's unmodified kubelet and its containerd's NRI
//! socket (see `knic_e2e::real_node`), real pods through the real scheduler, and:
//!
//! * `real/network_template_and_exhaustion` — the real `knic-controller` turns a Network into a
//!   template, pods get its addresses, and a full subnet keeps a pod Pending until an address
//!   is freed (`real_node/networks.rs`);
//! * `real/stable_address_across_pod_recreation` — a real StatefulSet pod deleted and
//!   re-created keeps its address on a Network with a grace period, and the real controller
//!   releases the hold once the StatefulSet is scaled to 0 (`real_node/stable.rs`);
//! * `real/fail_closed_*` — the driver frozen (SIGSTOP) before prepare and between prepare and
//!   the sandbox hook, and running without the runtime's NRI socket: no container runs without
//!   its interface, and the pod comes up once the driver can attach again
//!   (`real_node/fail_closed.rs`);
//! * `real/device_metadata_in_the_container` — KEP-5304 device metadata: the app containers of a
//!   pod with a claim by name and of one with a templated claim read the `DeviceMetadata` file
//!   at the KEP's path through containerd's CDI mount, matching `ip` in their namespace
//!   (`real_node/metadata.rs`);
//! * `real/kill9_*` — the driver aborted at failpoints mid-attach and mid-detach, restarted,
//!   and the node converges (`real_node/crash.rs`).
//!
//! Each trial has its own `knic-e2e-…` namespace, DeviceClass, Network and `knt-…` links, and
//! removes them whatever happens. Without a real cluster, root, or the binaries, the trials
//! are reported ignored with the reason printed.

use std::path::PathBuf;

use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::trial;

#[path = "real_node/crash.rs"]
mod crash;
#[path = "real_node/fail_closed.rs"]
mod fail_closed;
#[path = "real_node/gate.rs"]
mod gate;
#[path = "real_node/metadata.rs"]
mod metadata;
#[path = "real_node/networks.rs"]
mod networks;
#[path = "real_node/stable.rs"]
mod stable;

/// Why the real twins cannot run here, if they cannot.
fn missing(real: &Option<RealCluster>) -> Option<String> {
    if real.is_none() {
        // `real_cluster` printed the reason.
        return Some(String::new());
    }
    if !nix::unistd::geteuid().is_root() {
        return Some(
            "the real node twins need root (links, namespaces, the kubelet's directories)".into(),
        );
    }
    knic_e2e::driver::binary().err().map(|e| format!("{e:#}"))
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let real = knic_e2e::harness::real_cluster();
    let missing = missing(&real);
    if let Some(reason) = missing.as_deref().filter(|r| !r.is_empty()) {
        eprintln!("skipped: real/*: {reason}");
    }
    let controller = knic_e2e::harness::controller_binary();
    if let (None, Err(reason)) = (&missing, &controller) {
        eprintln!("skipped: real/network_template_and_exhaustion: {reason}");
    }
    let ignored = missing.is_some();
    let cluster = move || {
        real.clone()
            .ok_or_else(|| anyhow::anyhow!("no real cluster (the trial should be ignored)"))
    };
    let controller_bin: PathBuf = controller.clone().unwrap_or_default();
    let stable_bin = controller_bin.clone();
    let trials = vec![
        trial(
            "real/network_template_and_exhaustion".into(),
            ignored || controller.is_err(),
            {
                let cluster = cluster.clone();
                move || async move {
                    networks::network_template_and_exhaustion(cluster()?, controller_bin).await
                }
            },
        ),
        trial(
            "real/stable_address_across_pod_recreation".into(),
            ignored || controller.is_err(),
            {
                let cluster = cluster.clone();
                move || async move {
                    stable::stable_address_across_pod_recreation(cluster()?, stable_bin).await
                }
            },
        ),
        trial(
            "real/fail_closed_frozen_at_sandbox_start".into(),
            ignored,
            {
                let cluster = cluster.clone();
                move || async move { fail_closed::frozen_at_sandbox_start(cluster()?).await }
            },
        ),
        trial("real/fail_closed_frozen_before_prepare".into(), ignored, {
            let cluster = cluster.clone();
            move || async move { fail_closed::frozen_before_prepare(cluster()?).await }
        }),
        trial(
            "real/fail_closed_prepare_refused_without_nri".into(),
            ignored,
            {
                let cluster = cluster.clone();
                move || async move { fail_closed::prepare_refused_without_nri(cluster()?).await }
            },
        ),
        trial("real/kill9_mid_attach_after_checkpoint".into(), ignored, {
            let cluster = cluster.clone();
            move || async move { crash::mid_attach(cluster()?, "attach:after-checkpoint").await }
        }),
        trial("real/kill9_mid_attach_after_move".into(), ignored, {
            let cluster = cluster.clone();
            move || async move { crash::mid_attach(cluster()?, "attach:after-move").await }
        }),
        trial("real/device_metadata_in_the_container".into(), ignored, {
            let cluster = cluster.clone();
            move || async move { metadata::device_metadata_in_the_container(cluster()?).await }
        }),
        trial("real/kill9_mid_detach_after_move".into(), ignored, {
            let cluster = cluster.clone();
            move || async move { crash::mid_detach(cluster()?).await }
        }),
    ];
    knic_e2e::harness::run_trials(&args, trials);
}
