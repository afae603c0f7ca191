//! CEL as knic reads it: the one tokenizer for selector text, the syntax check and the cost rule
//! Network validation applies, the error type every CEL consumer reports with, and the evaluator
//! of the subset DRA device selectors written by knic use.
//!
//! Shared here because both binaries must compute the same answers: the controller counts the
//! nodes that offer a free matching device (`status.availableNodes`), and the driver answers
//! the same question for its own node (KNI `QueryNodeNetworks`, the node readiness object) and
//! picks the device a KNI attach gets, so one evaluator decides both.
//!
//! The controller reports in `status.availableNodes` how many nodes offer a free device a
//! Network's claims could get, which means running the DeviceClass's and the request's CEL
//! selectors against the devices of every ResourceSlice, as the scheduler does. No Rust CEL
//! crate parses Kubernetes' optional field syntax (`.?speed.orValue(0)`), which every friendly
//! Network compiles to, so this module evaluates the small language knic itself generates and
//! ships (see [`Selector`] for the exact subset).
//!
//! Anything outside the subset is refused with [`CelError::Unsupported`] (and malformed text
//! with [`CelError::Syntax`]) instead of being guessed at, so the caller can report the count
//! as unknown rather than a wrong number. Evaluation follows CEL where it matters for the
//! count: values of different types are unequal (cel-go's heterogeneous equality) but cannot be
//! ordered, and reading a missing attribute without `.?` is an error ([`CelError::Eval`]),
//! which in the scheduler fails the whole scheduling attempt of the pod (so the caller treats
//! it as "unknown", not as "no match"); `&&` and `||` absorb errors the commutative CEL way
//! (`false && error` is `false`).
//!
//! Selectors share one parser and syntax tree with the admission-policy expressions of
//! [`policy`] (one grammar, one place to fix it); the selector dialect's limits are checked
//! while parsing (`subset`), and each language has its own evaluator, because a selector
//! reads a [`Device`] and a policy reads JSON.
//!
//! Parsing and evaluation never panic and never recurse deeper than [`MAX_DEPTH`] levels, so a
//! hostile selector in a Network cannot crash or overflow the controller.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as resource;

use ast::Expr;
use eval::{Val, eval};

mod ast;
pub mod cost;
mod eval;
pub mod lexer;
mod parser;
pub mod policy;
mod subset;

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

/// How deeply expressions may nest (parentheses, lists, arguments, member steps such as
/// `.name` and `[key]`, and operators applied to operators). Kubernetes has no such limit of
/// its own below its cost budget, but knic's selectors nest about eight levels at most, and a
/// bound keeps a hostile expression from exhausting the stack of the recursive parser and
/// evaluators.
pub const MAX_DEPTH: usize = 64;

/// An attribute value as ResourceSlices publish it (`DeviceAttribute` has exactly one of
/// these set). Literals in selectors are the first three kinds; versions only come from
/// devices, because knic does not evaluate `semver()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `bool` attribute or `true`/`false` literal.
    Bool(bool),
    /// `int` attribute or integer literal.
    Int(i64),
    /// `string` attribute or string literal.
    String(String),
    /// `version` attribute: a semantic version, which CEL can only compare for equality with
    /// another version here (build metadata ignored, as Kubernetes' `semver` type does).
    Version(String),
}

impl Value {
    /// The value of a published attribute, or `None` if it sets no value kind this module
    /// knows (the API requires exactly one; an empty one is treated as absent).
    fn from_attribute(attribute: &resource::DeviceAttribute) -> Option<Value> {
        if let Some(b) = attribute.bool {
            Some(Value::Bool(b))
        } else if let Some(i) = attribute.int {
            Some(Value::Int(i))
        } else if let Some(s) = &attribute.string {
            Some(Value::String(s.clone()))
        } else {
            attribute
                .version
                .as_ref()
                .map(|v| Value::Version(v.clone()))
        }
    }
}

/// One device as a selector sees it: the CEL variable `device`, reduced to what knic
/// evaluates, so devices can be built in tests without a whole ResourceSlice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Device {
    /// The driver that published the device (`device.driver`).
    pub driver: String,
    /// Attributes by domain, then by id: `device.attributes["knic.dev"].kind` is
    /// `attributes["knic.dev"]["kind"]`. A missing domain reads as an empty map, like in
    /// Kubernetes.
    pub attributes: BTreeMap<String, BTreeMap<String, Value>>,
}

impl Device {
    /// From a `resource.k8s.io/v1` Device of a slice published by `driver`: a bare attribute
    /// name (`kind`) belongs to the driver's domain, a qualified one
    /// (`resource.kubernetes.io/pcieRoot`) to its prefix, which is how Kubernetes builds the
    /// `device.attributes` map.
    pub fn from_slice(driver: &str, device: &resource::Device) -> Device {
        let mut attributes: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
        for (name, attribute) in device.attributes.iter().flatten() {
            let Some(value) = Value::from_attribute(attribute) else {
                continue;
            };
            let (domain, id) = name.split_once('/').unwrap_or((driver, name));
            attributes
                .entry(domain.to_owned())
                .or_default()
                .insert(id.to_owned(), value);
        }
        Device {
            driver: driver.to_owned(),
            attributes,
        }
    }
}

/// A compiled device selector.
///
/// The subset it understands, which covers every selector knic generates and ships:
///
/// * literals: strings in double or single quotes with CEL's escapes (`\\ \" \' \n \r \t \a \b
///   \f \v \? \` \xHH \uXXXX \UXXXXXXXX` and octal), raw strings (`r"..."`), integers
///   (decimal or `0x` hex, negative with `-`), `true`, `false`, lists `[a, b]`;
/// * `device.driver`; `device.attributes["DOMAIN"].NAME` and `device.attributes["DOMAIN"]["NAME"]`;
///   optional access `device.attributes["DOMAIN"].?NAME` (or `[?"NAME"]`) followed by
///   `.orValue(LITERAL)`, `.hasValue()` or `.value()`; `has(device.attributes["DOMAIN"].NAME)`;
/// * `!`, unary `-`, `&&`, `||`, `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, parentheses, with CEL's
///   precedence (`||` below `&&` below relations below unary operators);
/// * the string methods `startsWith`, `endsWith` and `contains`;
/// * `//` comments.
///
/// Refused as unsupported: `device.capacity`, other fields of `device`, other identifiers and
/// functions, `.matches()` and every other method, arithmetic, `?:`, maps, floating-point,
/// unsigned, bytes and triple-quoted literals, `null`, and nesting deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    expr: Expr,
}

impl Selector {
    /// Parses `source`, refusing text that is not CEL ([`CelError::Syntax`]) and CEL outside
    /// the subset ([`CelError::Unsupported`]), so that evaluating never meets a construct it
    /// would have to guess about.
    pub fn compile(source: &str) -> Result<Selector> {
        let expr = parser::parse(source, parser::Dialect::Selector)?;
        Ok(Selector { expr })
    }

    /// Whether `device` satisfies the selector. An `Err` means the selector fails on this
    /// device (missing attribute, mismatched types, a result that is not a bool); Kubernetes
    /// does not allocate such a device, so callers count it as not matching.
    pub fn matches(&self, device: &Device) -> Result<bool> {
        match eval(&self.expr, device)? {
            Val::Bool(b) => Ok(b),
            other => Err(CelError::Eval(format!(
                "selector evaluated to {}, not bool",
                other.type_name()
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
