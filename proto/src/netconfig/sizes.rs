//! GSO/GRO maximum sizes of the pod's interface (`interface.gsoMaxSize`, `groMaxSize`,
//! `gsoIpv4MaxSize`, `groIpv4MaxSize`): how large a packet the stack builds before
//! segmentation and how large GRO may merge received ones. Above 64 KiB they enable Big TCP
//! (IPv6 since Linux 5.19, IPv4 since 6.3, where the IPv4 variants came).
//!
//! Rule: each in 1280..=524280. The upper bound is the kernel's `GRO_MAX_SIZE` (8 × 65535,
//! also the largest `tso_max_size` a device reports); the kernel refuses more ("too big
//! gso_max_size"). The lower bound is the IPv6 minimum MTU: a size below one packet makes no
//! aggregate at all (the kernel's own minimum, `MAX_TCP_HEADER + 1`, is a few hundred bytes
//! and depends on its build). A device with a smaller `tso_max_size` refuses a larger
//! `gsoMaxSize` at attach, with the kernel's text; a kernel without the IPv4 variants (before
//! 6.3) fails the attach naming the setting, before anything changes.

use serde::{Deserialize, Serialize};

use super::FieldError;

/// The smallest size knic accepts (see the module documentation).
pub const MIN_OFFLOAD_SIZE: u32 = 1280;
/// `GRO_MAX_SIZE`, 8 × 65535: the largest size the kernel accepts.
pub const MAX_OFFLOAD_SIZE: u32 = 524_280;

/// Checked GSO/GRO maximum sizes; `None` leaves the device's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OffloadSizes {
    /// `IFLA_GSO_MAX_SIZE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gso_max_size: Option<u32>,
    /// `IFLA_GRO_MAX_SIZE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gro_max_size: Option<u32>,
    /// `IFLA_GSO_IPV4_MAX_SIZE` (Linux 6.3+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gso_ipv4_max_size: Option<u32>,
    /// `IFLA_GRO_IPV4_MAX_SIZE` (Linux 6.3+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gro_ipv4_max_size: Option<u32>,
}

impl OffloadSizes {
    /// None set.
    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(|(_, v)| v.is_none())
    }

    /// (`interface.<field>` name, value) of each size, in attribute order, so callers report a
    /// size by the name the operator wrote.
    pub fn fields(&self) -> [(&'static str, Option<u32>); 4] {
        [
            ("gsoMaxSize", self.gso_max_size),
            ("groMaxSize", self.gro_max_size),
            ("gsoIpv4MaxSize", self.gso_ipv4_max_size),
            ("groIpv4MaxSize", self.gro_ipv4_max_size),
        ]
    }
}

/// Checks the four sizes of `interface`, reporting each out-of-range one.
pub(super) fn validate_sizes(
    wanted: [(&'static str, Option<u32>); 4],
    errors: &mut Vec<FieldError>,
) -> OffloadSizes {
    let mut checked = [None; 4];
    for (slot, (name, value)) in checked.iter_mut().zip(wanted) {
        let Some(value) = value else { continue };
        if (MIN_OFFLOAD_SIZE..=MAX_OFFLOAD_SIZE).contains(&value) {
            *slot = Some(value);
        } else {
            errors.push(FieldError::new(
                format!("interface.{name}"),
                format!(
                    "must be between {MIN_OFFLOAD_SIZE} and {MAX_OFFLOAD_SIZE} bytes (the kernel's GRO_MAX_SIZE), got {value}"
                ),
            ));
        }
    }
    OffloadSizes {
        gso_max_size: checked[0],
        gro_max_size: checked[1],
        gso_ipv4_max_size: checked[2],
        gro_ipv4_max_size: checked[3],
    }
}
