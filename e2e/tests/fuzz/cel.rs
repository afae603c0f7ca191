//! Fuzz target: CEL selectors (the shared tokenizer, syntax and cost checks, the controller's
//! compiler and evaluator).

use std::collections::BTreeMap;

use knic_controller::cel::{Device, Selector, Value as CelValue};
use knic_e2e::fuzz::{Rng, Settings, Verdict, mutate_text, run};

use super::describe;

fn cel_corpus() -> Vec<String> {
    [
        r#"device.driver == "knic.dev""#,
        r#"device.attributes["knic.dev"].kind == "pf""#,
        r#"device.attributes["knic.dev"].kind in ["pf", "vf"] && device.attributes["knic.dev"].speed >= 25000"#,
        r#"device.attributes["knic.dev"].?vlanCapable.orValue(false)"#,
        r#"has(device.attributes["knic.dev"].pciAddress) && device.attributes["knic.dev"].pciAddress.startsWith("0000:3b")"#,
        r#"!(device.attributes["knic.dev"]["ifName"].endsWith("v0")) || device.attributes["knic.dev"].numaNode == -1"#,
        r#"device.attributes["resource.kubernetes.io"].pcieRoot == 'pci0000:00' // root"#,
        r#"device.attributes["knic.dev"][?"exhausted"].hasValue() == false"#,
        r#"device.attributes["knic.dev"].ifName.contains(r"eth\d") || device.attributes["knic.dev"].firmware == "1.2.3""#,
        r#"device.attributes["knic.dev"].speed > 0x10 && device.attributes["knic.dev"].kind != "\x41\u00e9\101""#,
        r#"(device.driver == "knic.dev") == true"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

const CEL_TOKENS: &[&str] = &[
    "device",
    ".driver",
    ".attributes",
    "[\"knic.dev\"]",
    ".?",
    "[?",
    ".orValue(",
    ".hasValue()",
    ".value()",
    "has(",
    "(",
    ")",
    "[",
    "]",
    ",",
    "!",
    "-",
    "&&",
    "||",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    " in ",
    "?",
    ":",
    "\"",
    "'",
    "r\"",
    "\"\"\"",
    "\\",
    "\\u",
    "\\U0010ffff",
    "\\x",
    "\\777",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "0x",
    "0xffffffffffffffff",
    "1.5",
    "1e400",
    "1u",
    "true",
    "false",
    "null",
    "size(",
    ".matches(",
    ".startsWith(",
    ".endsWith(",
    ".contains(",
    "//",
    "/*",
    "\n",
    "\u{0}",
    "\u{202e}",
    "é",
    "{",
    "}",
    "b\"",
    "@",
    "`",
];

fn cel_devices() -> Vec<Device> {
    let mut knic = BTreeMap::new();
    knic.insert("kind".to_owned(), CelValue::String("pf".into()));
    knic.insert("speed".to_owned(), CelValue::Int(25000));
    knic.insert("numaNode".to_owned(), CelValue::Int(i64::MIN));
    knic.insert("vlanCapable".to_owned(), CelValue::Bool(true));
    knic.insert("ifName".to_owned(), CelValue::String("eth\u{0}é".into()));
    knic.insert("firmware".to_owned(), CelValue::Version("1.2.3+b".into()));
    let mut k8s = BTreeMap::new();
    k8s.insert("pcieRoot".to_owned(), CelValue::String("pci0000:00".into()));
    vec![
        Device {
            driver: "knic.dev".into(),
            attributes: BTreeMap::from([
                ("knic.dev".to_owned(), knic),
                ("resource.kubernetes.io".to_owned(), k8s),
            ]),
        },
        Device {
            driver: "knic.dev".into(),
            attributes: BTreeMap::new(),
        },
        Device {
            driver: String::new(),
            attributes: BTreeMap::from([("".to_owned(), BTreeMap::new())]),
        },
    ]
}

pub(super) fn cel_target(settings: &Settings) -> Result<String, String> {
    let corpus = cel_corpus();
    let gen_corpus = corpus.clone();
    let devices = cel_devices();
    let summary = run(
        "cel",
        settings,
        move |rng: &mut Rng| {
            let base = rng.pick(&gen_corpus).clone();
            mutate_text(rng, &base, &gen_corpus, CEL_TOKENS, 6)
        },
        move |source: &String| {
            let (tokens, error) = knic_proto::cel::lexer::scan(source);
            let lexed = knic_proto::cel::lexer::lex(source);
            // `lex` is `scan` minus what the evaluator does not support.
            let unsupported = tokens
                .iter()
                .any(|t| matches!(t.tok, knic_proto::cel::lexer::Tok::Unsupported(_)));
            if lexed.is_ok() != (error.is_none() && !unsupported) {
                return Err(format!(
                    "lex and scan disagree: lex {lexed:?}, scan error {error:?}"
                ));
            }
            let mut last = 0;
            for t in &tokens {
                if t.at > source.len() || t.at < last {
                    return Err(format!(
                        "token at byte {} out of order or past the end",
                        t.at
                    ));
                }
                last = t.at;
                let _ = t.tok.describe();
            }
            let _ = knic_proto::cel::syntax_problem(source);
            let _ = knic_proto::cel::exceeds_cost_limit(source);
            let _ = knic_proto::cel::clause_forms(source);
            match Selector::compile(source) {
                Ok(selector) => {
                    for device in &devices {
                        let _ = selector.matches(device);
                    }
                    Ok(Verdict::Accepted)
                }
                Err(e) => {
                    if e.to_string().is_empty() {
                        return Err("compile error without text".into());
                    }
                    Ok(Verdict::Refused)
                }
            }
        },
    )?;
    Ok(describe(&summary))
}
