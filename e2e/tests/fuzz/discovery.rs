//! Fuzz targets: discovery over generated sysfs trees, and the fixture loader's confinement.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use knic_driver::inventory::fixture::{materialise, synthetic_sriov};
use knic_driver::inventory::{Filter, Sources, Sysfs, discover_in};
use knic_e2e::fuzz::{Rng, Settings, Verdict, run};

use super::describe;

fn sysfs_corpus() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../driver/tests/fixtures/sysfs");
    let mut corpus: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(".real.txt") || name.ends_with(".derived.txt")
        })
        .filter(|p| !p.to_string_lossy().contains("ethtool"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    corpus.sort();
    corpus.push(synthetic_sriov(1, 3));
    corpus
}

const ODD_VALUES: &[&str] = &[
    "",
    "-1",
    "0",
    "0x",
    "0xffffffffffffffff",
    "99999999999999999999999",
    "4294967296",
    "nan",
    "ff:ff:ff:ff:ff:ff",
    "zz:zz",
    "0000:00:00.0",
    "../../..",
    "eth0 eth1",
    "\u{1b}[31mred\u{1b}[0m",
    "\u{202e}0ht\u{200b}e",
    "DEVTYPE=vlan",
    "INTERFACE=",
    "PCI_SLOT_NAME=../../../etc",
];

const ODD_LINKS: &[&str] = &[
    ".",
    "..",
    "../../../../../../../../../../../../../../../..",
    "/",
    "/dev/zero",
    "/dev/stdin",
    "/proc/self/fd/0",
    "/etc",
    "nonexistent",
    "../nonexistent/deeper",
    "../../devices/virtual/net/lo",
    "../../bus/pci/drivers/ice",
];

/// One line of a fixture's text with its kind.
fn mutate_fixture(rng: &mut Rng, base: &str, corpus: &[String]) -> String {
    let mut lines: Vec<String> = base
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    for _ in 0..rng.small(8) {
        let n = lines.len().max(1);
        match rng.below(9) {
            0 => {
                // Missing files.
                for _ in 0..rng.range(1, n / 8 + 1) {
                    if !lines.is_empty() {
                        let i = rng.below(lines.len());
                        lines.remove(i);
                    }
                }
            }
            1 => {
                // Garbage attribute contents.
                let values: Vec<usize> = (0..lines.len())
                    .filter(|&i| lines[i].contains(" = ") && !lines[i].ends_with("<<EOF"))
                    .collect();
                if !values.is_empty() {
                    let i = *rng.pick(&values);
                    let path = lines[i].split(" = ").next().unwrap_or("").to_owned();
                    let value = if rng.one_in(6) {
                        "A".repeat(rng.range(4096, 70_000))
                    } else {
                        (*rng.pick(ODD_VALUES)).to_owned()
                    };
                    lines[i] = format!("{path} = {value}");
                }
            }
            2 => {
                // Links anywhere: self, cycles, escapes, absolute, dangling.
                let links: Vec<usize> = (0..lines.len())
                    .filter(|&i| lines[i].contains(" -> "))
                    .collect();
                if !links.is_empty() {
                    let i = *rng.pick(&links);
                    let path = lines[i].split(" -> ").next().unwrap_or("").to_owned();
                    let own = path.rsplit('/').next().unwrap_or("").to_owned();
                    let target = match rng.below(3) {
                        0 => own,
                        1 => "../".repeat(rng.range(1, 400)),
                        _ => (*rng.pick(ODD_LINKS)).to_owned(),
                    };
                    lines[i] = format!("{path} -> {target}");
                }
            }
            3 => {
                // A two-link cycle and a device link pointing at itself.
                let a = rng.below(1000);
                lines.push(format!("sys/class/net/cyc{a}a -> cyc{a}b"));
                lines.push(format!("sys/class/net/cyc{a}b -> cyc{a}a"));
                lines.push(format!("sys/devices/virtual/net/self{a}/ifindex = {a}"));
                lines.push(format!(
                    "sys/devices/virtual/net/self{a}/device -> ../self{a}"
                ));
                lines.push(format!(
                    "sys/class/net/self{a} -> ../../devices/virtual/net/self{a}"
                ));
            }
            4 => {
                // A random extra device: a copy of an existing one under a new (odd) name.
                let links: Vec<(String, String)> = lines
                    .iter()
                    .filter_map(|l| l.strip_prefix("sys/class/net/"))
                    .filter_map(|l| l.split_once(" -> "))
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .collect();
                if !links.is_empty() {
                    let (name, target) = rng.pick(&links).clone();
                    let Some(real) = target.strip_prefix("../../") else {
                        continue;
                    };
                    let real = format!("sys/{real}");
                    let new = match rng.below(4) {
                        0 => format!("{name}x"),
                        1 => "n".repeat(rng.range(16, 300)),
                        2 => format!("{name}\u{7}é"),
                        _ => format!("d{}", rng.below(1_000_000)),
                    };
                    let new_real = match real.rsplit_once('/') {
                        Some((parent, _)) => format!("{parent}/{new}"),
                        None => continue,
                    };
                    let copies: Vec<String> = lines
                        .iter()
                        .filter_map(|l| l.strip_prefix(&format!("{real}/")))
                        .map(|rest| format!("{new_real}/{rest}"))
                        .collect();
                    lines.extend(copies);
                    let up = "../".repeat(new_real.matches('/').count() - 1);
                    let to = new_real.strip_prefix("sys/").unwrap_or(&new_real);
                    lines.push(format!("sys/class/net/{new} -> {up}{to}"));
                }
            }
            5 => {
                // Deep nesting below a PCI root.
                let depth = *rng.pick(&[8usize, 40, 120, 300]);
                let mut path = String::from("sys/devices/pci0000:00");
                for i in 0..depth {
                    path.push_str(&format!("/0000:{:02x}:00.0", i % 256));
                }
                let name = format!("deep{}", rng.below(100));
                lines.push(format!("{path}/vendor = 0x8086"));
                lines.push(format!("{path}/device = 0x1572"));
                lines.push(format!("{path}/net/{name}/ifindex = 77"));
                lines.push(format!("{path}/net/{name}/type = 1"));
                lines.push(format!("{path}/net/{name}/address = 02:00:00:00:00:77"));
                lines.push(format!("{path}/net/{name}/device -> ../.."));
                let to = path.strip_prefix("sys/").unwrap_or(&path);
                lines.push(format!("sys/class/net/{name} -> ../../{to}/net/{name}"));
            }
            6 => {
                // Lines of another fixture.
                let other: Vec<&str> = rng
                    .pick(corpus)
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .collect();
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = rng.range(a, (a + 60).min(other.len() - 1));
                    let at = rng.below(lines.len() + 1);
                    lines.splice(at..at, other[a..=b].iter().map(|s| (*s).to_owned()));
                }
            }
            7 => {
                // A multi-line uevent with odd keys.
                let dirs: Vec<String> = lines
                    .iter()
                    .filter_map(|l| l.split_once("/ifindex = ").map(|(d, _)| d.to_owned()))
                    .collect();
                if !dirs.is_empty() {
                    let d = rng.pick(&dirs).clone();
                    lines.push(format!("{d}/uevent = <<EOF"));
                    for _ in 0..rng.range(0, 5) {
                        lines.push(format!(
                            "{}={}",
                            rng.pick(&["INTERFACE", "DEVTYPE", "IFINDEX", "", "="]),
                            rng.pick(ODD_VALUES)
                        ));
                    }
                    lines.push("EOF".into());
                }
            }
            _ => {
                // Shuffle two lines (a link may now come before its target exists, or after).
                if lines.len() > 1 {
                    let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
                    lines.swap(a, b);
                }
            }
        }
    }
    lines.join("\n") + "\n"
}

/// A generated tree: fixture text, then files (by index in a sorted walk) turned into FIFOs
/// or given raw, non-UTF-8 content, and sometimes a filter.
#[derive(Debug)]
struct TreeInput {
    fixture: String,
    fifos: Vec<usize>,
    raw: Vec<(usize, Vec<u8>)>,
    filter: Option<(String, String)>,
}

/// Regular files below `dir`, sorted, never following a link.
fn regular_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => regular_files(&p, out),
            Ok(m) if m.is_file() => out.push(p),
            _ => {}
        }
    }
}

pub(super) fn discovery_target(settings: &Settings) -> Result<String, String> {
    let corpus = sysfs_corpus();
    let gen_corpus = corpus.clone();
    let globs = [
        "*",
        "eth*",
        "pci-*",
        "",
        "[",
        "**",
        "kind=pf",
        "vendor=0x8086",
        "é*",
        "\u{0}",
    ];
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let work = dir.path().join("tree");
    let summary = run(
        "discovery",
        settings,
        move |rng: &mut Rng| {
            let base = rng.pick(&gen_corpus).clone();
            let fixture = mutate_fixture(rng, &base, &gen_corpus);
            let fifos = (0..rng.range(0, 2)).map(|_| rng.below(10_000)).collect();
            let raw = (0..rng.range(0, 3))
                .map(|_| {
                    let n = rng.range(0, 64);
                    (rng.below(10_000), rng.bytes(n))
                })
                .collect();
            let filter = rng.one_in(4).then(|| {
                let include = (0..rng.range(0, 2))
                    .map(|_| *rng.pick(&globs))
                    .collect::<Vec<_>>();
                let exclude = (0..rng.range(0, 2))
                    .map(|_| *rng.pick(&globs))
                    .collect::<Vec<_>>();
                (include.join(","), exclude.join(","))
            });
            TreeInput {
                fixture,
                fifos,
                raw,
                filter,
            }
        },
        move |input: &TreeInput| {
            let _ = std::fs::remove_dir_all(&work);
            std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
            // A line the loader refuses ends the tree there: what exists is still a tree.
            let faults = materialise(&input.fixture, &work).unwrap_or_default();
            let mut files = Vec::new();
            regular_files(&work, &mut files);
            if !files.is_empty() {
                for &i in &input.fifos {
                    let f = &files[i % files.len()];
                    let _ = std::fs::remove_file(f);
                    let _ = nix::unistd::mkfifo(f, nix::sys::stat::Mode::from_bits_truncate(0o600));
                }
                for (i, bytes) in &input.raw {
                    let f = &files[i % files.len()];
                    if std::fs::symlink_metadata(f).is_ok_and(|m| m.is_file()) {
                        let _ = std::fs::write(f, bytes);
                    }
                }
            }
            let filter = match &input.filter {
                Some((include, exclude)) => match Filter::parse_lists(include, exclude) {
                    Ok(f) => f,
                    Err(e) if e.to_string().is_empty() => {
                        return Err("filter error without text".into());
                    }
                    Err(_) => Filter::default(),
                },
                None => Filter::default(),
            };
            let sysfs = Sysfs::new(&work).with_faults(faults);
            let inventory = discover_in(&sysfs, &Sources::sysfs_only(), &BTreeSet::new(), &filter);
            // Published names become ResourceSlice device names: unique DNS labels.
            let mut seen = BTreeSet::new();
            for device in &inventory.devices {
                if !knic_proto::names::is_dns_label(&device.name) {
                    return Err(format!("device name {:?} is not a DNS label", device.name));
                }
                if !seen.insert(device.name.clone()) {
                    return Err(format!("device name {:?} published twice", device.name));
                }
            }
            let _ = knic_driver::inventory::table::render_table(&inventory, "node-a");
            Ok(if inventory.devices.is_empty() {
                Verdict::Refused
            } else {
                Verdict::Accepted
            })
        },
    )?;
    drop(dir);
    Ok(describe(&summary))
}

/// The generator writes links as root; this pins that the loader never writes through one
/// (the bug the fuzzer would otherwise hit on the host's filesystem): a regression test for
/// `materialise`, run here too because the fuzz targets rely on it.
pub(super) fn fixture_confinement(_: &Settings) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).map_err(|e| e.to_string())?;
    let err = materialise("sys/a -> ../../outside\nsys/a/f = 1\n", &root)
        .err()
        .ok_or("a file below a link to outside the root was written")?;
    let text = err.to_string();
    if !text.contains("goes through the symlink \"sys/a\"") {
        return Err(format!("error text: {text}"));
    }
    if outside.join("f").exists() {
        return Err("wrote outside the root".into());
    }
    Ok("refused".into())
}
