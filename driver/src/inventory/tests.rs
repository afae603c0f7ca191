//! Discovery against every fixture in `driver/tests/fixtures/sysfs/`, value by value, plus
//! variants derived from them (vfio-bound VF, representors, default route on a bond, …).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::fixture::{ethtool_capture, materialise};
use super::pciids::{PciDb, PciNames};
use super::*;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs")
}

fn fixture_text(name: &str) -> String {
    fs::read_to_string(fixture_dir().join(name)).unwrap()
}

/// A fixture materialised in a temp dir, with its fault table.
struct Tree {
    dir: tempfile::TempDir,
    faults: BTreeMap<PathBuf, i32>,
}

impl Tree {
    fn load(name: &str) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let faults = materialise(&fixture_text(name), dir.path()).unwrap();
        Tree { dir, faults }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn sysfs(&self) -> Sysfs {
        Sysfs::new(self.root()).with_faults(self.faults.clone())
    }

    fn discover(&self, sources: &Sources, routes: &[&str], filter: &Filter) -> Inventory {
        let routes: BTreeSet<String> = routes.iter().map(|r| (*r).to_owned()).collect();
        discover_in(&self.sysfs(), sources, &routes, filter)
    }

    fn discover_default(&self) -> Inventory {
        self.discover(&Sources::default(), &[], &Filter::default())
    }

    fn write(&self, rel: &str, value: &str) {
        let path = self.root().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, format!("{value}\n")).unwrap();
    }

    fn link(&self, rel: &str, target: &str) {
        let path = self.root().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let _ = fs::remove_file(&path);
        symlink(target, path).unwrap();
    }

    fn remove(&self, rel: &str) {
        let path = self.root().join(rel);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(path).unwrap(),
            Ok(_) => fs::remove_file(path).unwrap(),
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }
}

fn s(v: &str) -> AttrValue {
    AttrValue::Str(v.to_owned())
}
fn i(v: i64) -> AttrValue {
    AttrValue::Int(v)
}
fn b(v: bool) -> AttrValue {
    AttrValue::Bool(v)
}

fn attrs(pairs: &[(&str, AttrValue)]) -> BTreeMap<String, AttrValue> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn names(inv: &Inventory) -> Vec<&str> {
    inv.devices.iter().map(|d| d.name.as_str()).collect()
}

fn excluded(inv: &Inventory) -> Vec<(&str, &str)> {
    inv.excluded
        .iter()
        .map(|e| (e.device.name.as_str(), e.reason.as_str()))
        .collect()
}

fn device<'a>(inv: &'a Inventory, name: &str) -> &'a NetDevice {
    inv.device(name)
        .unwrap_or_else(|| panic!("{name} not offered; inventory: {inv:#?}"))
}

/// Asserts the whole attribute map, showing a readable diff on failure.
fn assert_attrs(dev: &NetDevice, want: &[(&str, AttrValue)]) {
    let want = attrs(want);
    for (k, v) in &want {
        assert_eq!(
            dev.attributes.get(k),
            Some(v),
            "{}: attribute {k}",
            dev.name
        );
    }
    for k in dev.attributes.keys() {
        assert!(
            want.contains_key(k),
            "{}: unexpected attribute {k}",
            dev.name
        );
    }
    assert!(dev.attributes.len() <= MAX_ATTRIBUTES);
    for (k, v) in &dev.attributes {
        if let AttrValue::Str(v) = v {
            assert!(v.len() <= MAX_STRING_LEN, "{}: {k} too long", dev.name);
        }
    }
    assert!(super::names::is_dns_label(&dev.name), "{}", dev.name);
}

fn pci_common(bdf: &str, root: &str) -> Vec<(&'static str, AttrValue)> {
    vec![
        ("pciAddress", s(bdf)),
        (ATTR_PCI_BUS_ID, s(bdf)),
        (ATTR_PCIE_ROOT, s(root)),
    ]
}

fn with(
    mut base: Vec<(&'static str, AttrValue)>,
    more: &[(&'static str, AttrValue)],
) -> Vec<(&'static str, AttrValue)> {
    base.extend(more.iter().cloned());
    base
}

// ---------------------------------------------------------------------------------------------
// intel-e810-xxv-pf.real.txt

#[test]
fn inventory_e810_real_pf() {
    let tree = Tree::load("intel-e810-xxv-pf.real.txt");
    let sources = Sources {
        devlink: Box::new(FakeDevlink::default().with("0000:a2:00.0", EswitchMode::Legacy)),
        ..Sources::default()
    };
    let inv = tree.discover(&sources, &[], &Filter::default());
    assert_eq!(names(&inv), vec!["pci-0000-a2-00-0"]);
    assert!(inv.excluded.is_empty());
    let pf = device(&inv, "pci-0000-a2-00-0");
    assert_eq!(pf.kind, DeviceKind::Pf);
    assert_eq!(pf.if_name.as_deref(), Some("enp162s0f0np0"));
    assert_eq!(pf.pci_address.as_deref(), Some("0000:a2:00.0"));
    assert_attrs(
        pf,
        &with(
            pci_common("0000:a2:00.0", "pci0000:a2"),
            &[
                ("kind", s("pf")),
                ("pciVendor", s("8086")),
                ("pciDevice", s("159b")),
                ("pciSubsystem", s("8086:0003")),
                ("vendorName", s("Intel Corporation")),
                ("deviceName", s("Ethernet Controller E810-XXV for SFP")),
                // The capture's driver link has 8 "../" (relocation artefact): clamped, and
                // only its last component counts.
                ("driver", s("ice")),
                ("numaNode", i(1)),
                ("sriov", b(true)),
                ("sriovTotalVfs", i(128)),
                ("sriovNumVfs", i(0)),
                ("eswitchMode", s("legacy")),
                ("rdma", b(false)),
                ("ifName", s("enp162s0f0np0")),
                ("mac", s("30:3e:a7:01:1a:5a")),
                ("mtu", i(1500)),
                ("state", s("down")),
                // speed is empty in the capture: unknown, left out.
            ],
        ),
    );
}

#[test]
fn inventory_e810_real_pf_speed_read_errors_are_unknown() {
    let tree = Tree::load("intel-e810-xxv-pf.real.txt");
    let net = "sys/devices/pci0000:a2/0000:a2:00.0/net/enp162s0f0np0";
    tree.write(&format!("{net}/speed"), "25000");
    let inv = tree.discover_default();
    assert_eq!(
        device(&inv, "pci-0000-a2-00-0").attr("speed"),
        Some(&i(25000))
    );
    // EINVAL (admin down) and "-1" (no carrier) both mean unknown.
    let faulty = Sysfs::new(tree.root()).with_fault(format!("{net}/speed"), 22);
    let inv = discover_in(
        &faulty,
        &Sources::default(),
        &BTreeSet::new(),
        &Filter::default(),
    );
    assert_eq!(device(&inv, "pci-0000-a2-00-0").attr("speed"), None);
    tree.write(&format!("{net}/speed"), "-1");
    let inv = tree.discover_default();
    assert_eq!(device(&inv, "pci-0000-a2-00-0").attr("speed"), None);
    // Even class/net, vendor and the bus link failing does not fail discovery. (The vendor is
    // in `uevent` too, which is read first: both fail here.)
    let faulty = Sysfs::new(tree.root())
        .with_fault("sys/devices/pci0000:a2/0000:a2:00.0/uevent", 5)
        .with_fault("sys/devices/pci0000:a2/0000:a2:00.0/vendor", 5)
        .with_fault("sys/devices/pci0000:a2/0000:a2:00.0/numa_node", 22);
    let inv = discover_in(
        &faulty,
        &Sources::default(),
        &BTreeSet::new(),
        &Filter::default(),
    );
    let pf = device(&inv, "pci-0000-a2-00-0");
    assert_eq!(pf.attr("pciVendor"), None);
    assert_eq!(pf.attr("vendorName"), None);
    assert_eq!(pf.attr("deviceName"), None);
    assert_eq!(pf.attr("numaNode"), None);
    assert_eq!(pf.attr("pciDevice"), Some(&s("159b")));
}

// ---------------------------------------------------------------------------------------------
// intel-e810-pf-with-vfs.derived.txt

fn e810_vf(bdf: &str, if_name: &str, index: i64, mac: &str) -> Vec<(&'static str, AttrValue)> {
    let mut v = with(
        pci_common(bdf, "pci0000:a2"),
        &[
            ("kind", s("vf")),
            ("pciVendor", s("8086")),
            ("pciDevice", s("1889")),
            ("pciSubsystem", s("8086:0000")),
            ("vendorName", s("Intel Corporation")),
            ("deviceName", s("Ethernet Adaptive Virtual Function")),
            ("driver", s("iavf")),
            ("numaNode", i(1)),
            ("sriov", b(false)),
            ("pfPciAddress", s("0000:a2:00.0")),
            ("pfName", s("enp162s0f0np0")),
            ("vfIndex", i(index)),
            ("rdma", b(false)),
            ("mac", s(mac)),
        ],
    );
    if !if_name.is_empty() {
        v.extend([
            ("ifName", s(if_name)),
            ("mtu", i(1500)),
            ("state", s("up")),
            ("speed", i(25000)),
        ]);
    }
    v
}

#[test]
fn inventory_e810_pf_with_vfs() {
    let tree = Tree::load("intel-e810-pf-with-vfs.derived.txt");
    let inv = tree.discover_default();
    assert_eq!(
        names(&inv),
        vec!["pci-0000-a2-00-0", "pci-0000-a2-01-0", "pci-0000-a2-01-1"]
    );
    assert!(inv.excluded.is_empty());
    let pf = device(&inv, "pci-0000-a2-00-0");
    assert_attrs(
        pf,
        &with(
            pci_common("0000:a2:00.0", "pci0000:a2"),
            &[
                ("kind", s("pf")),
                ("pciVendor", s("8086")),
                ("pciDevice", s("159b")),
                ("pciSubsystem", s("8086:0003")),
                ("vendorName", s("Intel Corporation")),
                ("deviceName", s("Ethernet Controller E810-XXV for SFP")),
                ("driver", s("ice")),
                ("numaNode", i(1)),
                ("sriov", b(true)),
                ("sriovTotalVfs", i(128)),
                ("sriovNumVfs", i(2)),
                ("rdma", b(false)),
                ("ifName", s("enp162s0f0np0")),
                ("mac", s("30:3e:a7:01:1a:5a")),
                ("mtu", i(1500)),
                ("state", s("up")),
                ("speed", i(25000)),
            ],
        ),
    );
    let vf0 = device(&inv, "pci-0000-a2-01-0");
    assert_eq!(vf0.kind, DeviceKind::Vf);
    assert_eq!(vf0.if_name.as_deref(), Some("enp162s0f0v0"));
    assert_attrs(
        vf0,
        &e810_vf("0000:a2:01.0", "enp162s0f0v0", 0, "02:11:22:33:44:00"),
    );
    let vf1 = device(&inv, "pci-0000-a2-01-1");
    assert_attrs(
        vf1,
        &e810_vf("0000:a2:01.1", "enp162s0f0v1", 1, "d6:9b:3f:50:7e:21"),
    );
}

#[test]
fn inventory_e810_vfio_bound_vf_is_offered() {
    let tree = Tree::load("intel-e810-pf-with-vfs.derived.txt");
    // Rebind VF0 to vfio-pci: its netdev disappears from net/ and class/net.
    let vf0 = "sys/devices/pci0000:a2/0000:a2:01.0";
    tree.link(
        &format!("{vf0}/driver"),
        "../../../bus/pci/drivers/vfio-pci",
    );
    tree.remove(&format!("{vf0}/net"));
    tree.remove("sys/class/net/enp162s0f0v0");
    tree.remove("sys/bus/pci/drivers/iavf/0000:a2:01.0");
    tree.link(
        "sys/bus/pci/drivers/vfio-pci/0000:a2:01.0",
        "../../../../devices/pci0000:a2/0000:a2:01.0",
    );
    // The PF's VF table still knows the admin-set MAC.
    let links = FakeLinks::default().with(
        "enp162s0f0np0",
        LinkInfo {
            vfs: vec![
                VfInfo {
                    index: 0,
                    mac: Some("02:11:22:33:44:00".to_owned()),
                    vlan: None,
                },
                VfInfo {
                    index: 1,
                    mac: Some("00:00:00:00:00:00".to_owned()),
                    vlan: None,
                },
            ],
            ..LinkInfo::default()
        },
    );
    let sources = Sources {
        links: Box::new(links),
        ..Sources::default()
    };
    let inv = tree.discover(&sources, &[], &Filter::default());
    assert_eq!(
        names(&inv),
        vec!["pci-0000-a2-00-0", "pci-0000-a2-01-0", "pci-0000-a2-01-1"]
    );
    let vf = device(&inv, "pci-0000-a2-01-0");
    assert_eq!(vf.kind, DeviceKind::Vf);
    assert_eq!(vf.if_name, None);
    let mut want = e810_vf("0000:a2:01.0", "", 0, "02:11:22:33:44:00");
    for (k, v) in want.iter_mut() {
        if *k == "driver" {
            *v = s("vfio-pci");
        }
    }
    assert_attrs(vf, &want);

    // A VF whose netdev moved into a pod (netns-tagged sysfs hides it) stays offered too; its
    // MAC is unknown when the PF table says all zeros.
    tree.remove("sys/devices/pci0000:a2/0000:a2:01.1/net");
    tree.remove("sys/class/net/enp162s0f0v1");
    let inv = tree.discover(&sources, &[], &Filter::default());
    let vf1 = device(&inv, "pci-0000-a2-01-1");
    assert_eq!(vf1.if_name, None);
    let want: Vec<_> = e810_vf("0000:a2:01.1", "", 1, "")
        .into_iter()
        .filter(|(k, _)| *k != "mac")
        .collect();
    assert_attrs(vf1, &want);
}

#[test]
fn inventory_e810_pf_on_default_route_keeps_vfs() {
    let tree = Tree::load("intel-e810-pf-with-vfs.derived.txt");
    let inv = tree.discover(&Sources::default(), &["enp162s0f0np0"], &Filter::default());
    assert_eq!(names(&inv), vec!["pci-0000-a2-01-0", "pci-0000-a2-01-1"]);
    assert_eq!(
        excluded(&inv),
        vec![("pci-0000-a2-00-0", "carries a node default route")]
    );
}

#[test]
fn inventory_e810_filters() {
    let tree = Tree::load("intel-e810-pf-with-vfs.derived.txt");
    let sources = Sources::default();
    let filter = Filter::parse_lists("", "pci=8086:1889").unwrap();
    let inv = tree.discover(&sources, &[], &filter);
    assert_eq!(names(&inv), vec!["pci-0000-a2-00-0"]);
    assert_eq!(
        excluded(&inv),
        vec![
            (
                "pci-0000-a2-01-0",
                "matches filter exclude[0] \"pci=8086:1889\""
            ),
            (
                "pci-0000-a2-01-1",
                "matches filter exclude[0] \"pci=8086:1889\""
            ),
        ]
    );
    let filter = Filter::parse_lists("kind=vf", "name=*v1").unwrap();
    let inv = tree.discover(&sources, &[], &filter);
    assert_eq!(names(&inv), vec!["pci-0000-a2-01-0"]);
    assert_eq!(
        excluded(&inv),
        vec![
            ("pci-0000-a2-00-0", "matches no filter include entry"),
            ("pci-0000-a2-01-1", "matches filter exclude[0] \"name=*v1\""),
        ]
    );
    let filter = Filter::parse_lists("driver=ic?", "").unwrap();
    assert_eq!(
        names(&tree.discover(&sources, &[], &filter)),
        vec!["pci-0000-a2-00-0"]
    );
    // Alternative names from netlink match name globs too.
    let links = FakeLinks::default().with(
        "enp162s0f0v1",
        LinkInfo {
            alt_names: vec!["uplink-b".to_owned()],
            ..LinkInfo::default()
        },
    );
    let sources = Sources {
        links: Box::new(links),
        ..Sources::default()
    };
    let filter = Filter::parse_lists("name=uplink-*", "").unwrap();
    assert_eq!(
        names(&tree.discover(&sources, &[], &filter)),
        vec!["pci-0000-a2-01-1"]
    );
}

// ---------------------------------------------------------------------------------------------
// intel-i350-pf-bridged.real.txt

#[test]
fn inventory_i350_real_bridged_pf() {
    let tree = Tree::load("intel-i350-pf-bridged.real.txt");
    let inv = tree.discover_default();
    assert_eq!(names(&inv), vec!["pci-0000-45-00-0"]);
    let pf = device(&inv, "pci-0000-45-00-0");
    assert_eq!(pf.kind, DeviceKind::Pf);
    assert_attrs(
        pf,
        &with(
            pci_common("0000:45:00.0", "pci0000:40"),
            &[
                ("kind", s("pf")),
                ("pciVendor", s("8086")),
                ("pciDevice", s("1521")),
                ("pciSubsystem", s("8086:00a3")),
                ("vendorName", s("Intel Corporation")),
                ("deviceName", s("I350 Gigabit Network Connection")),
                ("driver", s("igb")),
                ("numaNode", i(0)),
                ("sriov", b(true)),
                ("sriovTotalVfs", i(7)),
                ("sriovNumVfs", i(0)),
                ("rdma", b(false)),
                ("ifName", s("ens10f0")),
                ("mac", s("68:05:ca:f0:cb:12")),
                ("mtu", i(1500)),
                ("state", s("up")),
                ("speed", i(1000)),
            ],
        ),
    );
    // The bridge itself is not in the capture, but its port still points at it: a default
    // route on vmbr0 keeps the port with the node.
    let inv = tree.discover(&Sources::default(), &["vmbr0"], &Filter::default());
    assert!(inv.devices.is_empty());
    assert_eq!(
        excluded(&inv),
        vec![(
            "pci-0000-45-00-0",
            "slave, port or lower device of vmbr0, which serves the default route on vmbr0"
        )]
    );
}

#[test]
fn inventory_dual_port_function_gets_port_suffix() {
    let tree = Tree::load("intel-i350-pf-bridged.real.txt");
    let fn_dir = "sys/devices/pci0000:40/0000:40:01.3/0000:45:00.0";
    tree.link(
        &format!("{fn_dir}/net/ens10f0d1/device"),
        "../../../0000:45:00.0",
    );
    tree.write(&format!("{fn_dir}/net/ens10f0d1/dev_port"), "1");
    tree.write(&format!("{fn_dir}/net/ens10f0d1/mtu"), "9000");
    let inv = tree.discover_default();
    assert_eq!(names(&inv), vec!["pci-0000-45-00-0", "pci-0000-45-00-0-p1"]);
    let port1 = device(&inv, "pci-0000-45-00-0-p1");
    assert_eq!(port1.if_name.as_deref(), Some("ens10f0d1"));
    assert_eq!(port1.attr("mtu"), Some(&i(9000)));
    assert_eq!(port1.attr("pciAddress"), Some(&s("0000:45:00.0")));
    assert_eq!(
        device(&inv, "pci-0000-45-00-0").if_name.as_deref(),
        Some("ens10f0")
    );
}

// ---------------------------------------------------------------------------------------------
// virtio-net.real.txt + ethtool-features.real.txt

#[test]
fn inventory_virtio_net() {
    let tree = Tree::load("virtio-net.real.txt");
    let ethtool = ethtool_capture(&fixture_text("ethtool-features.real.txt"));
    let sources = Sources {
        ethtool: Box::new(ethtool),
        ..Sources::default()
    };
    let inv = tree.discover(&sources, &[], &Filter::default());
    assert_eq!(names(&inv), vec!["pci-0000-00-03-0"]);
    let nic = device(&inv, "pci-0000-00-03-0");
    assert_eq!(nic.kind, DeviceKind::Nic);
    assert_eq!(nic.if_name.as_deref(), Some("eth0"));
    assert_attrs(
        nic,
        &with(
            pci_common("0000:00:03.0", "pci0000:00"),
            &[
                ("kind", s("nic")),
                // PCI ids of the function (device/.. of the netdev), not the virtio ids.
                ("pciVendor", s("1af4")),
                ("pciDevice", s("1041")),
                ("pciSubsystem", s("1af4:1041")),
                ("vendorName", s("Red Hat, Inc.")),
                ("deviceName", s("Virtio 1.0 network device")),
                ("driver", s("virtio-pci")),
                // numa_node = -1, speed = -1, phys_port_name EOPNOTSUPP: unknown.
                ("sriov", b(false)),
                ("rdma", b(false)),
                ("ifName", s("eth0")),
                ("mac", s("02:fc:00:00:00:01")),
                ("mtu", i(1400)),
                ("state", s("up")),
                ("vlanCapable", b(true)),
            ],
        ),
    );
    // The usual test VM: eth0 carries the default route, so nothing is offered.
    let inv = tree.discover(&sources, &["eth0"], &Filter::default());
    assert!(inv.devices.is_empty());
    assert_eq!(
        excluded(&inv),
        vec![("pci-0000-00-03-0", "carries a node default route")]
    );
}

// ---------------------------------------------------------------------------------------------
// virtual-bridge-veth-macvlan-vxlan.real.txt + ethtool-features.real.txt

fn virtual_links() -> FakeLinks {
    // `ip -d link` of the capture (its header): kind and master.
    let mut links = FakeLinks::default();
    for (name, kind, master) in [
        ("br0", "bridge", None),
        ("veth0", "veth", Some("br0")),
        ("veth1", "veth", None),
        ("mv0", "macvlan", None),
        ("vx0", "vxlan", None),
    ] {
        links = links.with(
            name,
            LinkInfo {
                kind: Some(kind.to_owned()),
                master: master.map(str::to_owned),
                ..LinkInfo::default()
            },
        );
    }
    links
}

#[test]
fn inventory_virtual_devices_need_include() {
    let tree = Tree::load("virtual-bridge-veth-macvlan-vxlan.real.txt");
    let inv = tree.discover_default();
    assert!(inv.devices.is_empty());
    let reason = "virtual interface: offered only when a filter include entry matches it";
    assert_eq!(
        excluded(&inv),
        vec![
            ("br0", reason),
            ("lo", "loopback"),
            ("mv0", reason),
            ("veth0", reason),
            ("veth1", reason),
            ("vx0", reason),
        ]
    );
    assert_eq!(
        inv.excluded("lo").unwrap().device.kind,
        DeviceKind::Loopback
    );
}

#[test]
fn inventory_virtual_devices_included() {
    let tree = Tree::load("virtual-bridge-veth-macvlan-vxlan.real.txt");
    let sources = Sources {
        links: Box::new(virtual_links()),
        ethtool: Box::new(ethtool_capture(&fixture_text("ethtool-features.real.txt"))),
        ..Sources::default()
    };
    // Even an include matching everything cannot bring loopback in.
    let filter = Filter::parse_lists("kind=virtual,name=*", "").unwrap();
    let inv = tree.discover(&sources, &[], &filter);
    assert_eq!(names(&inv), vec!["br0", "mv0", "veth0", "veth1", "vx0"]);
    assert_eq!(excluded(&inv), vec![("lo", "loopback")]);
    let virt = |name: &str, kind: &str, mac: &str, more: &[(&'static str, AttrValue)]| {
        let dev = device(&inv, name);
        assert_eq!(dev.kind, DeviceKind::Virtual);
        assert_eq!(dev.if_name.as_deref(), Some(name));
        assert_eq!(dev.pci_address, None);
        let mut want = vec![
            ("kind", s("virtual")),
            ("linkKind", s(kind)),
            ("ifName", s(name)),
            ("mac", s(mac)),
            ("mtu", i(1500)),
            ("vlanCapable", b(true)),
        ];
        want.extend(more.iter().cloned());
        assert_attrs(dev, &want);
    };
    let up = [("state", s("up")), ("speed", i(10000))];
    virt("br0", "bridge", "02:00:00:00:0b:00", &up);
    virt("veth0", "veth", "02:00:00:00:0e:00", &up);
    virt("veth1", "veth", "02:00:00:00:0e:01", &up);
    virt("mv0", "macvlan", "02:00:00:00:0a:00", &up);
    // operstate "unknown" and speed -1: both left out.
    virt("vx0", "vxlan", "02:00:00:00:0c:00", &[]);

    // Without netlink the kind still comes from uevent DEVTYPE where the kernel sets it.
    let inv = tree.discover(&Sources::default(), &[], &filter);
    let kinds: Vec<_> = inv
        .devices
        .iter()
        .map(|d| {
            (
                d.name.as_str(),
                d.attr("linkKind").and_then(AttrValue::as_str),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("br0", Some("bridge")),
            ("mv0", None),
            ("veth0", None),
            ("veth1", None),
            ("vx0", Some("vxlan")),
        ]
    );
}

#[test]
fn inventory_virtual_default_route_on_bridge_takes_its_ports() {
    let tree = Tree::load("virtual-bridge-veth-macvlan-vxlan.real.txt");
    let filter = Filter::parse_lists("kind=virtual", "").unwrap();
    let inv = tree.discover(&Sources::default(), &["br0"], &filter);
    // veth0 is br0's port (brif/, lower_, master); mv0 merely sits on top of br0.
    assert_eq!(names(&inv), vec!["mv0", "veth1", "vx0"]);
    assert_eq!(
        excluded(&inv),
        vec![
            ("br0", "carries a node default route"),
            ("lo", "loopback"),
            (
                "veth0",
                "slave, port or lower device of br0, which serves the default route on br0"
            ),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// mellanox-cx5-pf-vfs-rdma.derived.txt

fn cx5_pf(
    bdf: &str,
    if_name: &str,
    mac: &str,
    num_vfs: i64,
    ib: &str,
    mode: &str,
) -> Vec<(&'static str, AttrValue)> {
    with(
        pci_common(bdf, "pci0000:3a"),
        &[
            ("kind", s("pf")),
            ("pciVendor", s("15b3")),
            ("pciDevice", s("1017")),
            ("pciSubsystem", s("15b3:0020")),
            ("vendorName", s("Mellanox Technologies")),
            ("deviceName", s("MT27800 Family [ConnectX-5]")),
            ("driver", s("mlx5_core")),
            ("numaNode", i(0)),
            ("sriov", b(true)),
            ("sriovTotalVfs", i(8)),
            ("sriovNumVfs", i(num_vfs)),
            ("eswitchMode", s(mode)),
            ("rdma", b(true)),
            ("rdmaDevice", s(ib)),
            ("ifName", s(if_name)),
            ("mac", s(mac)),
            ("mtu", i(1500)),
            ("state", s("up")),
            ("speed", i(25000)),
        ],
    )
}

fn cx5_vf(
    bdf: &str,
    if_name: &str,
    mac: &str,
    index: i64,
    ib: &str,
    mode: &str,
) -> Vec<(&'static str, AttrValue)> {
    with(
        pci_common(bdf, "pci0000:3a"),
        &[
            ("kind", s("vf")),
            ("pciVendor", s("15b3")),
            ("pciDevice", s("1018")),
            ("pciSubsystem", s("15b3:0020")),
            ("vendorName", s("Mellanox Technologies")),
            (
                "deviceName",
                s("MT27800 Family [ConnectX-5 Virtual Function]"),
            ),
            ("driver", s("mlx5_core")),
            ("numaNode", i(0)),
            ("sriov", b(false)),
            ("pfPciAddress", s("0000:3b:00.0")),
            ("pfName", s("enp59s0f0np0")),
            ("vfIndex", i(index)),
            // The PF's devlink mode: VFs of a switchdev PF are the offloadable ones.
            ("eswitchMode", s(mode)),
            ("rdma", b(true)),
            ("rdmaDevice", s(ib)),
            ("ifName", s(if_name)),
            ("mac", s(mac)),
            ("mtu", i(1500)),
            ("state", s("up")),
            ("speed", i(25000)),
        ],
    )
}

fn cx5_devlink(mode: EswitchMode) -> Sources {
    Sources {
        devlink: Box::new(
            FakeDevlink::default()
                .with("0000:3b:00.0", mode)
                .with("0000:3b:00.1", EswitchMode::Legacy),
        ),
        ..Sources::default()
    }
}

#[test]
fn inventory_mlx5_pfs_vfs_rdma() {
    let tree = Tree::load("mellanox-cx5-pf-vfs-rdma.derived.txt");
    let inv = tree.discover(&cx5_devlink(EswitchMode::Legacy), &[], &Filter::default());
    assert_eq!(
        names(&inv),
        vec![
            "pci-0000-3b-00-0",
            "pci-0000-3b-00-1",
            "pci-0000-3b-00-2",
            "pci-0000-3b-00-3"
        ]
    );
    assert!(inv.excluded.is_empty());
    let kinds: Vec<_> = inv.devices.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        vec![
            DeviceKind::Pf,
            DeviceKind::Pf,
            DeviceKind::Vf,
            DeviceKind::Vf
        ]
    );
    assert_attrs(
        device(&inv, "pci-0000-3b-00-0"),
        &cx5_pf(
            "0000:3b:00.0",
            "enp59s0f0np0",
            "b8:ce:f6:0a:1b:2c",
            2,
            "mlx5_0",
            "legacy",
        ),
    );
    assert_attrs(
        device(&inv, "pci-0000-3b-00-1"),
        &cx5_pf(
            "0000:3b:00.1",
            "enp59s0f1np1",
            "b8:ce:f6:0a:1b:2d",
            0,
            "mlx5_1",
            "legacy",
        ),
    );
    // phys_port_name/phys_switch_id fail with EOPNOTSUPP on the VFs: not representors.
    assert_attrs(
        device(&inv, "pci-0000-3b-00-2"),
        &cx5_vf(
            "0000:3b:00.2",
            "enp59s0f0v0",
            "02:00:00:cc:00:00",
            0,
            "mlx5_2",
            "legacy",
        ),
    );
    assert_attrs(
        device(&inv, "pci-0000-3b-00-3"),
        &cx5_vf(
            "0000:3b:00.3",
            "enp59s0f0v1",
            "02:00:00:cc:00:01",
            1,
            "mlx5_3",
            "legacy",
        ),
    );
}

#[test]
fn inventory_mlx5_switchdev_representors_are_not_offered() {
    let tree = Tree::load("mellanox-cx5-pf-vfs-rdma.derived.txt");
    // switchdev: one representor netdev per VF appears under the PF's net/.
    let pf = "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
    for (n, rep) in ["enp59s0f0r0", "enp59s0f0r1"].iter().enumerate() {
        let dir = format!("{pf}/net/{rep}");
        tree.link(&format!("{dir}/device"), "../..");
        tree.write(&format!("{dir}/phys_port_name"), &format!("pf0vf{n}"));
        tree.write(&format!("{dir}/phys_switch_id"), "b8cef603000a1b2c");
        tree.write(&format!("{dir}/address"), &format!("4a:00:00:00:00:0{n}"));
        tree.write(&format!("{dir}/mtu"), "1500");
        tree.write(&format!("{dir}/operstate"), "up");
        tree.link(
            &format!("sys/class/net/{rep}"),
            &format!("../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/net/{rep}"),
        );
    }
    let inv = tree.discover(
        &cx5_devlink(EswitchMode::Switchdev),
        &[],
        &Filter::default(),
    );
    assert_eq!(
        names(&inv),
        vec![
            "pci-0000-3b-00-0",
            "pci-0000-3b-00-1",
            "pci-0000-3b-00-2",
            "pci-0000-3b-00-3"
        ]
    );
    assert_eq!(
        excluded(&inv),
        vec![
            (
                "enp59s0f0r0",
                "switchdev representor (phys_port_name pf0vf0)"
            ),
            (
                "enp59s0f0r1",
                "switchdev representor (phys_port_name pf0vf1)"
            ),
        ]
    );
    let rep = &inv.excluded("enp59s0f0r0").unwrap().device;
    assert_eq!(rep.kind, DeviceKind::Representor);
    assert_eq!(rep.pci_address.as_deref(), Some("0000:3b:00.0"));
    assert_attrs(
        rep,
        &[
            ("kind", s("representor")),
            ("pciAddress", s("0000:3b:00.0")),
            ("ifName", s("enp59s0f0r0")),
            ("mac", s("4a:00:00:00:00:00")),
            ("mtu", i(1500)),
            ("state", s("up")),
        ],
    );
    // The PF keeps its uplink netdev, and the VFs still find it among the representors.
    assert_attrs(
        device(&inv, "pci-0000-3b-00-0"),
        &cx5_pf(
            "0000:3b:00.0",
            "enp59s0f0np0",
            "b8:ce:f6:0a:1b:2c",
            2,
            "mlx5_0",
            "switchdev",
        ),
    );
    assert_attrs(
        device(&inv, "pci-0000-3b-00-2"),
        &cx5_vf(
            "0000:3b:00.2",
            "enp59s0f0v0",
            "02:00:00:cc:00:00",
            0,
            "mlx5_2",
            "switchdev",
        ),
    );
    // An include rule cannot bring a representor in.
    let filter = Filter::parse_lists("name=enp59s0f0r*", "").unwrap();
    let inv = tree.discover(&cx5_devlink(EswitchMode::Switchdev), &[], &filter);
    assert!(inv.devices.is_empty());
    assert_eq!(
        inv.excluded("enp59s0f0r1").map(|e| e.reason.as_str()),
        Some("switchdev representor (phys_port_name pf0vf1)")
    );
}

// ---------------------------------------------------------------------------------------------
// bond-active-backup.derived.txt

fn x710(bdf: &str, if_name: &str, mac: &str) -> Vec<(&'static str, AttrValue)> {
    with(
        pci_common(bdf, "pci0000:17"),
        &[
            ("kind", s("pf")),
            ("pciVendor", s("8086")),
            ("pciDevice", s("1572")),
            ("pciSubsystem", s("8086:0007")),
            ("vendorName", s("Intel Corporation")),
            ("deviceName", s("Ethernet Controller X710 for 10GbE SFP+")),
            ("driver", s("i40e")),
            ("numaNode", i(0)),
            ("sriov", b(true)),
            ("sriovTotalVfs", i(64)),
            ("sriovNumVfs", i(0)),
            ("rdma", b(false)),
            ("ifName", s(if_name)),
            ("mac", s(mac)),
            ("mtu", i(1500)),
            ("state", s("up")),
            ("speed", i(10000)),
        ],
    )
}

#[test]
fn inventory_bond_without_default_route() {
    let tree = Tree::load("bond-active-backup.derived.txt");
    let inv = tree.discover_default();
    assert_eq!(names(&inv), vec!["pci-0000-18-00-0", "pci-0000-18-00-1"]);
    // With fail_over_mac=none both slaves show the bond's MAC.
    assert_attrs(
        device(&inv, "pci-0000-18-00-0"),
        &x710("0000:18:00.0", "ens1f0", "3c:fd:fe:aa:bb:00"),
    );
    assert_attrs(
        device(&inv, "pci-0000-18-00-1"),
        &x710("0000:18:00.1", "ens1f1", "3c:fd:fe:aa:bb:00"),
    );
    let bond = &inv.excluded("bond0").unwrap().device;
    assert_eq!(bond.kind, DeviceKind::Virtual);
    assert_eq!(bond.attr("linkKind"), Some(&s("bond")));
    // Included, the bond shows its own facts.
    let inv = tree.discover(
        &Sources::default(),
        &[],
        &Filter::parse_lists("kind=virtual", "").unwrap(),
    );
    assert_eq!(names(&inv), vec!["bond0"]);
    assert_attrs(
        device(&inv, "bond0"),
        &[
            ("kind", s("virtual")),
            ("linkKind", s("bond")),
            ("ifName", s("bond0")),
            ("mac", s("3c:fd:fe:aa:bb:00")),
            ("mtu", i(1500)),
            ("state", s("up")),
            ("speed", i(10000)),
        ],
    );
}

#[test]
fn inventory_bond_default_route_excludes_slaves() {
    let tree = Tree::load("bond-active-backup.derived.txt");
    let include_all = Filter::parse_lists("kind=nic,kind=pf,kind=vf,kind=virtual", "").unwrap();
    let inv = tree.discover(&Sources::default(), &["bond0"], &include_all);
    assert!(inv.devices.is_empty(), "{:?}", names(&inv));
    let slave = "slave, port or lower device of bond0, which serves the default route on bond0";
    assert_eq!(
        excluded(&inv),
        vec![
            ("bond0", "carries a node default route"),
            ("pci-0000-18-00-0", slave),
            ("pci-0000-18-00-1", slave),
        ]
    );
    // A route on one slave takes its master, and through it the other slave.
    let inv = tree.discover(&Sources::default(), &["ens1f1"], &include_all);
    assert!(inv.devices.is_empty(), "{:?}", names(&inv));
    assert_eq!(
        excluded(&inv),
        vec![
            (
                "bond0",
                "bond/bridge master of ens1f1, which serves the default route on ens1f1"
            ),
            (
                "pci-0000-18-00-0",
                "slave, port or lower device of bond0, which serves the default route on ens1f1"
            ),
            ("pci-0000-18-00-1", "carries a node default route"),
        ]
    );
}

#[test]
fn inventory_bond_default_route_via_netlink_master_only() {
    // A kernel without adjacency links: netlink's master alone must be enough.
    let tree = Tree::load("bond-active-backup.derived.txt");
    for slave in ["ens1f0", "ens1f1"] {
        let pci = if slave == "ens1f0" {
            "0000:18:00.0"
        } else {
            "0000:18:00.1"
        };
        let dir = format!("sys/devices/pci0000:17/0000:17:02.0/{pci}/net/{slave}");
        tree.remove(&format!("{dir}/master"));
        tree.remove(&format!("{dir}/upper_bond0"));
        tree.remove(&format!("sys/devices/virtual/net/bond0/lower_{slave}"));
    }
    tree.remove("sys/devices/virtual/net/bond0/bonding");
    let mut links = FakeLinks::default().with(
        "bond0",
        LinkInfo {
            kind: Some("bond".to_owned()),
            ..LinkInfo::default()
        },
    );
    for slave in ["ens1f0", "ens1f1"] {
        links = links.with(
            slave,
            LinkInfo {
                master: Some("bond0".to_owned()),
                master_ifindex: Some(8),
                ..LinkInfo::default()
            },
        );
    }
    let sources = Sources {
        links: Box::new(links),
        ..Sources::default()
    };
    let inv = tree.discover(&sources, &["bond0"], &Filter::default());
    assert!(inv.devices.is_empty(), "{:?}", names(&inv));
    assert_eq!(inv.excluded.len(), 3);
    // Without routes the slaves are offered again.
    let inv = tree.discover(&sources, &[], &Filter::default());
    assert_eq!(names(&inv), vec!["pci-0000-18-00-0", "pci-0000-18-00-1"]);
}

// ---------------------------------------------------------------------------------------------
// pci-ids-sriov-nics.txt

struct PciRow {
    vendor: u16,
    pf: u16,
    pf_name: String,
    vf: u16,
    vf_name: String,
}

fn pci_rows() -> (BTreeMap<u16, String>, Vec<PciRow>) {
    let text = fixture_text("pci-ids-sriov-nics.txt");
    let mut vendors = BTreeMap::new();
    let mut rows = Vec::new();
    for line in text.lines() {
        if let Some(list) = line.strip_prefix("# Vendor names: ") {
            for pair in list.split("; ") {
                let (id, name) = pair.split_once('=').unwrap();
                vendors.insert(u16::from_str_radix(id, 16).unwrap(), name.to_owned());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split(" | ").collect();
        assert_eq!(cols.len(), 8, "{line}");
        let hex = |c: &str| u16::from_str_radix(c, 16).unwrap();
        rows.push(PciRow {
            vendor: hex(cols[0]),
            pf: hex(cols[1]),
            pf_name: cols[2].to_owned(),
            vf: hex(cols[3]),
            vf_name: cols[4].to_owned(),
        });
    }
    (vendors, rows)
}

#[test]
fn inventory_pci_ids_table_embedded_fallback() {
    let (vendors, rows) = pci_rows();
    assert_eq!(vendors.len(), 6);
    assert_eq!(rows.len(), 39);
    // No host pci.ids under this root: the embedded database answers every row.
    let empty = tempfile::tempdir().unwrap();
    let names = PciNames::load(empty.path());
    for (id, name) in &vendors {
        assert_eq!(
            names.vendor(*id).as_deref(),
            Some(name.as_str()),
            "{id:04x}"
        );
    }
    for row in &rows {
        assert_eq!(
            names.device(row.vendor, row.pf).as_deref(),
            Some(row.pf_name.as_str())
        );
        assert_eq!(
            names.device(row.vendor, row.vf).as_deref(),
            Some(row.vf_name.as_str())
        );
    }
}

#[test]
fn inventory_pci_ids_table_through_host_file() {
    // The same table written as a host pci.ids (wrong names on purpose, to see it win).
    let (vendors, rows) = pci_rows();
    let mut text = String::from("# generated\n");
    for (id, name) in &vendors {
        text.push_str(&format!("{id:04x}  host {name}\n"));
        let mut devices: BTreeMap<u16, &str> = BTreeMap::new();
        for row in rows.iter().filter(|r| r.vendor == *id) {
            devices.insert(row.pf, &row.pf_name);
            devices.insert(row.vf, &row.vf_name);
        }
        for (dev, name) in devices {
            text.push_str(&format!(
                "\t{dev:04x}  host {name}\n\t\t{id:04x} 0001  a subsystem\n"
            ));
        }
    }
    let db = PciDb::parse(&text);
    assert_eq!(db.vendor_count(), vendors.len());
    for row in &rows {
        assert_eq!(
            db.device_name(row.vendor, row.pf),
            Some(format!("host {}", row.pf_name).as_str())
        );
        assert_eq!(
            db.device_name(row.vendor, row.vf),
            Some(format!("host {}", row.vf_name).as_str())
        );
    }
    // And discovery picks the host file up from under the root.
    let tree = Tree::load("intel-e810-pf-with-vfs.derived.txt");
    tree.write("usr/share/misc/pci.ids", &text);
    let inv = tree.discover_default();
    let vf = device(&inv, "pci-0000-a2-01-0");
    assert_eq!(vf.attr("vendorName"), Some(&s("host Intel Corporation")));
    assert_eq!(
        vf.attr("deviceName"),
        Some(&s("host Ethernet Adaptive Virtual Function"))
    );
}

#[test]
fn inventory_long_names_are_shortened() {
    let tree = Tree::load("intel-e810-xxv-pf.real.txt");
    let long = "x".repeat(MAX_STRING_LEN + 1);
    tree.write(
        "usr/share/misc/pci.ids",
        &format!("8086  Intel Corporation\n\t159b  {long}\n"),
    );
    let inv = tree.discover_default();
    let pf = device(&inv, "pci-0000-a2-00-0");
    // A description, so cut (with a mark) rather than dropped; see slices::limits.
    let short = format!("{}…", "x".repeat(MAX_STRING_LEN - '…'.len_utf8()));
    assert_eq!(pf.attr("deviceName"), Some(&s(&short)));
    assert_eq!(short.len(), MAX_STRING_LEN);
    assert_eq!(pf.attr("vendorName"), Some(&s("Intel Corporation")));
}

// ---------------------------------------------------------------------------------------------
// every fixture, generically

#[test]
fn inventory_every_fixture_is_covered_and_well_formed() {
    let mut seen = Vec::new();
    for entry in fs::read_dir(fixture_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".txt") {
            continue;
        }
        seen.push(name.clone());
        let text = fixture_text(&name);
        // Attribution headers are kept.
        assert!(text.starts_with('#'), "{name} lost its header");
        if name == "pci-ids-sriov-nics.txt" || name == "ethtool-features.real.txt" {
            continue;
        }
        let tree = Tree::load(&name);
        let filter = Filter::parse_lists("kind=nic,kind=pf,kind=vf,kind=virtual", "").unwrap();
        let inv = tree.discover(&Sources::default(), &[], &filter);
        let mut all: Vec<&NetDevice> = inv.devices.iter().collect();
        all.extend(inv.excluded.iter().map(|e| &e.device));
        assert!(!all.is_empty(), "{name}: nothing found");
        let unique: BTreeSet<&str> = inv.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(unique.len(), inv.devices.len(), "{name}: duplicate names");
        let mut sorted = names(&inv);
        sorted.sort();
        assert_eq!(sorted, names(&inv), "{name}: not sorted");
        for dev in all {
            assert!(
                super::names::is_dns_label(&dev.name),
                "{name}: {}",
                dev.name
            );
            assert!(
                dev.attributes.len() <= MAX_ATTRIBUTES,
                "{name}: {}",
                dev.name
            );
            assert_eq!(
                dev.attr("kind"),
                Some(&s(dev.kind.as_str())),
                "{name}: {}",
                dev.name
            );
        }
        // Deterministic: same inputs, same inventory.
        assert_eq!(
            inv,
            tree.discover(&Sources::default(), &[], &filter),
            "{name}"
        );
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            "bond-active-backup.derived.txt",
            "ethtool-features.real.txt",
            "intel-e810-pf-with-vfs.derived.txt",
            "intel-e810-xxv-pf.real.txt",
            "intel-i350-pf-bridged.real.txt",
            "mellanox-cx5-pf-vfs-rdma.derived.txt",
            "pci-ids-sriov-nics.txt",
            "virtio-net.real.txt",
            "virtual-bridge-veth-macvlan-vxlan.real.txt",
        ]
    );
    assert!(fixture_dir().join("NOTICE").exists());
}

#[test]
fn inventory_empty_or_missing_root_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let inv = discover(
        dir.path(),
        &Sources::default(),
        &BTreeSet::new(),
        &Filter::default(),
    );
    assert_eq!(inv, Inventory::default());
    let inv = discover(
        &dir.path().join("nope"),
        &Sources::default(),
        &BTreeSet::from(["eth0".to_owned()]),
        &Filter::default(),
    );
    assert_eq!(inv, Inventory::default());
}

#[test]
fn inventory_serialises_like_device_attributes() {
    let tree = Tree::load("virtio-net.real.txt");
    let inv = tree.discover_default();
    let json = serde_json::to_value(&inv).unwrap();
    let dev = &json["devices"][0];
    assert_eq!(dev["name"], "pci-0000-00-03-0");
    assert_eq!(dev["kind"], "nic");
    assert_eq!(dev["ifName"], "eth0");
    assert_eq!(dev["pciAddress"], "0000:00:03.0");
    assert_eq!(dev["attributes"]["mtu"], serde_json::json!({"int": 1400}));
    assert_eq!(
        dev["attributes"]["sriov"],
        serde_json::json!({"bool": false})
    );
    assert_eq!(
        dev["attributes"]["driver"],
        serde_json::json!({"string": "virtio-pci"})
    );
}
