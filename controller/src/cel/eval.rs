//! Evaluates a parsed selector against one device, with CEL's semantics for the subset.

use std::cmp::Ordering;

use super::ast::*;
use super::{CelError, Device, Result, Value};

/// A value during evaluation, borrowing from the selector and the device.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val<'a> {
    Bool(bool),
    Int(i64),
    Str(&'a str),
    Version(&'a str),
    List(Vec<Val<'a>>),
}

impl<'a> Val<'a> {
    pub(super) fn of(value: &'a Value) -> Val<'a> {
        match value {
            Value::Bool(b) => Val::Bool(*b),
            Value::Int(i) => Val::Int(*i),
            Value::String(s) => Val::Str(s),
            Value::Version(v) => Val::Version(v),
        }
    }

    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Str(_) => "string",
            Val::Version(_) => "version",
            Val::List(_) => "list",
        }
    }
}

pub(super) fn no_overload(a: &Val<'_>, op: &str, b: &Val<'_>) -> CelError {
    CelError::Eval(format!(
        "no such overload: {} {op} {}",
        a.type_name(),
        b.type_name()
    ))
}

pub(super) fn eval<'a>(e: &'a Expr, device: &'a Device) -> Result<Val<'a>> {
    match &e.kind {
        Kind::Lit(v) => Ok(Val::of(v)),
        Kind::List(items) => items
            .iter()
            .map(|item| eval(item, device))
            .collect::<Result<_>>()
            .map(Val::List),
        Kind::Driver => Ok(Val::Str(&device.driver)),
        Kind::Attr {
            domain,
            name,
            default,
        } => match (device.attribute(domain, name), default) {
            (Some(v), _) | (None, Some(v)) => Ok(Val::of(v)),
            (None, None) => Err(CelError::Eval(format!(
                "no such attribute: device.attributes[{domain:?}].{name}"
            ))),
        },
        Kind::Has { domain, name } => Ok(Val::Bool(device.attribute(domain, name).is_some())),
        Kind::Not(x) => match eval(x, device)? {
            Val::Bool(b) => Ok(Val::Bool(!b)),
            other => Err(CelError::Eval(format!(
                "no such overload: !{}",
                other.type_name()
            ))),
        },
        Kind::Neg(x) => match eval(x, device)? {
            Val::Int(i) => i
                .checked_neg()
                .map(Val::Int)
                .ok_or_else(|| CelError::Eval("integer overflow in -".to_owned())),
            other => Err(CelError::Eval(format!(
                "no such overload: -{}",
                other.type_name()
            ))),
        },
        Kind::And(operands) => logical(operands, device, false),
        Kind::Or(operands) => logical(operands, device, true),
        Kind::Rel(op, a, b) => {
            let a = eval(a, device)?;
            let b = eval(b, device)?;
            let symbol = op.symbol();
            let result = match op {
                Rel::Eq => equal(&a, &b)?,
                Rel::Ne => !equal(&a, &b)?,
                Rel::Lt => order(&a, &b, symbol)? == Ordering::Less,
                Rel::Le => order(&a, &b, symbol)? != Ordering::Greater,
                Rel::Gt => order(&a, &b, symbol)? == Ordering::Greater,
                Rel::Ge => order(&a, &b, symbol)? != Ordering::Less,
                Rel::In => contains(&a, &b)?,
            };
            Ok(Val::Bool(result))
        }
        Kind::Method(method, receiver, arg) => {
            let receiver = eval(receiver, device)?;
            let arg = eval(arg, device)?;
            match (&receiver, &arg) {
                (Val::Str(s), Val::Str(t)) => Ok(Val::Bool(match method {
                    Method::StartsWith => s.starts_with(t),
                    Method::EndsWith => s.ends_with(t),
                    Method::Contains => s.contains(t),
                })),
                _ => Err(CelError::Eval(format!(
                    "no such overload: {}.{}({})",
                    receiver.type_name(),
                    method.name(),
                    arg.type_name()
                ))),
            }
        }
    }
}

/// `&&` (`absorbing` false) or `||` (`absorbing` true) the CEL way: the absorbing value wins
/// over errors and non-bool operands in any position; otherwise the first error is returned.
pub(super) fn logical(operands: &[Expr], device: &Device, absorbing: bool) -> Result<Val<'static>> {
    let mut error = None;
    for operand in operands {
        match eval(operand, device) {
            Ok(Val::Bool(b)) if b == absorbing => return Ok(Val::Bool(absorbing)),
            Ok(Val::Bool(_)) => {}
            Ok(other) => {
                let op = if absorbing { "||" } else { "&&" };
                error.get_or_insert(CelError::Eval(format!(
                    "no such overload: {} {op} ...",
                    other.type_name()
                )));
            }
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(Val::Bool(!absorbing)),
    }
}

/// CEL equality: values of different types are unequal (heterogeneous equality).
pub(super) fn equal(a: &Val<'_>, b: &Val<'_>) -> Result<bool> {
    match (a, b) {
        (Val::Bool(x), Val::Bool(y)) => Ok(x == y),
        (Val::Int(x), Val::Int(y)) => Ok(x == y),
        (Val::Str(x), Val::Str(y)) => Ok(x == y),
        (Val::Version(x), Val::Version(y)) => Ok(without_build(x) == without_build(y)),
        (Val::List(xs), Val::List(ys)) => {
            if xs.len() != ys.len() {
                return Ok(false);
            }
            for (x, y) in xs.iter().zip(ys) {
                if !equal(x, y)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        // Heterogeneous equality, as cel-go (and so the scheduler) evaluates it: values of
        // different types are simply not equal (`!=` is true), never an error.
        _ => Ok(false),
    }
}

/// A semantic version without its build metadata, which semver equality ignores.
pub(super) fn without_build(version: &str) -> &str {
    version.split_once('+').map_or(version, |(v, _)| v)
}

/// CEL ordering: bools (`false < true`), ints and strings (by code point), each only against
/// its own type.
pub(super) fn order(a: &Val<'_>, b: &Val<'_>, op: &str) -> Result<Ordering> {
    match (a, b) {
        (Val::Bool(x), Val::Bool(y)) => Ok(x.cmp(y)),
        (Val::Int(x), Val::Int(y)) => Ok(x.cmp(y)),
        (Val::Str(x), Val::Str(y)) => Ok(x.cmp(y)),
        _ => Err(no_overload(a, op, b)),
    }
}

/// `a in list`: true if an element equals `a` (elements of another type are unequal).
pub(super) fn contains(a: &Val<'_>, list: &Val<'_>) -> Result<bool> {
    let Val::List(items) = list else {
        return Err(no_overload(a, "in", list));
    };
    let mut error = None;
    for item in items {
        match equal(a, item) {
            Ok(true) => return Ok(true),
            Ok(false) => {}
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    error.map_or(Ok(false), Err)
}
