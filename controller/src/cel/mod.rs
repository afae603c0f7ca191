//! An evaluator for the subset of CEL that DRA device selectors written by knic use.
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

/// How deeply expressions may nest (parentheses, lists, arguments, member steps such as
/// `.name` and `[key]`, and operators applied to operators). Kubernetes has no such limit of
/// its own below its cost budget, but knic's selectors nest about eight levels at most, and a
/// bound keeps a hostile expression from exhausting the stack of the recursive parser and
/// evaluators.
pub const MAX_DEPTH: usize = 64;

use ast::Expr;
use eval::{Val, eval};
pub use knic_proto::cel::{
    COST_LIMIT_MESSAGE, CelError, clause_forms, exceeds_cost_limit, syntax_problem,
};
use knic_proto::cel::{syntax, unsupported};

type Result<T, E = CelError> = std::result::Result<T, E>;

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

mod ast;
mod eval;
mod parser;
pub mod policy;
mod subset;

#[cfg(test)]
mod tests;
