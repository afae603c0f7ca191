//! The one parser of knic's CEL, for device selectors and admission policies alike.
//!
//! Both languages share CEL's grammar, tokens and tree; they differ in what they accept. The
//! policy dialect has declared variables, `variables.NAME`, `null`, `? :`, `+`, `size()` and
//! the comprehension macros. The selector dialect has only `device`, and refuses anything its
//! evaluator cannot answer at the first offending construct in source order, with the
//! position callers report; so its checks ([`super::subset`]) run while parsing, at the very
//! points a selector-only parser would refuse, rather than as a later pass that could report
//! a later syntax error instead. Recursion is bounded by [`MAX_DEPTH`] here and by each node's
//! recorded depth, so no text can overflow the stack.

use super::lexer::{Tok, Token, lex};

use super::ast::{Chain, Expr, Func, Kind, Macro, Rel, node, too_deep};
use super::{MAX_DEPTH, Result, Value, subset, syntax, unsupported};

/// Which language a text is written in.
#[derive(Debug, Clone, Copy)]
pub(super) enum Dialect<'a> {
    /// A DRA device selector: see [`Selector`](super::Selector) for the subset.
    Selector,
    /// A ValidatingAdmissionPolicy expression whose free identifiers must be `declared`.
    Policy { declared: &'a [&'a str] },
}

/// The tree of `source`, refusing text that is not CEL ([`super::CelError::Syntax`]) and CEL
/// outside `dialect` ([`super::CelError::Unsupported`]).
pub(super) fn parse(source: &str, dialect: Dialect<'_>) -> Result<Expr> {
    let mut parser = Parser {
        tokens: lex(source)?,
        pos: 0,
        depth: 0,
        scope: Vec::new(),
        dialect,
    };
    if parser.peek().tok == Tok::End {
        return Err(syntax(0, "empty expression"));
    }
    let expr = parser.expr()?;
    let next = parser.peek();
    if next.tok != Tok::End {
        return Err(syntax(
            next.at,
            format!(
                "expected an operator or the end of the expression, found {}",
                next.tok.describe()
            ),
        ));
    }
    Ok(expr)
}

struct Parser<'a> {
    tokens: Vec<Token>,
    pos: usize,
    /// Current nesting of [`Parser::expr`] calls (and of selector `has(`).
    depth: usize,
    /// Comprehension variables in scope (policies only).
    scope: Vec<String>,
    dialect: Dialect<'a>,
}

/// The `End` token [`Parser::peek`] returns past the end (the lexer always ends with one, so
/// this is only a fallback that keeps indexing panic-free).
static END: Token = Token {
    tok: Tok::End,
    at: 0,
};

impl Parser<'_> {
    fn selector(&self) -> bool {
        matches!(self.dialect, Dialect::Selector)
    }

    fn peek(&self) -> &Token {
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

    /// A whole expression; the recursive entry point, so the nesting bound applies here.
    fn expr(&mut self) -> Result<Expr> {
        self.nested(Self::conditional)
    }

    /// Runs `inner` one nesting level deeper, refusing to go past [`MAX_DEPTH`].
    fn nested(&mut self, inner: fn(&mut Self) -> Result<Expr>) -> Result<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err(too_deep(self.peek().at));
        }
        self.depth += 1;
        let result = inner(self);
        self.depth -= 1;
        result
    }

    fn conditional(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let cond = self.or()?;
        let next = self.peek();
        if next.tok != Tok::Question {
            return Ok(cond);
        }
        if self.selector() {
            return Err(unsupported(next.at, "the conditional operator '? :'"));
        }
        self.bump();
        let then = self.or()?;
        self.expect(&Tok::Colon)?;
        let otherwise = self.expr()?;
        node(
            Kind::Cond(Box::new(cond), Box::new(then), Box::new(otherwise)),
            at,
        )
    }

    fn or(&mut self) -> Result<Expr> {
        self.chain(&Tok::Or, Self::and, Kind::Or)
    }

    fn and(&mut self) -> Result<Expr> {
        self.chain(&Tok::And, Self::relation, Kind::And)
    }

    /// `operand (op operand)*` as one flat node, so that long chains do not nest.
    fn chain(
        &mut self,
        op: &Tok,
        operand: fn(&mut Self) -> Result<Expr>,
        kind: fn(Chain) -> Kind,
    ) -> Result<Expr> {
        let at = self.peek().at;
        let first = operand(self)?;
        if &self.peek().tok != op {
            return Ok(first);
        }
        let mut chain = Chain {
            operands: vec![first],
            ops: Vec::new(),
        };
        while &self.peek().tok == op {
            chain.ops.push(self.bump().at);
            chain.operands.push(operand(self)?);
        }
        node(kind(chain), at)
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
            lhs = node(Kind::Rel(op, Box::new(lhs), Box::new(rhs)), at)?;
        }
    }

    /// `+` for policies (ints, strings, lists); selectors have no arithmetic at all.
    fn additive(&mut self) -> Result<Expr> {
        let mut lhs = self.unary()?;
        loop {
            let next = self.peek();
            match next.tok {
                Tok::Plus if !self.selector() => {
                    let at = self.bump().at;
                    let rhs = self.unary()?;
                    lhs = node(Kind::Add(Box::new(lhs), Box::new(rhs)), at)?;
                }
                Tok::Plus | Tok::Minus | Tok::Star | Tok::Slash | Tok::Percent => {
                    return Err(unsupported(
                        next.at,
                        format!("arithmetic operator {}", next.tok.describe()),
                    ));
                }
                _ => return Ok(lhs),
            }
        }
    }

    /// `!` and `-` prefixes. A selector takes a run of one of them only (`!-1` is refused as
    /// it always was), a policy any mix.
    fn unary(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let mut ops: Vec<Tok> = Vec::new();
        while matches!(self.peek().tok, Tok::Not | Tok::Minus) {
            if self.selector() && ops.first().is_some_and(|first| *first != self.peek().tok) {
                break;
            }
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
            let e = self.postfix(node(Kind::Lit(Value::Int(value)), lit.at)?)?;
            self.check_value(&e, lit.at)?;
            return apply_unary(ops, e, at);
        }
        let e = self.member()?;
        apply_unary(ops, e, at)
    }

    fn member(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let primary = self.primary()?;
        let e = self.postfix(primary)?;
        self.check_value(&e, at)?;
        Ok(e)
    }

    /// In a selector, a member chain must end at a value, not at `device` or one of its maps.
    fn check_value(&self, e: &Expr, at: usize) -> Result<()> {
        if self.selector() {
            subset::value(e, at)?;
        }
        Ok(())
    }

    fn primary(&mut self) -> Result<Expr> {
        let token = self.bump();
        let at = token.at;
        match token.tok {
            Tok::Int(magnitude) => match i64::try_from(magnitude) {
                Ok(i) => node(Kind::Lit(Value::Int(i)), at),
                Err(_) => Err(syntax(at, "integer literal out of range")),
            },
            Tok::Str(s) => node(Kind::Lit(Value::String(s)), at),
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
        let is_message = self.peek().tok == Tok::LBrace;
        let policy = !self.selector();
        match name.as_str() {
            "true" => node(Kind::Lit(Value::Bool(true)), at),
            "false" => node(Kind::Lit(Value::Bool(false)), at),
            "null" if policy => node(Kind::Null, at),
            "in" => Err(syntax(at, "expected an expression, found 'in'")),
            "has" if is_call => self.has(at),
            "size" if is_call && policy => self.size(at),
            _ if is_call => Err(unsupported(at, format!("function '{name}()'"))),
            _ => match self.dialect {
                Dialect::Selector => match name.as_str() {
                    _ if is_message => Err(unsupported(at, "message literals")),
                    "device" => node(Kind::Ident(name), at),
                    "null" => Err(unsupported(at, "the null literal")),
                    _ => Err(unsupported(
                        at,
                        format!("identifier '{name}' (only 'device' is declared)"),
                    )),
                },
                Dialect::Policy { declared } => self.declared(name, at, declared),
            },
        }
    }

    /// A policy's `variables.NAME`, declared name or comprehension variable.
    fn declared(&mut self, name: String, at: usize, declared: &[&str]) -> Result<Expr> {
        if name == "variables" {
            self.expect(&Tok::Dot)?;
            return match self.bump() {
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
            };
        }
        if self.scope.contains(&name) || declared.contains(&name.as_str()) {
            return node(Kind::Ident(name), at);
        }
        Err(unsupported(
            at,
            format!("identifier '{name}' (declared: {})", declared.join(", ")),
        ))
    }

    /// `has(` with the parenthesis next. A policy takes any field selection; a selector only
    /// `device.attributes["DOMAIN"].NAME`, parsed as a member chain (not a whole expression),
    /// so `has(` counts its own nesting.
    fn has(&mut self, at: usize) -> Result<Expr> {
        if !self.selector() {
            self.bump();
            let arg = self.expr()?;
            self.expect(&Tok::RParen)?;
            return match arg.kind {
                Kind::Select {
                    target,
                    field,
                    optional: false,
                } => node(Kind::Has { target, field }, at),
                _ => Err(syntax(at, "has() takes a field selection, like has(a.b)")),
            };
        }
        self.nested(Self::selector_has)
    }

    fn selector_has(&mut self) -> Result<Expr> {
        let open = self.bump();
        let arg_at = self.peek().at;
        let primary = self.primary()?;
        let arg = self.postfix(primary)?;
        self.expect(&Tok::RParen)?;
        let (target, field) = subset::has(arg, arg_at)?;
        node(Kind::Has { target, field }, open.at)
    }

    /// A policy's `size(x)`, with the parenthesis next.
    fn size(&mut self, at: usize) -> Result<Expr> {
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

    /// Expressions separated by commas up to `close`, which is consumed. CEL allows a
    /// trailing comma in list literals (`[1, 2,]`) but not in argument lists.
    fn list(&mut self, close: &Tok) -> Result<Vec<Expr>> {
        let trailing_comma = close == &Tok::RBracket;
        let mut items = Vec::new();
        if self.eat(close) {
            return Ok(items);
        }
        loop {
            items.push(self.expr()?);
            if self.eat(close) {
                return Ok(items);
            }
            if self.eat(&Tok::Comma) {
                if trailing_comma && self.eat(close) {
                    return Ok(items);
                }
            } else {
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

    /// `.f`, `.?f`, `.m(args)`, `[i]`, `[?i]` while they follow; a selector checks each step
    /// once it is parsed.
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
                    if !optional && self.eat(&Tok::LParen) {
                        cur = self.method(cur, &name, at)?;
                        continue;
                    }
                    if self.selector() {
                        subset::select(&cur, &name, optional, at)?;
                    }
                    let target = Box::new(cur);
                    cur = node(
                        Kind::Select {
                            target,
                            field: name,
                            optional,
                        },
                        at,
                    )?;
                }
                Tok::LBracket => {
                    let at = self.bump().at;
                    let optional = self.eat(&Tok::Question);
                    let index = self.expr()?;
                    self.expect(&Tok::RBracket)?;
                    if self.selector() {
                        subset::index(&cur, &index, optional, at)?;
                    }
                    let (target, index) = (Box::new(cur), Box::new(index));
                    cur = node(
                        Kind::Index {
                            target,
                            index,
                            optional,
                        },
                        at,
                    )?;
                }
                _ => return Ok(cur),
            }
        }
    }

    /// `target.name(`, through the closing parenthesis. A selector parses the arguments
    /// before judging the method, a policy knows its methods (and macros) up front.
    fn method(&mut self, target: Expr, name: &str, at: usize) -> Result<Expr> {
        let (func, args) = if self.selector() {
            let args = self.list(&Tok::RParen)?;
            (subset::call(&target, name, &args, at)?, args)
        } else {
            if let Some(kind) = macro_named(name) {
                return self.comprehension(kind, target, name, at);
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
            (func, args)
        };
        let target = Box::new(target);
        node(Kind::Call { func, target, args }, at)
    }

    /// `range.all(x, p)` and the other macros after the opening parenthesis; `x` is in scope
    /// in `p` only.
    fn comprehension(&mut self, kind: Macro, range: Expr, name: &str, at: usize) -> Result<Expr> {
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
        let (range, body) = (Box::new(range), Box::new(body));
        node(
            Kind::Comprehension {
                kind,
                range,
                var,
                body,
            },
            at,
        )
    }
}

fn macro_named(name: &str) -> Option<Macro> {
    match name {
        "all" => Some(Macro::All),
        "exists" => Some(Macro::Exists),
        "filter" => Some(Macro::Filter),
        "map" => Some(Macro::Map),
        _ => None,
    }
}

/// Wraps `e` in the prefix operators `ops`, innermost last, all located at `at`.
fn apply_unary(ops: Vec<Tok>, mut e: Expr, at: usize) -> Result<Expr> {
    for op in ops.into_iter().rev() {
        let inner = Box::new(e);
        e = if op == Tok::Not {
            node(Kind::Not(inner), at)?
        } else {
            node(Kind::Neg(inner), at)?
        };
    }
    Ok(e)
}
