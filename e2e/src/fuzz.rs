//! A small seeded mutation fuzzer for the parsers and decoders that read untrusted input.
//!
//! Written here rather than taken from `proptest`/`arbitrary`/`cargo fuzz` because it must run on
//! the stable toolchain inside `cargo test`, add nothing to a build that is already slow, and
//! replay a failure from one printed number. Each target runs for a time budget
//! ([`ENV_SECONDS`], a few seconds by default, longer on demand); every input is derived from its
//! own seed, runs on a worker thread under a deadline ([`ENV_INPUT_MS`]) and must neither panic
//! nor overrun it. A failure prints the input's seed: `KNIC_FUZZ_REPRO=<seed>` replays exactly
//! that input (filter the trial by name to pick the target).

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// Seconds each target runs (fractions allowed).
pub const ENV_SECONDS: &str = "KNIC_FUZZ_SECONDS";
/// The run's seed (decimal or `0x` hex); random when unset, and always printed.
pub const ENV_SEED: &str = "KNIC_FUZZ_SEED";
/// Milliseconds one input may take before it counts as a hang.
pub const ENV_INPUT_MS: &str = "KNIC_FUZZ_INPUT_MS";
/// One input seed (as printed on failure) to replay alone.
pub const ENV_REPRO: &str = "KNIC_FUZZ_REPRO";

/// Budget per target under plain `cargo test`: enough for thousands of inputs of the cheap
/// targets while keeping the suite short on a 2-core machine.
pub const DEFAULT_SECONDS: f64 = 2.0;
/// Deadline per input: generous for a debug build on a loaded machine, yet far below anything
/// a kubelet or runtime would wait, so a real hang is unmistakable.
pub const DEFAULT_INPUT_MS: u64 = 2000;

/// xorshift64*: tiny, fast, and deterministic across platforms, which is all replay needs.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value, zero included).
    pub fn new(seed: u64) -> Rng {
        // splitmix64 scrambles nearby seeds apart and never leaves xorshift at zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// A random element.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A small count biased to small values (1, 2, 3 most often), for stacking mutations.
    pub fn small(&mut self, max: usize) -> usize {
        let mut n = 1;
        while n < max && self.one_in(2) {
            n += 1;
        }
        n
    }
}

/// How long targets run and how the run is seeded, from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Time per target.
    pub budget: Duration,
    /// Deadline per input.
    pub per_input: Duration,
    /// The run's seed.
    pub seed: u64,
    /// Replay only this input seed.
    pub repro: Option<u64>,
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

impl Settings {
    /// Reads [`ENV_SECONDS`], [`ENV_SEED`], [`ENV_INPUT_MS`] and [`ENV_REPRO`]; a malformed value
    /// is an error naming the variable, not a silent default.
    pub fn from_env() -> anyhow::Result<Settings> {
        fn var(name: &str) -> Option<String> {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        }
        let seconds = match var(ENV_SECONDS) {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| anyhow::anyhow!("{ENV_SECONDS}={v}: not a positive number"))?,
            None => DEFAULT_SECONDS,
        };
        let input_ms = match var(ENV_INPUT_MS) {
            Some(v) => parse_u64(&v)
                .filter(|&n| n > 0)
                .ok_or_else(|| anyhow::anyhow!("{ENV_INPUT_MS}={v}: not a positive integer"))?,
            None => DEFAULT_INPUT_MS,
        };
        let seed = match var(ENV_SEED) {
            Some(v) => {
                parse_u64(&v).ok_or_else(|| anyhow::anyhow!("{ENV_SEED}={v}: not an integer"))?
            }
            None => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
            }
        };
        let repro = match var(ENV_REPRO) {
            Some(v) => Some(
                parse_u64(&v)
                    .ok_or_else(|| anyhow::anyhow!("{ENV_REPRO}={v}: not an input seed"))?,
            ),
            None => None,
        };
        Ok(Settings {
            budget: Duration::from_secs_f64(seconds),
            per_input: Duration::from_millis(input_ms),
            seed,
            repro,
        })
    }

    /// The seed of input `index` of target `target`: targets get unrelated streams from one
    /// run seed, and any input can be rebuilt from its seed alone.
    pub fn input_seed(&self, target: &str, index: u64) -> u64 {
        let mut h = self.seed;
        for b in target.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        Rng::new(h ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64()
    }
}

/// What one target's run did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Inputs run.
    pub inputs: u64,
    /// Inputs the target reported as accepted (the rest were refused with an error).
    pub accepted: u64,
    /// The slowest input.
    pub slowest: Duration,
}

/// What a check says about one input: it was accepted, or refused with an error (both fine);
/// a property violation is an `Err` of the check itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Parsed/decoded/evaluated.
    Accepted,
    /// Refused with an error, as bad input should be.
    Refused,
}

const MAX_SHOWN: usize = 4096;

fn shown<I: Debug>(input: &I) -> String {
    let mut text = format!("{input:#?}");
    if text.len() > MAX_SHOWN {
        let mut cut = MAX_SHOWN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let total = text.len();
        text.truncate(cut);
        text.push_str(&format!("\n... ({total} bytes in all)"));
    }
    text
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Runs `target`: inputs from `generate` (a pure function of the `Rng` it is given, so a seed
/// rebuilds the input) are checked by `check` on a worker thread until the budget is spent.
/// Fails on the first panic, property violation (`Err` from `check`) or input over the deadline,
/// with the input, its seed and the command that replays it.
pub fn run<I, G, C>(
    target: &str,
    settings: &Settings,
    mut generate: G,
    check: C,
) -> Result<Summary, String>
where
    I: Debug + Send + 'static,
    G: FnMut(&mut Rng) -> I,
    C: Fn(&I) -> Result<Verdict, String> + Send + 'static,
{
    type Outcome = std::thread::Result<Result<Verdict, String>>;
    let (to_worker, inputs) = mpsc::channel::<I>();
    let (to_main, outcomes) = mpsc::channel::<Outcome>();
    std::thread::Builder::new()
        .name(format!("fuzz-{target}"))
        .spawn(move || {
            for input in inputs {
                let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
                if to_main.send(outcome).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| format!("{target}: starting the worker: {e}"))?;

    let replay =
        |seed: u64| format!("{ENV_REPRO}={seed:#x} cargo test -p knic-e2e --test fuzz -- {target}");
    let mut summary = Summary::default();
    let start = Instant::now();
    let mut index = 0u64;
    loop {
        let seed = match settings.repro {
            Some(seed) if index == 0 => seed,
            Some(_) => break,
            None if start.elapsed() >= settings.budget && index > 0 => break,
            None => settings.input_seed(target, index),
        };
        index += 1;
        let input = generate(&mut Rng::new(seed));
        let began = Instant::now();
        if to_worker.send(input).is_err() {
            return Err(format!("{target}: the worker thread is gone"));
        }
        let failure = match outcomes.recv_timeout(settings.per_input) {
            Ok(Ok(Ok(verdict))) => {
                summary.inputs += 1;
                summary.accepted += u64::from(verdict == Verdict::Accepted);
                summary.slowest = summary.slowest.max(began.elapsed());
                continue;
            }
            Ok(Ok(Err(violation))) => format!("property violated: {violation}"),
            Ok(Err(payload)) => format!("panicked: {}", panic_text(payload.as_ref())),
            Err(_) => format!(
                "no result within {:?} (hang or runaway input); the worker is abandoned",
                settings.per_input
            ),
        };
        // The input went to the worker; the seed rebuilds it for the report.
        let input = generate(&mut Rng::new(seed));
        return Err(format!(
            "{target}: input #{index} (run seed {:#x}, input seed {seed:#x}) {failure}\n\
             replay: {}\ninput:\n{}",
            settings.seed,
            replay(seed),
            shown(&input)
        ));
    }
    Ok(summary)
}

/// Interesting 32-bit values for length and id fields: zero, one, sign and size boundaries,
/// and the limits knic's decoders enforce (4 MiB messages, 4 MiB + 10 mux frames).
pub const INTERESTING_U32: &[u32] = &[
    0,
    1,
    2,
    7,
    8,
    9,
    10,
    0x7f,
    0x80,
    0xff,
    0x100,
    0xffff,
    0x1_0000,
    (4 << 20) - 1,
    4 << 20,
    (4 << 20) + 1,
    (4 << 20) + 10,
    (4 << 20) + 11,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
];

/// One random edit of a byte string: bit flips, interesting bytes and big-endian words,
/// inserts, deletes, duplications, splices from `corpus`, truncation and length extremes.
/// Applies `1..=max_ops` stacked edits.
pub fn mutate_bytes(rng: &mut Rng, base: &[u8], corpus: &[Vec<u8>], max_ops: usize) -> Vec<u8> {
    let mut data = base.to_vec();
    for _ in 0..rng.small(max_ops) {
        let len = data.len();
        match rng.below(11) {
            0 if len > 0 => {
                let at = rng.below(len);
                data[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                data[at] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'\n', b'"', b'\\']);
            }
            2 => {
                let at = rng.below(len + 1);
                let n = rng.range(1, 16);
                let bytes = rng.bytes(n);
                data.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let n = rng.range(1, (len - at).min(64));
                data.drain(at..at + n);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = rng.range(1, (len - at).min(256));
                let copy = data[at..at + n].to_vec();
                let to = rng.below(len + 1);
                data.splice(to..to, copy);
            }
            5 if !corpus.is_empty() => {
                // Splice: our head, another input's tail.
                let other = rng.pick(corpus);
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => data.truncate(rng.below(len)),
            7 if len >= 4 => {
                let at = rng.below(len - 3);
                let v = *rng.pick(INTERESTING_U32);
                data[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            8 if !corpus.is_empty() => {
                let other = rng.pick(corpus);
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = rng.range(a + 1, other.len());
                    let at = rng.below(len + 1);
                    data.splice(at..at, other[a..b].iter().copied());
                }
            }
            9 if rng.one_in(8) => {
                // Length extreme: a long run of one byte.
                let n = rng.range(1024, 64 * 1024);
                let b = rng.next_u64() as u8;
                let at = rng.below(len + 1);
                data.splice(at..at, std::iter::repeat_n(b, n));
            }
            _ => {
                let at = rng.below(len + 1);
                let b = rng.next_u64() as u8;
                data.insert(at, b);
            }
        }
    }
    data
}

/// The longest text [`mutate_text`] returns: several times any limit a text input of knic has
/// (a device selector may be 10 KiB), so "too long" is exercised, while stacked repetitions
/// cannot grow an input into megabytes that only measure the machine.
pub const MAX_TEXT: usize = 64 * 1024;

/// One random edit of a text: tokens from `dictionary` inserted or substituted, ranges deleted
/// or repeated, splices from `corpus`, deep nesting, long repetition, and byte-level edits read
/// back lossily (so invalid UTF-8 becomes U+FFFD, as it would reaching a `&str` API).
pub fn mutate_text(
    rng: &mut Rng,
    base: &str,
    corpus: &[String],
    dictionary: &[&str],
    max_ops: usize,
) -> String {
    let mut text = base.to_owned();
    for _ in 0..rng.small(max_ops) {
        let boundaries: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        let at = *rng.pick(&boundaries);
        match rng.below(9) {
            0 | 1 if !dictionary.is_empty() => {
                let word = *rng.pick(dictionary);
                text.insert_str(at, word);
            }
            2 if !dictionary.is_empty() => {
                let end = *rng.pick(&boundaries[boundaries.partition_point(|&b| b < at)..]);
                let word = *rng.pick(dictionary);
                text.replace_range(at..end, word);
            }
            3 => {
                let end = *rng.pick(&boundaries[boundaries.partition_point(|&b| b < at)..]);
                text.replace_range(at..end, "");
            }
            4 if !corpus.is_empty() => {
                let other = rng.pick(corpus);
                let cut = (0..=other.len())
                    .filter(|&i| other.is_char_boundary(i))
                    .nth(rng.below(other.chars().count() + 1))
                    .unwrap_or(0);
                text.truncate(at);
                text.push_str(&other[cut..]);
            }
            5 => {
                let depth = *rng.pick(&[2usize, 16, 40, 99, 100, 101, 200, 1000]);
                let (open, close) = *rng.pick(&[("(", ")"), ("[", "]"), ("!", ""), ("-", "")]);
                text = format!("{}{text}{}", open.repeat(depth), close.repeat(depth));
            }
            6 => {
                let end = *rng.pick(&boundaries[boundaries.partition_point(|&b| b < at)..]);
                let piece = text[at..end].to_owned();
                let times = *rng.pick(&[2usize, 10, 100, 1000]);
                let joiner = *rng.pick(&["", " && ", " || ", ", "]);
                let repeated = vec![piece.as_str(); times].join(joiner);
                text.replace_range(at..end, &repeated);
            }
            _ => {
                let bytes = mutate_bytes(rng, text.as_bytes(), &[], 2);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        if text.len() > MAX_TEXT {
            let mut cut = MAX_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
    }
    text
}

/// Scalars that break assumptions: type confusions, integer and float extremes, empty, long,
/// control and bidirectional characters, and near-miss addresses.
fn odd_scalar(rng: &mut Rng) -> Value {
    match rng.below(20) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => Value::from(*rng.pick(&[
            0i64,
            -1,
            1,
            4094,
            4095,
            4096,
            65535,
            65536,
            i64::MIN,
            i64::MAX,
        ])),
        3 => Value::from(u64::MAX),
        4 => Value::from(*rng.pick(&[0.5f64, -0.0, 1e308, -1e308, 1.5e-300])),
        5 => Value::String(String::new()),
        6 => Value::String("x".repeat(*rng.pick(&[16usize, 256, 4097, 70_000]))),
        7 => Value::String("\u{0}\u{7}\n\t\u{200b}\u{202e}\u{feff}é".into()),
        8 => Value::String(
            (*rng.pick(&[
                "0.0.0.0/0",
                "255.255.255.255/32",
                "127.0.0.1/8",
                "224.0.0.1/4",
                "240.0.0.1/4",
                "10.0.0.0/33",
                "10.0.0.1/-1",
                "::/0",
                "::ffff:10.0.0.1/120",
                "fe80::1%eth0/64",
                "1.2.3.4",
                "1.2.3.4/24/24",
                "01.02.03.04/8",
                "ff:ff:ff:ff:ff:ff",
                "00:00:00:00:00:00",
                "02:00:00:00:00:01",
                "net.ipv4.conf.all.forwarding",
                "ipv4/../../../etc",
                "eth0",
                "lo",
                ".",
                "..",
                "a/b",
                "0123456789abcdef",
            ]))
            .to_owned(),
        ),
        9 => Value::Array(Vec::new()),
        10 => Value::Object(Map::new()),
        11 => {
            let n = rng.range(1, 24);
            Value::String(String::from_utf8_lossy(&rng.bytes(n)).into_owned())
        }
        _ => Value::from(rng.next_u64() as i64 >> rng.below(64)),
    }
}

/// Every subtree of `value`, for splicing.
fn subtrees(value: &Value, out: &mut Vec<Value>) {
    out.push(value.clone());
    match value {
        Value::Array(items) => items.iter().for_each(|v| subtrees(v, out)),
        Value::Object(map) => map.values().for_each(|v| subtrees(v, out)),
        _ => {}
    }
}

/// A random node of `value` (the root included), reached by a random walk.
fn random_node<'a>(rng: &mut Rng, value: &'a mut Value) -> &'a mut Value {
    let children = match &*value {
        Value::Array(items) => items.len(),
        Value::Object(map) => map.len(),
        _ => 0,
    };
    if children == 0 || rng.one_in(3) {
        return value;
    }
    let i = rng.below(children);
    match value {
        Value::Array(items) => random_node(rng, &mut items[i]),
        Value::Object(map) => match map.values_mut().nth(i) {
            Some(child) => random_node(rng, child),
            None => unreachable!("index below the map's length"),
        },
        _ => unreachable!("only containers have children"),
    }
}

/// The most nodes one array blow-up may add: big enough to find quadratic code, small enough
/// that stacked edits stay far below the machine's memory.
const MAX_BLOWUP_NODES: usize = 100_000;

/// The number of JSON nodes in `value`, stopping early once past [`MAX_BLOWUP_NODES`].
fn nodes(value: &Value) -> usize {
    fn count(value: &Value, total: &mut usize) {
        *total += 1;
        if *total > MAX_BLOWUP_NODES {
            return;
        }
        match value {
            Value::Array(items) => items.iter().for_each(|v| count(v, total)),
            Value::Object(map) => map.values().for_each(|v| count(v, total)),
            _ => {}
        }
    }
    let mut total = 0;
    count(value, &mut total);
    total
}

/// One random edit of a JSON document, structure-aware: a node replaced by an odd scalar or by
/// a subtree of another corpus document, keys deleted or added (known `keys` and garbage),
/// arrays emptied or blown up, nodes wrapped in containers (deep nesting), strings edited as
/// text. Applies `1..=max_ops` stacked edits.
pub fn mutate_json(
    rng: &mut Rng,
    base: &Value,
    corpus: &[Value],
    keys: &[&str],
    max_ops: usize,
) -> Value {
    let mut doc = base.clone();
    let mut pool = Vec::new();
    for v in corpus {
        subtrees(v, &mut pool);
    }
    for _ in 0..rng.small(max_ops) {
        let op = rng.below(10);
        let node = random_node(rng, &mut doc);
        match op {
            0 | 1 => *node = odd_scalar(rng),
            2 if !pool.is_empty() => *node = rng.pick(&pool).clone(),
            3 => {
                if let Value::Object(map) = node
                    && !map.is_empty()
                {
                    let i = rng.below(map.len());
                    if let Some(key) = map.keys().nth(i).cloned() {
                        map.remove(&key);
                    }
                }
            }
            4 => {
                if let Value::Object(map) = node {
                    let key = if !keys.is_empty() && !rng.one_in(4) {
                        (*rng.pick(keys)).to_owned()
                    } else {
                        let n = rng.range(0, 12);
                        String::from_utf8_lossy(&rng.bytes(n)).into_owned()
                    };
                    let value = if !pool.is_empty() && rng.one_in(2) {
                        rng.pick(&pool).clone()
                    } else {
                        odd_scalar(rng)
                    };
                    map.insert(key, value);
                }
            }
            5 => {
                if let Value::Array(items) = node {
                    if items.is_empty() || rng.one_in(3) {
                        items.clear();
                    } else {
                        let copy = rng.pick(items).clone();
                        let times = *rng.pick(&[2usize, 17, 100, 1000]);
                        // Bounded: stacked blow-ups of arrays of arrays once grew a document
                        // past 24 GiB and the OOM killer ended the whole fuzz run.
                        if nodes(&copy).saturating_mul(times) <= MAX_BLOWUP_NODES {
                            items.extend(std::iter::repeat_n(copy, times));
                        }
                    }
                }
            }
            6 => {
                let depth = *rng.pick(&[1usize, 2, 8, 40, 100]);
                let mut wrapped = std::mem::take(node);
                for _ in 0..depth {
                    wrapped = if rng.one_in(2) {
                        Value::Array(vec![wrapped])
                    } else {
                        let mut map = Map::new();
                        let key = if keys.is_empty() { "x" } else { rng.pick(keys) };
                        map.insert(key.to_owned(), wrapped);
                        Value::Object(map)
                    };
                }
                *node = wrapped;
            }
            7 | 8 => {
                if let Value::String(s) = node {
                    *s = mutate_text(rng, s, &[], &[".", "/", ":", "-", "0", "%", "\u{0}"], 3);
                } else if let Value::Number(n) = node {
                    // Type confusion: the number as a string, as YAML users write it.
                    *node = Value::String(n.to_string());
                }
            }
            _ => {
                if let Value::Object(map) = node {
                    // A key twice in different case, or a near-miss spelling.
                    if let Some(key) = map.keys().next().cloned() {
                        let value = map[&key].clone();
                        map.insert(key.to_uppercase(), value);
                    }
                }
            }
        }
    }
    doc
}

/// CRC-32 (IEEE, reflected, as zlib and the checkpoint envelope use), so mutated checkpoint
/// bodies can carry a valid checksum and reach the decoder's consistency checks.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_inputs() {
        let corpus = vec![b"hello world".to_vec(), b"other".to_vec()];
        let a = mutate_bytes(&mut Rng::new(7), &corpus[0], &corpus, 8);
        let b = mutate_bytes(&mut Rng::new(7), &corpus[0], &corpus, 8);
        assert_eq!(a, b);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }
}
