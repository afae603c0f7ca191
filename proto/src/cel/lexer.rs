//! Tokens of a CEL selector: the one scanner for selector text (the parser, the cost rule and
//! Network validation all read through it), with CEL's literal rules.
//!
//! [`scan`] tokenises all valid CEL, marking literals knic does not evaluate (floating-point,
//! unsigned, bytes, triple-quoted strings) as [`Tok::Unsupported`], so Network validation can
//! check any selector the apiserver would compile; [`lex`] is the evaluator's strict view,
//! which refuses the first of those.

use super::{CelError, Result, syntax, unsupported};

/// One token. Punctuation and operator variants are named after what they spell.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
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
    /// Valid CEL literal outside knic's subset; the text names the kind.
    Unsupported(&'static str),
    End,
}

impl Tok {
    /// The token as error messages name it.
    pub fn describe(&self) -> String {
        let punct = match self {
            Tok::Ident(name) if name == "in" => return "'in'".to_owned(),
            Tok::Ident(name) => return format!("identifier '{name}'"),
            Tok::Int(n) => return format!("integer {n}"),
            Tok::Str(_) => return "string literal".to_owned(),
            Tok::End => return "end of input".to_owned(),
            Tok::Unsupported(what) => return (*what).to_owned(),
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

/// A token and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// What was read.
    pub tok: Tok,
    /// Byte offset of the token's first character.
    pub at: usize,
}

/// The evaluator's tokens: every token of `src`, or the first problem by position (an
/// unsupported literal, or text that is not CEL).
pub fn lex(src: &str) -> Result<Vec<Token>> {
    let (tokens, error) = scan(src);
    if let Some(t) = tokens.iter().find(|t| matches!(t.tok, Tok::Unsupported(_))) {
        return Err(unsupported(t.at, t.tok.describe()));
    }
    match error {
        Some(e) => Err(e),
        None => Ok(tokens),
    }
}

/// Every token of `src` up to the first text that is not CEL, and that problem, if any.
pub fn scan(src: &str) -> (Vec<Token>, Option<CelError>) {
    let mut tokens = Vec::new();
    let error = scan_into(src, &mut tokens).err();
    (tokens, error)
}

fn scan_into(src: &str, tokens: &mut Vec<Token>) -> Result<()> {
    let bytes = src.as_bytes();
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
                (Tok::Unsupported(FLOAT), float_len(bytes, at))
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
                        "b" | "rb" | "br" => {
                            let raw = word.len() == 2;
                            let (_, len) = lex_string(src, at, end, raw)?;
                            (Tok::Unsupported("bytes literals"), len + (end - at))
                        }
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
    Ok(())
}

const FLOAT: &str = "floating-point literals";

/// Length of the floating-point literal at `at` (digits, fraction, exponent).
fn float_len(bytes: &[u8], at: usize) -> usize {
    let digits = |mut i: usize| {
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut end = digits(at);
    if bytes.get(end) == Some(&b'.') {
        end = digits(end + 1);
    }
    if matches!(bytes.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
        end = digits(end + 1 + sign);
    }
    end - at
}

/// An integer literal at `at`: its token and length. Floating-point and unsigned literals are
/// valid CEL that knic does not evaluate.
pub fn lex_number(bytes: &[u8], at: usize) -> Result<(Tok, usize)> {
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
        Some(b'u' | b'U') => {
            return Ok((Tok::Unsupported("unsigned integer literals"), end + 1 - at));
        }
        Some(b'.') if !hex && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) => {
            return Ok((Tok::Unsupported(FLOAT), float_len(bytes, at)));
        }
        Some(b'e' | b'E')
            if !hex
                && (bytes.get(end + 1).is_some_and(u8::is_ascii_digit)
                    || (matches!(bytes.get(end + 1), Some(b'+' | b'-'))
                        && bytes.get(end + 2).is_some_and(u8::is_ascii_digit))) =>
        {
            return Ok((Tok::Unsupported(FLOAT), float_len(bytes, at)));
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
pub fn lex_string(src: &str, at: usize, quote_at: usize, raw: bool) -> Result<(Tok, usize)> {
    let rest = src.get(quote_at..).unwrap_or_default();
    let mut chars = rest.char_indices().peekable();
    let Some((_, quote)) = chars.next() else {
        return Err(syntax(at, "unterminated string literal"));
    };
    let triple = format!("{quote}{quote}{quote}");
    if rest.starts_with(&triple) {
        // Valid CEL knic does not evaluate; found to its end so scanning can go on.
        let body = &rest[3..];
        let mut offset = 0;
        while offset < body.len() {
            if body[offset..].starts_with(&triple) {
                return Ok((Tok::Unsupported("triple-quoted strings"), offset + 6));
            }
            let step = body[offset..].chars().next().map_or(1, char::len_utf8);
            offset += if !raw && body.as_bytes()[offset] == b'\\' {
                1 + body[offset + 1..].chars().next().map_or(0, char::len_utf8)
            } else {
                step
            };
        }
        return Err(syntax(at, "unterminated string literal"));
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
