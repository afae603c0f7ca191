//! Evaluates a parsed policy expression over [`Val`]s with CEL's semantics for the subset:
//! heterogeneous equality is `false`, ordering only within ints and strings, commutative
//! `&&`/`||` that absorb errors, optional chaining that stays optional, and a step budget.

use std::collections::BTreeMap;

use super::super::ast::{Chain, Expr, Func, Kind, Macro, Rel};
use super::super::{CelError, Result, Value};
use super::{Env, STEP_LIMIT, Val};

pub(super) struct Eval<'e> {
    pub(super) env: &'e Env,
    /// Comprehension variables in scope, innermost last.
    pub(super) bound: Vec<(String, Val)>,
    pub(super) steps: usize,
}

fn err(at: usize, message: impl std::fmt::Display) -> CelError {
    CelError::Eval(format!("{message} (at byte {at})"))
}

fn overload(at: usize, op: &str, args: &[&Val]) -> CelError {
    let types: Vec<&str> = args.iter().map(|v| v.type_name()).collect();
    err(at, format!("no such overload: {op}({})", types.join(", ")))
}

impl Eval<'_> {
    pub(super) fn eval(&mut self, e: &Expr) -> Result<Val> {
        self.steps += 1;
        if self.steps > STEP_LIMIT {
            return Err(err(e.at, format!("evaluation exceeded {STEP_LIMIT} steps")));
        }
        let at = e.at;
        match &e.kind {
            Kind::Lit(v) => Ok(match v {
                Value::Bool(b) => Val::Bool(*b),
                Value::Int(i) => Val::Int(*i),
                // The parser makes no versions; were one there, it would be its text.
                Value::String(s) | Value::Version(s) => Val::Str(s.clone()),
            }),
            Kind::Null => Ok(Val::Null),
            Kind::List(items) => items
                .iter()
                .map(|i| self.eval(i))
                .collect::<Result<_>>()
                .map(Val::List),
            Kind::Ident(name) => self
                .bound
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v)
                .or_else(|| self.env.names.get(name))
                .cloned()
                .ok_or_else(|| err(at, format!("no value for '{name}' in the environment"))),
            Kind::Variable(name) => match self.env.variables.get(name) {
                Some(Ok(v)) => Ok(v.clone()),
                Some(Err(e)) => Err(e.clone()),
                None => Err(err(at, format!("undeclared reference to variables.{name}"))),
            },
            Kind::Select {
                target,
                field,
                optional,
            } => {
                let target = self.eval(target)?;
                step(target, &Val::Str(field.clone()), *optional, at)
            }
            Kind::Index {
                target,
                index,
                optional,
            } => {
                let target = self.eval(target)?;
                let index = self.eval(index)?;
                step(target, &index, *optional, at)
            }
            Kind::Has { target, field } => match self.eval(target)? {
                Val::Map(m) => Ok(Val::Bool(m.contains_key(field))),
                other => Err(err(
                    at,
                    format!("has() of field '{field}' on a {}", other.type_name()),
                )),
            },
            Kind::Call { func, target, args } => {
                let target = self.eval(target)?;
                let args: Vec<Val> = args.iter().map(|a| self.eval(a)).collect::<Result<_>>()?;
                call(*func, target, args, at)
            }
            Kind::Comprehension {
                kind,
                range,
                var,
                body,
            } => self.comprehension(*kind, range, var, body, at),
            Kind::Not(x) => match self.eval(x)? {
                Val::Bool(b) => Ok(Val::Bool(!b)),
                other => Err(overload(at, "!_", &[&other])),
            },
            Kind::Neg(x) => match self.eval(x)? {
                Val::Int(i) => i
                    .checked_neg()
                    .map(Val::Int)
                    .ok_or_else(|| err(at, "integer overflow")),
                other => Err(overload(at, "-_", &[&other])),
            },
            Kind::And(chain) => self.logic(chain, false, at),
            Kind::Or(chain) => self.logic(chain, true, at),
            Kind::Cond(c, t, f) => match self.eval(c)? {
                Val::Bool(true) => self.eval(t),
                Val::Bool(false) => self.eval(f),
                other => Err(overload(at, "_?_:_", &[&other])),
            },
            Kind::Add(a, b) => {
                let (a, b) = (self.eval(a)?, self.eval(b)?);
                match (a, b) {
                    (Val::Int(x), Val::Int(y)) => x
                        .checked_add(y)
                        .map(Val::Int)
                        .ok_or_else(|| err(at, "integer overflow")),
                    (Val::Str(x), Val::Str(y)) => Ok(Val::Str(x + &y)),
                    (Val::List(mut x), Val::List(y)) => {
                        x.extend(y);
                        Ok(Val::List(x))
                    }
                    (a, b) => Err(overload(at, "_+_", &[&a, &b])),
                }
            }
            Kind::Rel(op, a, b) => {
                let (a, b) = (self.eval(a)?, self.eval(b)?);
                relation(*op, &a, &b, at).map(Val::Bool)
            }
        }
    }

    /// `&&` (`short` false) or `||` (`short` true): the short-circuiting value of any operand
    /// wins over an error on another, as in CEL; otherwise the first error (in source order)
    /// is the result, a non-bool operand reported at its operator.
    fn logic(&mut self, chain: &Chain, short: bool, at: usize) -> Result<Val> {
        let name = if short { "_||_" } else { "_&&_" };
        let mut error = None;
        for (i, operand) in chain.operands.iter().enumerate() {
            match self.eval(operand) {
                Ok(Val::Bool(x)) if x == short => return Ok(Val::Bool(short)),
                Ok(Val::Bool(_)) => {}
                Ok(other) => {
                    error.get_or_insert_with(|| overload(chain.op_at(i, at), name, &[&other]));
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        error.map_or(Ok(Val::Bool(!short)), Err)
    }

    fn comprehension(
        &mut self,
        kind: Macro,
        range: &Expr,
        var: &str,
        body: &Expr,
        at: usize,
    ) -> Result<Val> {
        let items: Vec<Val> = match self.eval(range)? {
            Val::List(items) => items,
            Val::Map(m) => m.into_keys().map(Val::Str).collect(),
            other => {
                return Err(err(
                    at,
                    format!("comprehension over a {}", other.type_name()),
                ));
            }
        };
        let mut out = Vec::new();
        let mut first_error = None;
        for item in items {
            self.bound.push((var.to_owned(), item.clone()));
            let result = self.eval(body);
            self.bound.pop();
            match (kind, result) {
                (Macro::Map, Ok(v)) => out.push(v),
                (_, Ok(Val::Bool(b))) => match kind {
                    Macro::All if !b => return Ok(Val::Bool(false)),
                    Macro::Exists if b => return Ok(Val::Bool(true)),
                    Macro::Filter if b => out.push(item),
                    _ => {}
                },
                (_, Ok(other)) => {
                    return Err(err(
                        at,
                        format!("predicate evaluated to {}, not bool", other.type_name()),
                    ));
                }
                // `all` and `exists` absorb errors when another element decides; `filter` and
                // `map` cannot.
                (Macro::All | Macro::Exists, Err(e)) => {
                    first_error.get_or_insert(e);
                }
                (_, Err(e)) => return Err(e),
            }
        }
        match (kind, first_error) {
            (_, Some(e)) => Err(e),
            (Macro::All, None) => Ok(Val::Bool(true)),
            (Macro::Exists, None) => Ok(Val::Bool(false)),
            (Macro::Filter | Macro::Map, None) => Ok(Val::List(out)),
        }
    }
}

/// `target.field`, `target[index]`, or their optional forms. Selecting from an optional value
/// is itself optional (`a.?b.c` is `none` when `b` is absent), as in cel-go.
fn step(target: Val, key: &Val, optional: bool, at: usize) -> Result<Val> {
    let (target, optional) = match target {
        Val::Opt(None) => return Ok(Val::Opt(None)),
        Val::Opt(Some(v)) => (*v, true),
        v => (v, optional),
    };
    let found = match (&target, key) {
        (Val::Map(m), Val::Str(k)) => m.get(k).cloned(),
        (Val::List(items), Val::Int(i)) => {
            usize::try_from(*i).ok().and_then(|i| items.get(i).cloned())
        }
        _ => return Err(overload(at, "_[_]", &[&target, key])),
    };
    match (found, optional) {
        (Some(v), false) => Ok(v),
        (found, true) => Ok(Val::Opt(found.map(Box::new))),
        (None, false) => Err(match key {
            Val::Str(k) => err(at, format!("no such key: {k}")),
            _ => err(at, format!("index out of range: {}", key.describe())),
        }),
    }
}

fn call(func: Func, target: Val, args: Vec<Val>, at: usize) -> Result<Val> {
    let arg = args.into_iter().next();
    match (func, target, arg) {
        (Func::Size, Val::Str(s), None) => Ok(Val::Int(len(s.chars().count()))),
        (Func::Size, Val::List(l), None) => Ok(Val::Int(len(l.len()))),
        (Func::Size, Val::Map(m), None) => Ok(Val::Int(len(m.len()))),
        (Func::StartsWith, Val::Str(s), Some(Val::Str(p))) => Ok(Val::Bool(s.starts_with(&p))),
        (Func::EndsWith, Val::Str(s), Some(Val::Str(p))) => Ok(Val::Bool(s.ends_with(&p))),
        (Func::Contains, Val::Str(s), Some(Val::Str(p))) => Ok(Val::Bool(s.contains(&p))),
        (Func::OrValue, Val::Opt(v), Some(default)) => Ok(v.map_or(default, |v| *v)),
        (Func::HasValue, Val::Opt(v), None) => Ok(Val::Bool(v.is_some())),
        (Func::Value, Val::Opt(Some(v)), None) => Ok(*v),
        (Func::Value, Val::Opt(None), None) => Err(err(at, "value() of an empty optional")),
        (func, target, arg) => {
            let mut args = vec![&target];
            args.extend(arg.as_ref());
            Err(overload(at, &format!("{func:?}"), &args))
        }
    }
}

fn len(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn relation(op: Rel, a: &Val, b: &Val, at: usize) -> Result<bool> {
    let ordering = |a: &Val, b: &Val| match (a, b) {
        (Val::Int(x), Val::Int(y)) => Ok(x.cmp(y)),
        (Val::Str(x), Val::Str(y)) => Ok(x.cmp(y)),
        _ => Err(overload(at, "_<_", &[a, b])),
    };
    match op {
        Rel::Eq => equal(a, b, at),
        Rel::Ne => equal(a, b, at).map(|e| !e),
        Rel::Lt => ordering(a, b).map(|o| o.is_lt()),
        Rel::Le => ordering(a, b).map(|o| o.is_le()),
        Rel::Gt => ordering(a, b).map(|o| o.is_gt()),
        Rel::Ge => ordering(a, b).map(|o| o.is_ge()),
        Rel::In => match b {
            Val::List(items) => {
                for item in items {
                    if equal(a, item, at)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Val::Map(m) => match a {
                Val::Str(k) => Ok(m.contains_key(k)),
                _ => Ok(false),
            },
            _ => Err(overload(at, "@in", &[a, b])),
        },
    }
}

/// CEL equality: values of different types are unequal; optionals are refused rather than
/// compared, because whether an apiserver accepts `==` on them is not something knic relies on.
fn equal(a: &Val, b: &Val, at: usize) -> Result<bool> {
    Ok(match (a, b) {
        (Val::Opt(_), _) | (_, Val::Opt(_)) => {
            return Err(CelError::Unsupported(format!(
                "equality of optional values (at byte {at})"
            )));
        }
        (Val::List(x), Val::List(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (x, y) in x.iter().zip(y) {
                if !equal(x, y, at)? {
                    return Ok(false);
                }
            }
            true
        }
        (Val::Map(x), Val::Map(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (k, v) in x {
                match y.get(k) {
                    Some(w) if equal(v, w, at)? => {}
                    _ => return Ok(false),
                }
            }
            true
        }
        _ => a == b,
    })
}

/// JSON as CEL sees it; floating-point numbers are outside the subset.
pub(super) fn from_json(value: &serde_json::Value) -> Result<Val> {
    use serde_json::Value as J;
    Ok(match value {
        J::Null => Val::Null,
        J::Bool(b) => Val::Bool(*b),
        J::Number(n) => Val::Int(n.as_i64().ok_or_else(|| {
            CelError::Unsupported(format!(
                "the number {n} (only 64-bit integers are evaluated)"
            ))
        })?),
        J::String(s) => Val::Str(s.clone()),
        J::Array(items) => Val::List(items.iter().map(from_json).collect::<Result<_>>()?),
        J::Object(m) => Val::Map(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), from_json(v)?)))
                .collect::<Result<BTreeMap<_, _>>>()?,
        ),
    })
}
