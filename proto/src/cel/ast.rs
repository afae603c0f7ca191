//! The one syntax tree of knic's CEL: device selectors and admission-policy expressions parse
//! into it alike, so the grammar lives in one place and only the evaluators differ. Every
//! node records its height, bounded by [`MAX_DEPTH`], so walking or dropping a tree never
//! recurses deeper than that.

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

/// Functions and methods of the language; `Size` is both `size(x)` and `x.size()`. The
/// variant names appear in policy overload errors (`no such overload: StartsWith(...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Func {
    Size,
    StartsWith,
    EndsWith,
    Contains,
    OrValue,
    HasValue,
    Value,
}

impl Func {
    /// The method's name as written in CEL, for selector errors.
    pub(super) fn name(self) -> &'static str {
        match self {
            Func::Size => "size",
            Func::StartsWith => "startsWith",
            Func::EndsWith => "endsWith",
            Func::Contains => "contains",
            Func::OrValue => "orValue",
            Func::HasValue => "hasValue",
            Func::Value => "value",
        }
    }
}

/// The comprehension macros `range.all(x, p)`, `.exists(x, p)`, `.filter(x, p)`, `.map(x, t)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Macro {
    All,
    Exists,
    Filter,
    Map,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Expr {
    pub(super) kind: Kind,
    /// Byte offset of the construct, for errors.
    pub(super) at: usize,
    /// Height of the tree below and including this node, bounded by [`MAX_DEPTH`] so that
    /// evaluating (and dropping) never recurses deeper.
    pub(super) depth: usize,
}

/// Operands of `&&` or `||`, kept flat so that long chains do not nest (and so do not hit
/// [`MAX_DEPTH`]); `ops[i]` is where the operator before `operands[i + 1]` stands, which
/// policy errors report.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Chain {
    pub(super) operands: Vec<Expr>,
    pub(super) ops: Vec<usize>,
}

impl Chain {
    /// Where the operator that joins operand `i` stands: the one before it, or for the first
    /// operand the one after it (a binary `a && b` reports both sides at its operator).
    pub(super) fn op_at(&self, i: usize, fallback: usize) -> usize {
        self.ops
            .get(i.saturating_sub(1))
            .copied()
            .unwrap_or(fallback)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    /// A bool, int or string literal (the parser never makes a version).
    Lit(Value),
    Null,
    List(Vec<Expr>),
    /// A declared variable (`device`, `object`, ...) or a comprehension's bound name.
    Ident(String),
    /// `variables.NAME`: evaluated lazily by the caller, so its error surfaces only when used.
    Variable(String),
    Select {
        target: Box<Expr>,
        field: String,
        optional: bool,
    },
    Index {
        target: Box<Expr>,
        index: Box<Expr>,
        optional: bool,
    },
    /// `has(target.field)`.
    Has {
        target: Box<Expr>,
        field: String,
    },
    Call {
        func: Func,
        target: Box<Expr>,
        args: Vec<Expr>,
    },
    Comprehension {
        kind: Macro,
        range: Box<Expr>,
        var: String,
        body: Box<Expr>,
    },
    Not(Box<Expr>),
    Neg(Box<Expr>),
    And(Chain),
    Or(Chain),
    Rel(Rel, Box<Expr>, Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
}

/// A node whose depth is checked against [`MAX_DEPTH`]; `at` locates it (and the error).
pub(super) fn node(kind: Kind, at: usize) -> Result<Expr> {
    let children: Vec<&Expr> = match &kind {
        Kind::Lit(_) | Kind::Null | Kind::Ident(_) | Kind::Variable(_) => Vec::new(),
        Kind::List(items) => items.iter().collect(),
        Kind::And(chain) | Kind::Or(chain) => chain.operands.iter().collect(),
        Kind::Select { target, .. } | Kind::Has { target, .. } => vec![target],
        Kind::Index { target, index, .. } => vec![target, index],
        Kind::Call { target, args, .. } => std::iter::once(&**target).chain(args).collect(),
        Kind::Comprehension { range, body, .. } => vec![range, body],
        Kind::Not(x) | Kind::Neg(x) => vec![x],
        Kind::Rel(_, a, b) | Kind::Add(a, b) => vec![a, b],
        Kind::Cond(a, b, c) => vec![a, b, c],
    };
    let depth = 1 + children.iter().map(|c| c.depth).max().unwrap_or(0);
    if depth > MAX_DEPTH {
        return Err(too_deep(at));
    }
    Ok(Expr { kind, at, depth })
}

pub(super) fn too_deep(at: usize) -> CelError {
    unsupported(at, format!("nesting deeper than {MAX_DEPTH} levels"))
}
