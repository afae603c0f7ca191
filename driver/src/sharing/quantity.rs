//! Rates in the share policy: Kubernetes quantities in bit/s, parsed by the one exact parser
//! both binaries use ([`knic_proto::quantity`]), within what a capacity can hold.

pub use knic_proto::quantity::canonical;
use knic_proto::quantity::parse_quantity;

use crate::inventory::filter::Invalid;

/// The largest rate: the apiserver refuses a range bound above `i64::MAX`.
pub const MAX_BITS: u64 = i64::MAX as u64;

/// Parses a rate: greater than zero and at most [`MAX_BITS`]; the error says which rule is
/// broken.
pub(crate) fn parse_bits(text: &str) -> std::result::Result<u64, Invalid> {
    let bits = parse_quantity(text).map_err(|e| Invalid(e.to_string()))?;
    if bits == 0 {
        return Err(Invalid("must be greater than zero".to_owned()));
    }
    if bits > MAX_BITS {
        return Err(Invalid(format!("more than {MAX_BITS} bit/s")));
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_bits(text).unwrap_err().0
    }

    #[test]
    fn sharing_quantity_bounds_what_a_capacity_holds() {
        assert_eq!(parse_bits("25G").map_err(|e| e.0), Ok(25_000_000_000));
        assert_eq!(parse_bits("1Gi").map_err(|e| e.0), Ok(1 << 30));
        assert_eq!(err("0"), "must be greater than zero");
        assert_eq!(err("0.0G"), "must be greater than zero");
        assert_eq!(err("10E"), "more than 9223372036854775807 bit/s");
        assert_eq!(
            err("0.5"),
            "\"0.5\" is not a whole number; give a value without a fraction of the unit \
             (e.g. \"1500k\" rather than \"1.5000001M\")"
        );
    }

    /// Every string of up to four characters over the grammar's alphabet: no panic, and
    /// whatever parses survives its canonical spelling unchanged.
    #[test]
    fn sharing_quantity_never_panics_and_round_trips() {
        let alphabet: Vec<char> = "09.5kMGEi-e".chars().collect();
        let mut parsed = 0;
        let mut stack: Vec<usize> = Vec::new();
        loop {
            let text: String = stack.iter().map(|&i| alphabet[i]).collect();
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
}
