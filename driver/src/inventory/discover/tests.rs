use super::attrs::Attrs;
use super::ports::{is_representor_port, is_uplink_port, is_zero_mac};
use super::*;
use crate::inventory::{MAX_ATTRIBUTES, MAX_STRING_LEN};

#[test]
fn inventory_port_names() {
    for rep in [
        "pf0vf0", "pf1vf12", "pf0sf2", "c1pf0vf1", "c1pf0", "pf0hpf", "pf0vfr1",
    ] {
        assert!(is_representor_port(rep), "{rep}");
    }
    for not in [
        "p0", "p1", "pf0", "pf", "pfvf1", "c1", "cpf0vf1", "pf0vf", "sby", "",
    ] {
        assert!(!is_representor_port(not), "{not}");
    }
    assert!(is_uplink_port("p0") && is_uplink_port("p12"));
    assert!(!is_uplink_port("p") && !is_uplink_port("pf0vf0"));
    assert_eq!(
        pcie_root(Path::new("sys/devices/pci0000:a2/0000:a2:00.0")).as_deref(),
        Some("pci0000:a2")
    );
    assert_eq!(pcie_root(Path::new("bus/pci/devices/0000:a2:00.0")), None);
    assert!(is_zero_mac("00:00:00:00:00:00") && !is_zero_mac("02:00:00:00:00:00"));
}

#[test]
fn inventory_attrs_limits() {
    let mut attrs = Attrs::default();
    attrs.str("long", &"x".repeat(MAX_STRING_LEN + 1));
    // Sorts first, so it survives the trim to the limit.
    attrs.str("a-edge", &"x".repeat(MAX_STRING_LEN));
    for i in 0..40 {
        attrs.int(&format!("a{i:02}"), i);
    }
    let map = attrs.finish("dev");
    assert!(!map.contains_key("long"));
    assert!(map.contains_key("a-edge"));
    assert!(!map.contains_key("a39"));
    assert_eq!(map.len(), MAX_ATTRIBUTES);
}
