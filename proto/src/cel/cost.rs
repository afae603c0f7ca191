//! What a real kube-apiserver refuses in a device selector before anything is scheduled, and
//! the shape of a selector for comparing it with recorded apiserver verdicts.
//!
//! The apiserver estimates each selector's worst-case CEL cost and refuses one over the limit
//! ("Forbidden: too complex, exceeds cost limit"). Observed on v1.36
//! (`shared/fixtures/apiserver/cel-selector-verdicts-1.36.json`): an optional attribute read
//! `.?name.orValue(…)` loses the attribute's 64-byte bound in the estimate, so a function priced
//! by string length (`contains`, `matches`) on it is refused, while `startsWith`/`endsWith`,
//! comparisons and `contains` on a guarded plain read are accepted. knic cannot run the
//! apiserver's estimator, so it applies exactly that observed rule — to the selectors admins
//! write in a Network (a clear error before anything is generated) and in the e2e fake API
//! (which refuses what the real one refuses) — and never guesses beyond it.

use super::lexer::{Tok, Token, scan};
use super::{Result, syntax};

/// All tokens of `source` (unsupported literals included: the apiserver judges them too).
fn tokens(source: &str) -> Result<Vec<Token>> {
    match scan(source) {
        (_, Some(e)) => Err(e),
        (tokens, None) => Ok(tokens),
    }
}

/// The apiserver's own words for the refusal, after the field path.
pub const COST_LIMIT_MESSAGE: &str = "Forbidden: too complex, exceeds cost limit";

/// Whether a v1.36 apiserver refuses `source` for its cost: `contains()` or `matches()` called
/// on the result of `.orValue(…)`. Text that does not lex is not judged (`Ok(false)` is not
/// claimed for it: the lexer's error comes back).
pub fn exceeds_cost_limit(source: &str) -> Result<bool> {
    let tokens: Vec<Tok> = tokens(source)?.into_iter().map(|t| t.tok).collect();
    for (i, tok) in tokens.iter().enumerate() {
        let is_or_value = matches!(tok, Tok::Ident(name) if name == "orValue")
            && i > 0
            && tokens[i - 1] == Tok::Dot
            && tokens.get(i + 1) == Some(&Tok::LParen);
        if !is_or_value {
            continue;
        }
        let Some(close) = matching_paren(&tokens, i + 1) else {
            continue;
        };
        // Parentheses around the receiver change nothing: `(x.orValue("")).contains(…)`.
        let mut next = close + 1;
        while tokens.get(next) == Some(&Tok::RParen) {
            next += 1;
        }
        let length_priced = tokens.get(next) == Some(&Tok::Dot)
            && matches!(tokens.get(next + 1), Some(Tok::Ident(m)) if m == "contains" || m == "matches")
            && tokens.get(next + 2) == Some(&Tok::LParen);
        if length_priced {
            return Ok(true);
        }
    }
    Ok(false)
}

fn matching_paren(tokens: &[Tok], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, tok) in tokens.iter().enumerate().skip(open) {
        match tok {
            Tok::LParen => depth += 1,
            Tok::RParen => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The top-level `&&` clauses of `source`, each as a form: tokens separated by one space,
/// string literals as `S`, integer literals as `N` (a sign stays an operator), attribute names
/// (`device.attributes[D].NAME`, `.?NAME`) as `A`. Costs of `&&` operands add up, so a
/// conjunction of bounded clauses stays bounded; a clause's form is what a verdict is about.
/// Names are abstracted because every attribute has the same declared type in the
/// apiserver's CEL environment (a 64-byte-bounded string, an int, a bool or a version), so
/// the cost estimate of a read does not depend on which attribute it reads.
pub fn clause_forms(source: &str) -> Result<Vec<String>> {
    let tokens = tokens(source)?;
    let mut clauses = vec![Vec::new()];
    let mut depth = 0usize;
    for token in tokens {
        let word = match &token.tok {
            Tok::End => break,
            Tok::Str(_) => "S".to_owned(),
            Tok::Int(_) => "N".to_owned(),
            Tok::Unsupported(what) => format!("<{what}>"),
            Tok::Ident(name) => {
                const READ: [&str; 6] = ["attributes", "[", "S", "]", ".", "?"];
                let clause = clauses.last().map(Vec::as_slice).unwrap_or_default();
                let ends = |pattern: &[&str]| {
                    clause.len() >= pattern.len()
                        && clause[clause.len() - pattern.len()..]
                            .iter()
                            .zip(pattern)
                            .all(|(a, b)| a == b)
                };
                if ends(&READ[..5]) || ends(&READ) {
                    "A".to_owned()
                } else {
                    name.clone()
                }
            }
            Tok::And if depth == 0 => {
                clauses.push(Vec::new());
                continue;
            }
            other => {
                match other {
                    Tok::LParen | Tok::LBracket | Tok::LBrace => depth += 1,
                    Tok::RParen | Tok::RBracket | Tok::RBrace => {
                        depth = depth
                            .checked_sub(1)
                            .ok_or_else(|| syntax(token.at, "unbalanced closing bracket"))?;
                    }
                    _ => {}
                }
                other.describe().trim_matches('\'').to_owned()
            }
        };
        if let Some(clause) = clauses.last_mut() {
            clause.push(word);
        }
    }
    Ok(clauses.into_iter().map(|c| c.join(" ")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_observed_rule() {
        for refused in [
            r#"!device.attributes["knic.dev"].?exhaustedNetworks.orValue("").contains(",ab12cd34,")"#,
            r#"device.attributes["knic.dev"].?ifName.orValue("").contains("f0")"#,
            r#"device.attributes["d"][?"x"].orValue("").matches("a+")"#,
            r#"device.attributes["d"].?x.orValue(("")).contains("a")"#,
            r#"(device.attributes["d"].?x.orValue("")).contains("a")"#,
            r#"((device.attributes["d"][?"x"].orValue(""))).matches("a")"#,
        ] {
            assert_eq!(exceeds_cost_limit(refused), Ok(true), "{refused}");
        }
        for accepted in [
            r#"device.attributes["knic.dev"].?ifName.orValue("").startsWith("ens")"#,
            r#"device.attributes["knic.dev"].ifName.contains("f0")"#,
            r#"!has(device.attributes["knic.dev"].exhaustedNetworks) || !device.attributes["knic.dev"].exhaustedNetworks.contains(",ab12cd34,")"#,
            r#"device.attributes["knic.dev"].?x.orValue("") == "contains""#,
        ] {
            assert_eq!(exceeds_cost_limit(accepted), Ok(false), "{accepted}");
        }
        assert!(exceeds_cost_limit(r#"device.driver == "x"#).is_err());
    }

    #[test]
    fn forms_abstract_literals_and_split_conjunctions() {
        assert_eq!(
            clause_forms(
                r#"device.driver == "knic.dev" && (device.attributes["knic.dev"].?numaNode.orValue(-1) == 1 && true)"#
            ),
            Ok(vec![
                "device . driver == S".to_owned(),
                "( device . attributes [ S ] . ? A . orValue ( - N ) == N && true )".to_owned(),
            ])
        );
    }
}
