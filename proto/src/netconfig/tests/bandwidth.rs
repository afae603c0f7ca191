//! `bandwidth`: the egress limit. Every refusal asserts its exact text, as in the parent module.

use serde_json::json;

use super::*;

rejects! {
    // shape
    reject_unknown_bandwidth_field: { "bandwidth": { "ingress": "1G" } }
        => ["bandwidth.ingress: unknown field"];
    reject_bandwidth_not_an_object: { "bandwidth": "2G" }
        => ["bandwidth: expected an object, got string \"2G\""];
    reject_bandwidth_egress_as_number: { "bandwidth": { "egress": 1000000 } }
        => ["bandwidth.egress: expected a quantity string like \"2G\", got number 1000000 (quote it)"];
    reject_bandwidth_burst_as_boolean: { "bandwidth": { "burst": true } }
        => ["bandwidth.burst: expected a quantity string like \"2G\", got boolean true"];

    // egress
    reject_negative_egress: { "bandwidth": { "egress": "-1G" } }
        => ["bandwidth.egress: \"-1G\" is negative; it must be positive"];
    reject_zero_egress: { "bandwidth": { "egress": "0" } }
        => ["bandwidth.egress: \"0\" is below 8 bit/s (one byte per second), the smallest rate the kernel can enforce"];
    reject_egress_below_a_byte_per_second: { "bandwidth": { "egress": "7" } }
        => ["bandwidth.egress: \"7\" is below 8 bit/s (one byte per second), the smallest rate the kernel can enforce"];
    reject_overflowing_egress: { "bandwidth": { "egress": "20E" } }
        => ["bandwidth.egress: \"20E\" is too large; at most 18446744073709551615 is possible"];
    reject_garbage_egress: { "bandwidth": { "egress": "2Gbps" } }
        => ["bandwidth.egress: \"2Gbps\" is not a quantity; expected digits with an optional suffix (k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei), e.g. \"2G\" or \"500Mi\""];
    reject_empty_egress: { "bandwidth": { "egress": "" } }
        => ["bandwidth.egress: must not be empty"];
    reject_inexact_egress: { "bandwidth": { "egress": "1.5" } }
        => ["bandwidth.egress: \"1.5\" is not a whole number; give a value without a fraction of the unit (e.g. \"1500k\" rather than \"1.5000001M\")"];
    reject_long_egress: { "bandwidth": { "egress": "0000000000000000000000000000000000000000000000000000000000000001G" } }
        => ["bandwidth.egress: is 65 characters long; a quantity has at most 64"];

    // burst
    reject_zero_burst: { "bandwidth": { "egress": "1G", "burst": "0" } }
        => ["bandwidth.burst: \"0\" is zero; a burst is at least 1 byte"];
    reject_negative_burst: { "bandwidth": { "egress": "1G", "burst": "-64Ki" } }
        => ["bandwidth.burst: \"-64Ki\" is negative; it must be positive"];
    reject_burst_beyond_the_kernels_u32: { "bandwidth": { "egress": "1G", "burst": "4Gi" } }
        => ["bandwidth.burst: \"4Gi\" is 4294967296 bytes; the kernel takes at most 4294967295 (4Gi - 1)"];
    reject_overflowing_burst: { "bandwidth": { "burst": "99999999999999999999" } }
        => ["bandwidth.burst: \"99999999999999999999\" is too large; at most 18446744073709551615 is possible"];
    reject_garbage_burst: { "bandwidth": { "burst": "lots" } }
        => ["bandwidth.burst: \"lots\" is not a quantity; expected digits with an optional suffix (k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei), e.g. \"2G\" or \"500Mi\""];
    reject_inexact_burst: { "bandwidth": { "burst": "0.1Ki" } }
        => ["bandwidth.burst: \"0.1Ki\" is not a whole number; give a value without a fraction of the unit (e.g. \"1500k\" rather than \"1.5000001M\")"];

    // both at once, and the mode that has no interface to limit
    reject_both_bandwidth_fields_at_once: { "bandwidth": { "egress": "fast", "burst": "0" } }
        => [
            "bandwidth.egress: \"fast\" is not a quantity; expected digits with an optional suffix (k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei), e.g. \"2G\" or \"500Mi\"",
            "bandwidth.burst: \"0\" is zero; a burst is at least 1 byte",
        ];
    reject_bandwidth_with_vfio: { "deviceMode": "vfio-pci", "bandwidth": { "egress": "1G" } }
        => ["bandwidth: cannot be set with deviceMode: \"vfio-pci\": the device is bound to vfio-pci and has no network interface to configure"];
}

#[test]
fn rates_are_exact_bits_per_second_and_bursts_bytes() {
    let cases = [
        ("2G", 2_000_000_000u64),
        ("500M", 500_000_000),
        ("1Gi", 1 << 30),
        ("1.5G", 1_500_000_000),
        ("8", 8),
        ("100e6", 100_000_000),
        ("18446744073709551615", u64::MAX),
    ];
    for (text, rate) in cases {
        let v = valid(json!({ "bandwidth": { "egress": text } }));
        assert_eq!(
            v.bandwidth,
            Some(BandwidthSettings {
                egress: Some(rate),
                burst: None
            }),
            "{text}"
        );
    }
    let v = valid(json!({ "bandwidth": { "burst": "4294967295" } }));
    assert_eq!(
        v.bandwidth,
        Some(BandwidthSettings {
            egress: None,
            burst: Some(u32::MAX)
        })
    );
    // Nothing asked, nothing planned: `{}` and `null` are both "no limit".
    assert_eq!(valid(json!({ "bandwidth": {} })).bandwidth, None);
    assert_eq!(valid(json!({ "bandwidth": null })).bandwidth, None);
    assert_eq!(
        valid(json!({ "bandwidth": { "egress": null } })).bandwidth,
        None
    );
}

#[test]
fn bandwidth_merges_field_by_field_class_then_claim() {
    let class = parse(
        &object(json!({ "bandwidth": { "egress": "1G", "burst": "128Ki" } })),
        "config[0].parameters",
    )
    .expect("class parses");
    let claim = parse(
        &object(json!({ "bandwidth": { "egress": "250M" } })),
        "config[1].parameters",
    )
    .expect("claim parses");
    let merged = merge(&[class.clone(), claim]);
    assert_eq!(
        merged.bandwidth,
        Some(BandwidthConfig {
            egress: Some("250M".into()),
            burst: Some("128Ki".into()),
        })
    );
    assert_eq!(
        validate(&merged).expect("valid").bandwidth,
        Some(BandwidthSettings {
            egress: Some(250_000_000),
            burst: Some(131_072),
        })
    );
    // A claim without the block keeps the class's limit.
    let plain = parse(&object(json!({ "interface": { "mtu": 9000 } })), "").expect("parses");
    assert_eq!(merge(&[class.clone(), plain]).bandwidth, class.bandwidth);
    // Paths carry the entry's prefix.
    let err = parse(
        &object(json!({ "bandwidth": { "egress": 5 } })),
        "config[2].parameters",
    )
    .expect_err("a number")
    .to_string();
    assert_eq!(
        err,
        "config[2].parameters.bandwidth.egress: expected a quantity string like \"2G\", got \
         number 5 (quote it)"
    );
}

#[test]
fn consumed_capacity_is_parsed_like_the_config() {
    assert_eq!(parse_egress("2G").expect("rate"), 2_000_000_000);
    assert_eq!(
        parse_egress("4").expect_err("too slow").to_string(),
        "\"4\" is below 8 bit/s (one byte per second), the smallest rate the kernel can enforce"
    );
}
