//! An evaluator for the subset of CEL that DRA device selectors written by knic use.
//!
//! The controller reports in `status.availableNodes` how many nodes offer a free device a
//! Network's claims could get, which means running the DeviceClass's and the request's CEL
//! selectors against the devices of every ResourceSlice, as the scheduler does. No Rust CEL
//! crate parses Kubernetes' optional field syntax (`.?speed.orValue(0)`), which every friendly
//! Network compiles to, so this module evaluates the small language knic itself generates and
//! ships (see [`Selector`] for the exact subset).
//!
//! Anything outside the subset is refused with [`CelError::Unsupported`] (and malformed text
//! with [`CelError::Syntax`]) instead of being guessed at, so the caller can report the count
//! as unknown rather than a wrong number. Evaluation follows CEL where it matters for the
//! count: values of different types are unequal (cel-go's heterogeneous equality) but cannot be
//! ordered, and reading a missing attribute without `.?` is an error ([`CelError::Eval`]),
//! which in the scheduler fails the whole scheduling attempt of the pod (so the caller treats
//! it as "unknown", not as "no match"); `&&` and `||` absorb errors the commutative CEL way
//! (`false && error` is `false`).
//!
//! Parsing and evaluation never panic and never recurse deeper than [`MAX_DEPTH`] levels, so a
//! hostile selector in a Network cannot crash or overflow the controller.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as resource;

/// How deeply expressions may nest (parentheses, lists, arguments, and operators applied to
/// operators). Kubernetes has no such limit of its own below its cost budget, but knic's
/// selectors nest three levels at most, and a bound keeps a hostile selector from exhausting
/// the stack of the recursive parser and evaluator.
pub const MAX_DEPTH: usize = 64;

/// An attribute value as ResourceSlices publish it (`DeviceAttribute` has exactly one of
/// these set). Literals in selectors are the first three kinds; versions only come from
/// devices, because knic does not evaluate `semver()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `bool` attribute or `true`/`false` literal.
    Bool(bool),
    /// `int` attribute or integer literal.
    Int(i64),
    /// `string` attribute or string literal.
    String(String),
    /// `version` attribute: a semantic version, which CEL can only compare for equality with
    /// another version here (build metadata ignored, as Kubernetes' `semver` type does).
    Version(String),
}

impl Value {
    /// The value of a published attribute, or `None` if it sets no value kind this module
    /// knows (the API requires exactly one; an empty one is treated as absent).
    fn from_attribute(attribute: &resource::DeviceAttribute) -> Option<Value> {
        if let Some(b) = attribute.bool {
            Some(Value::Bool(b))
        } else if let Some(i) = attribute.int {
            Some(Value::Int(i))
        } else if let Some(s) = &attribute.string {
            Some(Value::String(s.clone()))
        } else {
            attribute
                .version
                .as_ref()
                .map(|v| Value::Version(v.clone()))
        }
    }
}

/// One device as a selector sees it: the CEL variable `device`, reduced to what knic
/// evaluates, so devices can be built in tests without a whole ResourceSlice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Device {
    /// The driver that published the device (`device.driver`).
    pub driver: String,
    /// Attributes by domain, then by id: `device.attributes["knic.dev"].kind` is
    /// `attributes["knic.dev"]["kind"]`. A missing domain reads as an empty map, like in
    /// Kubernetes.
    pub attributes: BTreeMap<String, BTreeMap<String, Value>>,
}

impl Device {
    /// From a `resource.k8s.io/v1` Device of a slice published by `driver`: a bare attribute
    /// name (`kind`) belongs to the driver's domain, a qualified one
    /// (`resource.kubernetes.io/pcieRoot`) to its prefix, which is how Kubernetes builds the
    /// `device.attributes` map.
    pub fn from_slice(driver: &str, device: &resource::Device) -> Device {
        let mut attributes: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
        for (name, attribute) in device.attributes.iter().flatten() {
            let Some(value) = Value::from_attribute(attribute) else {
                continue;
            };
            let (domain, id) = name.split_once('/').unwrap_or((driver, name));
            attributes
                .entry(domain.to_owned())
                .or_default()
                .insert(id.to_owned(), value);
        }
        Device {
            driver: driver.to_owned(),
            attributes,
        }
    }

    /// The attribute `id` of `domain`, if published.
    fn attribute(&self, domain: &str, id: &str) -> Option<&Value> {
        self.attributes.get(domain)?.get(id)
    }
}

/// Why a selector could not be compiled or evaluated. Local to this module (the caller wraps
/// it), and comparable so tests and callers can tell the three outcomes apart: malformed text,
/// valid CEL that knic does not evaluate (count unknown), and a selector that fails on one
/// device (that device does not match, as in Kubernetes).
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CelError {
    /// The text is not CEL (or calls a method with the wrong number of arguments).
    #[error("CEL syntax error at byte {at}: {message}")]
    Syntax {
        /// Byte offset of the offending token in the source.
        at: usize,
        /// What was expected or what is wrong there.
        message: String,
    },
    /// Valid CEL outside the subset knic evaluates; the message names the construct and where
    /// it is.
    #[error("unsupported CEL: {0}")]
    Unsupported(String),
    /// Evaluating against one device failed (missing attribute, mismatched types); Kubernetes
    /// treats such a device as not matching.
    #[error("CEL evaluation error: {0}")]
    Eval(String),
}

type Result<T, E = CelError> = std::result::Result<T, E>;

fn syntax(at: usize, message: impl Into<String>) -> CelError {
    CelError::Syntax {
        at,
        message: message.into(),
    }
}

fn unsupported(at: usize, what: impl std::fmt::Display) -> CelError {
    CelError::Unsupported(format!("{what} (at byte {at})"))
}

/// A compiled device selector.
///
/// The subset it understands, which covers every selector knic generates and ships:
///
/// * literals: strings in double or single quotes with CEL's escapes (`\\ \" \' \n \r \t \a \b
///   \f \v \? \` \xHH \uXXXX \UXXXXXXXX` and octal), raw strings (`r"..."`), integers
///   (decimal or `0x` hex, negative with `-`), `true`, `false`, lists `[a, b]`;
/// * `device.driver`; `device.attributes["DOMAIN"].NAME` and `device.attributes["DOMAIN"]["NAME"]`;
///   optional access `device.attributes["DOMAIN"].?NAME` (or `[?"NAME"]`) followed by
///   `.orValue(LITERAL)`, `.hasValue()` or `.value()`; `has(device.attributes["DOMAIN"].NAME)`;
/// * `!`, unary `-`, `&&`, `||`, `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, parentheses, with CEL's
///   precedence (`||` below `&&` below relations below unary operators);
/// * the string methods `startsWith`, `endsWith` and `contains`;
/// * `//` comments.
///
/// Refused as unsupported: `device.capacity`, other fields of `device`, other identifiers and
/// functions, `.matches()` and every other method, arithmetic, `?:`, maps, floating-point,
/// unsigned, bytes and triple-quoted literals, `null`, and nesting deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    expr: Expr,
}

impl Selector {
    /// Parses `source`, refusing text that is not CEL ([`CelError::Syntax`]) and CEL outside
    /// the subset ([`CelError::Unsupported`]), so that evaluating never meets a construct it
    /// would have to guess about.
    pub fn compile(source: &str) -> Result<Selector> {
        let tokens = lex(source)?;
        let mut parser = Parser {
            tokens,
            pos: 0,
            depth: 0,
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
        Ok(Selector { expr })
    }

    /// Whether `device` satisfies the selector. An `Err` means the selector fails on this
    /// device (missing attribute, mismatched types, a result that is not a bool); Kubernetes
    /// does not allocate such a device, so callers count it as not matching.
    pub fn matches(&self, device: &Device) -> Result<bool> {
        match eval(&self.expr, device)? {
            Val::Bool(b) => Ok(b),
            other => Err(CelError::Eval(format!(
                "selector evaluated to {}, not bool",
                other.type_name()
            ))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lexer

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// An integer literal's magnitude; the sign is the parser's, so `-9223372036854775808` fits.
    Int(u64),
    Str(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Dot,
    Question,
    Colon,
    Not,
    And,
    Or,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    End,
}

impl Tok {
    /// The token as error messages name it.
    fn describe(&self) -> String {
        let punct = match self {
            Tok::Ident(name) if name == "in" => return "'in'".to_owned(),
            Tok::Ident(name) => return format!("identifier '{name}'"),
            Tok::Int(n) => return format!("integer {n}"),
            Tok::Str(_) => return "string literal".to_owned(),
            Tok::End => return "end of input".to_owned(),
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::Comma => ",",
            Tok::Dot => ".",
            Tok::Question => "?",
            Tok::Colon => ":",
            Tok::Not => "!",
            Tok::And => "&&",
            Tok::Or => "||",
            Tok::Eq => "==",
            Tok::Ne => "!=",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::Percent => "%",
        };
        format!("'{punct}'")
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Token {
    tok: Tok,
    /// Byte offset of the token's first character.
    at: usize,
}

fn lex(src: &str) -> Result<Vec<Token>> {
    let bytes = src.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let next = bytes.get(i + 1).copied();
        let at = i;
        let (tok, len) = match b {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0c => {
                i += 1;
                continue;
            }
            b'/' if next == Some(b'/') => {
                while bytes.get(i).is_some_and(|&c| c != b'\n') {
                    i += 1;
                }
                continue;
            }
            b'(' => (Tok::LParen, 1),
            b')' => (Tok::RParen, 1),
            b'[' => (Tok::LBracket, 1),
            b']' => (Tok::RBracket, 1),
            b'{' => (Tok::LBrace, 1),
            b'}' => (Tok::RBrace, 1),
            b',' => (Tok::Comma, 1),
            b'.' if next.is_some_and(|c| c.is_ascii_digit()) => {
                return Err(unsupported(at, "floating-point literals"));
            }
            b'.' => (Tok::Dot, 1),
            b'?' => (Tok::Question, 1),
            b':' => (Tok::Colon, 1),
            b'+' => (Tok::Plus, 1),
            b'-' => (Tok::Minus, 1),
            b'*' => (Tok::Star, 1),
            b'/' => (Tok::Slash, 1),
            b'%' => (Tok::Percent, 1),
            b'!' if next == Some(b'=') => (Tok::Ne, 2),
            b'!' => (Tok::Not, 1),
            b'=' if next == Some(b'=') => (Tok::Eq, 2),
            b'=' => return Err(syntax(at, "'=' is not an operator; compare with '=='")),
            b'<' if next == Some(b'=') => (Tok::Le, 2),
            b'<' => (Tok::Lt, 1),
            b'>' if next == Some(b'=') => (Tok::Ge, 2),
            b'>' => (Tok::Gt, 1),
            b'&' if next == Some(b'&') => (Tok::And, 2),
            b'&' => return Err(syntax(at, "'&' is not an operator; use '&&'")),
            b'|' if next == Some(b'|') => (Tok::Or, 2),
            b'|' => return Err(syntax(at, "'|' is not an operator; use '||'")),
            b'"' | b'\'' => lex_string(src, at, at, false)?,
            b'0'..=b'9' => lex_number(bytes, at)?,
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let mut end = at;
                while bytes
                    .get(end)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
                {
                    end += 1;
                }
                let word = src.get(at..end).unwrap_or_default();
                if matches!(bytes.get(end), Some(b'"' | b'\'')) {
                    match word.to_ascii_lowercase().as_str() {
                        "r" => {
                            let (tok, len) = lex_string(src, at, end, true)?;
                            (tok, len + (end - at))
                        }
                        "b" | "rb" | "br" => return Err(unsupported(at, "bytes literals")),
                        _ => (Tok::Ident(word.to_owned()), end - at),
                    }
                } else {
                    (Tok::Ident(word.to_owned()), end - at)
                }
            }
            _ => {
                let c = src.get(at..).and_then(|s| s.chars().next()).unwrap_or('?');
                return Err(syntax(at, format!("unexpected character {c:?}")));
            }
        };
        tokens.push(Token { tok, at });
        i += len;
    }
    tokens.push(Token {
        tok: Tok::End,
        at: src.len(),
    });
    Ok(tokens)
}

/// An integer literal at `at`: its token and length. Floating-point and unsigned literals are
/// valid CEL that knic does not evaluate.
fn lex_number(bytes: &[u8], at: usize) -> Result<(Tok, usize)> {
    let hex = bytes.get(at) == Some(&b'0') && matches!(bytes.get(at + 1), Some(b'x' | b'X'));
    let (radix, digits_start) = if hex { (16, at + 2) } else { (10, at) };
    let mut end = digits_start;
    let mut value: u64 = 0;
    let mut overflow = false;
    while let Some(digit) = bytes.get(end).and_then(|&c| char::from(c).to_digit(radix)) {
        match value
            .checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(u64::from(digit)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        end += 1;
    }
    if end == digits_start {
        return Err(syntax(at, "expected hex digits after '0x'"));
    }
    match bytes.get(end) {
        Some(b'u' | b'U') => return Err(unsupported(at, "unsigned integer literals")),
        Some(b'.') if !hex && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) => {
            return Err(unsupported(at, "floating-point literals"));
        }
        Some(b'e' | b'E')
            if !hex
                && (bytes.get(end + 1).is_some_and(u8::is_ascii_digit)
                    || (matches!(bytes.get(end + 1), Some(b'+' | b'-'))
                        && bytes.get(end + 2).is_some_and(u8::is_ascii_digit))) =>
        {
            return Err(unsupported(at, "floating-point literals"));
        }
        _ => {}
    }
    if overflow {
        return Err(syntax(at, "integer literal out of range"));
    }
    Ok((Tok::Int(value), end - at))
}

/// A string literal whose prefix starts at `at` and whose opening quote is at `quote_at`:
/// its token and length from the quote on. `raw` strings keep backslashes as they are.
fn lex_string(src: &str, at: usize, quote_at: usize, raw: bool) -> Result<(Tok, usize)> {
    let rest = src.get(quote_at..).unwrap_or_default();
    let mut chars = rest.char_indices().peekable();
    let Some((_, quote)) = chars.next() else {
        return Err(syntax(at, "unterminated string literal"));
    };
    if rest.starts_with(&format!("{quote}{quote}{quote}")) {
        return Err(unsupported(at, "triple-quoted strings"));
    }
    let mut out = String::new();
    while let Some((offset, c)) = chars.next() {
        match c {
            c if c == quote => return Ok((Tok::Str(out), offset + c.len_utf8())),
            '\n' | '\r' => {
                return Err(syntax(
                    quote_at + offset,
                    "line break in string literal (write \\n)",
                ));
            }
            '\\' if !raw => {
                let escape_at = quote_at + offset;
                let Some((_, e)) = chars.next() else {
                    break;
                };
                let mut hex = |n: usize| -> Result<char> {
                    let mut code = 0u32;
                    for _ in 0..n {
                        let digit = chars
                            .next_if(|(_, c)| c.is_ascii_hexdigit())
                            .and_then(|(_, c)| c.to_digit(16))
                            .ok_or_else(|| {
                                syntax(
                                    escape_at,
                                    format!(
                                        "invalid escape sequence: '\\{e}' needs {n} hex digits"
                                    ),
                                )
                            })?;
                        code = code * 16 + digit;
                    }
                    char::from_u32(code).ok_or_else(|| {
                        syntax(
                            escape_at,
                            format!(
                                "invalid escape sequence: U+{code:X} is not a Unicode scalar value"
                            ),
                        )
                    })
                };
                let decoded = match e {
                    '\\' | '"' | '\'' | '`' | '?' => e,
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'v' => '\u{b}',
                    'x' | 'X' => hex(2)?,
                    'u' => hex(4)?,
                    'U' => hex(8)?,
                    '0'..='3' => {
                        let mut code = e.to_digit(8).unwrap_or(0);
                        for _ in 0..2 {
                            let digit = chars
                                .next_if(|(_, c)| ('0'..='7').contains(c))
                                .and_then(|(_, c)| c.to_digit(8))
                                .ok_or_else(|| {
                                    syntax(
                                        escape_at,
                                        "invalid escape sequence: octal escapes need 3 digits",
                                    )
                                })?;
                            code = code * 8 + digit;
                        }
                        // At most 0o377, always a scalar value.
                        char::from_u32(code).unwrap_or('\u{fffd}')
                    }
                    other => {
                        return Err(syntax(
                            escape_at,
                            format!("invalid escape sequence '\\{other}'"),
                        ));
                    }
                };
                out.push(decoded);
            }
            c => out.push(c),
        }
    }
    Err(syntax(at, "unterminated string literal"))
}

// ---------------------------------------------------------------------------------------------
// Syntax tree

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rel {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
}

impl Rel {
    fn symbol(self) -> &'static str {
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
enum Method {
    StartsWith,
    EndsWith,
    Contains,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::StartsWith => "startsWith",
            Method::EndsWith => "endsWith",
            Method::Contains => "contains",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Expr {
    kind: Kind,
    /// Height of the tree below and including this node, bounded by [`MAX_DEPTH`] so that
    /// evaluating (and dropping) never recurses deeper.
    depth: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
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
fn node(kind: Kind, at: usize) -> Result<Expr> {
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

fn too_deep(at: usize) -> CelError {
    unsupported(at, format!("nesting deeper than {MAX_DEPTH} levels"))
}

// ---------------------------------------------------------------------------------------------
// Parser

/// What a member chain (`device.attributes["d"].?x`) has reached so far: the `device`
/// variable and its maps are not values of their own in the subset, only steps towards one.
#[derive(Debug)]
enum Partial {
    Device,
    Attributes,
    Domain(String),
    Optional { domain: String, name: String },
    Expr(Expr),
}

impl Partial {
    fn into_expr(self, at: usize) -> Result<Expr> {
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

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    /// Current nesting of [`Parser::expr`] calls.
    depth: usize,
}

/// The `End` token [`Parser::peek`] returns past the end (the lexer always ends with one, so
/// this is only a fallback that keeps indexing panic-free).
static END: Token = Token {
    tok: Tok::End,
    at: 0,
};

impl Parser {
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
        if &self.peek().tok == tok {
            self.bump();
            true
        } else {
            false
        }
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

    /// A whole expression; the only recursive entry point, so the nesting bound lives here.
    fn expr(&mut self) -> Result<Expr> {
        if self.depth >= MAX_DEPTH {
            return Err(too_deep(self.peek().at));
        }
        self.depth += 1;
        let result = self.conditional();
        self.depth -= 1;
        result
    }

    fn conditional(&mut self) -> Result<Expr> {
        let e = self.or()?;
        let next = self.peek();
        if next.tok == Tok::Question {
            return Err(unsupported(next.at, "the conditional operator '? :'"));
        }
        Ok(e)
    }

    fn or(&mut self) -> Result<Expr> {
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

    fn and(&mut self) -> Result<Expr> {
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

    fn relation(&mut self) -> Result<Expr> {
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

    fn calc(&mut self) -> Result<Expr> {
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

    fn unary(&mut self) -> Result<Expr> {
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

    fn member(&mut self) -> Result<Expr> {
        let at = self.peek().at;
        let primary = self.primary()?;
        let (partial, _) = self.postfix(primary)?;
        partial.into_expr(at)
    }

    fn primary(&mut self) -> Result<Partial> {
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
    fn has(&mut self) -> Result<Partial> {
        // `has(` recurses into `primary` without passing through `expr`, so it counts itself.
        if self.depth >= MAX_DEPTH {
            return Err(too_deep(self.peek().at));
        }
        self.depth += 1;
        let result = self.has_inner();
        self.depth -= 1;
        result
    }

    fn has_inner(&mut self) -> Result<Partial> {
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
    fn postfix(&mut self, mut cur: Partial) -> Result<(Partial, bool)> {
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
    fn args(&mut self) -> Result<Vec<Expr>> {
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
fn select(cur: Partial, name: String, optional: bool, at: usize) -> Result<Partial> {
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
fn index_into(cur: Partial, index: Expr, optional: bool, at: usize) -> Result<Partial> {
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
fn call(cur: Partial, name: &str, mut args: Vec<Expr>, at: usize) -> Result<Partial> {
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

// ---------------------------------------------------------------------------------------------
// Evaluation

/// A value during evaluation, borrowing from the selector and the device.
#[derive(Debug, Clone, PartialEq)]
enum Val<'a> {
    Bool(bool),
    Int(i64),
    Str(&'a str),
    Version(&'a str),
    List(Vec<Val<'a>>),
}

impl<'a> Val<'a> {
    fn of(value: &'a Value) -> Val<'a> {
        match value {
            Value::Bool(b) => Val::Bool(*b),
            Value::Int(i) => Val::Int(*i),
            Value::String(s) => Val::Str(s),
            Value::Version(v) => Val::Version(v),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Str(_) => "string",
            Val::Version(_) => "version",
            Val::List(_) => "list",
        }
    }
}

fn no_overload(a: &Val<'_>, op: &str, b: &Val<'_>) -> CelError {
    CelError::Eval(format!(
        "no such overload: {} {op} {}",
        a.type_name(),
        b.type_name()
    ))
}

fn eval<'a>(e: &'a Expr, device: &'a Device) -> Result<Val<'a>> {
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
fn logical(operands: &[Expr], device: &Device, absorbing: bool) -> Result<Val<'static>> {
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
fn equal(a: &Val<'_>, b: &Val<'_>) -> Result<bool> {
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
fn without_build(version: &str) -> &str {
    version.split_once('+').map_or(version, |(v, _)| v)
}

/// CEL ordering: bools (`false < true`), ints and strings (by code point), each only against
/// its own type.
fn order(a: &Val<'_>, b: &Val<'_>, op: &str) -> Result<Ordering> {
    match (a, b) {
        (Val::Bool(x), Val::Bool(y)) => Ok(x.cmp(y)),
        (Val::Int(x), Val::Int(y)) => Ok(x.cmp(y)),
        (Val::Str(x), Val::Str(y)) => Ok(x.cmp(y)),
        _ => Err(no_overload(a, op, b)),
    }
}

/// `a in list`: true if an element equals `a` (elements of another type are unequal).
fn contains(a: &Val<'_>, list: &Val<'_>) -> Result<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;

    use serde::Deserialize as _;
    use serde_json::json;

    fn s(v: &str) -> Value {
        Value::String(v.to_owned())
    }

    fn i(v: i64) -> Value {
        Value::Int(v)
    }

    fn b(v: bool) -> Value {
        Value::Bool(v)
    }

    /// A device of `driver`; attribute names without a domain belong to the driver's.
    fn device(driver: &str, attrs: &[(&str, Value)]) -> Device {
        let mut d = Device {
            driver: driver.to_owned(),
            attributes: BTreeMap::new(),
        };
        for (name, value) in attrs {
            let (domain, id) = name.split_once('/').unwrap_or((driver, name));
            d.attributes
                .entry(domain.to_owned())
                .or_default()
                .insert(id.to_owned(), value.clone());
        }
        d
    }

    fn knic(attrs: &[(&str, Value)]) -> Device {
        device("knic.dev", attrs)
    }

    fn intel_nic() -> Device {
        knic(&[
            ("kind", s("nic")),
            ("pciVendor", s("8086")),
            ("vendorName", s("Intel Corporation")),
            ("speed", i(25000)),
            ("numaNode", i(1)),
            ("rdma", b(true)),
        ])
    }

    fn intel_pf_slow() -> Device {
        knic(&[
            ("kind", s("pf")),
            ("pciVendor", s("8086")),
            ("speed", i(10000)),
            ("numaNode", i(1)),
            ("rdma", b(true)),
        ])
    }

    /// A VF without an `rdma` attribute.
    fn mlx_vf() -> Device {
        knic(&[
            ("kind", s("vf")),
            ("pciVendor", s("15b3")),
            ("vendorName", s("Mellanox Technologies")),
            ("pfName", s("ens1f0")),
            ("speed", i(100_000)),
            ("numaNode", i(0)),
        ])
    }

    /// A knic device without any attribute.
    fn bare() -> Device {
        knic(&[])
    }

    /// Another driver's device, whose attributes live in its own domain.
    fn gpu() -> Device {
        device("gpu.example.com", &[("kind", s("nic"))])
    }

    /// `device` with `name` (in the knic.dev domain) set to `value`, added or replaced.
    fn with(mut device: Device, name: &str, value: Value) -> Device {
        device
            .attributes
            .entry("knic.dev".to_owned())
            .or_default()
            .insert(name.to_owned(), value);
        device
    }

    fn without(mut device: Device, name: &str) -> Device {
        if let Some(attrs) = device.attributes.get_mut("knic.dev") {
            attrs.remove(name);
        }
        device
    }

    fn compile(src: &str) -> Selector {
        Selector::compile(src).unwrap_or_else(|e| panic!("{src:?} does not compile: {e}"))
    }

    /// `src` on `device`, errors as their message.
    fn on(src: &str, device: &Device) -> Result<bool, String> {
        compile(src).matches(device).map_err(|e| e.to_string())
    }

    /// `src` on a device without attributes.
    fn eval(src: &str) -> Result<bool, String> {
        on(src, &bare())
    }

    fn compile_err(src: &str) -> String {
        match Selector::compile(src) {
            Ok(selector) => panic!("{src:?} compiled to {selector:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn missing(name: &str) -> Result<bool, String> {
        Err(format!(
            "CEL evaluation error: no such attribute: device.attributes[\"knic.dev\"].{name}"
        ))
    }

    /// The value of a literal expression.
    fn lit(src: &str) -> Value {
        match compile(src).expr.kind {
            Kind::Lit(v) => v,
            other => panic!("{src:?} is not a literal: {other:?}"),
        }
    }

    const E1: &str = r#"device.driver == "knic.dev""#;
    const E2: &str =
        r#"device.driver == "knic.dev" && device.attributes["knic.dev"].kind in ["nic", "pf"]"#;
    const E3: &str = r#"device.attributes["knic.dev"].kind == "vf""#;
    const E4: &str = r#"device.attributes["knic.dev"].?rdma.orValue(false)"#;
    const E5: &str = r#"device.attributes["knic.dev"].kind in ["nic", "pf"] && device.attributes["knic.dev"].?pciVendor.orValue("") == "8086" && device.attributes["knic.dev"].?speed.orValue(0) >= 25000 && device.attributes["knic.dev"].?numaNode.orValue(-1) == 1 && device.attributes["knic.dev"].?rdma.orValue(false)"#;
    const E6: &str = r#"device.attributes["knic.dev"].kind == "vf" && device.attributes["knic.dev"].?vendorName.orValue("") == "Mellanox Technologies" && device.attributes["knic.dev"].?pfName.orValue("") == "ens1f0" && !device.attributes["knic.dev"].?rdma.orValue(false)"#;
    const E7: &str =
        r#"!device.attributes["knic.dev"].?exhausted.orValue("").contains(",ab12cd,")"#;
    const EXAMPLES: [&str; 7] = [E1, E2, E3, E4, E5, E6, E7];

    #[test]
    fn driver_selector() {
        assert_eq!(on(E1, &intel_nic()), Ok(true));
        assert_eq!(on(E1, &bare()), Ok(true));
        assert_eq!(on(E1, &gpu()), Ok(false));
    }

    #[test]
    fn nic_class_selector() {
        assert_eq!(on(E2, &intel_nic()), Ok(true));
        assert_eq!(on(E2, &intel_pf_slow()), Ok(true));
        assert_eq!(on(E2, &mlx_vf()), Ok(false));
        // A knic device without `kind`: the missing attribute is an error...
        assert_eq!(on(E2, &bare()), missing("kind"));
        // ...which `false &&` absorbs for another driver's device (no knic.dev domain at all).
        assert_eq!(on(E2, &gpu()), Ok(false));
    }

    #[test]
    fn vf_selector() {
        assert_eq!(on(E3, &mlx_vf()), Ok(true));
        assert_eq!(on(E3, &intel_nic()), Ok(false));
        assert_eq!(on(E3, &bare()), missing("kind"));
        assert_eq!(on(E3, &gpu()), missing("kind"));
    }

    #[test]
    fn optional_bool_selector() {
        assert_eq!(on(E4, &intel_nic()), Ok(true));
        assert_eq!(on(E4, &with(intel_nic(), "rdma", b(false))), Ok(false));
        // Missing: the default.
        assert_eq!(on(E4, &mlx_vf()), Ok(false));
        assert_eq!(on(E4, &bare()), Ok(false));
        // Present with another type: the value, not the default, which is not a bool.
        assert_eq!(
            on(E4, &with(intel_nic(), "rdma", s("yes"))),
            Err("CEL evaluation error: selector evaluated to string, not bool".to_owned())
        );
    }

    #[test]
    fn friendly_nic_selector() {
        assert_eq!(on(E5, &intel_nic()), Ok(true));
        assert_eq!(on(E5, &with(intel_nic(), "kind", s("pf"))), Ok(true));
        assert_eq!(on(E5, &with(intel_nic(), "speed", i(100_000))), Ok(true));
        assert_eq!(on(E5, &intel_pf_slow()), Ok(false), "too slow");
        assert_eq!(on(E5, &with(intel_nic(), "numaNode", i(0))), Ok(false));
        assert_eq!(on(E5, &without(intel_nic(), "numaNode")), Ok(false));
        assert_eq!(on(E5, &without(intel_nic(), "speed")), Ok(false));
        assert_eq!(on(E5, &without(intel_nic(), "pciVendor")), Ok(false));
        assert_eq!(on(E5, &without(intel_nic(), "rdma")), Ok(false));
        assert_eq!(
            on(E5, &with(intel_nic(), "pciVendor", s("15b3"))),
            Ok(false)
        );
        assert_eq!(on(E5, &mlx_vf()), Ok(false));
        // `kind` is missing (an error) but the vendor's default "" is false, which wins.
        assert_eq!(on(E5, &bare()), Ok(false));
        assert_eq!(on(E5, &without(intel_nic(), "kind")), missing("kind"));
        // A speed published as a string cannot be compared with an int.
        assert_eq!(
            on(E5, &with(intel_nic(), "speed", s("25000"))),
            Err("CEL evaluation error: no such overload: string >= int".to_owned())
        );
    }

    #[test]
    fn friendly_vf_selector() {
        assert_eq!(on(E6, &mlx_vf()), Ok(true));
        assert_eq!(on(E6, &with(mlx_vf(), "rdma", b(false))), Ok(true));
        assert_eq!(on(E6, &with(mlx_vf(), "rdma", b(true))), Ok(false));
        assert_eq!(on(E6, &with(mlx_vf(), "pfName", s("ens1f1"))), Ok(false));
        assert_eq!(on(E6, &without(mlx_vf(), "pfName")), Ok(false));
        assert_eq!(
            on(E6, &with(mlx_vf(), "vendorName", s("Intel Corporation"))),
            Ok(false)
        );
        assert_eq!(on(E6, &intel_nic()), Ok(false));
        assert_eq!(on(E6, &bare()), Ok(false));
        assert_eq!(
            on(E6, &with(mlx_vf(), "rdma", i(1))),
            Err("CEL evaluation error: no such overload: !int".to_owned())
        );
    }

    #[test]
    fn exhaustion_selector() {
        assert_eq!(on(E7, &intel_nic()), Ok(true));
        assert_eq!(
            on(E7, &with(bare(), "exhausted", s(",ab12cd,ef34gh,"))),
            Ok(false)
        );
        assert_eq!(on(E7, &with(bare(), "exhausted", s(",ef34gh,"))), Ok(true));
        assert_eq!(on(E7, &with(bare(), "exhausted", s(",xab12cd,"))), Ok(true));
        assert_eq!(
            on(E7, &with(bare(), "exhausted", i(5))),
            Err("CEL evaluation error: no such overload: int.contains(string)".to_owned())
        );

        // The selector knic really generates, against the attribute drivers really publish.
        use knic_proto::network::{
            EXHAUSTED_ATTRIBUTE, exhausted_attribute, exhaustion_selector, exhaustion_token,
        };
        let selector = compile(&exhaustion_selector("blue"));
        let listing = |networks: &[&str]| {
            let tokens: Vec<String> = networks.iter().map(|n| exhaustion_token(n)).collect();
            let value =
                exhausted_attribute(tokens.iter().map(String::as_str)).expect("something to list");
            with(intel_nic(), EXHAUSTED_ATTRIBUTE, s(&value))
        };
        assert_eq!(selector.matches(&intel_nic()), Ok(true));
        assert_eq!(selector.matches(&listing(&["red"])), Ok(true));
        assert_eq!(selector.matches(&listing(&["red", "blue"])), Ok(false));
        assert_eq!(selector.matches(&listing(&["blue"])), Ok(false));
    }

    /// Every selector of the shipped DeviceClasses, against the devices they are meant for.
    #[test]
    fn shipped_device_classes() {
        let yaml = include_str!("../../deviceclasses/knic.yaml");
        let mut classes = BTreeMap::new();
        for document in serde_yaml_ng::Deserializer::from_str(yaml) {
            let class = serde_yaml_ng::Value::deserialize(document).expect("YAML");
            let name = class["metadata"]["name"].as_str().expect("name").to_owned();
            let selectors: Vec<Selector> = class["spec"]["selectors"]
                .as_sequence()
                .expect("selectors")
                .iter()
                .map(|s| compile(s["cel"]["expression"].as_str().expect("expression")))
                .collect();
            classes.insert(name, selectors);
        }
        let matches = |class: &str, device: &Device| -> Result<bool, CelError> {
            let mut all = true;
            for selector in &classes[class] {
                all &= selector.matches(device)?;
            }
            Ok(all)
        };
        let (nic, pf, vf, bare, gpu) = (intel_nic(), intel_pf_slow(), mlx_vf(), bare(), gpu());
        let table: [(&str, [Result<bool, ()>; 5]); 4] = [
            (
                "knic.dev",
                [Ok(true), Ok(true), Ok(true), Ok(true), Ok(false)],
            ),
            (
                "nic.knic.dev",
                [Ok(true), Ok(true), Ok(false), Err(()), Ok(false)],
            ),
            (
                "vf.knic.dev",
                [Ok(false), Ok(false), Ok(true), Err(()), Ok(false)],
            ),
            (
                "rdma.knic.dev",
                [Ok(true), Ok(true), Ok(false), Ok(false), Ok(false)],
            ),
        ];
        assert_eq!(classes.len(), table.len());
        for (class, expected) in table {
            let got: Vec<Result<bool, ()>> = [&nic, &pf, &vf, &bare, &gpu]
                .into_iter()
                .map(|d| matches(class, d).map_err(|_| ()))
                .collect();
            assert_eq!(got, expected, "{class}");
        }
    }

    /// The selectors the controller generates from friendly Networks.
    #[test]
    fn generated_selectors() {
        use crate::network::{DeviceRequestOf as _, NetworkSpec};
        let selector = |devices: serde_json::Value| -> Selector {
            let spec: NetworkSpec = serde_json::from_value(json!({
                "devices": devices,
                "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1" }] },
                "namespaces": { "names": ["team-a"] }
            }))
            .expect("spec");
            let request = spec.device_request().expect("valid devices");
            assert_eq!(request.device_class_name, "knic.dev");
            assert_eq!(request.selectors.len(), 1, "{:?}", request.selectors);
            compile(&request.selectors[0])
        };
        let nic = selector(json!({
            "kind": "nic", "vendor": "8086", "minSpeed": 25000, "numaNode": 1, "rdma": true
        }));
        assert_eq!(nic.matches(&intel_nic()), Ok(true));
        assert_eq!(nic.matches(&intel_pf_slow()), Ok(false));
        assert_eq!(nic.matches(&mlx_vf()), Ok(false));

        let vf = selector(json!({
            "kind": "vf", "vendor": "Mellanox Technologies", "pfName": "ens1f0", "rdma": false
        }));
        assert_eq!(vf.matches(&mlx_vf()), Ok(true));
        assert_eq!(
            vf.matches(&with(mlx_vf(), "pfName", s("ens1f1"))),
            Ok(false)
        );
        assert_eq!(vf.matches(&intel_nic()), Ok(false));

        let by_id = selector(json!({ "vendor": "0X15B3" }));
        assert_eq!(by_id.matches(&mlx_vf()), Ok(true));
        assert_eq!(by_id.matches(&intel_nic()), Ok(false));

        // A vendor name that needs escaping round-trips through the generated literal.
        let odd = selector(json!({ "vendor": "Odd \"Vendor\" \\ Inc" }));
        let named = |name: &str| with(bare(), "vendorName", s(name));
        assert_eq!(odd.matches(&named("Odd \"Vendor\" \\ Inc")), Ok(true));
        assert_eq!(odd.matches(&named("Odd \"Vendor\" \\\\ Inc")), Ok(false));
        assert_eq!(odd.matches(&named("Odd Vendor Inc")), Ok(false));
    }

    #[test]
    fn from_slice_sorts_attributes_into_domains() {
        use k8s_openapi::api::resource::v1::{Device as ApiDevice, DeviceAttribute};
        let attr = |f: fn(&mut DeviceAttribute)| {
            let mut a = DeviceAttribute::default();
            f(&mut a);
            a
        };
        let api = ApiDevice {
            name: "eth0".to_owned(),
            attributes: Some(BTreeMap::from([
                (
                    "kind".to_owned(),
                    attr(|a| a.string = Some("nic".to_owned())),
                ),
                ("speed".to_owned(), attr(|a| a.int = Some(25000))),
                ("rdma".to_owned(), attr(|a| a.bool = Some(true))),
                (
                    "firmware".to_owned(),
                    attr(|a| a.version = Some("1.2.3+b7".to_owned())),
                ),
                (
                    "resource.kubernetes.io/pcieRoot".to_owned(),
                    attr(|a| a.string = Some("pci0000:00".to_owned())),
                ),
                ("empty".to_owned(), DeviceAttribute::default()),
            ])),
            ..ApiDevice::default()
        };
        let d = Device::from_slice("knic.dev", &api);
        let expected = Device {
            driver: "knic.dev".to_owned(),
            attributes: BTreeMap::from([
                (
                    "knic.dev".to_owned(),
                    BTreeMap::from([
                        ("kind".to_owned(), s("nic")),
                        ("speed".to_owned(), i(25000)),
                        ("rdma".to_owned(), b(true)),
                        ("firmware".to_owned(), Value::Version("1.2.3+b7".to_owned())),
                    ]),
                ),
                (
                    "resource.kubernetes.io".to_owned(),
                    BTreeMap::from([("pcieRoot".to_owned(), s("pci0000:00"))]),
                ),
            ]),
        };
        assert_eq!(d, expected);
        assert_eq!(
            on(
                r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#,
                &d
            ),
            Ok(true)
        );
        assert_eq!(on(E5, &d), Ok(false), "no pciVendor");
        assert_eq!(on(E2, &d), Ok(true));
        assert_eq!(
            on(r#"has(device.attributes["knic.dev"].empty)"#, &d),
            Ok(false)
        );
        assert_eq!(
            Device::from_slice("knic.dev", &ApiDevice::default()),
            knic(&[]),
            "no attributes at all"
        );
    }

    #[test]
    fn string_literals_and_escapes() {
        let cases: [(&str, &str); 16] = [
            (r#""plain""#, "plain"),
            (r#"'single'"#, "single"),
            (r#""""#, ""),
            (r#""a\\b""#, "a\\b"),
            (r#""say \"hi\"""#, "say \"hi\""),
            (r#"'it\'s'"#, "it's"),
            (r#""it's""#, "it's"),
            (r#"'"'"#, "\""),
            (r#""\n\r\t""#, "\n\r\t"),
            (r#""\a\b\f\v\?\`""#, "\u{7}\u{8}\u{c}\u{b}?`"),
            (r#""\u00e9\U0001F600""#, "é😀"),
            (r#""\x41\X42\101""#, "ABA"),
            (r#""ñ und 😀""#, "ñ und 😀"),
            (r#"r"a\nb\""#, "a\\nb\\"),
            (r#"R'\d+'"#, "\\d+"),
            (r#""\u0000""#, "\u{0}"),
        ];
        for (src, expected) in cases {
            assert_eq!(lit(src), s(expected), "{src}");
        }
        // An escaped quote does not end the literal, and `//` inside one is text.
        assert_eq!(eval(r#""a\"b" == 'a"b'"#), Ok(true));
        assert_eq!(lit(r#""// not a comment""#), s("// not a comment"));
    }

    #[test]
    fn other_literals() {
        assert_eq!(lit("0"), i(0));
        assert_eq!(lit("42"), i(42));
        assert_eq!(lit("-1"), i(-1));
        assert_eq!(lit("0x1F"), i(31));
        assert_eq!(lit("-0x10"), i(-16));
        assert_eq!(lit("9223372036854775807"), i(i64::MAX));
        assert_eq!(lit("-9223372036854775808"), i(i64::MIN));
        assert_eq!(lit("true"), b(true));
        assert_eq!(lit("false"), b(false));
        assert_eq!(eval("--1 == 1"), Ok(true));
        assert_eq!(eval("[1, 'a', true] == [1, 'a', true,]"), Ok(true));
        assert_eq!(eval("[] == []"), Ok(true));
        assert_eq!(eval("[1] == [1, 2]"), Ok(false));
        assert_eq!(eval("[1, 2] == [1, 3]"), Ok(false));
        assert_eq!(eval("[1] == ['a']"), Ok(false), "heterogeneous equality");
        assert_eq!(
            eval("[1] < [2]"),
            Err("CEL evaluation error: no such overload: list < list".to_owned())
        );
        assert_eq!(
            eval("device.driver == 'knic.dev' // the driver\n && true"),
            Ok(true)
        );
    }

    #[test]
    fn attribute_access_forms() {
        let nic = intel_nic();
        assert_eq!(
            on(r#"device.attributes["knic.dev"]["kind"] == "nic""#, &nic),
            Ok(true)
        );
        assert_eq!(
            on(r#"device.attributes['knic.dev'].speed == 25000"#, &nic),
            Ok(true)
        );
        assert_eq!(
            on(
                r#"device.attributes["knic.dev"][?"numaNode"].orValue(-1) == 1"#,
                &nic
            ),
            Ok(true)
        );
        assert_eq!(
            on(
                r#"device.attributes["knic.dev"][?"pfName"].orValue("none") == "none""#,
                &nic
            ),
            Ok(true)
        );
        assert_eq!(
            on(r#"device.attributes["knic.dev"].?speed.value() > 0"#, &nic),
            Ok(true)
        );
        assert_eq!(
            on(
                r#"device.attributes["knic.dev"].?pfName.value() == """#,
                &nic
            ),
            missing("pfName")
        );
        assert_eq!(
            on(r#"device.attributes["knic.dev"].?rdma.hasValue()"#, &nic),
            Ok(true)
        );
        assert_eq!(
            on(r#"device.attributes["knic.dev"].?pfName.hasValue()"#, &nic),
            Ok(false)
        );
        assert_eq!(
            on(r#"has(device.attributes["knic.dev"].rdma)"#, &nic),
            Ok(true)
        );
        assert_eq!(
            on(r#"!has(device.attributes["knic.dev"].rdma)"#, &mlx_vf()),
            Ok(true)
        );
        // A domain by field selection, as CEL allows for map keys.
        assert_eq!(
            on(
                r#"device.attributes.example.x == 1"#,
                &device("example", &[("x", i(1))])
            ),
            Ok(true)
        );
        // An unknown domain reads as an empty map.
        assert_eq!(
            on(r#"device.attributes["nope.dev"].x == 1"#, &nic),
            Err(
                "CEL evaluation error: no such attribute: device.attributes[\"nope.dev\"].x"
                    .to_owned()
            )
        );
        assert_eq!(
            on(r#"device.attributes["nope.dev"].?x.orValue(7) == 7"#, &nic),
            Ok(true)
        );
        // Another driver's device may publish into the knic.dev domain with a qualified name;
        // its own bare names stay in its domain.
        let other = device("other.dev", &[("knic.dev/kind", s("vf")), ("kind", s("x"))]);
        assert_eq!(on(E3, &other), Ok(true));
        assert_eq!(
            on(
                r#"device.attributes["other.dev"].?kind.orValue("") == "x""#,
                &other
            ),
            Ok(true)
        );
    }

    #[test]
    fn relations_and_types() {
        let cases: [(&str, bool); 22] = [
            ("1 < 2", true),
            ("2 < 1", false),
            ("1 <= 1", true),
            ("2 <= 1", false),
            ("2 > 1", true),
            ("1 > 1", false),
            ("1 >= 1", true),
            ("1 >= 2", false),
            ("1 == 1", true),
            ("1 != 1", false),
            ("-5 < -4", true),
            ("'a' < 'b'", true),
            ("'B' < 'a'", true),
            ("'é' > 'z'", true),
            ("'ab' < 'abc'", true),
            ("false < true", true),
            ("true <= false", false),
            ("'x' != 'y'", true),
            ("2 in [1, 2]", true),
            ("3 in [1, 2]", false),
            ("'a' in []", false),
            ("1 < 2 == true", true),
        ];
        for (src, expected) in cases {
            assert_eq!(eval(src), Ok(expected), "{src}");
        }
        // Heterogeneous equality (cel-go's, hence the scheduler's): other types are unequal.
        assert_eq!(eval("1 == '1'"), Ok(false));
        assert_eq!(eval("'1' != 1"), Ok(true));
        assert_eq!(eval("2 in ['a', 1]"), Ok(false));
        let errors: [(&str, &str); 6] = [
            ("true < 1", "no such overload: bool < int"),
            ("'a' >= false", "no such overload: string >= bool"),
            ("1 in 1", "no such overload: int in int"),
            ("1 < 2 < 3", "no such overload: bool < int"),
            ("-'a' == 1", "no such overload: -string"),
            (
                "1.startsWith('a')",
                "no such overload: int.startsWith(string)",
            ),
        ];
        for (src, message) in errors {
            assert_eq!(
                eval(src),
                Err(format!("CEL evaluation error: {message}")),
                "{src}"
            );
        }
        // Elements of another type are simply unequal.
        assert_eq!(eval("1 in ['a', 1]"), Ok(true));
        let speed = with(intel_nic(), "speed", i(25000));
        assert_eq!(
            on(r#"device.attributes["knic.dev"].speed == "25000""#, &speed),
            Ok(false)
        );
        assert_eq!(
            on(
                r#"device.attributes["knic.dev"].speed in [10000, 25000]"#,
                &speed
            ),
            Ok(true)
        );
        assert_eq!(
            on(r#"-device.attributes["knic.dev"].speed == -25000"#, &speed),
            Ok(true)
        );
        assert_eq!(
            on(
                r#"-device.attributes["knic.dev"].speed > 0"#,
                &with(bare(), "speed", i(i64::MIN))
            ),
            Err("CEL evaluation error: integer overflow in -".to_owned())
        );
        assert_eq!(
            eval("device.driver"),
            Err("CEL evaluation error: selector evaluated to string, not bool".to_owned())
        );
        assert_eq!(
            eval("[true]"),
            Err("CEL evaluation error: selector evaluated to list, not bool".to_owned())
        );
    }

    #[test]
    fn versions_compare_only_with_versions() {
        let d = device(
            "knic.dev",
            &[
                ("firmware", Value::Version("1.2.3+b7".to_owned())),
                ("x.dev/firmware", Value::Version("1.2.3".to_owned())),
                ("y.dev/firmware", Value::Version("1.2.4".to_owned())),
            ],
        );
        let fw = |domain: &str| format!("device.attributes[{domain:?}].firmware");
        let (k, x, y) = (fw("knic.dev"), fw("x.dev"), fw("y.dev"));
        assert_eq!(
            on(&format!("{k} == {x}"), &d),
            Ok(true),
            "build metadata ignored"
        );
        assert_eq!(on(&format!("{k} != {y}"), &d), Ok(true));
        assert_eq!(on(&format!("{x} in [{y}, {k}]"), &d), Ok(true));
        assert_eq!(on(&format!("{x} == '1.2.3'"), &d), Ok(false));
        assert_eq!(
            on(&format!("{x} < {y}"), &d),
            Err("CEL evaluation error: no such overload: version < version".to_owned())
        );
    }

    #[test]
    fn string_methods() {
        let cases: [(&str, bool); 9] = [
            ("'ens1f0'.startsWith('ens')", true),
            ("'ens1f0'.startsWith('f0')", false),
            ("'ens1f0'.endsWith('f0')", true),
            ("'ens1f0'.endsWith('ens')", false),
            ("'ens1f0'.contains('1f')", true),
            ("'ens1f0'.contains('2')", false),
            ("''.contains('')", true),
            ("!'abc'.contains('b')", false),
            (
                "device.driver.endsWith('.dev') && device.driver.startsWith('knic')",
                true,
            ),
        ];
        for (src, expected) in cases {
            assert_eq!(eval(src), Ok(expected), "{src}");
        }
        assert_eq!(
            eval("'a'.contains(1)"),
            Err("CEL evaluation error: no such overload: string.contains(int)".to_owned())
        );
    }

    #[test]
    fn precedence() {
        // && binds tighter than ||.
        assert_eq!(eval("true || false && false"), Ok(true));
        assert_eq!(eval("(true || false) && false"), Ok(false));
        assert_eq!(eval("false && false || true"), Ok(true));
        assert_eq!(eval("false && (false || true)"), Ok(false));
        // Relations bind tighter than && and ||.
        assert_eq!(eval("1 == 1 && 2 == 2"), Ok(true));
        assert_eq!(eval("1 == 2 || 'a' in ['a']"), Ok(true));
        // ! binds tighter than relations: (!1) == 1, not !(1 == 1).
        assert_eq!(
            eval("!1 == 1"),
            Err("CEL evaluation error: no such overload: !int".to_owned())
        );
        assert_eq!(eval("!(1 == 1)"), Ok(false));
        assert_eq!(eval("!!true"), Ok(true));
        assert_eq!(eval("!!!true"), Ok(false));
        // Relations are left-associative: (1 == 1) == true.
        assert_eq!(eval("1 == 1 == true"), Ok(true));
        // Methods bind tighter than !.
        assert_eq!(eval("!'abc'.startsWith('a') == false"), Ok(true));
    }

    /// `false && error` is false and `true || error` is true, in either order; otherwise the
    /// first error wins. Non-bool operands are errors too.
    #[test]
    fn logical_operators_absorb_errors() {
        const ERR: &str = r#"device.attributes["knic.dev"].missing"#;
        let err = missing("missing");
        let cases: [(String, Result<bool, String>); 16] = [
            (format!("false && {ERR}"), Ok(false)),
            (format!("{ERR} && false"), Ok(false)),
            (format!("true && {ERR}"), err.clone()),
            (format!("{ERR} && true"), err.clone()),
            (format!("true || {ERR}"), Ok(true)),
            (format!("{ERR} || true"), Ok(true)),
            (format!("false || {ERR}"), err.clone()),
            (format!("{ERR} || false"), err.clone()),
            (format!("true && {ERR} && false"), Ok(false)),
            (format!("false || {ERR} || true"), Ok(true)),
            (format!("{ERR} && 1"), err.clone()),
            ("1 && false".to_owned(), Ok(false)),
            ("'x' || true".to_owned(), Ok(true)),
            (
                "1 && true".to_owned(),
                Err("CEL evaluation error: no such overload: int && ...".to_owned()),
            ),
            (
                "false || 'x'".to_owned(),
                Err("CEL evaluation error: no such overload: string || ...".to_owned()),
            ),
            // Relations are strict: an error operand is an error.
            (format!("{ERR} == false"), err.clone()),
        ];
        for (src, expected) in cases {
            assert_eq!(eval(&src), expected, "{src}");
        }
        assert_eq!(eval("true && true && true"), Ok(true));
        assert_eq!(eval("false || false || false"), Ok(false));
    }

    #[test]
    fn syntax_errors() {
        let cases: [(&str, usize, &str); 40] = [
            ("", 0, "empty expression"),
            ("  // only a comment", 0, "empty expression"),
            (
                "device.driver == ",
                17,
                "unexpected end of input, expected an expression",
            ),
            (
                r#"(device.driver == "a""#,
                21,
                "expected ')', found end of input",
            ),
            (
                r#"device.driver = "a""#,
                14,
                "'=' is not an operator; compare with '=='",
            ),
            ("true & false", 5, "'&' is not an operator; use '&&'"),
            ("true | false", 5, "'|' is not an operator; use '||'"),
            (r#""abc"#, 0, "unterminated string literal"),
            (r#"'abc""#, 0, "unterminated string literal"),
            (r#"x == r"abc"#, 5, "unterminated string literal"),
            (r#""abc\"#, 0, "unterminated string literal"),
            (r#""a\qb""#, 2, r"invalid escape sequence '\q'"),
            (
                r#""\u12""#,
                1,
                r"invalid escape sequence: '\u' needs 4 hex digits",
            ),
            (
                r#""\U0001F6""#,
                1,
                r"invalid escape sequence: '\U' needs 8 hex digits",
            ),
            (
                r#""\xg""#,
                1,
                r"invalid escape sequence: '\x' needs 2 hex digits",
            ),
            (
                r#""\ud800""#,
                1,
                "invalid escape sequence: U+D800 is not a Unicode scalar value",
            ),
            (
                r#""\U00110000""#,
                1,
                "invalid escape sequence: U+110000 is not a Unicode scalar value",
            ),
            (
                r#""\18""#,
                1,
                "invalid escape sequence: octal escapes need 3 digits",
            ),
            ("\"a\nb\"", 2, r"line break in string literal (write \n)"),
            (
                r#"device.driver == "a" "b""#,
                21,
                "expected an operator or the end of the expression, found string literal",
            ),
            (
                "true false",
                5,
                "expected an operator or the end of the expression, found identifier 'false'",
            ),
            (
                "device.",
                7,
                "expected a field name after '.', found end of input",
            ),
            (
                "device..driver",
                7,
                "expected a field name after '.', found '.'",
            ),
            (
                r#"device.attributes["knic.dev""#,
                28,
                "expected ']', found end of input",
            ),
            ("[1 2]", 3, "expected ',' or ']', found integer 2"),
            ("[1,", 3, "unexpected end of input, expected an expression"),
            ("[,]", 1, "expected an expression, found ','"),
            (
                r#""a".startsWith("a" "b")"#,
                19,
                "expected ',' or ')', found string literal",
            ),
            (
                r#""a".startsWith("b",)"#,
                19,
                "expected an expression, found ')'",
            ),
            (
                r#""a".startsWith()"#,
                4,
                "startsWith() takes 1 argument, got 0",
            ),
            (
                r#""a".contains("a", "b")"#,
                4,
                "contains() takes 1 argument, got 2",
            ),
            (
                r#"device.attributes["d"].?x.orValue()"#,
                26,
                "orValue() takes 1 argument, got 0",
            ),
            (
                r#"device.attributes["d"].?x.hasValue(1)"#,
                26,
                "hasValue() takes 0 arguments, got 1",
            ),
            (
                "9223372036854775808 == 1",
                0,
                "integer literal out of range",
            ),
            (
                "-9223372036854775809 == 1",
                1,
                "integer literal out of range",
            ),
            ("99999999999999999999", 0, "integer literal out of range"),
            ("0x == 1", 0, "expected hex digits after '0x'"),
            ("1 # 2", 2, "unexpected character '#'"),
            (")", 0, "expected an expression, found ')'"),
            ("!-1", 1, "expected an expression, found '-'"),
        ];
        for (src, at, message) in cases {
            assert_eq!(
                Selector::compile(src).map(|_| ()),
                Err(CelError::Syntax {
                    at,
                    message: message.to_owned()
                }),
                "{src:?}"
            );
            assert_eq!(
                compile_err(src),
                format!("CEL syntax error at byte {at}: {message}")
            );
        }
        assert_eq!(
            compile_err("é"),
            "CEL syntax error at byte 0: unexpected character 'é'"
        );
        assert_eq!(
            compile_err("in [1]"),
            "CEL syntax error at byte 0: expected an expression, found 'in'"
        );
        assert_eq!(
            compile_err("(true"),
            "CEL syntax error at byte 5: expected ')', found end of input"
        );
    }

    #[test]
    fn unsupported_constructs() {
        let cases: [(&str, &str); 38] = [
            (
                r#"device.capacity["knic.dev"].x > 1"#,
                "device.capacity is not evaluated by knic (at byte 7)",
            ),
            (
                "device.allowMultipleAllocations",
                "device.allowMultipleAllocations is not evaluated by knic (at byte 7)",
            ),
            (
                r#"device.driver.matches("^k")"#,
                "matches() (regular expressions) is not evaluated by knic (at byte 14)",
            ),
            ("device.driver.size() > 1", "method size() (at byte 14)"),
            ("size(device.driver) > 1", "function 'size()' (at byte 0)"),
            (
                "cel.bind(x, 1, x == 1)",
                "identifier 'cel' (only 'device' is declared) (at byte 0)",
            ),
            ("1 + 2 == 3", "arithmetic operator '+' (at byte 2)"),
            ("2 - 1 == 1", "arithmetic operator '-' (at byte 2)"),
            ("2 * 1 == 2", "arithmetic operator '*' (at byte 2)"),
            ("2 / 1 == 2", "arithmetic operator '/' (at byte 2)"),
            ("2 % 1 == 0", "arithmetic operator '%' (at byte 2)"),
            (
                "true ? true : false",
                "the conditional operator '? :' (at byte 5)",
            ),
            (r#"{"a": 1}"#, "map literals (at byte 0)"),
            ("1.5 > 1", "floating-point literals (at byte 0)"),
            ("x == .5", "floating-point literals (at byte 5)"),
            ("1e3 > 1", "floating-point literals (at byte 0)"),
            ("1u > 0", "unsigned integer literals (at byte 0)"),
            (r#"b"x" == b"x""#, "bytes literals (at byte 0)"),
            (r#"rb'x' == b"x""#, "bytes literals (at byte 0)"),
            (r#""""x""" == "x""#, "triple-quoted strings (at byte 0)"),
            (r#"r'''x''' == "x""#, "triple-quoted strings (at byte 0)"),
            ("null == 1", "the null literal (at byte 0)"),
            (
                "foo == 1",
                "identifier 'foo' (only 'device' is declared) (at byte 0)",
            ),
            (
                r#".device.driver == "x""#,
                "leading '.' (root-scoped identifiers) (at byte 0)",
            ),
            ("Foo{}", "message literals (at byte 0)"),
            (
                "device == 1",
                "'device' used as a value (select .driver or .attributes) (at byte 0)",
            ),
            (
                "device.attributes == 1",
                "device.attributes used as a value (index it with a domain) (at byte 0)",
            ),
            (
                r#"device.attributes["d"] == 1"#,
                r#"device.attributes["d"] used as a value (select an attribute) (at byte 0)"#,
            ),
            (
                r#"device.attributes["d"].?x == 1"#,
                r#"optional device.attributes["d"].?x used without .orValue() (at byte 0)"#,
            ),
            (
                r#"device.attributes["d"].?x.orValue(device.driver)"#,
                "orValue() with a default that is not a literal (at byte 26)",
            ),
            (
                "device.attributes[device.driver].x == 1",
                "an attribute map indexed by something other than a string literal (at byte 17)",
            ),
            (
                "device.driver[0] == 1",
                "indexing anything but device.attributes and its domains (at byte 13)",
            ),
            (
                r#"device.attributes["d"].x.y"#,
                "field selection .y on a value that is not an attribute map (at byte 25)",
            ),
            (
                "device.?driver",
                "optional selection device.?driver (at byte 8)",
            ),
            (
                "device.attributes.?d.x",
                "optional selection of an attribute domain (device.attributes.?d) (at byte 19)",
            ),
            (
                r#"device.attributes[?"d"].x"#,
                "optional index of an attribute domain (device.attributes[?...]) (at byte 17)",
            ),
            (
                "has(device.driver)",
                r#"has() of anything but device.attributes["DOMAIN"].NAME (at byte 4)"#,
            ),
            (
                r#"has(device.attributes["d"]["x"])"#,
                r#"has() of anything but device.attributes["DOMAIN"].NAME (at byte 4)"#,
            ),
        ];
        for (src, message) in cases {
            assert_eq!(
                Selector::compile(src).map(|_| ()),
                Err(CelError::Unsupported(message.to_owned())),
                "{src:?}"
            );
            assert_eq!(compile_err(src), format!("unsupported CEL: {message}"));
        }
        assert_eq!(
            compile_err(r#"device.attributes["d"].?x.foo()"#),
            "unsupported CEL: method foo() on an optional value (at byte 26)"
        );
        assert_eq!(
            compile_err("device.attributes.size()"),
            "unsupported CEL: method size() on device or an attribute map (at byte 18)"
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let parens = |n: usize| format!("{}true{}", "(".repeat(n), ")".repeat(n));
        assert_eq!(eval(&parens(63)), Ok(true));
        assert_eq!(
            compile_err(&parens(64)),
            "unsupported CEL: nesting deeper than 64 levels (at byte 64)"
        );
        let lists = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(
            eval(&lists(63)),
            Err("CEL evaluation error: selector evaluated to list, not bool".to_owned())
        );
        assert_eq!(
            compile_err(&lists(64)),
            "unsupported CEL: nesting deeper than 64 levels (at byte 64)"
        );
        // Operators applied to operators nest the tree without nesting the parser.
        let nots = |n: usize| format!("{}true", "!".repeat(n));
        assert_eq!(eval(&nots(63)), Ok(false));
        assert_eq!(
            compile_err(&nots(64)),
            "unsupported CEL: nesting deeper than 64 levels (at byte 0)"
        );
        let relations = |n: usize| format!("true{}", " == true".repeat(n));
        assert_eq!(eval(&relations(63)), Ok(true));
        assert_eq!(
            compile_err(&relations(64)),
            "unsupported CEL: nesting deeper than 64 levels (at byte 509)"
        );
        // `has(` nests the parser without passing through a whole expression.
        let has = |n: usize| format!("{}x{}", "has(".repeat(n), ")".repeat(n));
        assert!(compile_err(&has(64)).starts_with("unsupported CEL: nesting deeper than 64"));
        assert!(compile_err(&has(100_000)).starts_with("unsupported CEL: nesting deeper"));
        let methods = |n: usize| format!("'a'{}", ".contains('a')".repeat(n));
        assert!(compile_err(&methods(64)).starts_with("unsupported CEL: nesting deeper than 64"));
        // Hostile sizes return errors instead of overflowing the stack.
        for hostile in [
            parens(100_000),
            lists(100_000),
            nots(100_000),
            format!("{}1 == 1", "-".repeat(100_000)),
            relations(100_000),
            methods(100_000),
            format!("{}true", "(!".repeat(50_000)),
            format!(
                "'a'.contains({}'a'{})",
                "(".repeat(100_000),
                ")".repeat(100_000)
            ),
        ] {
            assert!(
                compile_err(&hostile).starts_with("unsupported CEL: nesting deeper than 64 levels"),
                "{}",
                &hostile[..20]
            );
        }
        // Long flat chains of && and || are not deep.
        let long = vec![E1; 10_000].join(" && ");
        assert_eq!(on(&long, &intel_nic()), Ok(true));
        assert_eq!(on(&long, &gpu()), Ok(false));
        let long = vec![E3; 10_000].join(" || ");
        assert_eq!(on(&long, &mlx_vf()), Ok(true));
        assert_eq!(on(&long, &bare()), missing("kind"));
    }

    /// A small xorshift generator, so the fuzz test is repeatable without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            let n = u64::try_from(n.max(1)).expect("fits");
            usize::try_from(self.next() % n).expect("fits")
        }

        /// A char boundary of `s` (its length included).
        fn boundary(&mut self, s: &str) -> usize {
            let mut at = self.below(s.len() + 1);
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            at
        }
    }

    /// Truncated and mutated versions of the examples compile to errors or selectors that
    /// evaluate to results or errors; nothing panics, and syntax errors point into the text.
    #[test]
    fn mutated_examples_never_panic() {
        let devices = [intel_nic(), intel_pf_slow(), mlx_vf(), bare(), gpu()];
        let mut outcomes = BTreeMap::<&str, usize>::new();
        let mut check = |src: &str| match Selector::compile(src) {
            Ok(selector) => {
                for d in &devices {
                    let kind = match selector.matches(d) {
                        Ok(_) => "evaluated",
                        Err(CelError::Eval(m)) => {
                            assert!(!m.is_empty());
                            "eval error"
                        }
                        Err(other) => panic!("{src:?} evaluated to {other:?}"),
                    };
                    *outcomes.entry(kind).or_default() += 1;
                }
            }
            Err(CelError::Syntax { at, message }) => {
                assert!(at <= src.len(), "{src:?}: {at} {message}");
                assert!(!message.is_empty());
                *outcomes.entry("syntax").or_default() += 1;
            }
            Err(CelError::Unsupported(m)) => {
                assert!(m.contains("(at byte "), "{src:?}: {m}");
                *outcomes.entry("unsupported").or_default() += 1;
            }
            Err(CelError::Eval(m)) => panic!("{src:?} failed to compile with {m}"),
        };
        for example in EXAMPLES {
            for end in 0..=example.len() {
                check(&example[..end]);
                check(&example[end..]);
            }
        }
        let fragments = [
            "(",
            ")",
            "[",
            "]",
            ".",
            ".?",
            "?",
            ":",
            "!",
            "-",
            "&&",
            "||",
            "==",
            "!=",
            "<",
            " in ",
            "\"",
            "'",
            "\\",
            "\\u",
            "\\U0010",
            "r\"",
            "1",
            "-1",
            "0x",
            "99999999999999999999",
            "1.5",
            "device",
            ".attributes",
            "[\"knic.dev\"]",
            ".orValue(",
            ",",
            "é",
            "😀",
            "//",
            "\n",
            "has(",
            "true",
            "{",
            "+",
            " ",
            ".contains(",
            ".matches(",
            "null",
            "[?",
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let mut src = EXAMPLES[rng.below(EXAMPLES.len())].to_owned();
            for _ in 0..1 + rng.below(3) {
                match rng.below(4) {
                    0 => {
                        let at = rng.boundary(&src);
                        src.truncate(at);
                    }
                    1 => {
                        let (a, b) = (rng.boundary(&src), rng.boundary(&src));
                        src.replace_range(a.min(b)..a.max(b), "");
                    }
                    2 => {
                        let at = rng.boundary(&src);
                        src.insert_str(at, fragments[rng.below(fragments.len())]);
                    }
                    _ => {
                        let (a, b) = (rng.boundary(&src), rng.boundary(&src));
                        let piece = src[a.min(b)..a.max(b)].to_owned();
                        let at = rng.boundary(&src);
                        src.insert_str(at, &piece);
                    }
                }
            }
            check(&src);
        }
        // Every kind of outcome happened often, so the loop did exercise all the paths.
        for kind in ["evaluated", "eval error", "syntax", "unsupported"] {
            assert!(
                outcomes.get(kind).copied().unwrap_or(0) > 50,
                "{kind}: {outcomes:?}"
            );
        }
    }
}
