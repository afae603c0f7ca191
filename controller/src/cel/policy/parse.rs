//! Parses admission-policy CEL into [`Expr`], refusing anything outside the subset with its
//! position. Recursion is bounded by [`MAX_DEPTH`] in the parser and by each node's recorded
//! depth, so neither parsing nor evaluating nor dropping a hostile expression can overflow.

use knic_proto::cel::lexer::{Tok, Token};

use super::super::{MAX_DEPTH, Result, syntax, unsupported};
use super::Val;

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

/// Functions and methods of the subset; `Size` is both `size(x)` and `x.size()`.
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
    /// Byte offset of the construct, for evaluation errors.
    pub(super) at: usize,
    /// Height of the tree below and including this node, at most [`MAX_DEPTH`].
    depth: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    Lit(Val),
    List(Vec<Expr>),
    /// A declared variable of the environment or a comprehension's bound name.
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
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Rel(Rel, Box<Expr>, Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
}

fn node(kind: Kind, at: usize) -> Result<Expr> {
    let children: Vec<&Expr> = match &kind {
        Kind::Lit(_) | Kind::Ident(_) | Kind::Variable(_) => Vec::new(),
        Kind::List(items) => items.iter().collect(),
        Kind::Select { target, .. } | Kind::Has { target, .. } => vec![target],
        Kind::Index { target, index, .. } => vec![target, index],
        Kind::Call { target, args, .. } => std::iter::once(&**target).chain(args).collect(),
        Kind::Comprehension { range, body, .. } => vec![range, body],
        Kind::Not(x) | Kind::Neg(x) => vec![x],
        Kind::And(a, b) | Kind::Or(a, b) | Kind::Rel(_, a, b) | Kind::Add(a, b) => vec![a, b],
        Kind::Cond(a, b, c) => vec![a, b, c],
    };
    let depth = 1 + children.iter().map(|c| c.depth).max().unwrap_or(0);
    if depth > MAX_DEPTH {
        return Err(too_deep(at));
    }
    Ok(Expr { kind, at, depth })
}

fn too_deep(at: usize) -> super::super::CelError {
    unsupported(at, format!("nesting deeper than {MAX_DEPTH} levels"))
}

fn boxed(kind: impl FnOnce() -> Kind, at: usize) -> Result<Expr> {
    node(kind(), at)
}

pub(super) struct Parser<'a> {
    pub(super) tokens: Vec<Token>,
    pub(super) pos: usize,
    pub(super) depth: usize,
    /// The environment's declared names; comprehension variables are pushed while in scope.
    pub(super) scope: Vec<String>,
    pub(super) declared: &'a [&'a str],
}

static END: Token = Token {
    tok: Tok::End,
    at: 0,
};

impl Parser<'_> {
    pub(super) fn peek(&self) -> &Token {
        self.tokens
            .get(self.pos)
            .or_else(|| self.tokens.last())
            .unwrap_or(&END)
    }

    fn bump(&mut self) -> Token {
        let token = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        token
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        let hit = &self.peek().tok == tok;
        if hit {
            self.bump();
        }
        hit
    }

    fn expect(&mut self, tok: &Tok) -> Result<()> {
        if self.eat(tok) {
            return Ok(());
        }
        let next = self.peek();
        Err(syntax(
            next.at,
            format!("expected {}, found {}", tok.describe(), next.tok.describe()),
        ))
    }

    /// A whole expression, the one recursive entry point that counts nesting.
    pub(super) fn expr(&mut self) -> Result<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err(too_deep(self.peek().at));
        }
        self.depth += 1;
        let result = self.conditional();
        self.depth -= 1;
        result
    }

    fn conditional(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let cond = self.or()?;
        if !self.eat(&Tok::Question) {
            return Ok(cond);
        }
        let then = self.or()?;
        self.expect(&Tok::Colon)?;
        let otherwise = self.expr()?;
        boxed(
            || Kind::Cond(Box::new(cond), Box::new(then), Box::new(otherwise)),
            at,
        )
    }

    fn or(&mut self) -> Result<Expr> {
        let mut lhs = self.and()?;
        while self.peek().tok == Tok::Or {
            let at = self.bump().at;
            let rhs = self.and()?;
            lhs = boxed(|| Kind::Or(Box::new(lhs), Box::new(rhs)), at)?;
        }
        Ok(lhs)
    }

    fn and(&mut self) -> Result<Expr> {
        let mut lhs = self.relation()?;
        while self.peek().tok == Tok::And {
            let at = self.bump().at;
            let rhs = self.relation()?;
            lhs = boxed(|| Kind::And(Box::new(lhs), Box::new(rhs)), at)?;
        }
        Ok(lhs)
    }

    fn relation(&mut self) -> Result<Expr> {
        let mut lhs = self.additive()?;
        loop {
            let op = match &self.peek().tok {
                Tok::Eq => Rel::Eq,
                Tok::Ne => Rel::Ne,
                Tok::Lt => Rel::Lt,
                Tok::Le => Rel::Le,
                Tok::Gt => Rel::Gt,
                Tok::Ge => Rel::Ge,
                Tok::Ident(word) if word == "in" => Rel::In,
                _ => return Ok(lhs),
            };
            let at = self.bump().at;
            let rhs = self.additive()?;
            lhs = boxed(|| Kind::Rel(op, Box::new(lhs), Box::new(rhs)), at)?;
        }
    }

    fn additive(&mut self) -> Result<Expr> {
        let mut lhs = self.unary()?;
        loop {
            let next = self.peek();
            match next.tok {
                Tok::Plus => {
                    let at = self.bump().at;
                    let rhs = self.unary()?;
                    lhs = boxed(|| Kind::Add(Box::new(lhs), Box::new(rhs)), at)?;
                }
                Tok::Minus | Tok::Star | Tok::Slash | Tok::Percent => {
                    return Err(unsupported(
                        next.at,
                        format!("arithmetic operator {}", next.tok.describe()),
                    ));
                }
                _ => return Ok(lhs),
            }
        }
    }

    fn unary(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let mut ops = Vec::new();
        while matches!(self.peek().tok, Tok::Not | Tok::Minus) {
            ops.push(self.bump().tok);
        }
        // Fold one minus into an integer literal, so i64::MIN can be written.
        if ops.last() == Some(&Tok::Minus)
            && let Tok::Int(magnitude) = self.peek().tok
        {
            let lit = self.bump();
            ops.pop();
            let value = 0i64
                .checked_sub_unsigned(magnitude)
                .ok_or_else(|| syntax(lit.at, "integer literal out of range"))?;
            let e = self.postfix(node(Kind::Lit(Val::Int(value)), lit.at)?)?;
            return apply_unary(ops, e, at);
        }
        let e = self.member()?;
        apply_unary(ops, e, at)
    }

    fn member(&mut self) -> Result<Expr> {
        let primary = self.primary()?;
        self.postfix(primary)
    }

    fn primary(&mut self) -> Result<Expr> {
        let token = self.bump();
        let at = token.at;
        match token.tok {
            Tok::Int(magnitude) => match i64::try_from(magnitude) {
                Ok(i) => node(Kind::Lit(Val::Int(i)), at),
                Err(_) => Err(syntax(at, "integer literal out of range")),
            },
            Tok::Str(s) => node(Kind::Lit(Val::Str(s)), at),
            Tok::Ident(name) => self.identifier(name, at),
            Tok::LParen => {
                let e = self.expr()?;
                self.expect(&Tok::RParen)?;
                Ok(e)
            }
            Tok::LBracket => {
                let items = self.list(&Tok::RBracket)?;
                node(Kind::List(items), at)
            }
            Tok::LBrace => Err(unsupported(at, "map literals")),
            Tok::Dot => Err(unsupported(at, "leading '.' (root-scoped identifiers)")),
            Tok::End => Err(syntax(
                at,
                "unexpected end of input, expected an expression",
            )),
            other => Err(syntax(
                at,
                format!("expected an expression, found {}", other.describe()),
            )),
        }
    }

    fn identifier(&mut self, name: String, at: usize) -> Result<Expr> {
        let is_call = self.peek().tok == Tok::LParen;
        match name.as_str() {
            "true" => node(Kind::Lit(Val::Bool(true)), at),
            "false" => node(Kind::Lit(Val::Bool(false)), at),
            "null" => node(Kind::Lit(Val::Null), at),
            "in" => Err(syntax(at, "expected an expression, found 'in'")),
            "has" if is_call => {
                self.bump();
                let arg = self.expr()?;
                self.expect(&Tok::RParen)?;
                match arg.kind {
                    Kind::Select {
                        target,
                        field,
                        optional: false,
                    } => node(Kind::Has { target, field }, at),
                    _ => Err(syntax(at, "has() takes a field selection, like has(a.b)")),
                }
            }
            "size" if is_call => {
                self.bump();
                let mut args = self.list(&Tok::RParen)?;
                let Some(target) = args.pop().filter(|_| args.is_empty()) else {
                    return Err(syntax(at, "size() takes 1 argument"));
                };
                node(
                    Kind::Call {
                        func: Func::Size,
                        target: Box::new(target),
                        args,
                    },
                    at,
                )
            }
            _ if is_call => Err(unsupported(at, format!("function '{name}()'"))),
            "variables" => {
                self.expect(&Tok::Dot)?;
                match self.bump() {
                    Token {
                        tok: Tok::Ident(var),
                        ..
                    } => node(Kind::Variable(var), at),
                    other => Err(syntax(
                        other.at,
                        format!(
                            "expected a variable name after 'variables.', found {}",
                            other.tok.describe()
                        ),
                    )),
                }
            }
            _ if self.scope.contains(&name) || self.declared.contains(&name.as_str()) => {
                node(Kind::Ident(name), at)
            }
            _ => Err(unsupported(
                at,
                format!(
                    "identifier '{name}' (declared: {})",
                    self.declared.join(", ")
                ),
            )),
        }
    }

    /// Expressions separated by commas up to `close`, which is consumed.
    fn list(&mut self, close: &Tok) -> Result<Vec<Expr>> {
        let mut items = Vec::new();
        if self.eat(close) {
            return Ok(items);
        }
        loop {
            items.push(self.expr()?);
            if self.eat(close) {
                return Ok(items);
            }
            if !self.eat(&Tok::Comma) {
                let next = self.peek();
                return Err(syntax(
                    next.at,
                    format!(
                        "expected ',' or {}, found {}",
                        close.describe(),
                        next.tok.describe()
                    ),
                ));
            }
        }
    }

    /// `.f`, `.?f`, `.m(args)`, `[i]`, `[?i]` while they follow.
    fn postfix(&mut self, mut cur: Expr) -> Result<Expr> {
        loop {
            match self.peek().tok {
                Tok::Dot => {
                    self.bump();
                    let optional = self.eat(&Tok::Question);
                    let name_token = self.bump();
                    let Tok::Ident(name) = name_token.tok else {
                        return Err(syntax(
                            name_token.at,
                            format!(
                                "expected a field name after '.', found {}",
                                name_token.tok.describe()
                            ),
                        ));
                    };
                    let at = name_token.at;
                    cur = if !optional && self.eat(&Tok::LParen) {
                        self.method(cur, &name, at)?
                    } else {
                        boxed(
                            || Kind::Select {
                                target: Box::new(cur),
                                field: name,
                                optional,
                            },
                            at,
                        )?
                    };
                }
                Tok::LBracket => {
                    let at = self.bump().at;
                    let optional = self.eat(&Tok::Question);
                    let index = self.expr()?;
                    self.expect(&Tok::RBracket)?;
                    cur = boxed(
                        || Kind::Index {
                            target: Box::new(cur),
                            index: Box::new(index),
                            optional,
                        },
                        at,
                    )?;
                }
                _ => return Ok(cur),
            }
        }
    }

    /// `target.name(`, through the closing parenthesis.
    fn method(&mut self, target: Expr, name: &str, at: usize) -> Result<Expr> {
        let kind = match name {
            "all" => Some(Macro::All),
            "exists" => Some(Macro::Exists),
            "filter" => Some(Macro::Filter),
            "map" => Some(Macro::Map),
            _ => None,
        };
        if let Some(kind) = kind {
            let var_token = self.bump();
            let Tok::Ident(var) = var_token.tok else {
                return Err(syntax(
                    var_token.at,
                    format!("{name}() takes a variable name first"),
                ));
            };
            self.expect(&Tok::Comma)?;
            self.scope.push(var.clone());
            let body = self.expr();
            self.scope.pop();
            let body = body?;
            if self.peek().tok == Tok::Comma {
                return Err(unsupported(at, format!("{name}() with three arguments")));
            }
            self.expect(&Tok::RParen)?;
            return node(
                Kind::Comprehension {
                    kind,
                    range: Box::new(target),
                    var,
                    body: Box::new(body),
                },
                at,
            );
        }
        let (func, arity) = match name {
            "size" => (Func::Size, 0),
            "startsWith" => (Func::StartsWith, 1),
            "endsWith" => (Func::EndsWith, 1),
            "contains" => (Func::Contains, 1),
            "orValue" => (Func::OrValue, 1),
            "hasValue" => (Func::HasValue, 0),
            "value" => (Func::Value, 0),
            _ => return Err(unsupported(at, format!("method {name}()"))),
        };
        let args = self.list(&Tok::RParen)?;
        if args.len() != arity {
            let plural = if arity == 1 { "" } else { "s" };
            return Err(syntax(
                at,
                format!(
                    "{name}() takes {arity} argument{plural}, got {}",
                    args.len()
                ),
            ));
        }
        node(
            Kind::Call {
                func,
                target: Box::new(target),
                args,
            },
            at,
        )
    }
}

fn apply_unary(ops: Vec<Tok>, mut e: Expr, at: usize) -> Result<Expr> {
    for op in ops.into_iter().rev() {
        e = if op == Tok::Not {
            boxed(|| Kind::Not(Box::new(e)), at)?
        } else {
            boxed(|| Kind::Neg(Box::new(e)), at)?
        };
    }
    Ok(e)
}
