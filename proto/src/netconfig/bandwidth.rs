//! `bandwidth`: the pod interface's egress limit. Rates are Kubernetes quantities in bits per
//! second (`2G` is 2·10⁹ bit/s), the burst in bytes, both exact integers (see
//! [`crate::quantity`]), so a config, a device's `bandwidth` capacity and an allocation's
//! `consumedCapacity.bandwidth` all mean the same number.

use serde::{Deserialize, Serialize};

use super::FieldError;
use crate::quantity::parse_quantity;
use crate::{Error, Result};

/// The smallest rate: the kernel limits in whole bytes per second, so 8 bit/s.
pub const MIN_EGRESS: u64 = 8;

/// The largest burst: the kernel's token bucket takes it as a 32-bit byte count
/// (`TCA_TBF_BURST`).
pub const MAX_BURST: u64 = u32::MAX as u64;

/// The wire form of `bandwidth`; strings so a bad quantity is reported with its text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BandwidthConfig {
    /// Egress rate cap in bit/s, as a quantity (`"2G"`, `"500M"`, `"1Gi"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<String>,
    /// Bytes that may leave at line rate before the cap applies, as a quantity (`"256Ki"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<String>,
}

impl BandwidthConfig {
    /// Later layers win field by field: a class can fix the burst while claims pick rates.
    pub(super) fn merge_from(&mut self, layer: &BandwidthConfig) {
        if layer.egress.is_some() {
            self.egress.clone_from(&layer.egress);
        }
        if layer.burst.is_some() {
            self.burst.clone_from(&layer.burst);
        }
    }
}

/// Checked `bandwidth` settings. `egress` may be missing: the rate then comes from what the
/// allocation consumed of the device's `bandwidth` capacity (the driver's plan decides).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BandwidthSettings {
    /// bit/s, at least [`MIN_EGRESS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<u64>,
    /// Bytes, 1..=[`MAX_BURST`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

/// An egress limit as enforced: a rate and, optionally, the burst the operator chose (the
/// driver picks one otherwise). Stored in the attach plan, so serde-stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    /// bit/s, at least [`MIN_EGRESS`].
    pub egress: u64,
    /// Bytes; `None` lets the driver size it from the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

/// An egress rate (bit/s) from a quantity text, with the rule it breaks otherwise; shared by
/// the config's `bandwidth.egress` and the allocation's consumed capacity so both refuse alike.
pub fn parse_egress(text: &str) -> Result<u64> {
    let rate = parse_quantity(text)?;
    if rate < MIN_EGRESS {
        return Err(Error::Rule(format!(
            "{text:?} is below {MIN_EGRESS} bit/s (one byte per second), the smallest rate the \
             kernel can enforce"
        )));
    }
    Ok(rate)
}

/// Checks `bandwidth` (paths `bandwidth.<field>`), pushing every problem onto `errors`;
/// `None` when nothing valid is asked for.
pub(super) fn validate_bandwidth(
    config: &BandwidthConfig,
    errors: &mut Vec<FieldError>,
) -> Option<BandwidthSettings> {
    let mut out = BandwidthSettings::default();
    if let Some(text) = &config.egress {
        match parse_egress(text) {
            Ok(rate) => out.egress = Some(rate),
            Err(e) => errors.push(FieldError::new("bandwidth.egress", e.to_string())),
        }
    }
    if let Some(text) = &config.burst {
        match parse_quantity(text) {
            Ok(0) => errors.push(FieldError::new(
                "bandwidth.burst",
                format!("{text:?} is zero; a burst is at least 1 byte"),
            )),
            Ok(bytes) => match u32::try_from(bytes) {
                Ok(bytes) => out.burst = Some(bytes),
                Err(_) => errors.push(FieldError::new(
                    "bandwidth.burst",
                    format!(
                        "{text:?} is {bytes} bytes; the kernel takes at most {MAX_BURST} (4Gi - 1)"
                    ),
                )),
            },
            Err(e) => errors.push(FieldError::new("bandwidth.burst", e.to_string())),
        }
    }
    (out != BandwidthSettings::default()).then_some(out)
}
