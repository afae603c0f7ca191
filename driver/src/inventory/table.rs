//! The human-readable inventory table `knic-driver inventory` prints: what an operator checks
//! first when a pod stays Pending ("does this node offer what my class selects?").
//!
//! Every cell comes from sysfs, netlink, the PCI database or the filter config, none of which
//! promises printable text: an interface alias or a device name with an escape sequence would
//! otherwise drive the operator's terminal (move the cursor, rewrite earlier rows, retitle the
//! window). So each cell is escaped once, before widths are measured, with [`printable`].

use std::fmt::Write;

use super::{Inventory, NetDevice};

/// Characters that draw nothing but change how the text around them is shown: zero-width
/// characters, bidirectional embeddings/overrides/isolates and marks, the line and paragraph
/// separators, invisible operators, the byte-order mark and interlinear annotations. A
/// device name with U+202E (right-to-left override) would show reversed, and one with U+200B
/// would look identical to another device's, so they are escaped like control characters.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

/// `s` with nothing a terminal would interpret: `\t`, `\n`, `\r` and `\\` as themselves
/// escaped, other C0 controls and DEL as `\x1b`-style, C1 controls and the [`invisible`]
/// characters as `\u{9b}`-style. Backslash is escaped too, so an escape in the table always
/// means the character and never a name that happened to contain the same text.
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\\' => out.push_str("\\\\"),
            '\0'..='\u{1f}' | '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || invisible(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

fn attr(d: &NetDevice, key: &str) -> String {
    d.attr(key)
        .map(|v| printable(&v.to_string()))
        .unwrap_or_else(|| "-".into())
}

fn opt(value: Option<&String>) -> String {
    value.map_or_else(|| "-".into(), |v| printable(v))
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
        (Some(n), Some(t), _) => printable(&format!("{n}/{t}")),
        (_, _, Some(i)) => format!("vf{}@{}", printable(&i.to_string()), attr(d, "pfName")),
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
        printable(&d.name),
        d.kind.as_str().to_string(),
        opt(d.if_name.as_ref()),
        opt(d.pci_address.as_ref()),
        shorten(attr(d, "vendorName"), 20),
        shorten(attr(d, "deviceName"), 28),
        d.attr("speed")
            .map(|s| format!("{}Mb/s", printable(&s.to_string())))
            .unwrap_or_else(|| "-".into()),
        attr(d, "numaNode"),
        vfs(d),
        yes_no(d, "vlanCapable"),
        attr(d, "rdmaDevice"),
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
        "Node {}: {} device(s) offered",
        printable(node),
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
                printable(&e.device.name),
                e.device.kind.as_str().to_string(),
                opt(e.device.if_name.as_ref()),
                printable(&e.reason),
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
                default_route: false,
                device: lo,
                reason: "loopback".into(),
            }],
            overlay: None,
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

    fn device(name: &str, if_name: &str, attributes: &[(&str, &str)]) -> NetDevice {
        NetDevice {
            name: name.into(),
            kind: DeviceKind::Virtual,
            if_name: Some(if_name.into()),
            pci_address: None,
            attributes: attributes
                .iter()
                .map(|(k, v)| (k.to_string(), AttrValue::Str((*v).into())))
                .collect(),
        }
    }

    #[test]
    fn printable_escapes_controls_invisibles_and_backslash() {
        assert_eq!(printable("eth0"), "eth0");
        assert_eq!(printable("Ünïcödé 网卡"), "Ünïcödé 网卡");
        assert_eq!(printable("a\tb\nc\rd"), "a\\tb\\nc\\rd");
        assert_eq!(printable("\u{1b}[2J\u{7}"), "\\x1b[2J\\x07");
        assert_eq!(printable("\0\u{7f}"), "\\x00\\x7f");
        assert_eq!(printable("\u{9b}31m\u{85}"), "\\u{9b}31m\\u{85}");
        assert_eq!(printable("\u{202e}lanigiro"), "\\u{202e}lanigiro");
        assert_eq!(
            printable("et\u{200b}h0\u{2066}\u{feff}\u{ad}\u{2028}"),
            "et\\u{200b}h0\\u{2066}\\u{feff}\\u{ad}\\u{2028}"
        );
        assert_eq!(printable("a\\x1b"), "a\\\\x1b");
    }

    #[test]
    fn table_cells_cannot_drive_the_terminal() {
        let hostile = device(
            "evil\u{1b}]0;pwned\u{7}",
            "x\r\ny",
            &[
                ("vendorName", "Acme\u{9b}2J"),
                ("deviceName", "NIC\u{202e}\u{200b}\t\u{7f}"),
            ],
        );
        let inv = Inventory {
            devices: vec![hostile.clone()],
            excluded: vec![ExcludedDevice {
                default_route: false,
                device: hostile,
                reason: "excluded by name=\u{1b}[31m*".into(),
            }],
            overlay: None,
        };
        let table = render_table(&inv, "node-a");
        let bad: Vec<char> = table
            .chars()
            .filter(|&c| c != '\n' && (c.is_control() || invisible(c)))
            .collect();
        assert!(bad.is_empty(), "{bad:?} in\n{table}");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 7, "{table}");
        assert!(
            lines[2].starts_with(
                "evil\\x1b]0;pwned\\x07  virtual  x\\r\\ny  -    Acme\\u{9b}2J  \
                 NIC\\u{202e}\\u{200b}\\t\\x7f"
            ),
            "{}",
            lines[2]
        );
        assert_eq!(
            lines[6],
            "evil\\x1b]0;pwned\\x07  virtual  x\\r\\ny  excluded by name=\\x1b[31m*"
        );
        // Columns stay aligned: every row is as long as the header up to the last column.
        assert_eq!(lines[1].find("IFNAME"), lines[2].find("x\\r"));
    }
}
