//! `spec.devices`: checking it, compiling the friendly form into CEL, and deciding whether two
//! networks may be given the same device.

use std::collections::BTreeSet;

use crate::netconfig::{FieldError, check_interface_name};
use crate::{Error, Result};

use super::{DeviceKind, Devices, FRIENDLY_DEVICE_CLASS};

/// Kubernetes' limit on one CEL selector (`CELSelectorExpressionMaxLength`).
const MAX_CEL_BYTES: usize = 10 * 1024;
/// Kubernetes' limit on selectors per request (`DeviceSelectorsMaxSize`).
const MAX_SELECTORS: usize = 32;

/// The driver leaves out string attributes longer than this, so a longer vendor name can never
/// match anything.
const MAX_ATTRIBUTE_STRING: usize = 64;

/// The attribute map of knic devices in CEL, as the DeviceClasses write it.
const ATTRS: &str = "device.attributes[\"knic.dev\"]";

/// The DeviceClasses knic ships (`deviceclasses/knic.yaml`) and what they select, written as
/// friendly forms: a raw `devices` naming one of them without selectors is compared with other
/// networks as precisely as a friendly one.
fn builtin_class(name: &str) -> Option<Friendly> {
    let mut f = Friendly::default();
    match name {
        "knic.dev" => {}
        "nic.knic.dev" => f.kind = Some(DeviceKind::Nic),
        "vf.knic.dev" => f.kind = Some(DeviceKind::Vf),
        "rdma.knic.dev" => f.rdma = Some(true),
        _ => return None,
    }
    Some(f)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Vendor {
    Id(u16),
    Name(String),
}

/// The friendly form, checked and normalised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Friendly {
    kind: Option<DeviceKind>,
    vendor: Option<Vendor>,
    pf_name: Option<String>,
    min_speed: Option<u32>,
    numa_node: Option<u32>,
    rdma: Option<bool>,
}

impl Friendly {
    fn to_cel(&self) -> String {
        let mut parts = Vec::new();
        match self.kind {
            Some(DeviceKind::Nic) => parts.push(format!("{ATTRS}.kind in [\"nic\", \"pf\"]")),
            Some(DeviceKind::Vf) => parts.push(format!("{ATTRS}.kind == \"vf\"")),
            None => {}
        }
        match &self.vendor {
            Some(Vendor::Id(id)) => {
                parts.push(format!("{ATTRS}.?pciVendor.orValue(\"\") == \"{id:04x}\""));
            }
            Some(Vendor::Name(name)) => parts.push(format!(
                "{ATTRS}.?vendorName.orValue(\"\") == {}",
                cel_string(name)
            )),
            None => {}
        }
        if let Some(pf) = &self.pf_name {
            parts.push(format!(
                "{ATTRS}.?pfName.orValue(\"\") == {}",
                cel_string(pf)
            ));
        }
        if let Some(speed) = self.min_speed {
            parts.push(format!("{ATTRS}.?speed.orValue(0) >= {speed}"));
        }
        if let Some(numa) = self.numa_node {
            parts.push(format!("{ATTRS}.?numaNode.orValue(-1) == {numa}"));
        }
        match self.rdma {
            Some(true) => parts.push(format!("{ATTRS}.?rdma.orValue(false)")),
            Some(false) => parts.push(format!("!{ATTRS}.?rdma.orValue(false)")),
            None => {}
        }
        parts.join(" && ")
    }

    /// Whether some device could satisfy both: no field set in both with different values.
    /// `minSpeed` never separates two networks (any two minimums share the faster devices), and
    /// a vendor id against a vendor name cannot be told apart without the node's `pci.ids`, so
    /// it counts as compatible.
    fn compatible(&self, other: &Friendly) -> bool {
        fn same<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
        }
        let vendors = match (&self.vendor, &other.vendor) {
            (Some(Vendor::Id(a)), Some(Vendor::Id(b))) => a == b,
            (Some(Vendor::Name(a)), Some(Vendor::Name(b))) => a == b,
            _ => true,
        };
        same(&self.kind, &other.kind)
            && vendors
            && same(&self.pf_name, &other.pf_name)
            && same(&self.numa_node, &other.numa_node)
            && same(&self.rdma, &other.rdma)
    }
}

/// A CEL string literal: double-quoted, with `\`, `"` and control characters escaped, so no
/// value an admin writes can end the literal early.
fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The friendly fields that are set, so "which form is this" has one definition.
fn has_friendly(d: &Devices) -> bool {
    d.kind.is_some()
        || d.vendor.is_some()
        || d.pf_name.is_some()
        || d.min_speed.is_some()
        || d.numa_node.is_some()
        || d.rdma.is_some()
}

fn has_raw(d: &Devices) -> bool {
    d.device_class_name.is_some() || !d.selectors.is_empty()
}

/// Checks `spec.devices`, pushing every problem, and returns the class and selectors of the
/// request (also when there were problems, if the form is clear enough to compile).
/// `reserved` is how many selectors knic adds to the generated template (the exhaustion
/// selector, for networks that allocate addresses), which the admin's share of Kubernetes'
/// limit gives up.
pub(super) fn check(
    d: &Devices,
    reserved: usize,
    errors: &mut Vec<FieldError>,
) -> Option<(String, Vec<String>)> {
    let mut error = |path: &str, message: String| {
        errors.push(FieldError::new(format!("spec.devices{path}"), message));
    };
    match (has_raw(d), has_friendly(d)) {
        (true, true) => {
            error(
                "",
                "set either deviceClassName (with optional selectors) or the device fields kind, vendor, pfName, minSpeed, numaNode and rdma, not both".to_owned(),
            );
            None
        }
        (false, false) => {
            error(
                "",
                "set deviceClassName (with optional selectors) or at least one of kind, vendor, pfName, minSpeed, numaNode and rdma; empty devices are allowed only with spec.vxlan".to_owned(),
            );
            None
        }
        (true, false) => {
            match &d.device_class_name {
                None => error(
                    ".deviceClassName",
                    "is required when selectors are given".to_owned(),
                ),
                Some(class) if !is_dns_subdomain(class) => error(
                    ".deviceClassName",
                    format!(
                        "{class:?} is not a DeviceClass name (a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
                    ),
                ),
                Some(_) => {}
            }
            let allowed = MAX_SELECTORS - reserved;
            if d.selectors.len() > allowed {
                let rule = if reserved == 0 {
                    format!("Kubernetes allows at most {MAX_SELECTORS}")
                } else {
                    format!(
                        "at most {allowed} (Kubernetes allows {MAX_SELECTORS} and knic adds the \
                         exhaustion selector)"
                    )
                };
                error(
                    ".selectors",
                    format!("has {} entries; {rule}", d.selectors.len()),
                );
            }
            for (i, selector) in d.selectors.iter().enumerate() {
                if let Err(e) = lint_cel(selector) {
                    error(&format!(".selectors[{i}]"), e.to_string());
                }
            }
            Some((d.device_class_name.clone()?, d.selectors.clone()))
        }
        (false, true) => {
            let friendly = friendly(d, &mut error)?;
            Some((FRIENDLY_DEVICE_CLASS.to_owned(), vec![friendly.to_cel()]))
        }
    }
}

/// The friendly form normalised, or `None` after reporting why it is not valid.
fn friendly(d: &Devices, error: &mut impl FnMut(&str, String)) -> Option<Friendly> {
    let mut ok = true;
    let vendor = match d.vendor.as_deref().map(parse_vendor) {
        Some(Err(e)) => {
            error(".vendor", e.to_string());
            ok = false;
            None
        }
        Some(Ok(vendor)) => Some(vendor),
        None => None,
    };
    if let Some(pf) = &d.pf_name {
        if let Err(e) = check_interface_name(pf) {
            error(".pfName", e.to_string());
            ok = false;
        } else if d.kind == Some(DeviceKind::Nic) {
            error(
                ".pfName",
                "only VFs have a PF name; use kind: vf or remove pfName".to_owned(),
            );
            ok = false;
        }
    }
    if d.min_speed == Some(0) {
        error(".minSpeed", "must be at least 1 (Mb/s)".to_owned());
        ok = false;
    }
    ok.then(|| Friendly {
        kind: d.kind,
        vendor,
        pf_name: d.pf_name.clone(),
        min_speed: d.min_speed,
        numa_node: d.numa_node,
        rdma: d.rdma,
    })
}

/// `8086`, `0x8086` (any case) → an id; anything else that is a plausible attribute value → a
/// name. A `0x` prefix commits to an id, so `0x80` is an error rather than a vendor name.
fn parse_vendor(text: &str) -> Result<Vendor> {
    let hex = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X"));
    let digits = hex.unwrap_or(text);
    if digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return u16::from_str_radix(digits, 16)
            .map(Vendor::Id)
            .map_err(|e| Error::Rule(format!("{text:?}: {e}")));
    }
    if hex.is_some() {
        return Err(Error::Rule(format!(
            "{text:?} is not a PCI vendor id; write four hex digits, e.g. 0x8086"
        )));
    }
    if text.trim().is_empty() {
        return Err(Error::Rule(
            "must not be empty; write a PCI vendor id (8086 or 0x8086) or the vendor's name as in pci.ids"
                .to_owned(),
        ));
    }
    if text.len() > MAX_ATTRIBUTE_STRING {
        return Err(Error::Rule(format!(
            "{text:?} is {} bytes; the driver publishes vendor names of at most {MAX_ATTRIBUTE_STRING} bytes",
            text.len()
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(Error::Rule(format!(
            "{text:?} must not contain control characters"
        )));
    }
    Ok(Vendor::Name(text.to_owned()))
}

/// A cheap syntax check of a CEL selector: not empty, within Kubernetes' size limit, tokens
/// that are CEL (string literals closed), `()`, `[]`, `{}` balanced, and no form the
/// apiserver's cost limit refuses.
///
/// Full CEL compilation (names, types, functions) is not available in Rust: the apiserver
/// compiles every selector when the reconciler applies the generated ResourceClaimTemplate and
/// refuses the template if one does not compile; that refusal lands in the Network's status.
/// This check catches the typos that are visible without a compiler, before anything is
/// generated, with a position the admin can find.
pub fn lint_cel(expression: &str) -> Result<()> {
    if expression.trim().is_empty() {
        return Err(Error::Rule("must not be empty".to_owned()));
    }
    if expression.len() > MAX_CEL_BYTES {
        return Err(Error::Rule(format!(
            "is {} bytes; Kubernetes allows at most {MAX_CEL_BYTES}",
            expression.len()
        )));
    }
    if let Some(problem) = crate::cel::syntax_problem(expression) {
        return Err(Error::Rule(problem));
    }
    if crate::cel::exceeds_cost_limit(expression) == Ok(true) {
        return Err(Error::Rule(format!(
            "Kubernetes refuses this selector ({}): contains() or matches() on an optional read \
             .?NAME.orValue(…) has no length bound in the apiserver's cost estimate; read the \
             attribute behind a guard instead, e.g. !has(device.attributes[\"DOMAIN\"].NAME) || \
             !device.attributes[\"DOMAIN\"].NAME.contains(\"…\")",
            crate::cel::COST_LIMIT_MESSAGE
        )));
    }
    Ok(())
}

pub(super) use crate::names::is_dns_subdomain;

/// A network's devices in the form overlap is decided on.
#[derive(Debug, Clone)]
pub(super) struct DeviceSet {
    /// Set for friendly forms and for a built-in class without selectors.
    friendly: Option<Friendly>,
    class: String,
    selectors: BTreeSet<String>,
}

impl DeviceSet {
    /// `None` when `devices` is not valid (its own validation reports why).
    pub(super) fn of(d: &Devices) -> Option<DeviceSet> {
        let mut errors = Vec::new();
        let (class, selectors) = check(d, 0, &mut errors)?;
        if !errors.is_empty() {
            return None;
        }
        let friendly = if has_friendly(d) {
            friendly(d, &mut |_, _| {})
        } else if selectors.is_empty() {
            builtin_class(&class)
        } else {
            None
        };
        Some(DeviceSet {
            friendly,
            class,
            selectors: selectors.iter().map(|s| s.trim().to_owned()).collect(),
        })
    }

    /// Whether the two networks may be given the same device, decided only where it can be
    /// shown without evaluating CEL (see [`super::validate_against`]):
    /// * two friendly forms (a built-in class without selectors is one) share devices when no
    ///   field separates them;
    /// * otherwise, when both use the same DeviceClass and one's selectors are a subset of the
    ///   other's (identical selectors included, compared after trimming): every device of the
    ///   narrower network then also belongs to the wider one.
    pub(super) fn may_share(&self, other: &DeviceSet) -> bool {
        if let (Some(a), Some(b)) = (&self.friendly, &other.friendly) {
            return a.compatible(b);
        }
        self.class == other.class
            && (self.selectors.is_subset(&other.selectors)
                || other.selectors.is_subset(&self.selectors))
    }
}
