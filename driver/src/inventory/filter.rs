//! The admin's include/exclude filter.
//!
//! Admins need to keep management NICs out of the pool and to opt virtual interfaces in, without
//! writing code, from a flag, an environment variable or a config file. Every entry is one
//! `KEY=VALUE` condition:
//!
//! | key | value | matches |
//! |---|---|---|
//! | `name` | glob (`*`, `?`, `[a-z]`, `[!0-9]`) | the interface name or one of its alternative names |
//! | `pci` | `VVVV:DDDD` or `VVVV:*`, hex | the PCI vendor and device id |
//! | `driver` | glob | the kernel driver of the PCI function (or netdev parent) |
//! | `kind` | `nic`, `pf`, `vf` or `virtual` | the device kind |
//!
//! Semantics: with no include entries the default set (NICs, PFs, VFs) is advertised; with
//! include entries exactly the devices matching at least one of them are (this is how virtual
//! interfaces get in: `kind=virtual`). An exclude entry always wins over include. Interfaces
//! carrying the node's default routes, their bond/bridge relatives, loopback and switchdev
//! representors are never advertised, whatever the filter says.
//!
//! In a flag or environment variable the entries are comma-separated (`kind=vf,pci=8086:*`);
//! a config file (YAML or JSON) has `include:` and `exclude:` lists of entry strings. A bad
//! entry is an [`Error::Setting`] naming the list, index and text, e.g.
//! `filter include[2] "pci=8086:zz": pci vendor/device must be 4 hex digits each`.
//!
//! Bounds: a config file must be a regular file of at most [`MAX_CONFIG_BYTES`] (a FIFO there
//! hung start-up), and an entry quoted in an error is cut to [`MAX_ECHOED_BYTES`], so one
//! pasted-in megabyte cannot become a megabyte of log line.

use std::path::Path;

use serde::Deserialize;

use super::DeviceKind;
use crate::bounded::{Links, quote, read_regular};
use crate::error::{Error, Result};

const KEYS: &str = "name, pci, driver, kind";

/// The largest filter config file read: far above any real list of entries, small enough that a
/// wrong path (a log, an image) is refused at once instead of parsed.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// How much of an entry an error quotes.
pub const MAX_ECHOED_BYTES: usize = 256;

/// A parsed, validated admin filter; the default one (no entries) advertises the default set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    include: Vec<Rule>,
    exclude: Vec<Rule>,
}

/// One validated filter entry, keeping its text so exclusion reasons can quote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    text: String,
    matcher: Matcher,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Matcher {
    Name(Glob),
    Pci { vendor: u16, device: Option<u16> },
    Driver(Glob),
    Kind(DeviceKind),
}

/// What a filter entry can be matched against: the facts of one device.
#[derive(Debug, Clone, Default)]
pub struct Subject<'a> {
    /// Interface name and alternative names (empty for a function without a netdev).
    pub names: Vec<&'a str>,
    /// PCI vendor and device id.
    pub pci: Option<(u16, u16)>,
    /// Kernel driver.
    pub driver: Option<&'a str>,
    /// Device kind.
    pub kind: Option<DeviceKind>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterConfig {
    #[serde(default)]
    include: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
}

impl Filter {
    /// Parses comma-separated entry lists, as given by a flag or environment variable; empty
    /// strings mean "no entries".
    pub fn parse_lists(include: &str, exclude: &str) -> Result<Filter> {
        Filter::from_entries(&split_list(include), &split_list(exclude))
    }

    /// Parses entry lists (one entry per element).
    pub fn from_entries<S: AsRef<str>>(include: &[S], exclude: &[S]) -> Result<Filter> {
        Ok(Filter {
            include: parse_rules("include", include)?,
            exclude: parse_rules("exclude", exclude)?,
        })
    }

    /// Parses a config document, YAML or JSON (`{"include": [...], "exclude": [...]}`).
    pub fn from_config(text: &str) -> Result<Filter> {
        Filter::from_config_named(text, "config")
    }

    /// Reads and parses a config file (see [`Filter::from_config`]); it must be a regular file
    /// (a symlink to one is fine: ConfigMap mounts are symlinks) of at most
    /// [`MAX_CONFIG_BYTES`].
    pub fn from_config_file(path: &Path) -> Result<Filter> {
        let context = || format!("reading filter config {}", path.display());
        let bytes = read_regular(path, MAX_CONFIG_BYTES, Links::Follow)
            .map_err(|e| Error::io(context(), e))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::io(
                context(),
                std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
            )
        })?;
        Filter::from_config_named(&text, &format!("config {}", path.display()))
    }

    fn from_config_named(text: &str, what: &str) -> Result<Filter> {
        if text.trim().is_empty() {
            return Ok(Filter::default());
        }
        let config: FilterConfig = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| parse_error(what, &e))?
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| parse_error(what, &e))?
        };
        Filter::from_entries(&config.include, &config.exclude)
    }

    /// Appends another filter's entries (e.g. flags after the config file).
    pub fn extend(&mut self, other: Filter) {
        self.include.extend(other.include);
        self.exclude.extend(other.exclude);
    }

    /// Whether include entries exist, which turns the default set off.
    pub fn has_include(&self) -> bool {
        !self.include.is_empty()
    }

    /// The first include entry matching `subject`.
    pub fn included_by(&self, subject: &Subject<'_>) -> Option<&Rule> {
        self.include.iter().find(|r| r.matches(subject))
    }

    /// The first exclude entry matching `subject`, with its index for the reason text.
    pub fn excluded_by(&self, subject: &Subject<'_>) -> Option<(usize, &Rule)> {
        self.exclude
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(subject))
    }
}

impl Rule {
    /// The entry as the admin wrote it (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the device described by `subject` satisfies this entry.
    pub fn matches(&self, subject: &Subject<'_>) -> bool {
        match &self.matcher {
            Matcher::Name(glob) => subject.names.iter().any(|n| glob.matches(n)),
            Matcher::Pci { vendor, device } => subject
                .pci
                .is_some_and(|(v, d)| v == *vendor && device.is_none_or(|want| want == d)),
            Matcher::Driver(glob) => subject.driver.is_some_and(|d| glob.matches(d)),
            Matcher::Kind(kind) => subject.kind == Some(*kind),
        }
    }
}

/// A parser's error, which may quote the offending value whole, cut to a few quoted
/// entries' worth.
fn parse_error(what: &str, error: &dyn std::fmt::Display) -> Error {
    let text = error.to_string();
    setting(format!(
        "{what}: {}",
        crate::bounded::cap_text(&text, 4 * MAX_ECHOED_BYTES)
    ))
}

fn setting(reason: String) -> Error {
    Error::Setting {
        setting: "filter",
        reason,
    }
}

/// Splits a flag value on commas outside `[...]`, so `name=eth[0,1]` stays one entry.
fn split_list(list: &str) -> Vec<String> {
    if list.trim().is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_class = false;
    for c in list.chars() {
        match c {
            '[' => in_class = true,
            ']' => in_class = false,
            ',' if !in_class => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current);
    out
}

fn parse_rules<S: AsRef<str>>(list: &str, entries: &[S]) -> Result<Vec<Rule>> {
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let text = entry.as_ref().trim();
            parse_rule(text)
                .map(|matcher| Rule {
                    text: text.to_owned(),
                    matcher,
                })
                .map_err(|Invalid(why)| {
                    let text = quote(text, MAX_ECHOED_BYTES);
                    setting(format!("{list}[{i}] {text}: {why}"))
                })
        })
        .collect()
}

/// Why one filter entry or glob is not valid; [`parse_rules`] adds the list, index and entry.
#[derive(Debug)]
pub(crate) struct Invalid(pub(crate) String);

fn parse_rule(text: &str) -> std::result::Result<Matcher, Invalid> {
    if text.is_empty() {
        return Err(Invalid(format!(
            "empty entry; expected KEY=VALUE with KEY one of {KEYS}"
        )));
    }
    let Some((key, value)) = text.split_once('=') else {
        return Err(Invalid(format!(
            "expected KEY=VALUE with KEY one of {KEYS}"
        )));
    };
    let (key, value) = (key.trim(), value.trim());
    if value.is_empty() {
        return Err(Invalid(format!(
            "empty value for {}",
            quote(key, MAX_ECHOED_BYTES)
        )));
    }
    match key {
        "name" => {
            if value.contains(|c: char| c == '/' || c.is_whitespace()) {
                return Err(Invalid(
                    "interface name must not contain \"/\" or whitespace".to_owned(),
                ));
            }
            Ok(Matcher::Name(Glob::parse(value)?))
        }
        "driver" => {
            if value.contains(|c: char| c == '/' || c.is_whitespace()) {
                return Err(Invalid(
                    "driver name must not contain \"/\" or whitespace".to_owned(),
                ));
            }
            Ok(Matcher::Driver(Glob::parse(value)?))
        }
        "pci" => {
            let Some((vendor, device)) = value.split_once(':') else {
                return Err(Invalid(
                    "pci must be VENDOR:DEVICE in hex, e.g. 8086:159b or 8086:*".to_owned(),
                ));
            };
            let hex4 = |s: &str| {
                (s.len() == 4 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                    .then(|| u16::from_str_radix(s, 16).ok())
                    .flatten()
            };
            let vendor = hex4(vendor);
            let device = if device == "*" {
                Some(None)
            } else {
                hex4(device).map(Some)
            };
            match (vendor, device) {
                (Some(vendor), Some(device)) => Ok(Matcher::Pci { vendor, device }),
                _ => Err(Invalid(
                    "pci vendor/device must be 4 hex digits each".to_owned(),
                )),
            }
        }
        "kind" => match value {
            "nic" => Ok(Matcher::Kind(DeviceKind::Nic)),
            "pf" => Ok(Matcher::Kind(DeviceKind::Pf)),
            "vf" => Ok(Matcher::Kind(DeviceKind::Vf)),
            "virtual" => Ok(Matcher::Kind(DeviceKind::Virtual)),
            _ => Err(Invalid(
                "kind must be one of nic, pf, vf, virtual".to_owned(),
            )),
        },
        _ => Err(Invalid(format!(
            "unknown key {}; expected one of {KEYS}",
            quote(key, MAX_ECHOED_BYTES)
        ))),
    }
}

/// A shell-style glob: `*` any run, `?` one character, `[abc]`, `[a-z]`, `[!a-z]`/`[^a-z]`;
/// a `]` right after the opening bracket (or its negation) is a member. No escapes: interface
/// and driver names never contain glob characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    tokens: Vec<Token>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Char(char),
    One,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    /// Compiles `pattern`; the error says what is malformed.
    pub(crate) fn parse(pattern: &str) -> std::result::Result<Glob, Invalid> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                    i += 1;
                }
                '?' => {
                    tokens.push(Token::One);
                    i += 1;
                }
                '[' => {
                    let (token, next) = parse_class(&chars, i, pattern)?;
                    tokens.push(token);
                    i = next;
                }
                c => {
                    tokens.push(Token::Char(c));
                    i += 1;
                }
            }
        }
        Ok(Glob { tokens })
    }

    /// Whether the whole of `text` matches.
    pub fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        let (mut t, mut p) = (0, 0);
        let mut backtrack: Option<(usize, usize)> = None;
        while t < text.len() {
            match self.tokens.get(p) {
                Some(Token::Star) => {
                    backtrack = Some((p, t));
                    p += 1;
                    continue;
                }
                Some(token) if token.matches_one(text[t]) => {
                    p += 1;
                    t += 1;
                    continue;
                }
                _ => {}
            }
            match backtrack {
                Some((star, from)) => {
                    p = star + 1;
                    t = from + 1;
                    backtrack = Some((star, from + 1));
                }
                None => return false,
            }
        }
        self.tokens[p..].iter().all(|tok| *tok == Token::Star)
    }
}

impl Token {
    fn matches_one(&self, c: char) -> bool {
        match self {
            Token::Char(want) => *want == c,
            Token::One => true,
            Token::Star => false,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
            }
        }
    }
}

/// Parses `[...]` starting at `chars[start] == '['`; returns the token and the index after `]`.
fn parse_class(
    chars: &[char],
    start: usize,
    pattern: &str,
) -> std::result::Result<(Token, usize), Invalid> {
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let Some(&c) = chars.get(i) else {
            return Err(Invalid(format!(
                "unclosed \"[\" in glob {}",
                quote(pattern, MAX_ECHOED_BYTES)
            )));
        };
        if c == ']' && !first {
            return Ok((Token::Class { negated, ranges }, i + 1));
        }
        first = false;
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&hi| hi != ']') {
            let hi = chars[i + 2];
            if hi < c {
                return Err(Invalid(format!(
                    "bad range \"{c}-{hi}\" in glob {}",
                    quote(pattern, MAX_ECHOED_BYTES)
                )));
            }
            ranges.push((c, hi));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(include: &[&str], exclude: &[&str]) -> String {
        Filter::from_entries(include, exclude)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn inventory_filter_glob() {
        let g = |p: &str| Glob::parse(p).unwrap();
        assert!(g("eth*").matches("eth0"));
        assert!(g("eth*").matches("eth"));
        assert!(!g("eth*").matches("veth0"));
        assert!(g("*0").matches("veth0"));
        assert!(g("e?h0").matches("eth0"));
        assert!(!g("e?h0").matches("eh0"));
        assert!(g("ens[1-3]f[01]").matches("ens2f1"));
        assert!(!g("ens[1-3]f[01]").matches("ens4f1"));
        assert!(g("ens[!1]*").matches("ens2f0"));
        assert!(!g("ens[^1]*").matches("ens1f0"));
        assert!(g("[]x]").matches("]"));
        assert!(g("a[-]b").matches("a-b"));
        assert!(g("a[x-]b").matches("a-b"));
        assert!(g("*a*b*c*").matches("xxaxxbxxcxx"));
        assert!(!g("*a*b*c*").matches("xxaxxcxxbxx"));
        assert!(g("**").matches(""));
        assert!(g("").matches(""));
        assert!(!g("").matches("a"));
        assert_eq!(
            Glob::parse("eth[0").unwrap_err().0,
            "unclosed \"[\" in glob \"eth[0\""
        );
        assert_eq!(
            Glob::parse("[]").unwrap_err().0,
            "unclosed \"[\" in glob \"[]\""
        );
        assert_eq!(
            Glob::parse("[z-a]").unwrap_err().0,
            "bad range \"z-a\" in glob \"[z-a]\""
        );
    }

    #[test]
    fn inventory_filter_matching() {
        let f = Filter::parse_lists(
            "kind=virtual,name=ens[1,2]f0,pci=8086:*,driver=mlx5*",
            "pci=8086:159b",
        )
        .unwrap();
        assert!(f.has_include());
        let veth = Subject {
            names: vec!["veth0"],
            kind: Some(DeviceKind::Virtual),
            ..Subject::default()
        };
        assert_eq!(f.included_by(&veth).map(Rule::text), Some("kind=virtual"));
        let alt = Subject {
            names: vec!["eno1", "ens2f0"],
            kind: Some(DeviceKind::Nic),
            ..Subject::default()
        };
        assert_eq!(f.included_by(&alt).map(Rule::text), Some("name=ens[1,2]f0"));
        let e810 = Subject {
            pci: Some((0x8086, 0x159b)),
            kind: Some(DeviceKind::Pf),
            ..Subject::default()
        };
        assert_eq!(f.included_by(&e810).map(Rule::text), Some("pci=8086:*"));
        assert_eq!(
            f.excluded_by(&e810).map(|(i, r)| (i, r.text())),
            Some((0, "pci=8086:159b"))
        );
        let cx5 = Subject {
            pci: Some((0x15b3, 0x1017)),
            driver: Some("mlx5_core"),
            ..Subject::default()
        };
        assert_eq!(f.included_by(&cx5).map(Rule::text), Some("driver=mlx5*"));
        assert!(f.excluded_by(&cx5).is_none());
        assert!(f.included_by(&Subject::default()).is_none());
        assert!(!Filter::default().has_include());
        assert_eq!(Filter::parse_lists("", " ").unwrap(), Filter::default());
    }

    #[test]
    fn inventory_filter_bad_entries_are_named() {
        let cases: &[(&[&str], &[&str], &str)] = &[
            (
                &["kind=vf", "name=eth*", "pci=8086:zz"],
                &[],
                "invalid setting filter: include[2] \"pci=8086:zz\": pci vendor/device must be \
                 4 hex digits each",
            ),
            (
                &[],
                &["pci=80861:159b"],
                "invalid setting filter: exclude[0] \"pci=80861:159b\": pci vendor/device must \
                 be 4 hex digits each",
            ),
            (
                &["pci=*:159b"],
                &[],
                "include[0] \"pci=*:159b\": pci vendor/device must be 4 hex digits each",
            ),
            (
                &["pci=8086"],
                &[],
                "include[0] \"pci=8086\": pci must be VENDOR:DEVICE in hex, e.g. 8086:159b or \
                 8086:*",
            ),
            (
                &["eth0"],
                &[],
                "include[0] \"eth0\": expected KEY=VALUE with KEY one of name, pci, driver, kind",
            ),
            (
                &["kind=vf", ""],
                &[],
                "include[1] \"\": empty entry; expected KEY=VALUE with KEY one of name, pci, \
                 driver, kind",
            ),
            (
                &["mac=aa:bb"],
                &[],
                "include[0] \"mac=aa:bb\": unknown key \"mac\"; expected one of name, pci, \
                 driver, kind",
            ),
            (
                &["name="],
                &[],
                "include[0] \"name=\": empty value for \"name\"",
            ),
            (
                &[],
                &["kind=loopback"],
                "exclude[0] \"kind=loopback\": kind must be one of nic, pf, vf, virtual",
            ),
            (
                &["name=eth[0"],
                &[],
                "include[0] \"name=eth[0\": unclosed \"[\" in glob \"eth[0\"",
            ),
            (
                &["name=eth [0]"],
                &[],
                "include[0] \"name=eth [0]\": interface name must not contain \"/\" or \
                 whitespace",
            ),
            (
                &["driver=mlx5/core"],
                &[],
                "include[0] \"driver=mlx5/core\": driver name must not contain \"/\" or \
                 whitespace",
            ),
            (
                &["driver=[z-a]"],
                &[],
                "include[0] \"driver=[z-a]\": bad range \"z-a\" in glob \"[z-a]\"",
            ),
        ];
        for (include, exclude, want) in cases {
            let got = err(include, exclude);
            assert!(got.contains(want), "got {got:?}, want {want:?}");
        }
        // The flag form counts entries the same way.
        let got = Filter::parse_lists("kind=vf,,", "")
            .unwrap_err()
            .to_string();
        assert!(got.contains("include[1] \"\": empty entry"), "{got}");
    }

    #[test]
    fn inventory_filter_config_yaml_and_json() {
        let yaml = "include:\n  - kind=vf\n  - name=veth*\nexclude:\n  - pci=8086:1889\n";
        let f = Filter::from_config(yaml).unwrap();
        assert_eq!(
            f,
            Filter::parse_lists("kind=vf,name=veth*", "pci=8086:1889").unwrap()
        );
        let json = r#"{"include": ["kind=vf", "name=veth*"], "exclude": ["pci=8086:1889"]}"#;
        assert_eq!(Filter::from_config(json).unwrap(), f);
        assert_eq!(Filter::from_config("  \n").unwrap(), Filter::default());
        assert_eq!(
            Filter::from_config("exclude: [kind=nic]").unwrap().include,
            vec![]
        );

        let got = Filter::from_config("include: [kind=vf, pci=8086:zz]")
            .unwrap_err()
            .to_string();
        assert_eq!(
            got,
            "invalid setting filter: include[1] \"pci=8086:zz\": pci vendor/device must be 4 \
             hex digits each"
        );
        let got = Filter::from_config("includes: [kind=vf]")
            .unwrap_err()
            .to_string();
        assert!(
            got.starts_with("invalid setting filter: config: unknown field `includes`"),
            "{got}"
        );
        let got = Filter::from_config(r#"{"include": "kind=vf"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            got.starts_with("invalid setting filter: config: invalid type: string \"kind=vf\""),
            "{got}"
        );
        let got = Filter::from_config("include: [kind=vf")
            .unwrap_err()
            .to_string();
        assert!(got.starts_with("invalid setting filter: config: "), "{got}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("filter.yaml");
        std::fs::write(&path, "exclude: [\"name=eth0\", \"kind=nope\"]\n").unwrap();
        let got = Filter::from_config_file(&path).unwrap_err().to_string();
        assert_eq!(
            got,
            "invalid setting filter: exclude[1] \"kind=nope\": kind must be one of nic, pf, vf, \
             virtual"
        );
        std::fs::write(&path, "exclude: 3\n").unwrap();
        let got = Filter::from_config_file(&path).unwrap_err().to_string();
        assert!(
            got.starts_with(&format!(
                "invalid setting filter: config {}: ",
                path.display()
            )),
            "{got}"
        );
        let missing = dir.path().join("missing.yaml");
        let got = Filter::from_config_file(&missing).unwrap_err().to_string();
        assert!(
            got.starts_with(&format!("reading filter config {}: ", missing.display())),
            "{got}"
        );

        let mut merged = Filter::from_config("include: [kind=vf]").unwrap();
        merged.extend(Filter::parse_lists("", "name=eth0").unwrap());
        assert_eq!(merged, Filter::parse_lists("kind=vf", "name=eth0").unwrap());
    }
    #[test]
    fn inventory_filter_config_file_must_be_a_bounded_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("filter.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(Filter::from_config_file(&path).map_err(|e| e.to_string()));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("reading a FIFO as the filter config hung")
            .unwrap_err();
        assert_eq!(
            got,
            format!(
                "reading filter config {}: not a regular file (it is a FIFO)",
                fifo.display()
            )
        );

        let big = dir.path().join("big.yaml");
        let limit = usize::try_from(MAX_CONFIG_BYTES).unwrap();
        std::fs::write(&big, format!("include: [kind=vf]\n#{}", "x".repeat(limit))).unwrap();
        let got = Filter::from_config_file(&big).unwrap_err().to_string();
        assert_eq!(
            got,
            format!(
                "reading filter config {}: larger than the 1048576-byte limit for this file",
                big.display()
            )
        );

        // A symlink to a regular file (how a ConfigMap is mounted) is still read.
        let real = dir.path().join("real.yaml");
        std::fs::write(&real, "include: [kind=vf]\n").unwrap();
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(Filter::from_config_file(&link).unwrap().has_include());
    }

    #[test]
    fn inventory_filter_errors_quote_at_most_a_bounded_part_of_an_entry() {
        let long = format!("kind={}", "v".repeat(100_000));
        let got = err(&[long.as_str()], &[]);
        assert!(got.len() < 1024, "{} bytes", got.len());
        assert!(
            got.contains(&format!(
                "include[0] \"kind={}\"… (99749 more bytes cut): kind must be one of",
                "v".repeat(251)
            )),
            "{got}"
        );
        let got = err(&[format!("{}=x", "k".repeat(100_000)).as_str()], &[]);
        assert!(got.len() < 1024, "{} bytes", got.len());
        assert!(
            got.contains("more bytes cut); expected one of name"),
            "{got}"
        );
        let doc = format!("include: {}", "y".repeat(100_000));
        let got = Filter::from_config(&doc).unwrap_err().to_string();
        assert!(got.len() < 2048, "{} bytes", got.len());
    }
}
