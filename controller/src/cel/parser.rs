//! Parses tokens into the supported subset, refusing anything else with its position.

use super::ast::*;
use super::{MAX_DEPTH, Result, Value, syntax, unsupported};
use knic_proto::cel::lexer::{Tok, Token};

/// What a member chain (`device.attributes["d"].?x`) has reached so far: the `device`
/// variable and its maps are not values of their own in the subset, only steps towards one.
#[derive(Debug)]
pub(super) enum Partial {
    Device,
    Attributes,
    Domain(String),
    Optional { domain: String, name: String },
    Expr(Expr),
}

impl Partial {
    pub(super) fn into_expr(self, at: usize) -> Result<Expr> {
        match self {
            Partial::Expr(e) => Ok(e),
            Partial::Device => Err(unsupported(
                at,
                "'device' used as a value (select .driver or .attributes)",
            )),
            Partial::Attributes => Err(unsupported(
                at,
                "device.attributes used as a value (index it with a domain)",
            )),
            Partial::Domain(d) => Err(unsupported(
                at,
                format!("device.attributes[{d:?}] used as a value (select an attribute)"),
            )),
            Partial::Optional { domain, name } => Err(unsupported(
                at,
                format!("optional device.attributes[{domain:?}].?{name} used without .orValue()"),
            )),
        }
    }
}

pub(super) struct Parser {
    pub(super) tokens: Vec<Token>,
    pub(super) pos: usize,
    /// Current nesting of [`Parser::expr`] calls.
    pub(super) depth: usize,
}

/// The `End` token [`Parser::peek`] returns past the end (the lexer always ends with one, so
/// this is only a fallback that keeps indexing panic-free).
static END: Token = Token {
    tok: Tok::End,
    at: 0,
};

impl Parser {
    pub(super) fn peek(&self) -> &Token {
        self.tokens
            .get(self.pos)
            .or_else(|| self.tokens.last())
            .unwrap_or(&END)
    }

    pub(super) fn bump(&mut self) -> Token {
        let token = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        token
    }

    pub(super) fn eat(&mut self, tok: &Tok) -> bool {
        if &self.peek().tok == tok {
            self.bump();
            true
        } else {
            false
        }
    }

    pub(super) fn expect(&mut self, tok: &Tok) -> Result<()> {
        if self.eat(tok) {
            return Ok(());
        }
        let next = self.peek();
        Err(syntax(
            next.at,
            format!("expected {}, found {}", tok.describe(), next.tok.describe()),
        ))
    }

    /// A whole expression; the only recursive entry point, so the nesting bound lives here.
    pub(super) fn expr(&mut self) -> Result<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err(too_deep(self.peek().at));
        }
        self.depth += 1;
        let result = self.conditional();
        self.depth -= 1;
        result
    }

    pub(super) fn conditional(&mut self) -> Result<Expr> {
        let e = self.or()?;
        let next = self.peek();
        if next.tok == Tok::Question {
            return Err(unsupported(next.at, "the conditional operator '? :'"));
        }
        Ok(e)
    }

    pub(super) fn or(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let first = self.and()?;
        if self.peek().tok != Tok::Or {
            return Ok(first);
        }
        let mut operands = vec![first];
        while self.eat(&Tok::Or) {
            operands.push(self.and()?);
        }
        node(Kind::Or(operands), at)
    }

    pub(super) fn and(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let first = self.relation()?;
        if self.peek().tok != Tok::And {
            return Ok(first);
        }
        let mut operands = vec![first];
        while self.eat(&Tok::And) {
            operands.push(self.relation()?);
        }
        node(Kind::And(operands), at)
    }

    pub(super) fn relation(&mut self) -> Result<Expr> {
        let mut lhs = self.calc()?;
        loop {
            let next = self.peek();
            let at = next.at;
            let op = match &next.tok {
                Tok::Eq => Rel::Eq,
                Tok::Ne => Rel::Ne,
                Tok::Lt => Rel::Lt,
                Tok::Le => Rel::Le,
                Tok::Gt => Rel::Gt,
                Tok::Ge => Rel::Ge,
                Tok::Ident(word) if word == "in" => Rel::In,
                _ => return Ok(lhs),
            };
            self.bump();
            let rhs = self.calc()?;
            lhs = node(Kind::Rel(op, Box::new(lhs), Box::new(rhs)), at)?;
        }
    }

    pub(super) fn calc(&mut self) -> Result<Expr> {
        let e = self.unary()?;
        let next = self.peek();
        match next.tok {
            Tok::Plus | Tok::Minus | Tok::Star | Tok::Slash | Tok::Percent => Err(unsupported(
                next.at,
                format!("arithmetic operator {}", next.tok.describe()),
            )),
            _ => Ok(e),
        }
    }

    pub(super) fn unary(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        match self.peek().tok {
            Tok::Not => {
                let mut count = 0;
                while self.eat(&Tok::Not) {
                    count += 1;
                }
                let mut e = self.member()?;
                for _ in 0..count {
                    e = node(Kind::Not(Box::new(e)), at)?;
                }
                Ok(e)
            }
            Tok::Minus => {
                let mut count = 0;
                while self.eat(&Tok::Minus) {
                    count += 1;
                }
                let next = self.peek().clone();
                let mut e = if let Tok::Int(magnitude) = next.tok {
                    // Fold one minus into the literal, so i64::MIN can be written.
                    self.bump();
                    count -= 1;
                    let value = 0i64
                        .checked_sub_unsigned(magnitude)
                        .ok_or_else(|| syntax(next.at, "integer literal out of range"))?;
                    let (partial, _) =
                        self.postfix(Partial::Expr(node(Kind::Lit(Value::Int(value)), next.at)?))?;
                    partial.into_expr(next.at)?
                } else {
                    self.member()?
                };
                for _ in 0..count {
                    e = node(Kind::Neg(Box::new(e)), at)?;
                }
                Ok(e)
            }
            _ => self.member(),
        }
    }

    pub(super) fn member(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let primary = self.primary()?;
        let (partial, _) = self.postfix(primary)?;
        partial.into_expr(at)
    }

    pub(super) fn primary(&mut self) -> Result<Partial> {
        let token = self.bump();
        let at = token.at;
        let lit = |v: Value| -> Result<Partial> { Ok(Partial::Expr(node(Kind::Lit(v), at)?)) };
        match token.tok {
            Tok::Int(magnitude) => match i64::try_from(magnitude) {
                Ok(i) => lit(Value::Int(i)),
                Err(_) => Err(syntax(at, "integer literal out of range")),
            },
            Tok::Str(s) => lit(Value::String(s)),
            Tok::Ident(name) => {
                let is_call = self.peek().tok == Tok::LParen;
                let is_message = self.peek().tok == Tok::LBrace;
                match name.as_str() {
                    "true" => lit(Value::Bool(true)),
                    "false" => lit(Value::Bool(false)),
                    "in" => Err(syntax(at, "expected an expression, found 'in'")),
                    "has" if is_call => self.has(),
                    _ if is_call => Err(unsupported(at, format!("function '{name}()'"))),
                    _ if is_message => Err(unsupported(at, "message literals")),
                    "device" => Ok(Partial::Device),
                    "null" => Err(unsupported(at, "the null literal")),
                    _ => Err(unsupported(
                        at,
                        format!("identifier '{name}' (only 'device' is declared)"),
                    )),
                }
            }
            Tok::LParen => {
                let e = self.expr()?;
                self.expect(&Tok::RParen)?;
                Ok(Partial::Expr(e))
            }
            Tok::LBracket => {
                let mut items = Vec::new();
                loop {
                    if self.eat(&Tok::RBracket) {
                        break;
                    }
                    items.push(self.expr()?);
                    if self.eat(&Tok::RBracket) {
                        break;
                    }
                    if !self.eat(&Tok::Comma) {
                        let next = self.peek();
                        return Err(syntax(
                            next.at,
                            format!("expected ',' or ']', found {}", next.tok.describe()),
                        ));
                    }
                }
                Ok(Partial::Expr(node(Kind::List(items), at)?))
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

    /// `has(device.attributes["DOMAIN"].NAME)`, after the identifier `has`.
    pub(super) fn has(&mut self) -> Result<Partial> {
        // `has(` recurses into `primary` without passing through `expr`, so it counts itself.
        if self.depth >= MAX_DEPTH {
            return Err(too_deep(self.peek().at));
        }
        self.depth += 1;
        let result = self.has_inner();
        self.depth -= 1;
        result
    }

    pub(super) fn has_inner(&mut self) -> Result<Partial> {
        let open = self.bump();
        let arg_at = self.peek().at;
        let primary = self.primary()?;
        let (partial, last_was_field) = self.postfix(primary)?;
        self.expect(&Tok::RParen)?;
        match partial {
            Partial::Expr(Expr {
                kind:
                    Kind::Attr {
                        domain,
                        name,
                        default: None,
                    },
                ..
            }) if last_was_field => Ok(Partial::Expr(node(Kind::Has { domain, name }, open.at)?)),
            _ => Err(unsupported(
                arg_at,
                "has() of anything but device.attributes[\"DOMAIN\"].NAME",
            )),
        }
    }

    /// Applies `.name`, `.?name`, `.method(args)`, `[index]` and `[?index]` to `cur` while
    /// they follow; also says whether the last step was a plain field selection (for `has`).
    pub(super) fn postfix(&mut self, mut cur: Partial) -> Result<(Partial, bool)> {
        let mut last_was_field = false;
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
                    if !optional && self.eat(&Tok::LParen) {
                        let args = self.args()?;
                        cur = call(cur, &name, args, name_token.at)?;
                        last_was_field = false;
                    } else {
                        cur = select(cur, name, optional, name_token.at)?;
                        last_was_field = !optional;
                    }
                }
                Tok::LBracket => {
                    let at = self.bump().at;
                    let optional = self.eat(&Tok::Question);
                    let index = self.expr()?;
                    self.expect(&Tok::RBracket)?;
                    cur = index_into(cur, index, optional, at)?;
                    last_was_field = false;
                }
                _ => return Ok((cur, last_was_field)),
            }
        }
    }

    /// Call arguments after the opening parenthesis, through the closing one.
    pub(super) fn args(&mut self) -> Result<Vec<Expr>> {
        let mut args = Vec::new();
        if self.eat(&Tok::RParen) {
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            if self.eat(&Tok::RParen) {
                return Ok(args);
            }
            if !self.eat(&Tok::Comma) {
                let next = self.peek();
                return Err(syntax(
                    next.at,
                    format!("expected ',' or ')', found {}", next.tok.describe()),
                ));
            }
        }
    }
}

/// `cur.name` or `cur.?name`.
pub(super) fn select(cur: Partial, name: String, optional: bool, at: usize) -> Result<Partial> {
    match cur {
        Partial::Device if optional => Err(unsupported(
            at,
            format!("optional selection device.?{name}"),
        )),
        Partial::Device => match name.as_str() {
            "driver" => Ok(Partial::Expr(node(Kind::Driver, at)?)),
            "attributes" => Ok(Partial::Attributes),
            "capacity" => Err(unsupported(at, "device.capacity is not evaluated by knic")),
            _ => Err(unsupported(
                at,
                format!("device.{name} is not evaluated by knic"),
            )),
        },
        Partial::Attributes if optional => Err(unsupported(
            at,
            format!("optional selection of an attribute domain (device.attributes.?{name})"),
        )),
        Partial::Attributes => Ok(Partial::Domain(name)),
        Partial::Domain(domain) if optional => Ok(Partial::Optional { domain, name }),
        Partial::Domain(domain) => Ok(Partial::Expr(node(
            Kind::Attr {
                domain,
                name,
                default: None,
            },
            at,
        )?)),
        Partial::Optional { .. } | Partial::Expr(_) => Err(unsupported(
            at,
            format!("field selection .{name} on a value that is not an attribute map"),
        )),
    }
}

/// `cur[index]` or `cur[?index]`: only attribute maps by string literals.
pub(super) fn index_into(cur: Partial, index: Expr, optional: bool, at: usize) -> Result<Partial> {
    let key = match index.kind {
        Kind::Lit(Value::String(key)) => Some(key),
        _ => None,
    };
    match (cur, key) {
        (Partial::Attributes, Some(_)) if optional => Err(unsupported(
            at,
            "optional index of an attribute domain (device.attributes[?...])",
        )),
        (Partial::Attributes, Some(domain)) => Ok(Partial::Domain(domain)),
        (Partial::Domain(domain), Some(name)) if optional => Ok(Partial::Optional { domain, name }),
        (Partial::Domain(domain), Some(name)) => Ok(Partial::Expr(node(
            Kind::Attr {
                domain,
                name,
                default: None,
            },
            at,
        )?)),
        (Partial::Attributes | Partial::Domain(_), None) => Err(unsupported(
            at,
            "an attribute map indexed by something other than a string literal",
        )),
        _ => Err(unsupported(
            at,
            "indexing anything but device.attributes and its domains",
        )),
    }
}

/// `cur.name(args)`.
pub(super) fn call(cur: Partial, name: &str, mut args: Vec<Expr>, at: usize) -> Result<Partial> {
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
    match cur {
        Partial::Optional { domain, name: id } => match name {
            "orValue" => {
                arity(1)?;
                match args.pop().map(|a| a.kind) {
                    Some(Kind::Lit(default)) => Ok(Partial::Expr(node(
                        Kind::Attr {
                            domain,
                            name: id,
                            default: Some(default),
                        },
                        at,
                    )?)),
                    _ => Err(unsupported(
                        at,
                        "orValue() with a default that is not a literal",
                    )),
                }
            }
            "hasValue" => {
                arity(0)?;
                Ok(Partial::Expr(node(Kind::Has { domain, name: id }, at)?))
            }
            "value" => {
                arity(0)?;
                Ok(Partial::Expr(node(
                    Kind::Attr {
                        domain,
                        name: id,
                        default: None,
                    },
                    at,
                )?))
            }
            _ => Err(unsupported(
                at,
                format!("method {name}() on an optional value"),
            )),
        },
        Partial::Expr(receiver) => {
            let method = match name {
                "startsWith" => Method::StartsWith,
                "endsWith" => Method::EndsWith,
                "contains" => Method::Contains,
                "matches" => {
                    return Err(unsupported(
                        at,
                        "matches() (regular expressions) is not evaluated by knic",
                    ));
                }
                _ => return Err(unsupported(at, format!("method {name}()"))),
            };
            arity(1)?;
            let arg = args.pop().ok_or_else(|| syntax(at, "missing argument"))?;
            Ok(Partial::Expr(node(
                Kind::Method(method, Box::new(receiver), Box::new(arg)),
                at,
            )?))
        }
        Partial::Device | Partial::Attributes | Partial::Domain(_) => Err(unsupported(
            at,
            format!("method {name}() on device or an attribute map"),
        )),
    }
}
