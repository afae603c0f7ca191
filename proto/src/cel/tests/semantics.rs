//! Literals, attribute access, relations, methods, precedence and the logical operators.

use super::*;

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
            "CEL evaluation error: no such attribute: device.attributes[\"nope.dev\"].x".to_owned()
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
