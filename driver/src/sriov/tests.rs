use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::fixture::{FixtureKernel, vf_address};
use super::writes::{LiveWrites, SysfsWrites};
use super::*;
use crate::inventory::{self, DeviceKind, Filter, Sources};

const E810: &str = include_str!("../../tests/fixtures/sysfs/intel-e810-pf-with-vfs.derived.txt");
const VIRTIO: &str = include_str!("../../tests/fixtures/sysfs/virtio-net.real.txt");
const BOND: &str = include_str!("../../tests/fixtures/sysfs/bond-active-backup.derived.txt");
const PF: &str = "enp162s0f0np0 (0000:a2:00.0)";
const PF_DIR: &str = "sys/devices/pci0000:a2/0000:a2:00.0";

fn tree(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    inventory::fixture::materialise(text, dir.path()).unwrap();
    dir
}

/// The fixture's kernel for the tree at `root`, VFs on `iavf` as on the E810.
fn kernel(root: &Path) -> Arc<FixtureKernel> {
    Arc::new(FixtureKernel::new(root, "iavf").unwrap())
}

fn provisioner(root: &Path, policy: &str, kernel: Arc<FixtureKernel>) -> Provisioner {
    Provisioner::new(root, SriovPolicy::parse(policy).unwrap(), kernel)
        .with_wait(Duration::from_millis(300))
}

fn vfs(root: &Path) -> Vec<(String, Option<String>)> {
    let inv = inventory::discover(
        root,
        &Sources::sysfs_only(),
        &BTreeSet::new(),
        &Filter::default(),
    );
    inv.devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Vf)
        .map(|d| (d.pci_address.clone().unwrap(), d.if_name.clone()))
        .collect()
}

fn texts(errors: &[crate::Error]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

fn numvfs(root: &Path) -> String {
    std::fs::read_to_string(root.join(PF_DIR).join("sriov_numvfs"))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn sriov_grows_a_pf_through_zero_and_discovery_sees_the_new_vfs() {
    let dir = tree(E810);
    let kernel = kernel(dir.path());
    let p = provisioner(
        dir.path(),
        "pools: [{name: fabric, pfNames: [\"enp162s0f0*\"], numVfs: 4}]",
        kernel.clone(),
    );
    let report = p.reconcile(&Held::default(), &BTreeMap::new());
    assert!(
        report.refused.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    assert_eq!(report.changed, vec![PF.to_owned()]);
    let writes: Vec<(PathBuf, String)> = kernel.writes();
    assert_eq!(
        writes,
        vec![
            (PathBuf::from(PF_DIR).join("sriov_numvfs"), "0".to_owned()),
            (PathBuf::from(PF_DIR).join("sriov_numvfs"), "4".to_owned()),
        ]
    );
    assert_eq!(numvfs(dir.path()), "4");
    assert_eq!(
        vfs(dir.path()),
        vec![
            ("0000:a2:01.0".to_owned(), Some("enp162s0f0v0".to_owned())),
            ("0000:a2:01.1".to_owned(), Some("enp162s0f0v1".to_owned())),
            ("0000:a2:01.2".to_owned(), Some("enp162s0f0v2".to_owned())),
            ("0000:a2:01.3".to_owned(), Some("enp162s0f0v3".to_owned())),
        ]
    );
    // Applied already: the next reconcile writes nothing.
    let again = p.reconcile(&Held::default(), &BTreeMap::new());
    assert!(again.changed.is_empty(), "{again:?}");
    assert_eq!(kernel.writes().len(), 2);
}

#[test]
fn sriov_refuses_each_rule_with_the_pf_and_writes_nothing() {
    let cases: [(&str, Held, &[&str], String); 3] = [
        (
            "pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 200}]",
            Held::default(),
            &[],
            format!(
                "SR-IOV PF {PF}: numVfs 200 is over sriov_totalvfs 128, the most this PF supports"
            ),
        ),
        (
            "pools: [{pciIds: [\"8086:159b\"], numVfs: 8}]",
            Held::default(),
            &["enp162s0f0np0"],
            format!(
                "SR-IOV PF {PF}: carries a node default route; changing its VF count can reset \
                 the link and cut the node off, so knic leaves it at 2 VFs"
            ),
        ),
        (
            "pools: [{pciAddresses: [\"0000:a2:00.0\"], numVfs: 1}]",
            Held {
                by_pf: BTreeMap::from([(
                    "0000:a2:00.0".to_owned(),
                    BTreeSet::from(["ns/a".to_owned(), "ns/b".to_owned()]),
                )]),
                vfs: BTreeSet::from(["0000:a2:01.0".to_owned()]),
            },
            &[],
            format!(
                "SR-IOV PF {PF}: numVfs 1 wanted, but it or its VFs are prepared for claims \
                 ns/a, ns/b; changing the count goes through 0 and would destroy them, so it \
                 stays at 2 until they are released"
            ),
        ),
    ];
    for (policy, held, routes, want) in cases {
        let dir = tree(E810);
        let kernel = kernel(dir.path());
        let routes: BTreeSet<String> = routes.iter().map(|r| (*r).to_owned()).collect();
        let routes = route_bound(dir.path(), &routes);
        let report = provisioner(dir.path(), policy, kernel.clone()).reconcile(&held, &routes);
        assert_eq!(texts(&report.refused), vec![want], "{policy}");
        assert!(
            kernel.writes().is_empty(),
            "{policy}: {:?}",
            kernel.writes()
        );
        assert_eq!(numvfs(dir.path()), "2");
    }
}

#[test]
fn sriov_refuses_a_pf_that_is_not_sriov_capable() {
    let dir = tree(VIRTIO);
    let kernel = kernel(dir.path());
    let sysfs = crate::inventory::Sysfs::new(dir.path());
    let pf = &pf::read(&sysfs)[0];
    let policy = format!(
        "pools: [{{pciAddresses: [\"{}\"], numVfs: 2}}]",
        pf.pci_address
    );
    let report = provisioner(dir.path(), &policy, kernel.clone())
        .reconcile(&Held::default(), &BTreeMap::new());
    assert_eq!(
        texts(&report.refused),
        vec![format!(
            "SR-IOV PF {}: not SR-IOV capable (no sriov_totalvfs, or it is 0); numVfs cannot be set",
            pf.label()
        )]
    );
    assert!(kernel.writes().is_empty());
}

#[test]
fn sriov_one_entry_per_pf_and_unmatched_entries_are_reported() {
    let dir = tree(E810);
    let kernel = kernel(dir.path());
    let report = provisioner(
        dir.path(),
        "pools: [{name: a, pfNames: [\"enp*\"], numVfs: 2}, {name: b, pciIds: [\"8086:159b\"], numVfs: 6}, {name: c, pfNames: [\"ib*\"], numVfs: 1}]",
        kernel.clone(),
    )
    .reconcile(&Held::default(), &BTreeMap::new());
    assert_eq!(
        texts(&report.refused),
        vec![format!(
            "SR-IOV PF {PF}: selected by policy entries a and b; one entry per PF (the first one applies)"
        )]
    );
    assert_eq!(report.unmatched, vec!["c".to_owned()]);
    // Entry a wants what is there: nothing is written.
    assert!(kernel.writes().is_empty());
}

#[test]
fn sriov_a_held_pf_may_still_be_checked_when_its_count_is_right() {
    let dir = tree(E810);
    let kernel = kernel(dir.path());
    let held = Held {
        by_pf: BTreeMap::from([(
            "0000:a2:00.0".to_owned(),
            BTreeSet::from(["ns/a".to_owned()]),
        )]),
        vfs: BTreeSet::from(["0000:a2:01.0".to_owned()]),
    };
    let report = provisioner(
        dir.path(),
        "pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 2}]",
        kernel.clone(),
    )
    .reconcile(&held, &BTreeMap::new());
    assert!(
        report.refused.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    assert!(kernel.writes().is_empty());
}

#[test]
fn sriov_vfs_that_never_appear_fail_bounded_with_the_reason() {
    let dir = tree(E810);
    let kernel = Arc::new(FixtureKernel::new(dir.path(), "iavf").unwrap().stalling());
    let started = std::time::Instant::now();
    let report = provisioner(
        dir.path(),
        "pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 3}]",
        kernel,
    )
    .reconcile(&Held::default(), &BTreeMap::new());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        texts(&report.failed),
        vec![format!(
            "SR-IOV PF {PF}: 3 VFs requested, 0 appeared within 300 ms (missing virtfn0, virtfn1, \
             virtfn2); the PF's driver may have refused them (see the kernel log)"
        )]
    );
}

#[test]
fn sriov_kernel_refusals_reach_the_report() {
    let dir = tree(E810);
    // A count the fixture's kernel refuses like the real one (EBUSY between non-zero counts)
    // shows through a writer that skips the step through 0.
    struct Direct(FixtureKernel);
    impl SysfsWrites for Direct {
        fn write(
            &self,
            sysfs: &crate::inventory::Sysfs,
            rel: &Path,
            value: &str,
        ) -> std::io::Result<()> {
            if value == "0" {
                return Ok(());
            }
            self.0.write(sysfs, rel, value)
        }
    }
    let report = Provisioner::new(
        dir.path(),
        SriovPolicy::parse("pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 5}]").unwrap(),
        Arc::new(Direct(FixtureKernel::new(dir.path(), "iavf").unwrap())),
    )
    .with_wait(Duration::from_millis(100))
    .reconcile(&Held::default(), &BTreeMap::new());
    let failed = texts(&report.failed);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].starts_with(&format!("SR-IOV PF {PF}: wrote 0 to sriov_numvfs to change 2 VFs to 5, but VFs remain after 100 ms")),
        "{failed:?}"
    );
}

#[test]
fn sriov_vfio_pools_bind_vfs_to_vfio_pci_and_back() {
    let dir = tree(E810);
    let kernel = kernel(dir.path());
    let vfio = "pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 3, vfDriver: vfio-pci}]";
    // vfio-pci not loaded: refused with the reason, VFs keep their driver.
    let report =
        provisioner(dir.path(), vfio, kernel.clone()).reconcile(&Held::default(), &BTreeMap::new());
    assert_eq!(
        texts(&report.failed),
        vec![format!(
            "SR-IOV PF {PF}: vfDriver vfio-pci: the vfio-pci driver is not loaded (modprobe \
             vfio-pci); nothing was changed"
        )]
    );
    assert!(kernel.writes().is_empty(), "{:?}", kernel.writes());
    std::fs::create_dir_all(dir.path().join("sys/bus/pci/drivers/vfio-pci")).unwrap();
    let netdev = "pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 3}]";
    provisioner(dir.path(), netdev, kernel.clone()).reconcile(&Held::default(), &BTreeMap::new());
    let held = Held {
        by_pf: BTreeMap::from([(
            "0000:a2:00.0".to_owned(),
            BTreeSet::from(["ns/a".to_owned()]),
        )]),
        vfs: BTreeSet::from(["0000:a2:01.2".to_owned()]),
    };
    let report = provisioner(dir.path(), vfio, kernel.clone()).reconcile(&held, &BTreeMap::new());
    assert!(report.failed.is_empty(), "{report:?}");
    let sysfs = crate::inventory::Sysfs::new(dir.path());
    let driver =
        |vf: &str| sysfs.link_name(&Path::new("sys/bus/pci/devices").join(vf).join("driver"));
    assert_eq!(driver("0000:a2:01.0").as_deref(), Some("vfio-pci"));
    assert_eq!(driver("0000:a2:01.1").as_deref(), Some("vfio-pci"));
    // A held VF is the claim's business.
    assert_eq!(driver("0000:a2:01.2").as_deref(), Some("iavf"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join(PF_DIR).join("sriov_drivers_autoprobe"))
            .unwrap()
            .trim(),
        "1",
        "autoprobe is restored after binding"
    );
    // VFs on vfio-pci have no netdev; discovery still offers them.
    let found = vfs(dir.path());
    assert_eq!(found.len(), 3);
    assert_eq!(found[0], ("0000:a2:01.0".to_owned(), None));
    // Back to netdev: the override knic set is cleared and the VFs get their driver again.
    let report =
        provisioner(dir.path(), netdev, kernel).reconcile(&Held::default(), &BTreeMap::new());
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(driver("0000:a2:01.0").as_deref(), Some("iavf"));
    assert_eq!(vfs(dir.path())[0].1.as_deref(), Some("enp162s0f0v0"));
}

#[test]
fn sriov_held_vfs_are_read_from_the_checkpoint() {
    use crate::claims::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
    let attr = |s: &str| DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    };
    let device = |pf: Option<&str>, address: &str| PreparedDevice {
        request: "r".into(),
        pool: "node".into(),
        device: address.replace([':', '.'], "-"),
        share_id: None,
        consumed: Default::default(),
        published: Some(Device {
            name: "d".into(),
            attributes: Some(
                pf.map(|pf| ("pfPciAddress".to_owned(), attr(pf)))
                    .into_iter()
                    .chain([("pciAddress".to_owned(), attr(address))])
                    .collect(),
            ),
            ..Default::default()
        }),
    };
    let mut checkpoint = Checkpoint::default();
    checkpoint.claims.insert(
        "uid".into(),
        PreparedClaim {
            network_label: None,
            namespace: "ns".into(),
            name: "a".into(),
            uid: "uid".into(),
            pod_uid: String::new(),
            pod_name: String::new(),
            devices: vec![
                device(Some("0000:a2:00.0"), "0000:a2:01.0"),
                device(None, "0000:03:00.0"),
            ],
            configs: Vec::new(),
            prepared_at: 0,
            attachments: Vec::new(),
            allocations: Vec::new(),
            functions: Vec::new(),
        },
    );
    let held = Held::from_checkpoint(&checkpoint);
    assert_eq!(
        held.by_pf,
        BTreeMap::from([(
            "0000:a2:00.0".to_owned(),
            BTreeSet::from(["ns/a".to_owned()])
        )])
    );
    assert_eq!(held.vfs, BTreeSet::from(["0000:a2:01.0".to_owned()]));
}

#[test]
fn sriov_vf_addresses_follow_offset_and_stride_across_buses() {
    assert_eq!(
        vf_address("0000:a2:00.0", 8).as_deref(),
        Some("0000:a2:01.0")
    );
    assert_eq!(
        vf_address("0000:a2:00.1", 8 + 3).as_deref(),
        Some("0000:a2:01.4")
    );
    assert_eq!(
        vf_address("0000:3b:00.0", 256).as_deref(),
        Some("0000:3c:00.0")
    );
    assert_eq!(vf_address("0000:ff:ff.7", 1), None);
}

#[test]
fn sriov_live_writes_drive_a_served_fixture_tree() {
    // The path a driver process takes: plain file writes, answered by the fixture kernel
    // watching the tree from another thread.
    let dir = tree(E810);
    std::fs::create_dir_all(dir.path().join("sys/bus/pci/drivers/vfio-pci")).unwrap();
    let serving = kernel(dir.path()).serve().unwrap();
    let live = |policy: &str| {
        Provisioner::new(
            dir.path(),
            SriovPolicy::parse(policy).unwrap(),
            Arc::new(LiveWrites),
        )
        .with_wait(Duration::from_secs(5))
        .reconcile(&Held::default(), &BTreeMap::new())
    };
    let report = live("pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 4}]");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(numvfs(dir.path()), "4");
    assert_eq!(vfs(dir.path()).len(), 4);
    let report = live("pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 4, vfDriver: vfio-pci}]");
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(vfs(dir.path()).iter().all(|(_, netdev)| netdev.is_none()));
    let report = live("pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 0}]");
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(vfs(dir.path()).is_empty());
    drop(serving);
}

#[test]
fn sriov_live_writes_refuse_what_is_not_an_attribute_file() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = crate::inventory::Sysfs::new(dir.path());
    std::fs::create_dir_all(dir.path().join("sys/x")).unwrap();
    nix::unistd::mkfifo(
        &dir.path().join("sys/x/fifo"),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    let fifo = LiveWrites
        .write(&sysfs, Path::new("sys/x/fifo"), "1")
        .unwrap_err();
    assert_eq!(
        fifo.to_string(),
        format!(
            "writing {}: not a regular file (it is a FIFO)",
            dir.path().join("sys/x/fifo").display()
        )
    );
    let missing = LiveWrites
        .write(&sysfs, Path::new("sys/x/none"), "1")
        .unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    assert!(
        !dir.path().join("sys/x/none").exists(),
        "never creates a file"
    );
}

#[test]
fn sriov_pools_label_their_pfs_and_vfs_even_when_refused() {
    let dir = tree(E810);
    let kernel = kernel(dir.path());
    let p = provisioner(
        dir.path(),
        "pools: [{name: fabric, pfNames: [\"enp162s0f0np0\"], numVfs: 200}]",
        kernel,
    );
    let report = p.reconcile(&Held::default(), &BTreeMap::new());
    assert_eq!(report.refused.len(), 1);
    let mut inv = inventory::discover(
        dir.path(),
        &Sources::sysfs_only(),
        &BTreeSet::new(),
        &Filter::default(),
    );
    p.label(&mut inv);
    let pools: Vec<(String, Option<String>)> = inv
        .devices
        .iter()
        .map(|d| {
            (
                d.name.clone(),
                d.attr(ATTR_POOL)
                    .and_then(|a| a.as_str())
                    .map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        pools,
        vec![
            ("pci-0000-a2-00-0".to_owned(), Some("fabric".to_owned())),
            ("pci-0000-a2-01-0".to_owned(), Some("fabric".to_owned())),
            ("pci-0000-a2-01-1".to_owned(), Some("fabric".to_owned())),
        ]
    );
}

#[test]
fn sriov_a_pf_enslaved_to_the_default_route_bond_is_left_alone() {
    let dir = tree(BOND);
    // Make the bond's X710 ports SR-IOV capable.
    let port = "sys/devices/pci0000:17/0000:17:02.0/0000:18:00.0";
    std::fs::write(dir.path().join(port).join("sriov_totalvfs"), "64\n").unwrap();
    std::fs::write(dir.path().join(port).join("sriov_numvfs"), "0\n").unwrap();
    let kernel = kernel(dir.path());
    let routes = route_bound(dir.path(), &BTreeSet::from(["bond0".to_owned()]));
    let report = provisioner(
        dir.path(),
        "pools: [{pfNames: [ens1f0], numVfs: 4}]",
        kernel.clone(),
    )
    .reconcile(&Held::default(), &routes);
    let refused = texts(&report.refused);
    assert_eq!(refused.len(), 1, "{report:?}");
    assert!(
        refused[0]
            .starts_with("SR-IOV PF ens1f0 (0000:18:00.0): slave, port or lower device of bond0")
            && refused[0].ends_with("so knic leaves it at 0 VFs"),
        "{refused:?}"
    );
    assert!(kernel.writes().is_empty(), "{:?}", kernel.writes());
}

#[test]
fn sriov_a_pf_prepared_whole_is_held_even_without_vfs() {
    let dir = tree(E810);
    let kernel = kernel(dir.path());
    // Down to no VFs first, then the PF itself is prepared for a claim.
    provisioner(
        dir.path(),
        "pools: [{pfNames: [enp162s0f0np0], numVfs: 0}]",
        kernel.clone(),
    )
    .reconcile(&Held::default(), &BTreeMap::new());
    assert_eq!(numvfs(dir.path()), "0");
    let held = Held {
        by_pf: BTreeMap::from([(
            "0000:a2:00.0".to_owned(),
            BTreeSet::from(["ns/pf".to_owned()]),
        )]),
        vfs: BTreeSet::new(),
    };
    let before = kernel.writes().len();
    let report = provisioner(
        dir.path(),
        "pools: [{pfNames: [enp162s0f0np0], numVfs: 4}]",
        kernel.clone(),
    )
    .reconcile(&held, &BTreeMap::new());
    assert_eq!(
        texts(&report.refused),
        vec![format!(
            "SR-IOV PF {PF}: numVfs 4 wanted, but it or its VFs are prepared for claims ns/pf; \
             changing the count goes through 0 and would destroy them, so it stays at 0 until \
             they are released"
        )]
    );
    assert_eq!(kernel.writes().len(), before);
}

#[test]
fn sriov_autoprobe_left_off_by_a_crash_is_restored_for_a_netdev_pool() {
    let dir = tree(E810);
    std::fs::write(
        dir.path().join(PF_DIR).join("sriov_drivers_autoprobe"),
        "0\n",
    )
    .unwrap();
    let kernel = kernel(dir.path());
    let report = provisioner(
        dir.path(),
        "pools: [{pfNames: [enp162s0f0np0], numVfs: 2}]",
        kernel,
    )
    .reconcile(&Held::default(), &BTreeMap::new());
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(PF_DIR).join("sriov_drivers_autoprobe"))
            .unwrap()
            .trim(),
        "1"
    );
}

#[tokio::test]
async fn sriov_provisioning_holds_the_checkpoint_from_snapshot_to_the_last_write() {
    // A prepare records and binds under the checkpoint lock. Provisioning holds the same lock
    // from its snapshot of what claims hold until its writes are done, so no prepare can
    // commit in between (and see its VF destroyed or rebound by a stale decision).
    let dir = tree(E810);
    let store = Arc::new(crate::claims::ClaimStore::open(
        crate::claims::checkpoint::CheckpointStore::new(dir.path().join("plugin")),
    ));
    // VFs that never appear keep the reconcile in its (bounded) wait for 300 ms.
    let stalling = Arc::new(FixtureKernel::new(dir.path(), "iavf").unwrap().stalling());
    let discovery = crate::slices::rescan::Discovery {
        root: dir.path().to_path_buf(),
        filter: Filter::default(),
        netlink: false,
        provisioner: Some(Arc::new(provisioner(
            dir.path(),
            "pools: [{pfNames: [enp162s0f0np0], numVfs: 3}]",
            stalling,
        ))),
        sharing: Default::default(),
        overlay: None,
    };
    let task = {
        let store = store.clone();
        tokio::spawn(async move { discovery.provision(&store).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let locked = store.lock().await;
    let waited = started.elapsed();
    assert!(
        task.is_finished(),
        "a prepare got the checkpoint while provisioning wrote"
    );
    assert!(
        waited >= Duration::from_millis(100),
        "waited only {waited:?}"
    );
    drop(locked);
    let report = task.await.unwrap().expect("a report");
    assert_eq!(report.failed.len(), 1, "{report:?}");
}

#[test]
fn sriov_only_a_count_change_needs_the_default_routes() {
    let dir = tree(E810);
    let p = |policy: &str| provisioner(dir.path(), policy, kernel(dir.path()));
    assert!(
        !p("pools: [{pfNames: [enp162s0f0np0], numVfs: 2}]").wants_count_change(&Held::default())
    );
    assert!(
        p("pools: [{pfNames: [enp162s0f0np0], numVfs: 4}]").wants_count_change(&Held::default())
    );
}
