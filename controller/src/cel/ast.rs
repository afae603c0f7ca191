//! The syntax tree the parser builds and the evaluator walks; every node's depth is bounded.

use super::{CelError, MAX_DEPTH, Result, Value, unsupported};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rel {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
}

impl Rel {
    pub(super) fn symbol(self) -> &'static str {
        match self {
            Rel::Eq => "==",
            Rel::Ne => "!=",
            Rel::Lt => "<",
            Rel::Le => "<=",
            Rel::Gt => ">",
            Rel::Ge => ">=",
            Rel::In => "in",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    StartsWith,
    EndsWith,
    Contains,
}

impl Method {
    pub(super) fn name(self) -> &'static str {
        match self {
            Method::StartsWith => "startsWith",
            Method::EndsWith => "endsWith",
            Method::Contains => "contains",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Expr {
    pub(super) kind: Kind,
    /// Height of the tree below and including this node, bounded by [`MAX_DEPTH`] so that
    /// evaluating (and dropping) never recurses deeper.
    pub(super) depth: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    Lit(Value),
    List(Vec<Expr>),
    Driver,
    /// `device.attributes[domain].name`; with a default for `.?name.orValue(default)`.
    Attr {
        domain: String,
        name: String,
        default: Option<Value>,
    },
    /// `has(device.attributes[domain].name)` or `.?name.hasValue()`.
    Has {
        domain: String,
        name: String,
    },
    Not(Box<Expr>),
    Neg(Box<Expr>),
    /// `&&` of two or more operands, flat so long chains do not nest.
    And(Vec<Expr>),
    /// `||` of two or more operands.
    Or(Vec<Expr>),
    Rel(Rel, Box<Expr>, Box<Expr>),
    Method(Method, Box<Expr>, Box<Expr>),
}

/// A node whose depth is checked against [`MAX_DEPTH`]; `at` locates the error.
pub(super) fn node(kind: Kind, at: usize) -> Result<Expr> {
    let children: Vec<&Expr> = match &kind {
        Kind::Lit(_) | Kind::Driver | Kind::Attr { .. } | Kind::Has { .. } => Vec::new(),
        Kind::List(items) | Kind::And(items) | Kind::Or(items) => items.iter().collect(),
        Kind::Not(x) | Kind::Neg(x) => vec![x],
        Kind::Rel(_, a, b) | Kind::Method(_, a, b) => vec![a, b],
    };
    let depth = 1 + children.iter().map(|c| c.depth).max().unwrap_or(0);
    if depth > MAX_DEPTH {
        return Err(too_deep(at));
    }
    Ok(Expr { kind, depth })
}

pub(super) fn too_deep(at: usize) -> CelError {
    unsupported(at, format!("nesting deeper than {MAX_DEPTH} levels"))
}
