//! The human-readable inventory table `knic-driver inventory` prints: what an operator checks
//! first when a pod stays Pending ("does this node offer what my class selects?").

use std::fmt::Write;

use super::{Inventory, NetDevice};

fn attr(d: &NetDevice, key: &str) -> String {
    d.attr(key)
        .map(ToString::to_string)
        .unwrap_or_else(|| "-".into())
}

fn shorten(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        s
    } else {
        let mut out: String = s.chars().take(max - 1).collect();
        out.push('…');
        out
    }
}

fn vfs(d: &NetDevice) -> String {
    match (
        d.attr("sriovNumVfs"),
        d.attr("sriovTotalVfs"),
        d.attr("vfIndex"),
    ) {
        (Some(n), Some(t), _) => format!("{n}/{t}"),
        (_, _, Some(i)) => format!("vf{i}@{}", attr(d, "pfName")),
        _ => "-".into(),
    }
}

fn yes_no(d: &NetDevice, key: &str) -> String {
    match d.attr(key) {
        Some(super::AttrValue::Bool(true)) => "yes".into(),
        Some(super::AttrValue::Bool(false)) => "no".into(),
        _ => "-".into(),
    }
}

fn row(d: &NetDevice) -> [String; 11] {
    [
        d.name.clone(),
        d.kind.as_str().to_string(),
        d.if_name.clone().unwrap_or_else(|| "-".into()),
        d.pci_address.clone().unwrap_or_else(|| "-".into()),
        shorten(attr(d, "vendorName"), 20),
        shorten(attr(d, "deviceName"), 28),
        d.attr("speed")
            .map(|s| format!("{s}Mb/s"))
            .unwrap_or_else(|| "-".into()),
        attr(d, "numaNode"),
        vfs(d),
        yes_no(d, "vlanCapable"),
        d.attr("rdmaDevice")
            .map(ToString::to_string)
            .unwrap_or_else(|| "-".into()),
    ]
}

fn render(rows: &[Vec<String>], out: &mut String) {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell}{}", " ".repeat(w - cell.chars().count())))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}

/// Renders the offered devices, then the ones found but not offered with the reason.
pub fn render_table(inventory: &Inventory, node: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Node {node}: {} device(s) offered",
        inventory.devices.len()
    );
    let header = [
        "NAME", "KIND", "IFNAME", "PCI", "VENDOR", "DEVICE", "SPEED", "NUMA", "VFS", "VLAN", "RDMA",
    ];
    let mut rows = vec![header.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    rows.extend(inventory.devices.iter().map(|d| row(d).to_vec()));
    render(&rows, &mut out);
    if !inventory.excluded.is_empty() {
        let _ = writeln!(out, "\nNot offered: {} device(s)", inventory.excluded.len());
        let mut rows = vec![vec![
            "NAME".to_string(),
            "KIND".into(),
            "IFNAME".into(),
            "REASON".into(),
        ]];
        rows.extend(inventory.excluded.iter().map(|e| {
            vec![
                e.device.name.clone(),
                e.device.kind.as_str().to_string(),
                e.device.if_name.clone().unwrap_or_else(|| "-".into()),
                e.reason.clone(),
            ]
        }));
        render(&rows, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{AttrValue, DeviceKind, ExcludedDevice};
    use std::collections::BTreeMap;

    #[test]
    fn table_shows_devices_and_reasons() {
        let mut attributes = BTreeMap::new();
        attributes.insert("speed".to_string(), AttrValue::Int(25000));
        attributes.insert("sriovNumVfs".to_string(), AttrValue::Int(2));
        attributes.insert("sriovTotalVfs".to_string(), AttrValue::Int(128));
        attributes.insert("vlanCapable".to_string(), AttrValue::Bool(true));
        attributes.insert(
            "vendorName".to_string(),
            AttrValue::Str("Intel Corporation".into()),
        );
        let pf = NetDevice {
            name: "pci-0000-a2-00-0".into(),
            kind: DeviceKind::Pf,
            if_name: Some("enp162s0f0np0".into()),
            pci_address: Some("0000:a2:00.0".into()),
            attributes,
        };
        let lo = NetDevice {
            name: "lo".into(),
            kind: DeviceKind::Loopback,
            if_name: Some("lo".into()),
            pci_address: None,
            attributes: BTreeMap::new(),
        };
        let inv = Inventory {
            devices: vec![pf],
            excluded: vec![ExcludedDevice {
                device: lo,
                reason: "loopback".into(),
            }],
        };
        let table = render_table(&inv, "node-a");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "Node node-a: 1 device(s) offered");
        assert!(
            lines[1].starts_with("NAME              KIND  IFNAME         PCI"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].starts_with(
                "pci-0000-a2-00-0  pf    enp162s0f0np0  0000:a2:00.0  Intel Corporation"
            ),
            "{}",
            lines[2]
        );
        assert!(
            lines[2].ends_with("25000Mb/s  -     2/128  yes   -"),
            "{}",
            lines[2]
        );
        assert_eq!(lines[4], "Not offered: 1 device(s)");
        assert_eq!(lines[6], "lo    loopback  lo      loopback");
    }
}
