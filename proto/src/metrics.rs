//! Counters, gauges and histograms with labels, and their Prometheus text exposition (format
//! 0.0.4), shared by both binaries so their `/metrics` read the same way.
//!
//! Written here rather than taken from a metrics crate: knic needs a dozen series, exact text
//! its tests can compare, and no global registry (each binary and each test owns its own).
//! Label names are fixed per family by the handle's type (`Counter<2>` takes exactly two
//! values), so a call site cannot give a wrong number of labels. The exposition is in a stable
//! order (families by name, series by label values), so two scrapes of the same state are the
//! same text.
//!
//! [`Readiness`] is the named-conditions state behind both binaries' `/readyz`, and [`answer`]
//! what their `/metrics`, `/healthz` and `/readyz` say.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::{Error, Result};

/// The content type of [`Registry::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Latency buckets in seconds, from 1 ms to 60 s: kubelet calls, NRI hooks and attaches span
/// that range (a vfio-pci bind or a VF creation can take seconds).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Debug, Clone)]
enum Series {
    Value(f64),
    Histogram {
        /// Per bucket, not cumulative; the text makes them cumulative.
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    kind: Kind,
    labels: Vec<String>,
    buckets: Vec<f64>,
    series: Mutex<BTreeMap<Vec<String>, Series>>,
}

/// A metric's values stay meaningful after a panic elsewhere: never refuse to count.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Family {
    fn key<const N: usize>(values: [&str; N]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    fn update(&self, key: Vec<String>, f: impl FnOnce(&mut Series)) {
        let mut series = lock(&self.series);
        let entry = series.entry(key).or_insert_with(|| match self.kind {
            Kind::Histogram => Series::Histogram {
                counts: vec![0; self.buckets.len()],
                sum: 0.0,
                count: 0,
            },
            Kind::Counter | Kind::Gauge => Series::Value(0.0),
        });
        f(entry);
    }

    fn value(&self, key: &[String]) -> Option<Series> {
        lock(&self.series).get(key).cloned()
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(&self.help));
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind.as_str());
        let series = lock(&self.series);
        // A family without labels always has its one series, zero before the first change, so
        // a scrape tells "nothing happened" from "not exported".
        if series.is_empty() && self.labels.is_empty() {
            match self.kind {
                Kind::Histogram => {
                    self.render_histogram(out, &[], &vec![0; self.buckets.len()], 0.0, 0)
                }
                Kind::Counter | Kind::Gauge => {
                    let _ = writeln!(out, "{} 0", self.name);
                }
            }
        }
        for (values, s) in series.iter() {
            match s {
                Series::Value(v) => {
                    let _ = writeln!(
                        out,
                        "{}{} {}",
                        self.name,
                        label_text(&self.labels, values, None),
                        number(*v)
                    );
                }
                Series::Histogram { counts, sum, count } => {
                    self.render_histogram(out, values, counts, *sum, *count);
                }
            }
        }
    }

    fn render_histogram(
        &self,
        out: &mut String,
        values: &[String],
        counts: &[u64],
        sum: f64,
        count: u64,
    ) {
        let mut cumulative = 0u64;
        for (bound, n) in self.buckets.iter().zip(counts) {
            cumulative += n;
            let le = number(*bound);
            let _ = writeln!(
                out,
                "{}_bucket{} {cumulative}",
                self.name,
                label_text(&self.labels, values, Some(&le))
            );
        }
        let _ = writeln!(
            out,
            "{}_bucket{} {count}",
            self.name,
            label_text(&self.labels, values, Some("+Inf"))
        );
        let labels = label_text(&self.labels, values, None);
        let _ = writeln!(out, "{}_sum{labels} {}", self.name, number(sum));
        let _ = writeln!(out, "{}_count{labels} {count}", self.name);
    }
}

/// `{a="x",le="0.5"}`, or nothing without labels.
fn label_text(names: &[String], values: &[String], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}=\"{}\"", escape_label(v)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// The exposition format's label value escapes: backslash, double quote, line feed.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text escapes only backslash and line feed.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The shortest text that reads back as `v` (integers without a fraction), and the special
/// values as Prometheus spells them.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// Prometheus' metric name rule: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn check_metric_name(name: &str) -> Result<()> {
    let ok = name.chars().enumerate().all(|(i, c)| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    });
    if name.is_empty() || !ok {
        return Err(Error::Rule(format!(
            "metric name {name:?}: must match [a-zA-Z_:][a-zA-Z0-9_:]*"
        )));
    }
    Ok(())
}

/// Prometheus' label name rule, `[a-zA-Z_][a-zA-Z0-9_]*`, with `__` reserved and `le` taken
/// by histograms.
fn check_label_name(metric: &str, kind: Kind, label: &str) -> Result<()> {
    let ok = label
        .chars()
        .enumerate()
        .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit()));
    if label.is_empty() || !ok {
        return Err(Error::Rule(format!(
            "metric {metric}: label name {label:?}: must match [a-zA-Z_][a-zA-Z0-9_]*"
        )));
    }
    if label.starts_with("__") {
        return Err(Error::Rule(format!(
            "metric {metric}: label name {label:?}: names starting with \"__\" are reserved"
        )));
    }
    if kind == Kind::Histogram && label == "le" {
        return Err(Error::Rule(format!(
            "metric {metric}: label name \"le\": reserved for histogram buckets"
        )));
    }
    Ok(())
}

/// The families of one process (or one test); renders them as one exposition.
#[derive(Debug, Default)]
pub struct Registry {
    families: Mutex<BTreeMap<String, Arc<Family>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    fn register(
        &self,
        name: &str,
        help: &str,
        kind: Kind,
        labels: &[&str],
        buckets: &[f64],
    ) -> Result<Arc<Family>> {
        check_metric_name(name)?;
        for (i, label) in labels.iter().enumerate() {
            check_label_name(name, kind, label)?;
            if labels[..i].contains(label) {
                return Err(Error::Rule(format!(
                    "metric {name}: label name {label:?} is given twice"
                )));
            }
        }
        if kind == Kind::Histogram
            && (buckets.is_empty()
                || buckets.windows(2).any(|w| w[0] >= w[1])
                || buckets.iter().any(|b| !b.is_finite()))
        {
            return Err(Error::Rule(format!(
                "metric {name}: buckets must be finite, strictly increasing and at least one"
            )));
        }
        let mut families = lock(&self.families);
        if families.contains_key(name) {
            return Err(Error::Rule(format!("metric {name}: registered twice")));
        }
        let family = Arc::new(Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            buckets: buckets.to_vec(),
            series: Mutex::default(),
        });
        families.insert(name.to_owned(), family.clone());
        Ok(family)
    }

    /// A counter family with these label names (`_total` belongs in `name`).
    pub fn counter<const N: usize>(
        &self,
        name: &str,
        help: &str,
        labels: [&str; N],
    ) -> Result<Counter<N>> {
        Ok(Counter(self.register(
            name,
            help,
            Kind::Counter,
            &labels,
            &[],
        )?))
    }

    /// A gauge family with these label names.
    pub fn gauge<const N: usize>(
        &self,
        name: &str,
        help: &str,
        labels: [&str; N],
    ) -> Result<Gauge<N>> {
        Ok(Gauge(self.register(
            name,
            help,
            Kind::Gauge,
            &labels,
            &[],
        )?))
    }

    /// A histogram family with these label names and upper bucket bounds (`+Inf` is implied).
    pub fn histogram<const N: usize>(
        &self,
        name: &str,
        help: &str,
        labels: [&str; N],
        buckets: &[f64],
    ) -> Result<Histogram<N>> {
        Ok(Histogram(self.register(
            name,
            help,
            Kind::Histogram,
            &labels,
            buckets,
        )?))
    }

    /// The text exposition (format 0.0.4) of every family, in name order.
    pub fn render(&self) -> String {
        let families: Vec<Arc<Family>> = lock(&self.families).values().cloned().collect();
        let mut out = String::new();
        for family in families {
            family.render(&mut out);
        }
        out
    }
}

/// A monotonic count per label set.
#[derive(Debug, Clone)]
pub struct Counter<const N: usize>(Arc<Family>);

impl<const N: usize> Counter<N> {
    /// Adds one.
    pub fn inc(&self, labels: [&str; N]) {
        self.add(labels, 1.0);
    }

    /// Adds `v`; a negative or non-finite `v` is ignored (a counter never goes down).
    pub fn add(&self, labels: [&str; N], v: f64) {
        if !(v.is_finite() && v >= 0.0) {
            return;
        }
        self.0.update(Family::key(labels), |s| {
            if let Series::Value(x) = s {
                *x += v;
            }
        });
    }

    /// Exports the series at zero before anything happened, so rates and alerts see it.
    pub fn touch(&self, labels: [&str; N]) {
        self.add(labels, 0.0);
    }

    /// The current value (0 for a series never touched).
    pub fn get(&self, labels: [&str; N]) -> f64 {
        match self.0.value(&Family::key(labels)) {
            Some(Series::Value(v)) => v,
            _ => 0.0,
        }
    }
}

/// A value that goes up and down, per label set.
#[derive(Debug, Clone)]
pub struct Gauge<const N: usize>(Arc<Family>);

impl<const N: usize> Gauge<N> {
    /// Sets the value.
    pub fn set(&self, labels: [&str; N], v: f64) {
        self.0.update(Family::key(labels), |s| {
            if let Series::Value(x) = s {
                *x = v;
            }
        });
    }

    /// Adds `v` (negative to subtract).
    pub fn add(&self, labels: [&str; N], v: f64) {
        self.0.update(Family::key(labels), |s| {
            if let Series::Value(x) = s {
                *x += v;
            }
        });
    }

    /// Replaces every series with `values`: for a gauge that is recomputed as a whole (devices
    /// by kind), a label set that disappeared must not keep its last value.
    pub fn replace_all(&self, values: impl IntoIterator<Item = ([String; N], f64)>) {
        let mut series = lock(&self.0.series);
        series.clear();
        for (labels, v) in values {
            series.insert(labels.to_vec(), Series::Value(v));
        }
    }

    /// The current value (0 for a series never set).
    pub fn get(&self, labels: [&str; N]) -> f64 {
        match self.0.value(&Family::key(labels)) {
            Some(Series::Value(v)) => v,
            _ => 0.0,
        }
    }
}

/// Observations counted into buckets, per label set.
#[derive(Debug, Clone)]
pub struct Histogram<const N: usize>(Arc<Family>);

impl<const N: usize> Histogram<N> {
    /// Records one observation; a non-finite value is ignored.
    pub fn observe(&self, labels: [&str; N], v: f64) {
        if !v.is_finite() {
            return;
        }
        let bucket = self.0.buckets.iter().position(|b| v <= *b);
        self.0.update(Family::key(labels), |s| {
            if let Series::Histogram { counts, sum, count } = s {
                if let Some(i) = bucket {
                    counts[i] += 1;
                }
                *sum += v;
                *count += 1;
            }
        });
    }

    /// Records the seconds since `start`.
    pub fn observe_since(&self, labels: [&str; N], start: Instant) {
        self.observe(labels, start.elapsed().as_secs_f64());
    }

    /// How many observations the series has.
    pub fn count(&self, labels: [&str; N]) -> u64 {
        match self.0.value(&Family::key(labels)) {
            Some(Series::Histogram { count, .. }) => count,
            _ => 0,
        }
    }
}

/// Named conditions that must all hold for a process to be ready, in the order they were
/// declared; `/readyz` answers with the ones missing.
#[derive(Debug)]
pub struct Readiness {
    conditions: Mutex<Vec<(String, bool)>>,
}

impl Readiness {
    /// Every condition starts unmet.
    pub fn new(names: &[&str]) -> Readiness {
        Readiness {
            conditions: Mutex::new(names.iter().map(|n| ((*n).to_owned(), false)).collect()),
        }
    }

    /// Records whether `name` holds; an undeclared name is ignored.
    pub fn set(&self, name: &str, holds: bool) {
        if let Some(c) = lock(&self.conditions).iter_mut().find(|(n, _)| n == name) {
            c.1 = holds;
        }
    }

    /// The conditions that do not hold, in declaration order.
    pub fn missing(&self) -> Vec<String> {
        lock(&self.conditions)
            .iter()
            .filter(|(_, holds)| !holds)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The `/readyz` answer: ready, and the body naming what is missing.
    pub fn report(&self) -> (bool, String) {
        let missing = self.missing();
        if missing.is_empty() {
            (true, "ok\n".to_owned())
        } else {
            (false, format!("not ready: {}\n", missing.join(", ")))
        }
    }
}

mod endpoints;
pub use endpoints::{Answer, Health, Heartbeat, answer, listen_address};
#[cfg(feature = "server")]
pub mod server;

#[cfg(test)]
mod tests;
