//! The egress limit a device's plan carries: the config's `bandwidth`, or the rate the
//! allocation consumed of a shared device's `bandwidth` capacity.

use knic_proto::netconfig::{self, Bandwidth, BandwidthSettings, FieldError};

/// The egress limit of the device serving `request`: the config's `bandwidth.egress`, else
/// `consumed`, the rate the allocation took of the device's `bandwidth` capacity
/// (`consumedCapacity.bandwidth`, a quantity in bit/s), with the config's burst either way.
/// With both, the lower wins: a config may ask for less than the allocation set aside, never
/// for more (the scheduler counted only the consumed rate against the port, so more would take
/// another pod's share). A burst with neither rate is refused rather than ignored.
pub fn resolve_bandwidth(
    request: &str,
    config: Option<&BandwidthSettings>,
    consumed: Option<&str>,
) -> Result<Option<Bandwidth>, FieldError> {
    let burst = config.and_then(|c| c.burst);
    let consumed = consumed
        .map(|text| {
            netconfig::parse_egress(text).map_err(|e| {
                FieldError::new(
                    format!("request {request}: consumedCapacity.bandwidth"),
                    e.to_string(),
                )
            })
        })
        .transpose()?;
    let egress = match (config.and_then(|c| c.egress), consumed) {
        (Some(rate), Some(share)) => rate.min(share),
        (Some(rate), None) | (None, Some(rate)) => rate,
        (None, None) if burst.is_some() => {
            return Err(FieldError::new(
                format!("request {request}: bandwidth.burst"),
                "needs a rate: set bandwidth.egress, or request the device's bandwidth \
                 capacity (capacity: {requests: {bandwidth: ...}})",
            ));
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(Bandwidth { egress, burst }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::super::tests::{claim, config, device};
    use super::super::{IpamAddresses, configure, plans};
    use super::*;

    #[test]
    fn the_configs_limit_goes_into_the_plan_class_then_claim() {
        let c = claim(
            vec![
                device("a", "d0", Some("eth1")),
                device("b", "d1", Some("eth2")),
            ],
            vec![
                config(
                    "FromClass",
                    &[],
                    json!({"bandwidth": {"egress": "1G", "burst": "128Ki"}}),
                ),
                config(
                    "FromClaim",
                    &["b"],
                    json!({"bandwidth": {"egress": "2.5G"}}),
                ),
            ],
        );
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).unwrap();
        assert_eq!(
            p[0].bandwidth,
            Some(Bandwidth {
                egress: 1_000_000_000,
                burst: Some(131_072)
            })
        );
        assert_eq!(
            p[1].bandwidth,
            Some(Bandwidth {
                egress: 2_500_000_000,
                burst: Some(131_072)
            })
        );
    }

    #[test]
    fn no_block_no_limit_and_a_bad_one_is_reported_with_its_request() {
        let c = claim(vec![device("a", "d0", Some("eth1"))], vec![]);
        let p = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new()).unwrap();
        assert_eq!(p[0].bandwidth, None);
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"bandwidth": {"egress": "-2G"}}),
            )],
        );
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "request a: bandwidth.egress: \"-2G\" is negative; it must be positive"
        );
    }

    #[test]
    fn a_burst_without_any_rate_is_refused() {
        let c = claim(
            vec![device("a", "d0", Some("eth1"))],
            vec![config(
                "FromClaim",
                &[],
                json!({"bandwidth": {"burst": "1Mi"}}),
            )],
        );
        let err = plans(&c, &configure(&c), &BTreeSet::new(), &IpamAddresses::new())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "request a: bandwidth.burst: needs a rate: set bandwidth.egress, or request the \
             device's bandwidth capacity (capacity: {requests: {bandwidth: ...}})"
        );
    }

    #[test]
    fn consumed_capacity_is_the_rate_when_the_config_gives_none() {
        let burst_only = BandwidthSettings {
            egress: None,
            burst: Some(65_536),
        };
        assert_eq!(
            resolve_bandwidth("nic", Some(&burst_only), Some("2G")),
            Ok(Some(Bandwidth {
                egress: 2_000_000_000,
                burst: Some(65_536)
            }))
        );
        assert_eq!(
            resolve_bandwidth("nic", None, Some("1Gi")),
            Ok(Some(Bandwidth {
                egress: 1 << 30,
                burst: None
            }))
        );
        // A config may ask for less than the share, never more.
        let rate = BandwidthSettings {
            egress: Some(500_000_000),
            burst: None,
        };
        assert_eq!(
            resolve_bandwidth("nic", Some(&rate), Some("2G")),
            Ok(Some(Bandwidth {
                egress: 500_000_000,
                burst: None
            }))
        );
        let more = BandwidthSettings {
            egress: Some(10_000_000_000),
            burst: None,
        };
        assert_eq!(
            resolve_bandwidth("nic", Some(&more), Some("2G")),
            Ok(Some(Bandwidth {
                egress: 2_000_000_000,
                burst: None
            })),
            "capped at what the scheduler set aside"
        );
        assert_eq!(resolve_bandwidth("nic", None, None), Ok(None));
        let err = resolve_bandwidth("nic", None, Some("2.5"))
            .expect_err("not whole")
            .to_string();
        assert_eq!(
            err,
            "request nic: consumedCapacity.bandwidth: \"2.5\" is not a whole number; give a \
             value without a fraction of the unit (e.g. \"1500k\" rather than \"1.5000001M\")"
        );
        let err = resolve_bandwidth("nic", None, Some("1"))
            .expect_err("too slow")
            .to_string();
        assert_eq!(
            err,
            "request nic: consumedCapacity.bandwidth: \"1\" is below 8 bit/s (one byte per \
             second), the smallest rate the kernel can enforce"
        );
    }
}
