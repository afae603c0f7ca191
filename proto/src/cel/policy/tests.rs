use serde_json::json;

use super::{Env, Program, STEP_LIMIT, Val};
use crate::cel::CelError;

fn env() -> Env {
    let request = json!({
        "operation": "UPDATE",
        "userInfo": {
            "username": "system:serviceaccount:knic-system:knic-driver",
            "extra": {"authentication.kubernetes.io/node-name": ["node-a"]},
        },
    });
    let object = json!({"spec": {"nodeName": "node-a", "driver": "knic.dev", "n": 3},
        "items": [{"d": "x", "ok": true}, {"d": "y", "ok": false}]});
    let mut env = Env::new([
        ("request".to_owned(), Val::from_json(&request).unwrap()),
        ("object".to_owned(), Val::from_json(&object).unwrap()),
        ("oldObject".to_owned(), Val::Null),
    ]);
    env.set_variable("node", Ok(Val::Str("node-a".into())));
    env.set_variable("broken", Err(CelError::Eval("no such key: x".into())));
    env
}

fn run(source: &str) -> Result<Val, CelError> {
    let env = env();
    Program::compile(source, &env.declared())?.eval(&env)
}

fn yes(source: &str) {
    assert_eq!(run(source), Ok(Val::Bool(true)), "{source}");
}

fn fails(source: &str, want: &str) {
    let got = run(source);
    assert!(
        matches!(&got, Err(e) if e.to_string().contains(want)),
        "{source}: want an error containing {want:?}, got {got:?}"
    );
}

#[test]
fn evaluates_what_admission_policies_use() {
    yes(
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('') == 'node-a'",
    );
    yes("request.userInfo.extra[?'missing'][0].orValue('') == ''");
    yes(
        "(request.operation == 'DELETE' ? oldObject : object).spec.?nodeName.orValue('') == 'node-a'",
    );
    yes("object.spec.?absent.orValue('z') == 'z' && !object.spec.?absent.hasValue()");
    yes("object.?spec.?nodeName.value() == 'node-a'");
    yes("'on ' + variables.node + '!' == 'on node-a!'");
    yes("[1] + [2] == [1, 2] && 1 + 2 == 3");
    yes("object.items.filter(i, i.ok).map(i, i.d) == ['x']");
    yes("object.items.exists(i, i.d == 'y') && !object.items.all(i, i.ok)");
    yes("size(object.items) == 2 && object.items.size() == 2 && size('né') == 2");
    yes("has(object.spec.driver) && !has(object.spec.pool)");
    yes("'node-a' in ['node-a'] && 'spec' in object && !('x' in object)");
    yes("object.spec.n > 2 && object.spec.n <= 3 && 'a' < 'b' && -1 < 0");
    yes("object.spec.driver.startsWith('knic') && object.spec.driver.endsWith('.dev')");
}

#[test]
fn cel_semantics_where_they_matter() {
    // Heterogeneous equality is false, not an error; null equals only null.
    yes("object.spec.n != '3' && oldObject == null && !(object == null)");
    // && and || absorb an error when the other side decides.
    yes("false && variables.broken == 1 ? false : true");
    yes("variables.broken == 1 || true");
    fails("variables.broken == 1 && true", "no such key: x");
    // exists absorbs errors when an element matches; all when one fails.
    yes("object.items.exists(i, i.ok ? true : i.nope)");
    fails(
        "object.items.exists(i, i.ok ? i.nope : false)",
        "no such key: nope",
    );
    yes("!object.items.all(i, i.ok ? i.nope : false)");
    // Selecting from an optional stays optional.
    yes("!object.?nothing.deeper.hasValue()");
    yes("object.?spec.nodeName.orValue('') == 'node-a'");
}

#[test]
fn refuses_and_reports_what_it_does_not_evaluate() {
    fails("object.spec.pool", "no such key: pool");
    fails("object.items[5]", "index out of range: 5");
    fails(
        "unknown == 1",
        "identifier 'unknown' (declared: object, oldObject, request)",
    );
    fails("variables.nope", "undeclared reference to variables.nope");
    fails("{'a': 1}", "map literals");
    fails("1 - 1", "arithmetic operator '-'");
    fails("matches('x')", "function 'matches()'");
    fails("'x'.lowerAscii()", "method lowerAscii()");
    fails(
        "object.?spec == object.?spec",
        "equality of optional values",
    );
    fails("1.5 == 1.5", "unsupported CEL");
    fails("'a' + 1", "no such overload: _+_(string, int)");
    fails("1 < 'a'", "no such overload: _<_(int, string)");
    fails("1 ? 2 : 3", "no such overload: _?_:_(int)");
    fails(
        "object.items.all(i, i.d)",
        "predicate evaluated to string, not bool",
    );
    fails("has(object.spec.?driver)", "has() takes a field selection");
    fails(
        "object.spec.driver.size(1)",
        "size() takes 0 arguments, got 1",
    );
    fails("9223372036854775807 + 1", "integer overflow");
    fails("", "empty expression");
    fails("1 2", "expected an operator or the end of the expression");
    fails("object.spec.", "expected a field name after '.'");
    let deep = format!("{}1{}", "(".repeat(200), ")".repeat(200));
    fails(&deep, "nesting deeper than 64 levels");
    let long_chain = format!("object{}", ".a".repeat(200));
    fails(&long_chain, "nesting deeper than 64 levels");
    let env = env();
    let message = Program::compile("object.spec.n", &env.declared()).unwrap();
    assert_eq!(
        message.eval_string(&env).unwrap_err().to_string(),
        "CEL evaluation error: expression evaluated to int, not string"
    );
    assert_eq!(
        message.eval_bool(&env).unwrap_err().to_string(),
        "CEL evaluation error: expression evaluated to int, not bool"
    );
    assert!(Val::from_json(&json!({"x": 1.5})).is_err());
}

#[test]
fn evaluation_is_bounded() {
    // 300^3 = 27 million predicate evaluations would take far too long; the budget stops it.
    let items: Vec<serde_json::Value> = (0..300).map(|i| json!(i)).collect();
    let env = Env::new([("xs".to_owned(), Val::from_json(&json!(items)).unwrap())]);
    let program = Program::compile(
        "xs.all(a, xs.all(b, xs.all(c, a + b + c >= 0)))",
        &env.declared(),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let got = program.eval(&env);
    assert!(
        matches!(&got, Err(e) if e.to_string().contains(&format!("exceeded {STEP_LIMIT} steps"))),
        "{got:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// Policies share the selector parser: list literals take CEL's trailing comma (argument lists
/// do not), and `&&`/`||` chains are flat, so a long chain is not mistaken for deep nesting.
#[test]
fn shares_the_selector_grammar() {
    yes("[1, 2,] == [1, 2] && ['a',].size() == 1");
    fails(
        "size(object.items,)",
        "CEL syntax error at byte 18: expected an expression, found ')'",
    );
    fails(
        "[,]",
        "CEL syntax error at byte 1: expected an expression, found ','",
    );
    yes(&vec!["1 == 1"; 500].join(" && "));
    yes(&format!("{} || true", vec!["1 == 2"; 500].join(" || ")));
    fails(
        &format!("{} || 1", vec!["false"; 500].join(" || ")),
        "no such overload: _||_(int) (at byte 4497)",
    );
}
