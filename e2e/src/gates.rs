//! The DRA feature gates some scenarios need off. On the fake API they are flags; on the shared
//! real cluster (`../shared/harness`) the apiserver is restarted with another gate list, so the
//! gate-off twins run against a real apiserver's strategies instead of being skipped.
//!
//! A real cluster's gates are read from the harness's own file (`$HARNESS_DIR/conf/
//! feature-gates.txt`, which its components are started with) when `KNIC_E2E_HARNESS` names the
//! kit, else from `KNIC_E2E_FEATURE_GATES` (the same `A=true,B=false` list), else they are
//! taken to be 1.36's defaults (all on). Only with the kit can a twin switch them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{Context, bail};

/// `DRAPartitionableDevices`: PF budgets as shared counters.
pub const PARTITIONABLE: &str = "DRAPartitionableDevices";
/// `DRAConsumableCapacity`: shared ports with consumable capacity.
pub const CONSUMABLE: &str = "DRAConsumableCapacity";
/// `DRADeviceTaints`: device taints in slices.
pub const TAINTS: &str = "DRADeviceTaints";
/// The gates scenarios switch; all beta and on by default in 1.36.
pub const GATES: [&str; 3] = [CONSUMABLE, PARTITIONABLE, TAINTS];

/// The shared cluster's kit directory (holding `up`); set, real twins may restart its
/// apiserver with other feature gates.
pub const ENV_HARNESS: &str = "KNIC_E2E_HARNESS";
/// The feature gates of a real cluster without the kit, `A=true,B=false`.
pub const ENV_FEATURE_GATES: &str = "KNIC_E2E_FEATURE_GATES";

/// What a scenario needs of a real cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Every gate of [`GATES`] on, as 1.36 and the harness start them (most scenarios).
    On,
    /// These gates off from the start, the others of [`GATES`] on.
    Off(&'static [&'static str]),
    /// All on at the start; the scenario turns this one off while it runs.
    TurnedOff(&'static str),
    /// Cannot run on a real cluster, for the reason given.
    FakeOnly(&'static str),
}

impl Needs {
    /// The gates that must be off when the scenario starts (`None`: fake only).
    pub fn off_at_start(self) -> Option<BTreeSet<String>> {
        match self {
            Needs::On | Needs::TurnedOff(_) => Some(BTreeSet::new()),
            Needs::Off(gates) => Some(gates.iter().map(|g| (*g).to_owned()).collect()),
            Needs::FakeOnly(_) => None,
        }
    }
}

/// Parses a gate list as the Kubernetes components take it (`A=true,B=false`), naming the
/// entry and the rule on a bad one.
pub fn parse(list: &str) -> anyhow::Result<BTreeMap<String, bool>> {
    let mut gates = BTreeMap::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, value)) = entry.split_once('=') else {
            bail!("feature gate entry {entry:?}: want Name=true or Name=false");
        };
        let on = match value.trim() {
            "true" => true,
            "false" => false,
            other => bail!("feature gate {name}: value {other:?} is neither true nor false"),
        };
        gates.insert(name.trim().to_owned(), on);
    }
    Ok(gates)
}

/// The gate list in the components' syntax, in name order.
pub fn render(gates: &BTreeMap<String, bool>) -> String {
    let entries: Vec<String> = gates.iter().map(|(n, on)| format!("{n}={on}")).collect();
    entries.join(",")
}

/// Which of [`GATES`] a gate list turns off (a gate it does not name is on: 1.36's default).
pub fn off_in(gates: &BTreeMap<String, bool>) -> BTreeSet<String> {
    GATES
        .iter()
        .filter(|g| gates.get(**g) == Some(&false))
        .map(|g| (*g).to_owned())
        .collect()
}

/// Gates that must be off when one of [`GATES`] is: a v1.36 apiserver refuses to start with
/// "DRADeviceTaintRules is enabled, but depends on features that are disabled:
/// [DRADeviceTaints]".
const DEPENDENTS: [(&str, &str); 1] = [(TAINTS, "DRADeviceTaintRules")];

/// `gates` with exactly `off` of [`GATES`] off and the rest of them on, and the gates that
/// depend on one of them following it; other gates untouched.
pub fn with_off(gates: &BTreeMap<String, bool>, off: &BTreeSet<String>) -> BTreeMap<String, bool> {
    let mut next = gates.clone();
    for gate in GATES {
        next.insert(gate.to_owned(), !off.contains(gate));
    }
    for (gate, dependent) in DEPENDENTS {
        if off.contains(gate) {
            next.insert(dependent.to_owned(), false);
        } else if gates.get(dependent) == Some(&false) && off_in(gates).contains(gate) {
            // Switched off with its gate: back on with it.
            next.insert(dependent.to_owned(), true);
        }
    }
    next
}

/// The shared cluster's kit: its `up` (which restarts one component) and its state directory.
#[derive(Debug, Clone)]
pub struct Harness {
    /// The kit's `up` script.
    pub up: PathBuf,
    /// `HARNESS_DIR`: where the components' configuration lives.
    pub dir: PathBuf,
}

impl Harness {
    /// The kit named by `KNIC_E2E_HARNESS`, with `HARNESS_DIR` (default
    /// `/var/lib/knic-harness`, as `up` has it); `None` when unset.
    pub fn from_env() -> anyhow::Result<Option<Harness>> {
        let Some(kit) = std::env::var_os(ENV_HARNESS) else {
            return Ok(None);
        };
        let up = PathBuf::from(kit).join("up");
        if !up.is_file() {
            bail!(
                "{ENV_HARNESS}: {} is not the harness's up script",
                up.display()
            );
        }
        let dir = std::env::var_os("HARNESS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/lib/knic-harness"));
        Ok(Some(Harness { up, dir }))
    }

    /// `up --restart <component>`: stops it, starts it, waits until it is healthy and the
    /// node Ready again.
    pub fn restart(&self, component: &str) -> anyhow::Result<()> {
        // Through a shell that closes every inherited descriptor first: the component `up`
        // starts lives on, and would otherwise keep whatever this test process holds open
        // without close-on-exec (a `flock` of the caller kept the lock for the apiserver's
        // whole life, and every other user of the cluster waited on it).
        let out = std::process::Command::new("bash")
            .args([
                "-c",
                r#"for fd in /proc/self/fd/*; do n=${fd##*/}; [ "$n" -gt 2 ] && eval "exec $n>&-"; done; exec "$0" "$@""#,
            ])
            .arg(&self.up)
            .args(["--restart", component])
            .env("HARNESS_DIR", &self.dir)
            .output()
            .with_context(|| format!("running {} --restart {component}", self.up.display()))?;
        if !out.status.success() {
            bail!(
                "{} --restart {component}: {}",
                self.up.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Stops a component (SIGTERM, as `up` does) and waits until it has exited; `restart`
    /// starts it again.
    pub fn stop(&self, component: &str) -> anyhow::Result<()> {
        let file = self.dir.join("pids").join(format!("{component}.pid"));
        let pid: i32 = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{}: not a pid", file.display()))?;
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .with_context(|| format!("stopping {component} (pid {pid})"))?;
        for _ in 0..300 {
            if nix::sys::signal::kill(pid, None).is_err() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!("{component} (pid {pid}) did not exit within 30 s of SIGTERM")
    }

    fn file(&self) -> PathBuf {
        self.dir.join("conf/feature-gates.txt")
    }

    /// The gate list the cluster's components were started with.
    pub fn gates(&self) -> anyhow::Result<BTreeMap<String, bool>> {
        let file = self.file();
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading the cluster's gates from {}", file.display()))?;
        parse(&text)
    }

    /// Puts the gate list back as `gates` (read with [`Harness::gates`] before the switches),
    /// restarting the apiserver only when it differs.
    pub fn restore(&self, gates: &BTreeMap<String, bool>) -> anyhow::Result<()> {
        if self.gates()? == *gates {
            return Ok(());
        }
        std::fs::write(self.file(), format!("{}\n", render(gates)))
            .with_context(|| format!("writing {}", self.file().display()))?;
        self.restart("kube-apiserver")
            .with_context(|| format!("restarting the apiserver with {}", render(gates)))?;
        eprintln!(
            "real cluster: apiserver restarted with its gates back: {}",
            render(gates)
        );
        Ok(())
    }

    /// Restarts the apiserver with exactly `off` of [`GATES`] off, unless it already runs so;
    /// `up --restart` returns once it is healthy and the node Ready. True when it restarted.
    pub fn switch(&self, off: &BTreeSet<String>) -> anyhow::Result<bool> {
        let gates = self.gates()?;
        if off_in(&gates) == *off {
            return Ok(false);
        }
        let next = with_off(&gates, off);
        std::fs::write(self.file(), format!("{}\n", render(&next)))
            .with_context(|| format!("writing {}", self.file().display()))?;
        let started = std::time::Instant::now();
        self.restart("kube-apiserver")
            .with_context(|| format!("restarting the apiserver with {}", render(&next)))?;
        eprintln!(
            "real cluster: apiserver restarted with {} in {:.1?}",
            render(&next),
            started.elapsed()
        );
        Ok(true)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn gate_lists_parse_render_and_switch() {
        let gates = parse("DRAConsumableCapacity=true, DRADeviceTaints=false,Other=true").unwrap();
        assert_eq!(off_in(&gates), BTreeSet::from([TAINTS.to_owned()]));
        let off = BTreeSet::from([PARTITIONABLE.to_owned()]);
        assert_eq!(
            render(&with_off(&gates, &off)),
            "DRAConsumableCapacity=true,DRADeviceTaints=true,DRAPartitionableDevices=false,\
             Other=true"
        );
        assert_eq!(off_in(&parse("").unwrap()), BTreeSet::new());
    }

    #[test]
    fn a_dependent_gate_follows_its_gate_off_and_back() {
        let on = parse("DRADeviceTaints=true,DRADeviceTaintRules=true").unwrap();
        let off = with_off(&on, &BTreeSet::from([TAINTS.to_owned()]));
        assert_eq!(
            (off[TAINTS], off["DRADeviceTaintRules"]),
            (false, false),
            "a v1.36 apiserver refuses DRADeviceTaintRules without DRADeviceTaints"
        );
        let back = with_off(&off, &BTreeSet::new());
        assert_eq!((back[TAINTS], back["DRADeviceTaintRules"]), (true, true));
        // A cluster that runs without the rules keeps them off.
        let without = parse("DRADeviceTaints=true,DRADeviceTaintRules=false").unwrap();
        assert!(!with_off(&without, &BTreeSet::new())["DRADeviceTaintRules"]);
    }

    #[test]
    fn bad_gate_lists_name_the_entry_and_the_rule() {
        assert_eq!(
            parse("DRADeviceTaints").unwrap_err().to_string(),
            "feature gate entry \"DRADeviceTaints\": want Name=true or Name=false"
        );
        assert_eq!(
            parse("DRADeviceTaints=off").unwrap_err().to_string(),
            "feature gate DRADeviceTaints: value \"off\" is neither true nor false"
        );
    }

    #[test]
    fn what_a_scenario_needs_at_its_start() {
        assert_eq!(Needs::On.off_at_start(), Some(BTreeSet::new()));
        assert_eq!(
            Needs::TurnedOff(PARTITIONABLE).off_at_start(),
            Some(BTreeSet::new())
        );
        assert_eq!(
            Needs::Off(&[CONSUMABLE, PARTITIONABLE]).off_at_start(),
            Some(BTreeSet::from([
                CONSUMABLE.to_owned(),
                PARTITIONABLE.to_owned()
            ]))
        );
        assert_eq!(Needs::FakeOnly("why").off_at_start(), None);
    }
}
