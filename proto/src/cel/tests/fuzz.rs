//! Mutated examples: errors or results, never panics.

use super::*;

/// A small xorshift generator, so the fuzz test is repeatable without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n.max(1)).expect("fits");
        usize::try_from(self.next() % n).expect("fits")
    }

    /// A char boundary of `s` (its length included).
    fn boundary(&mut self, s: &str) -> usize {
        let mut at = self.below(s.len() + 1);
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        at
    }
}

/// Truncated and mutated versions of the examples compile to errors or selectors that
/// evaluate to results or errors; nothing panics, and syntax errors point into the text.
#[test]
fn mutated_examples_never_panic() {
    let devices = [intel_nic(), intel_pf_slow(), mlx_vf(), bare(), gpu()];
    let mut outcomes = BTreeMap::<&str, usize>::new();
    let mut check = |src: &str| match Selector::compile(src) {
        Ok(selector) => {
            for d in &devices {
                let kind = match selector.matches(d) {
                    Ok(_) => "evaluated",
                    Err(CelError::Eval(m)) => {
                        assert!(!m.is_empty());
                        "eval error"
                    }
                    Err(other) => panic!("{src:?} evaluated to {other:?}"),
                };
                *outcomes.entry(kind).or_default() += 1;
            }
        }
        Err(CelError::Syntax { at, message }) => {
            assert!(at <= src.len(), "{src:?}: {at} {message}");
            assert!(!message.is_empty());
            *outcomes.entry("syntax").or_default() += 1;
        }
        Err(CelError::Unsupported(m)) => {
            assert!(m.contains("(at byte "), "{src:?}: {m}");
            *outcomes.entry("unsupported").or_default() += 1;
        }
        Err(CelError::Eval(m)) => panic!("{src:?} failed to compile with {m}"),
    };
    for example in EXAMPLES {
        for end in 0..=example.len() {
            check(&example[..end]);
            check(&example[end..]);
        }
    }
    let fragments = [
        "(",
        ")",
        "[",
        "]",
        ".",
        ".?",
        "?",
        ":",
        "!",
        "-",
        "&&",
        "||",
        "==",
        "!=",
        "<",
        " in ",
        "\"",
        "'",
        "\\",
        "\\u",
        "\\U0010",
        "r\"",
        "1",
        "-1",
        "0x",
        "99999999999999999999",
        "1.5",
        "device",
        ".attributes",
        "[\"knic.dev\"]",
        ".orValue(",
        ",",
        "é",
        "😀",
        "//",
        "\n",
        "has(",
        "true",
        "{",
        "+",
        " ",
        ".contains(",
        ".matches(",
        "null",
        "[?",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut src = EXAMPLES[rng.below(EXAMPLES.len())].to_owned();
        for _ in 0..1 + rng.below(3) {
            match rng.below(4) {
                0 => {
                    let at = rng.boundary(&src);
                    src.truncate(at);
                }
                1 => {
                    let (a, b) = (rng.boundary(&src), rng.boundary(&src));
                    src.replace_range(a.min(b)..a.max(b), "");
                }
                2 => {
                    let at = rng.boundary(&src);
                    src.insert_str(at, fragments[rng.below(fragments.len())]);
                }
                _ => {
                    let (a, b) = (rng.boundary(&src), rng.boundary(&src));
                    let piece = src[a.min(b)..a.max(b)].to_owned();
                    let at = rng.boundary(&src);
                    src.insert_str(at, &piece);
                }
            }
        }
        check(&src);
    }
    // Every kind of outcome happened often, so the loop did exercise all the paths.
    for kind in ["evaluated", "eval error", "syntax", "unsupported"] {
        assert!(
            outcomes.get(kind).copied().unwrap_or(0) > 50,
            "{kind}: {outcomes:?}"
        );
    }
}
