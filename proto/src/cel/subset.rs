//! The device-selector subset of the shared syntax tree, checked while the parser builds it.
//!
//! A selector may only reach values through `device.driver` and
//! `device.attributes[DOMAIN].NAME` (with `.?NAME` and its `orValue`/`hasValue`/`value`), and
//! [`Selector`](super::Selector) must refuse everything else at the first offending construct
//! in source order, with the same message and byte offset callers and tests rely on. The
//! parser therefore calls these checks on each member step right after parsing it and before
//! building its node, which is exactly where a selector-only parser would have refused it; the
//! policy dialect never calls them.

use super::ast::{Expr, Func, Kind};
use super::{Result, Value, syntax, unsupported};

/// What a member chain in a selector has reached: `device` and its attribute maps are not
/// values of their own in the subset, only steps towards one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape<'a> {
    Device,
    Attributes,
    Domain(&'a str),
    Optional { domain: &'a str, name: &'a str },
    Value,
}

/// The shape of an already checked node. Only `device`-rooted chains of at most four steps
/// are anything but [`Shape::Value`], so the recursion is short.
pub(super) fn shape(e: &Expr) -> Shape<'_> {
    match &e.kind {
        Kind::Ident(name) if name == "device" => Shape::Device,
        Kind::Select {
            target,
            field,
            optional,
        } => match (shape(target), optional) {
            (Shape::Device, false) if field == "attributes" => Shape::Attributes,
            (Shape::Attributes, false) => Shape::Domain(field),
            (Shape::Domain(domain), true) => Shape::Optional {
                domain,
                name: field,
            },
            _ => Shape::Value,
        },
        Kind::Index {
            target,
            index,
            optional,
        } => match (shape(target), &index.kind, optional) {
            (Shape::Attributes, Kind::Lit(Value::String(domain)), false) => Shape::Domain(domain),
            (Shape::Domain(domain), Kind::Lit(Value::String(name)), true) => {
                Shape::Optional { domain, name }
            }
            _ => Shape::Value,
        },
        _ => Shape::Value,
    }
}

/// `target.name` or `target.?name`.
pub(super) fn select(target: &Expr, name: &str, optional: bool, at: usize) -> Result<()> {
    match shape(target) {
        Shape::Device if optional => Err(unsupported(
            at,
            format!("optional selection device.?{name}"),
        )),
        Shape::Device => match name {
            "driver" | "attributes" => Ok(()),
            "capacity" => Err(unsupported(at, "device.capacity is not evaluated by knic")),
            _ => Err(unsupported(
                at,
                format!("device.{name} is not evaluated by knic"),
            )),
        },
        Shape::Attributes if optional => Err(unsupported(
            at,
            format!("optional selection of an attribute domain (device.attributes.?{name})"),
        )),
        Shape::Attributes | Shape::Domain(_) => Ok(()),
        Shape::Optional { .. } | Shape::Value => Err(unsupported(
            at,
            format!("field selection .{name} on a value that is not an attribute map"),
        )),
    }
}

/// `target[index]` or `target[?index]`: only attribute maps, by string literals.
pub(super) fn index(target: &Expr, index: &Expr, optional: bool, at: usize) -> Result<()> {
    let is_key = matches!(index.kind, Kind::Lit(Value::String(_)));
    match (shape(target), is_key) {
        (Shape::Attributes, true) if optional => Err(unsupported(
            at,
            "optional index of an attribute domain (device.attributes[?...])",
        )),
        (Shape::Attributes | Shape::Domain(_), true) => Ok(()),
        (Shape::Attributes | Shape::Domain(_), false) => Err(unsupported(
            at,
            "an attribute map indexed by something other than a string literal",
        )),
        _ => Err(unsupported(
            at,
            "indexing anything but device.attributes and its domains",
        )),
    }
}

/// `target.name(args)`, after its arguments are parsed: the function it is, or why not.
pub(super) fn call(target: &Expr, name: &str, args: &[Expr], at: usize) -> Result<Func> {
    let arity = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            let plural = if n == 1 { "" } else { "s" };
            Err(syntax(
                at,
                format!("{name}() takes {n} argument{plural}, got {}", args.len()),
            ))
        }
    };
    match shape(target) {
        Shape::Optional { .. } => match name {
            "orValue" => {
                arity(1)?;
                match args.first().map(|a| &a.kind) {
                    Some(Kind::Lit(_)) => Ok(Func::OrValue),
                    _ => Err(unsupported(
                        at,
                        "orValue() with a default that is not a literal",
                    )),
                }
            }
            "hasValue" => arity(0).map(|()| Func::HasValue),
            "value" => arity(0).map(|()| Func::Value),
            _ => Err(unsupported(
                at,
                format!("method {name}() on an optional value"),
            )),
        },
        Shape::Value => {
            let func = match name {
                "startsWith" => Func::StartsWith,
                "endsWith" => Func::EndsWith,
                "contains" => Func::Contains,
                "matches" => {
                    return Err(unsupported(
                        at,
                        "matches() (regular expressions) is not evaluated by knic",
                    ));
                }
                _ => return Err(unsupported(at, format!("method {name}()"))),
            };
            arity(1).map(|()| func)
        }
        Shape::Device | Shape::Attributes | Shape::Domain(_) => Err(unsupported(
            at,
            format!("method {name}() on device or an attribute map"),
        )),
    }
}

/// A member chain that ended at `e`, which must be a value: `device`, its maps and optionals
/// not turned into a value are refused, at the chain's start `at`.
pub(super) fn value(e: &Expr, at: usize) -> Result<()> {
    match shape(e) {
        Shape::Value => Ok(()),
        Shape::Device => Err(unsupported(
            at,
            "'device' used as a value (select .driver or .attributes)",
        )),
        Shape::Attributes => Err(unsupported(
            at,
            "device.attributes used as a value (index it with a domain)",
        )),
        Shape::Domain(d) => Err(unsupported(
            at,
            format!("device.attributes[{d:?}] used as a value (select an attribute)"),
        )),
        Shape::Optional { domain, name } => Err(unsupported(
            at,
            format!("optional device.attributes[{domain:?}].?{name} used without .orValue()"),
        )),
    }
}

/// The argument of `has()`, which must be `device.attributes["DOMAIN"].NAME` (a plain field
/// selection, not an index or optional), as the scheduler's cost model and knic's evaluator
/// know no other presence test.
pub(super) fn has(arg: Expr, arg_at: usize) -> Result<(Box<Expr>, String)> {
    match arg.kind {
        Kind::Select {
            target,
            field,
            optional: false,
        } if matches!(shape(&target), Shape::Domain(_)) => Ok((target, field)),
        _ => Err(unsupported(
            arg_at,
            "has() of anything but device.attributes[\"DOMAIN\"].NAME",
        )),
    }
}
