//! The one log setup both binaries run (feature `logging`), so a log pipeline reads the driver
//! and the controller alike: the same `--log-format`/`KNIC_LOG_FORMAT` values, the same
//! `--log-level`/`KNIC_LOG_LEVEL` rule and error text, everything on stderr, and in JSON one
//! object per line with the same top-level keys.
//!
//! **The JSON shape.** `timestamp` (RFC 3339, UTC), `level` (`ERROR` … `TRACE`), `target` (the
//! Rust module that logged), `message`, and each of the event's fields as a key of its own
//! (`{"…","message":"address allocated","network":"blue","address":"192.0.2.7/24",…}`), never
//! nested under `fields`. **Spans are not printed**: knic's own code opens none (every event
//! carries its context as fields), and the spans of libraries (kube's HTTP span at `debug`)
//! would add `span`/`spans` keys to some lines and not others; leaving them out keeps one key
//! layout for every line.
//!
//! **Fatal errors always show.** A binary that stops on an error reports it through [`fatal`],
//! whose event passes any `--log-level` (even `off`), so the reason a pod restarts is never
//! filtered away.

use std::io::IsTerminal;
use std::str::FromStr;

use tracing_subscriber::EnvFilter;

use crate::error::{Error, Result};

/// The flag and its environment twin, as errors name them.
pub const FORMAT_SETTING: &str = "--log-format/KNIC_LOG_FORMAT";
/// See [`FORMAT_SETTING`].
pub const LEVEL_SETTING: &str = "--log-level/KNIC_LOG_LEVEL";

/// The filter directive that lets [`fatal`]'s event through whatever the operator's filter.
const FATAL_DIRECTIVE: &str = "knic_proto::logging=error";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One readable line per event (`text`; `human`, the driver's old name, is the same).
    Text,
    /// One JSON object per line (see the module documentation for its keys).
    Json,
}

impl LogFormat {
    /// Parses a `--log-format` value: `text` or `json`, and `human` (the driver's spelling
    /// before both binaries shared one) for `text`, so existing deployments keep working.
    /// Exact and lowercase, like every other enumerated flag.
    pub fn parse(value: &str) -> Result<LogFormat> {
        match value {
            "text" | "human" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(Error::Rule(format!(
                "{other:?} is not a log format: use text (one readable line per event; human is \
                 the same) or json (one object per line)"
            ))),
        }
    }
}

impl FromStr for LogFormat {
    type Err = Error;

    fn from_str(value: &str) -> Result<LogFormat> {
        LogFormat::parse(value)
    }
}

/// The filter of `--log-level`, or the error naming the setting and the rule.
pub fn filter(level: &str) -> Result<EnvFilter> {
    let filter = EnvFilter::try_new(level).map_err(|e| {
        Error::Setting(format!(
            "invalid {LEVEL_SETTING} {level:?}: {e} (want a tracing filter: a level such as \
             info, or comma-separated target=level directives such as info,knic_driver=debug)"
        ))
    })?;
    let fatal = FATAL_DIRECTIVE
        .parse()
        .map_err(|e| Error::Setting(format!("the built-in directive {FATAL_DIRECTIVE}: {e}")))?;
    Ok(filter.add_directive(fatal))
}

/// Installs the process's log subscriber: `format` lines on stderr, filtered by `level`.
/// Colours only when stderr is a terminal (never in a pod's log). Fails on a bad `level`, or
/// when a subscriber is already installed.
pub fn init(format: LogFormat, level: &str) -> Result<()> {
    use tracing_subscriber::util::SubscriberInitExt;
    subscriber(
        format,
        level,
        std::io::stderr,
        std::io::stderr().is_terminal(),
    )?
    .try_init()
    .map_err(|e| Error::Setting(format!("installing the log subscriber: {e}")))
}

/// The subscriber [`init`] installs, writing to `writer` (a buffer in tests).
fn subscriber<W>(
    format: LogFormat,
    level: &str,
    writer: W,
    ansi: bool,
) -> Result<Box<dyn tracing::Subscriber + Send + Sync>>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(level)?)
        .with_writer(writer)
        .with_ansi(ansi);
    Ok(match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    })
}

/// Reports the error a binary stops on: in JSON an `ERROR` event with the text in its `error`
/// field (never filtered out, see the module documentation); in text `<binary>: <text>` on
/// stderr, as command-line tools write it.
pub fn fatal(format: LogFormat, binary: &str, text: &str) {
    match format {
        LogFormat::Json => tracing::error!(binary, error = %text, "stopped by an error"),
        LogFormat::Text => eprintln!("{binary}: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_of_text_and_json_are_accepted() {
        assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse("human"), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse("json"), Ok(LogFormat::Json));
        assert_eq!("human".parse::<LogFormat>(), Ok(LogFormat::Text));
    }

    #[test]
    fn a_bad_format_names_the_value_and_the_choices() {
        for bad in ["xml", "JSON", "Text", "", " json"] {
            assert_eq!(
                LogFormat::parse(bad).unwrap_err().to_string(),
                format!(
                    "{bad:?} is not a log format: use text (one readable line per event; human \
                     is the same) or json (one object per line)"
                )
            );
        }
    }

    #[test]
    fn a_bad_level_names_the_setting_the_value_and_the_rule() {
        let err = filter("info,[").unwrap_err().to_string();
        assert!(
            err.starts_with("invalid --log-level/KNIC_LOG_LEVEL \"info,[\": "),
            "{err}"
        );
        assert!(
            err.ends_with(
                "(want a tracing filter: a level such as info, or comma-separated target=level \
                 directives such as info,knic_driver=debug)"
            ),
            "{err}"
        );
        assert_eq!(err.matches("invalid filter directive").count(), 1, "{err}");
    }

    /// Lines written by `subscriber(format, level)` while `log` runs.
    fn lines(format: LogFormat, level: &str, log: impl FnOnce()) -> Vec<String> {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = subscriber(format, level, move || buffer.clone(), false).unwrap();
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    fn object(line: &str) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::from_str(line) {
            Ok(serde_json::Value::Object(map)) => map,
            other => panic!("not a JSON object: {line} ({other:?})"),
        }
    }

    #[test]
    fn json_lines_carry_the_fields_at_the_top_and_no_spans() {
        let got = lines(LogFormat::Json, "info", || {
            let span = tracing::info_span!("HTTP", url = "/api");
            let _inside = span.enter();
            tracing::info!(target: "knic_driver::claims", network = "blue", count = 3,
                "address allocated");
            tracing::debug!(target: "knic_driver::claims", "filtered out");
        });
        assert_eq!(got.len(), 1, "{got:?}");
        let line = object(&got[0]);
        let keys: std::collections::BTreeSet<&str> = line.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "count",
                "level",
                "message",
                "network",
                "target",
                "timestamp"
            ]
            .into()
        );
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "address allocated");
        assert_eq!(line["network"], "blue");
        assert_eq!(line["count"], 3);
        assert_eq!(line["target"], "knic_driver::claims");
        let timestamp = line["timestamp"].as_str().unwrap();
        assert!(
            timestamp.len() > 20 && timestamp.as_bytes()[10] == b'T' && timestamp.ends_with('Z'),
            "{timestamp}"
        );
    }

    #[test]
    fn fatal_errors_pass_every_filter_and_others_do_not() {
        for level in ["info", "off", "knic_driver=debug", "warn,knic_proto=off"] {
            let got = lines(LogFormat::Json, level, || {
                tracing::info!(target: "knic_controller::reconcile", "routine");
                fatal(
                    LogFormat::Json,
                    "knic-driver",
                    "reading kubeconfig /x: gone",
                );
            });
            let fatal: Vec<_> = got.iter().map(|l| object(l)).collect();
            let last = fatal
                .last()
                .unwrap_or_else(|| panic!("{level}: nothing logged"));
            assert_eq!(last["error"], "reading kubeconfig /x: gone", "{level}");
            assert_eq!(last["binary"], "knic-driver", "{level}");
            assert_eq!(last["level"], "ERROR", "{level}");
            assert_eq!(last["message"], "stopped by an error", "{level}");
            let routine = got.iter().filter(|l| l.contains("routine")).count();
            assert_eq!(routine, usize::from(level == "info"), "{level}: {got:?}");
        }
    }

    #[test]
    fn text_lines_are_one_readable_line_per_event() {
        let got = lines(LogFormat::Text, "info", || {
            tracing::warn!(target: "knic_driver::claims", network = "blue", "subnet nearly full");
        });
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].contains(" WARN knic_driver::claims: subnet nearly full network=\"blue\""),
            "{got:?}"
        );
    }
}
