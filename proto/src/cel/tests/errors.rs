//! Syntax errors, constructs outside the subset, and the nesting bound.

use super::*;

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
