//! Rates as Kubernetes quantities in bit/s, with exact integer arithmetic.
//!
//! The share policy is written by people (`25G`, `100M`, `1Gi`), and what the driver publishes
//! must be the apiserver's canonical spelling (`25000000000` is stored as `25G`): a slice whose
//! stored form differs from the sent one would look changed to the publisher on every sync.
//! Private to `sharing` until the shared quantity parser in `knic-proto` lands; then
//! [`parse_bits`] and [`canonical`] merge into it.

use crate::inventory::filter::Invalid;

/// The largest rate: the apiserver refuses a range bound above `i64::MAX`.
pub const MAX_BITS: u64 = i64::MAX as u64;

/// What [`parse_bits`] says about text that is not a quantity.
const GRAMMAR: &str = "not a quantity in bit/s (digits with an optional suffix k, M, G, T, P, E, \
     Ki, Mi, Gi, Ti, Pi or Ei, e.g. 25G)";

const DECIMAL: [(&str, u32); 6] = [("k", 1), ("M", 2), ("G", 3), ("T", 4), ("P", 5), ("E", 6)];
const BINARY: [(&str, u32); 6] = [
    ("Ki", 1),
    ("Mi", 2),
    ("Gi", 3),
    ("Ti", 4),
    ("Pi", 5),
    ("Ei", 6),
];

/// Parses a rate: digits, an optional fraction, an optional SI (`k`…`E`) or binary
/// (`Ki`…`Ei`) suffix. The result must be a whole number of bit/s greater than zero and at
/// most [`MAX_BITS`]; the error says which rule is broken.
pub(crate) fn parse_bits(text: &str) -> std::result::Result<u64, Invalid> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: u128 = if suffix.is_empty() {
        1
    } else if let Some((_, p)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        1000u128.pow(*p)
    } else if let Some((_, p)) = BINARY.iter().find(|(s, _)| *s == suffix) {
        1024u128.pow(*p)
    } else {
        return Err(Invalid(GRAMMAR.to_owned()));
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || fraction.contains('.') || (number.contains('.') && fraction.is_empty()) {
        return Err(Invalid(GRAMMAR.to_owned()));
    }
    let too_large = || Invalid(format!("more than {MAX_BITS} bit/s"));
    // Leading zeros and trailing fraction zeros change nothing; more than 40 significant
    // digits cannot be a rate below 2^63 and would overflow the arithmetic.
    let whole = whole.trim_start_matches('0');
    let fraction = fraction.trim_end_matches('0');
    if whole.len() > 40 {
        return Err(too_large());
    }
    if fraction.len() > 40 {
        return Err(Invalid("not a whole number of bit/s".to_owned()));
    }
    let digits = |s: &str| s.bytes().fold(0u128, |n, b| n * 10 + u128::from(b - b'0'));
    let scale = 10u128.pow(fraction.len() as u32);
    let scaled = digits(whole)
        .checked_mul(scale)
        .and_then(|w| w.checked_add(digits(fraction)))
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(too_large)?;
    if !scaled.is_multiple_of(scale) {
        return Err(Invalid("not a whole number of bit/s".to_owned()));
    }
    let bits = scaled / scale;
    if bits == 0 {
        return Err(Invalid("must be greater than zero".to_owned()));
    }
    if bits > u128::from(MAX_BITS) {
        return Err(too_large());
    }
    Ok(bits as u64)
}

/// The apiserver's canonical spelling of a whole number in decimal SI form: the largest
/// suffix that keeps the mantissa whole (`25000000000` → `25G`, `1500000` → `1500k`).
pub fn canonical(value: u64) -> String {
    if value == 0 {
        return "0".to_owned();
    }
    let mut mantissa = value;
    let mut exponent = 0;
    while exponent < DECIMAL.len() && mantissa.is_multiple_of(1000) {
        mantissa /= 1000;
        exponent += 1;
    }
    match exponent {
        0 => mantissa.to_string(),
        e => format!("{mantissa}{}", DECIMAL[e - 1].0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_bits(text).unwrap_err().0
    }

    #[test]
    fn sharing_quantity_parses_si_binary_and_fractions_exactly() {
        let cases = [
            ("25G", 25_000_000_000),
            ("100M", 100_000_000),
            ("1Gi", 1_073_741_824),
            ("1.5G", 1_500_000_000),
            ("0.5k", 500),
            ("007", 7),
            ("2.50M", 2_500_000),
            ("9223372036854775807", MAX_BITS),
            ("8E", 8_000_000_000_000_000_000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_bits(text).map_err(|e| e.0), Ok(want), "{text}");
        }
    }

    #[test]
    fn sharing_quantity_refuses_each_bad_form_by_rule() {
        for bad in [
            "", "G", "25g", "25 G", "-1", "1e9", "1..2", "1.", ".5", "25Gb", "1m",
        ] {
            assert_eq!(err(bad), GRAMMAR, "{bad:?}");
        }
        assert_eq!(err("0"), "must be greater than zero");
        assert_eq!(err("0.0G"), "must be greater than zero");
        assert_eq!(err("0.5"), "not a whole number of bit/s");
        assert_eq!(err("1.0000000001k"), "not a whole number of bit/s");
        assert_eq!(
            err("9223372036854775808"),
            "more than 9223372036854775807 bit/s"
        );
        assert_eq!(err("10E"), "more than 9223372036854775807 bit/s");
        assert_eq!(err(&"9".repeat(60)), "more than 9223372036854775807 bit/s");
    }

    /// Every string of up to four characters over the grammar's alphabet: no panic, and
    /// whatever parses survives its canonical spelling unchanged.
    #[test]
    fn sharing_quantity_never_panics_and_round_trips() {
        let alphabet: Vec<char> = "09.5kMGEi-e".chars().collect();
        let mut parsed = 0;
        let mut text = String::new();
        let mut stack = vec![0usize; 0];
        loop {
            text.clear();
            text.extend(stack.iter().map(|&i| alphabet[i]));
            if let Ok(value) = parse_bits(&text) {
                parsed += 1;
                assert_eq!(parse_bits(&canonical(value)).unwrap(), value, "{text}");
            }
            // The next string in length-then-lexicographic order.
            let mut i = stack.len();
            loop {
                if i == 0 {
                    if stack.len() == 4 {
                        assert!(parsed > 100, "{parsed}");
                        return;
                    }
                    stack = vec![0; stack.len() + 1];
                    break;
                }
                i -= 1;
                stack[i] += 1;
                if stack[i] < alphabet.len() {
                    break;
                }
                stack[i] = 0;
            }
        }
    }

    #[test]
    fn sharing_quantity_canonical_matches_the_apiservers_decimal_form() {
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
        }
        for value in [1, 10_000_000, 25_000_000_000, 1_073_741_824] {
            assert_eq!(parse_bits(&canonical(value)).unwrap(), value);
        }
    }
}
