//! Kubernetes quantities (`2G`, `500Mi`, `1.5k`) as exact unsigned integers.
//!
//! Rates and sizes reach knic as quantity strings from two places that must agree to the bit:
//! a NetworkConfig's `bandwidth` block and an allocation's `consumedCapacity`. The apiserver's
//! own parser keeps arbitrary precision; knic needs a whole number the kernel can take, so
//! this one works in integers only (no floats that would turn `2G` into 1999999999) and refuses
//! what it cannot represent exactly instead of rounding: a fraction of a bit, a negative rate,
//! or a value beyond `u64`.

use crate::{Error, Result};

/// Longer texts are refused before any arithmetic: no real rate needs more, and an unbounded
/// string from a claim must not cost unbounded work or end up whole in an error message.
pub const MAX_QUANTITY_CHARS: usize = 64;

/// The suffixes as the error text lists them.
const SUFFIXES: &str = "k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei";

/// Parses a Kubernetes quantity into an exact `u64`.
///
/// Accepted, as the apiserver accepts them: an optional `+`, digits with an optional decimal
/// fraction (`1.5`, `.5`, `2.`), then one of the decimal suffixes `m` (10⁻³), `k`, `M`, `G`,
/// `T`, `P`, `E`, the binary suffixes `Ki` … `Ei`, or a decimal exponent (`2e9`, `5E+3`).
/// The result must be a whole number: `1.5k` is 1500, `1.5` is refused. Zero is returned as 0;
/// callers state their own minimum. Errors quote the text (bounded) and say which rule failed.
pub fn parse_quantity(text: &str) -> Result<u64> {
    if text.is_empty() {
        return Err(Error::Rule("must not be empty".to_owned()));
    }
    let chars = text.chars().count();
    if chars > MAX_QUANTITY_CHARS {
        return Err(Error::Rule(format!(
            "is {chars} characters long; a quantity has at most {MAX_QUANTITY_CHARS}"
        )));
    }
    let garbage = || {
        Error::Rule(format!(
            "{text:?} is not a quantity; expected digits with an optional suffix ({SUFFIXES}), \
             e.g. \"2G\" or \"500Mi\""
        ))
    };
    let (negative, unsigned) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(garbage());
    }
    let scale = Scale::of(suffix).ok_or_else(garbage)?;
    if negative {
        let zero = whole.bytes().chain(fraction.bytes()).all(|b| b == b'0');
        if !zero {
            return Err(Error::Rule(format!(
                "{text:?} is negative; it must be positive"
            )));
        }
        return Ok(0);
    }
    let too_large = || {
        Error::Rule(format!(
            "{text:?} is too large; at most {} is possible",
            u64::MAX
        ))
    };
    // Trailing zeros of the fraction change nothing; dropping them keeps `1.000…0G` exact.
    let fraction = fraction.trim_end_matches('0');
    let mut mantissa: u128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or_else(too_large)?;
    }
    let fraction_digits = i64::try_from(fraction.len()).map_err(|_| garbage())?;
    let exponent = scale
        .decimal
        .checked_sub(fraction_digits)
        .ok_or_else(too_large)?;
    let scaled = mantissa
        .checked_mul(1u128 << scale.binary)
        .ok_or_else(too_large)?;
    let value = if exponent >= 0 {
        let factor = u32::try_from(exponent)
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
            .ok_or_else(too_large)?;
        if scaled == 0 {
            0
        } else {
            scaled.checked_mul(factor).ok_or_else(too_large)?
        }
    } else {
        let divisor = exponent
            .checked_neg()
            .and_then(|e| u32::try_from(e).ok())
            .and_then(|e| 10u128.checked_pow(e));
        match divisor {
            Some(d) if scaled % d == 0 => scaled / d,
            _ if scaled == 0 => 0,
            _ => {
                return Err(Error::Rule(format!(
                    "{text:?} is not a whole number; give a value without a fraction of the \
                     unit (e.g. \"1500k\" rather than \"1.5000001M\")"
                )));
            }
        }
    };
    u64::try_from(value).map_err(|_| too_large())
}

/// The apiserver's canonical spelling of a whole number in decimal SI form: the largest
/// suffix that keeps the mantissa whole (`25000000000` → `25G`, `1500000` → `1500k`). What knic
/// publishes must be spelled so: a slice whose stored form differs from the sent one would
/// look changed to the publisher on every sync.
pub fn canonical(value: u64) -> String {
    const SUFFIXES: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    if value == 0 {
        return "0".to_owned();
    }
    let mut mantissa = value;
    let mut exponent = 0;
    while exponent < SUFFIXES.len() && mantissa.is_multiple_of(1000) {
        mantissa /= 1000;
        exponent += 1;
    }
    match exponent {
        0 => mantissa.to_string(),
        e => format!("{mantissa}{}", SUFFIXES[e - 1]),
    }
}

/// What a suffix multiplies by: `10^decimal · 2^binary`.
struct Scale {
    decimal: i64,
    binary: u32,
}

impl Scale {
    fn of(suffix: &str) -> Option<Scale> {
        let decimal = |decimal| Some(Scale { decimal, binary: 0 });
        let binary = |binary| Some(Scale { decimal: 0, binary });
        match suffix {
            "" => decimal(0),
            "m" => decimal(-3),
            "k" => decimal(3),
            "M" => decimal(6),
            "G" => decimal(9),
            "T" => decimal(12),
            "P" => decimal(15),
            "E" => decimal(18),
            "Ki" => binary(10),
            "Mi" => binary(20),
            "Gi" => binary(30),
            "Ti" => binary(40),
            "Pi" => binary(50),
            "Ei" => binary(60),
            _ => {
                let rest = suffix.strip_prefix(['e', 'E'])?;
                let (sign, digits) = match rest.as_bytes().first()? {
                    b'-' => (-1, &rest[1..]),
                    b'+' => (1, &rest[1..]),
                    _ => (1, rest),
                };
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                // Parsed within i64; the arithmetic on it is checked, so an absurd exponent
                // (e.g. `e-9223372036854775807` with a fraction) is refused, never wraps.
                let exponent: i64 = digits.parse().ok()?;
                decimal(sign * exponent)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> u64 {
        parse_quantity(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn err(text: &str) -> String {
        parse_quantity(text)
            .expect_err("must be refused")
            .to_string()
    }

    #[test]
    fn canonical_matches_the_apiservers_decimal_form_and_round_trips() {
        let cases = [
            (0, "0"),
            (1, "1"),
            (999, "999"),
            (1000, "1k"),
            (1_500_000, "1500k"),
            (25_000_000_000, "25G"),
            (1_073_741_824, "1073741824"),
            (8_000_000_000_000_000_000, "8E"),
        ];
        for (value, want) in cases {
            assert_eq!(canonical(value), want, "{value}");
            assert_eq!(ok(want), value, "{want}");
        }
    }

    #[test]
    fn suffixes_decimal_binary_and_exponents() {
        assert_eq!(ok("2G"), 2_000_000_000);
        assert_eq!(ok("500M"), 500_000_000);
        assert_eq!(ok("1k"), 1000);
        assert_eq!(ok("3T"), 3_000_000_000_000);
        assert_eq!(ok("2P"), 2_000_000_000_000_000);
        assert_eq!(ok("18E"), 18_000_000_000_000_000_000);
        assert_eq!(ok("1Ki"), 1024);
        assert_eq!(ok("256Ki"), 262_144);
        assert_eq!(ok("1Mi"), 1 << 20);
        assert_eq!(ok("1Gi"), 1 << 30);
        assert_eq!(ok("1Ti"), 1 << 40);
        assert_eq!(ok("1Pi"), 1 << 50);
        assert_eq!(ok("15Ei"), 15 << 60);
        assert_eq!(ok("2e9"), 2_000_000_000);
        assert_eq!(ok("5E+3"), 5000);
        assert_eq!(ok("250e-1"), 25);
        assert_eq!(ok("8000m"), 8);
        assert_eq!(ok("12345"), 12345);
        assert_eq!(ok("+7"), 7);
        assert_eq!(ok("007"), 7);
        assert_eq!(ok("18446744073709551615"), u64::MAX);
    }

    #[test]
    fn exact_fractions_are_whole_numbers() {
        assert_eq!(ok("1.5G"), 1_500_000_000);
        assert_eq!(ok("1.5k"), 1500);
        assert_eq!(ok(".5k"), 500);
        assert_eq!(ok("2."), 2);
        assert_eq!(ok("0.5Ki"), 512);
        assert_eq!(
            ok("1.000000000000000000000000000000000000000000000000G"),
            1_000_000_000
        );
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("-0"), 0);
    }

    #[test]
    fn every_bad_input_names_its_rule() {
        // Exponents at the edge of i64: checked arithmetic, a refusal, never a panic.
        for text in [
            "1.1e-9223372036854775807",
            "1.11e-9223372036854775807",
            "1e-9223372036854775808",
            "1.5e9223372036854775807",
        ] {
            assert!(parse_quantity(text).is_err(), "{text}");
        }
        assert_eq!(err(""), "must not be empty");
        assert_eq!(
            err(&"1".repeat(65)),
            "is 65 characters long; a quantity has at most 64"
        );
        assert_eq!(err("-1G"), "\"-1G\" is negative; it must be positive");
        assert_eq!(
            err("1.5"),
            "\"1.5\" is not a whole number; give a value without a fraction of the unit \
             (e.g. \"1500k\" rather than \"1.5000001M\")"
        );
        assert_eq!(
            err("1.0000000001G"),
            "\"1.0000000001G\" is not a whole number; give a value without a fraction of the \
             unit (e.g. \"1500k\" rather than \"1.5000001M\")"
        );
        assert_eq!(
            err("500m"),
            "\"500m\" is not a whole number; give a value without a fraction of the unit \
             (e.g. \"1500k\" rather than \"1.5000001M\")"
        );
        assert_eq!(
            err("19E"),
            "\"19E\" is too large; at most 18446744073709551615 is possible"
        );
        assert_eq!(
            err("16Ei"),
            "\"16Ei\" is too large; at most 18446744073709551615 is possible"
        );
        assert_eq!(
            err("18446744073709551616"),
            "\"18446744073709551616\" is too large; at most 18446744073709551615 is possible"
        );
        assert_eq!(
            err("1e40"),
            "\"1e40\" is too large; at most 18446744073709551615 is possible"
        );
        for garbage in [
            "fast", "G", "2g", "2 G", " 2G", "2Gb", "2GiB", "1..5", "1.5.", ".", "+", "-", "2e",
            "2e+", "0x10", "1_000", "2Mi3", "١٢",
        ] {
            assert_eq!(
                err(garbage),
                format!(
                    "{garbage:?} is not a quantity; expected digits with an optional suffix \
                     (k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei), e.g. \"2G\" or \"500Mi\""
                ),
                "{garbage}"
            );
        }
    }
}
