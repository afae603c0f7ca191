//! An evaluator for the CEL that knic's ValidatingAdmissionPolicies use, over JSON.
//!
//! The chart's policies are the only thing standing between a compromised node and every other
//! node's ResourceSlices, claim statuses and addresses, and a policy that never matches (or
//! always denies) looks fine until someone attacks or installs it. So the chart test renders
//! each policy and evaluates its expressions against allowed and forbidden admission requests;
//! no Rust CEL crate parses Kubernetes' optional syntax (`extra[?'k'][0].orValue('')`). The text
//! goes through the same parser and tree as device selectors (in its policy dialect), but the
//! device-selector evaluator is shaped around its one `device` variable, so policies have their
//! own evaluator over JSON values.
//!
//! The subset: `null`, bool, int and string literals, lists; declared variables (`request`,
//! `object`, `oldObject`, ...) and `variables.NAME`; `.f`, `.?f`, `[i]`, `[?k]`, `has(a.f)`;
//! `.orValue()`, `.hasValue()`, `.value()`; `size()`, `startsWith`, `endsWith`, `contains`;
//! the macros `all`, `exists`, `filter`, `map`; `!`, unary `-`, `&&`, `||`, `? :`, `+` (ints,
//! strings, lists), `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`. Everything else (map literals,
//! other arithmetic, other functions, floating-point, equality of optionals) is refused with
//! [`CelError::Unsupported`], so a test can never pass on a guessed answer.
//!
//! Nesting is bounded by [`MAX_DEPTH`](super::MAX_DEPTH) and evaluation by [`STEP_LIMIT`], so a
//! hostile expression or input neither overflows the stack nor runs unbounded.

use std::collections::BTreeMap;

use super::ast::Expr;
use super::parser::{Dialect, parse};
use super::{CelError, Result};

mod eval;

/// How many expression nodes one evaluation may visit: far above what a policy needs on one
/// request, low enough that nested comprehensions over a huge input stop within milliseconds.
pub const STEP_LIMIT: usize = 1_000_000;

/// A CEL value of the subset. Maps have string keys, as JSON objects do.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// `null`.
    Null,
    /// `bool`.
    Bool(bool),
    /// `int` (64-bit, overflow is an error).
    Int(i64),
    /// `string`.
    Str(String),
    /// `list`.
    List(Vec<Val>),
    /// `map` with string keys.
    Map(BTreeMap<String, Val>),
    /// `optional_type`: the result of `.?f`, `[?k]` and of selections on an optional.
    Opt(Option<Box<Val>>),
}

impl Val {
    /// `value` as CEL sees the JSON an apiserver hands a policy.
    pub fn from_json(value: &serde_json::Value) -> Result<Val> {
        eval::from_json(value)
    }

    /// The CEL type name, for errors.
    pub fn type_name(&self) -> &'static str {
        match self {
            Val::Null => "null_type",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Str(_) => "string",
            Val::List(_) => "list",
            Val::Map(_) => "map",
            Val::Opt(_) => "optional_type",
        }
    }

    fn describe(&self) -> String {
        match self {
            Val::Int(i) => i.to_string(),
            Val::Str(s) => format!("{s:?}"),
            other => other.type_name().to_owned(),
        }
    }
}

/// What an expression can refer to: named values (`request`, `object`, ...) and the policy's
/// `variables`, each already evaluated or failed. A failed variable is an error only where an
/// expression reads it, as in the apiserver, which evaluates variables lazily.
#[derive(Debug, Clone, Default)]
pub struct Env {
    names: BTreeMap<String, Val>,
    variables: BTreeMap<String, Result<Val>>,
}

impl Env {
    /// An environment declaring `names` with their values.
    pub fn new(names: impl IntoIterator<Item = (String, Val)>) -> Env {
        Env {
            names: names.into_iter().collect(),
            variables: BTreeMap::new(),
        }
    }

    /// Records `variables.NAME`'s outcome.
    pub fn set_variable(&mut self, name: &str, value: Result<Val>) {
        self.variables.insert(name.to_owned(), value);
    }

    /// The names an expression may refer to.
    pub fn declared(&self) -> Vec<&str> {
        self.names.keys().map(String::as_str).collect()
    }
}

/// A compiled policy expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    expr: Expr,
}

impl Program {
    /// Parses `source`, whose free identifiers must be among `declared` (and `variables`).
    pub fn compile(source: &str, declared: &[&str]) -> Result<Program> {
        let expr = parse(source, Dialect::Policy { declared })?;
        Ok(Program { expr })
    }

    /// The value of the expression in `env`.
    pub fn eval(&self, env: &Env) -> Result<Val> {
        eval::Eval {
            env,
            bound: Vec::new(),
            steps: 0,
        }
        .eval(&self.expr)
    }

    /// The value, which must be a bool (a validation or match condition).
    pub fn eval_bool(&self, env: &Env) -> Result<bool> {
        match self.eval(env)? {
            Val::Bool(b) => Ok(b),
            other => Err(CelError::Eval(format!(
                "expression evaluated to {}, not bool",
                other.type_name()
            ))),
        }
    }

    /// The value, which must be a string (a `messageExpression`).
    pub fn eval_string(&self, env: &Env) -> Result<String> {
        match self.eval(env)? {
            Val::Str(s) => Ok(s),
            other => Err(CelError::Eval(format!(
                "expression evaluated to {}, not string",
                other.type_name()
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
