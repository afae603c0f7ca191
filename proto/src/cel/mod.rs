//! CEL device selectors as the apiserver reads them: the one tokenizer for selector text, the
//! syntax check and the cost rule Network validation applies, and the error type every CEL
//! consumer reports with.
//!
//! Shared here rather than kept with the controller's evaluator because validating a Network is
//! domain both binaries must agree on (a webhook or the driver may refuse what the reconciler
//! refuses); evaluating selectors against devices stays in the controller, which alone counts
//! nodes.

pub mod cost;
pub mod lexer;

pub use cost::{COST_LIMIT_MESSAGE, clause_forms, exceeds_cost_limit};
use lexer::Tok;

/// Why a selector could not be compiled or evaluated. Comparable so tests and callers can tell the three outcomes apart: malformed text,
/// valid CEL that knic does not evaluate (count unknown), and a selector that fails on one
/// device (that device does not match, as in Kubernetes).
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CelError {
    /// The text is not CEL (or calls a method with the wrong number of arguments).
    #[error("CEL syntax error at byte {at}: {message}")]
    Syntax {
        /// Byte offset of the offending token in the source.
        at: usize,
        /// What was expected or what is wrong there.
        message: String,
    },
    /// Valid CEL outside the subset knic evaluates; the message names the construct and where
    /// it is.
    #[error("unsupported CEL: {0}")]
    Unsupported(String),
    /// Evaluating against one device failed (missing attribute, mismatched types); Kubernetes
    /// treats such a device as not matching.
    #[error("CEL evaluation error: {0}")]
    Eval(String),
}

/// Result of the CEL syntax functions.
pub type Result<T, E = CelError> = std::result::Result<T, E>;

/// A [`CelError::Syntax`] at byte `at`.
pub fn syntax(at: usize, message: impl Into<String>) -> CelError {
    CelError::Syntax {
        at,
        message: message.into(),
    }
}

/// A [`CelError::Unsupported`] naming `what` and byte `at`.
pub fn unsupported(at: usize, what: impl std::fmt::Display) -> CelError {
    CelError::Unsupported(format!("{what} (at byte {at})"))
}

/// What makes `source` not CEL, found without compiling it (names, types and functions are
/// the apiserver's to check): text that does not tokenise, a string never closed, or `()`,
/// `[]`, `{}` that do not pair up. Every literal CEL has is accepted, also those knic does not
/// evaluate, so Network validation refuses nothing the apiserver would compile.
pub fn syntax_problem(source: &str) -> Option<String> {
    let (tokens, error) = lexer::scan(source);
    if let Some(e) = error {
        return Some(match e {
            CelError::Syntax { at, message } if message == "unterminated string literal" => {
                format!("string literal starting at byte {at} is never closed")
            }
            other => other.to_string(),
        });
    }
    let mut open: Vec<(char, usize)> = Vec::new();
    for token in &tokens {
        let (closing, want) = match token.tok {
            Tok::LParen => {
                open.push(('(', token.at));
                continue;
            }
            Tok::LBracket => {
                open.push(('[', token.at));
                continue;
            }
            Tok::LBrace => {
                open.push(('{', token.at));
                continue;
            }
            Tok::RParen => (')', '('),
            Tok::RBracket => (']', '['),
            Tok::RBrace => ('}', '{'),
            _ => continue,
        };
        let i = token.at;
        match open.pop() {
            Some((o, _)) if o == want => {}
            Some((o, at)) => {
                return Some(format!(
                    "unbalanced: '{closing}' at byte {i} closes '{o}' opened at byte {at}"
                ));
            }
            None => {
                return Some(format!(
                    "unbalanced: '{closing}' at byte {i} has no matching '{want}'"
                ));
            }
        }
    }
    open.pop()
        .map(|(o, at)| format!("unbalanced: '{o}' at byte {at} is never closed"))
}
