//! Evaluates a parsed selector against one device, with CEL's semantics for the subset.
//!
//! The tree is the one policies use too; [`super::subset`] guaranteed while parsing that it
//! only reaches values through `device.driver` and `device.attributes[...]` chains, so the
//! device-shaped intermediate values below never meet an operator. Should a tree of another
//! shape arrive anyway, evaluation reports an error rather than guessing or panicking.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::ast::{Chain, Expr, Func, Kind, Rel};
use super::{CelError, Device, Result, Value};

/// A value during evaluation, borrowing from the selector and the device.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val<'a> {
    Bool(bool),
    Int(i64),
    Str(&'a str),
    Version(&'a str),
    List(Vec<Val<'a>>),
    /// `device`, only ever selected from.
    Device,
    /// `device.attributes`, only ever indexed.
    Attributes,
    /// `device.attributes[domain]`: the domain's attributes, if the device has any.
    Domain(&'a str, Option<&'a BTreeMap<String, Value>>),
    /// `device.attributes[domain].?name`, only ever unwrapped by a method.
    Optional {
        domain: &'a str,
        name: &'a str,
        value: Option<&'a Value>,
    },
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
            Val::Device | Val::Attributes | Val::Domain(..) => "map",
            Val::Optional { .. } => "optional_type",
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

/// The error for a tree the subset check would have refused; never reached from
/// [`super::Selector::compile`]'s output.
fn outside_subset(what: &str) -> CelError {
    CelError::Eval(format!("{what} is not evaluated in a device selector"))
}

fn missing(domain: &str, name: &str) -> CelError {
    CelError::Eval(format!(
        "no such attribute: device.attributes[{domain:?}].{name}"
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
        Kind::Ident(name) if name == "device" => Ok(Val::Device),
        Kind::Select {
            target,
            field,
            optional,
        } => step(eval(target, device)?, field, *optional, device),
        Kind::Index {
            target,
            index,
            optional,
        } => match eval(index, device)? {
            Val::Str(key) => step(eval(target, device)?, key, *optional, device),
            _ => Err(outside_subset("an index that is not a string")),
        },
        Kind::Has { target, field } => match eval(target, device)? {
            Val::Domain(_, attributes) => Ok(Val::Bool(
                attributes.is_some_and(|a| a.contains_key(field.as_str())),
            )),
            _ => Err(outside_subset("has() of anything but an attribute")),
        },
        Kind::Call { func, target, args } => call(*func, target, args, device),
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
        Kind::And(chain) => logical(chain, device, false),
        Kind::Or(chain) => logical(chain, device, true),
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
        Kind::Null => Err(outside_subset("null")),
        Kind::Ident(name) => Err(outside_subset(&format!("identifier '{name}'"))),
        Kind::Variable(name) => Err(outside_subset(&format!("variables.{name}"))),
        Kind::Comprehension { .. } => Err(outside_subset("a comprehension")),
        Kind::Add(..) => Err(outside_subset("'+'")),
        Kind::Cond(..) => Err(outside_subset("'? :'")),
    }
}

/// `target.key`, `target[key]` or their optional forms, along `device.attributes[d].name`.
fn step<'a>(target: Val<'a>, key: &'a str, optional: bool, device: &'a Device) -> Result<Val<'a>> {
    match (target, optional) {
        (Val::Device, false) if key == "driver" => Ok(Val::Str(&device.driver)),
        (Val::Device, false) if key == "attributes" => Ok(Val::Attributes),
        // A missing domain reads as an empty map, as in Kubernetes.
        (Val::Attributes, false) => Ok(Val::Domain(key, device.attributes.get(key))),
        (Val::Domain(domain, attributes), optional) => {
            let value = attributes.and_then(|a| a.get(key));
            match (value, optional) {
                (_, true) => Ok(Val::Optional {
                    domain,
                    name: key,
                    value,
                }),
                (Some(v), false) => Ok(Val::of(v)),
                (None, false) => Err(missing(domain, key)),
            }
        }
        _ => Err(outside_subset("selecting anything but device attributes")),
    }
}

/// A method: `orValue`/`hasValue`/`value` on an optional attribute, the string tests on
/// strings. The receiver is evaluated before the argument.
fn call<'a>(func: Func, target: &'a Expr, args: &'a [Expr], device: &'a Device) -> Result<Val<'a>> {
    let receiver = eval(target, device)?;
    if let Val::Optional {
        domain,
        name,
        value,
    } = receiver
    {
        return match (func, value, args.first()) {
            (Func::OrValue, Some(v), _) | (Func::Value, Some(v), _) => Ok(Val::of(v)),
            (Func::OrValue, None, Some(default)) => eval(default, device),
            (Func::HasValue, value, _) => Ok(Val::Bool(value.is_some())),
            (Func::Value, None, _) => Err(missing(domain, name)),
            _ => Err(outside_subset(&format!("{}() of an optional", func.name()))),
        };
    }
    let [arg] = args else {
        return Err(outside_subset(&format!("{}() of a value", func.name())));
    };
    let arg = eval(arg, device)?;
    let test: fn(&str, &str) -> bool = match func {
        Func::StartsWith => |s, t| s.starts_with(t),
        Func::EndsWith => |s, t| s.ends_with(t),
        Func::Contains => |s, t| s.contains(t),
        _ => return Err(outside_subset(&format!("{}()", func.name()))),
    };
    match (&receiver, &arg) {
        (Val::Str(s), Val::Str(t)) => Ok(Val::Bool(test(s, t))),
        _ => Err(CelError::Eval(format!(
            "no such overload: {}.{}({})",
            receiver.type_name(),
            func.name(),
            arg.type_name()
        ))),
    }
}

/// `&&` (`absorbing` false) or `||` (`absorbing` true) the CEL way: the absorbing value wins
/// over errors and non-bool operands in any position; otherwise the first error is returned.
pub(super) fn logical(chain: &Chain, device: &Device, absorbing: bool) -> Result<Val<'static>> {
    let mut error = None;
    for operand in &chain.operands {
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
