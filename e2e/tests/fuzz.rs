//! Bounded fuzzing of everything knic decodes from outside: NetworkConfig parameters (parse,
//! merge, validate), the NRI multiplexer and ttrpc framing (the pure decoders and the whole
//! plugin behind a socket), the checkpoint file, CEL selectors (the shared tokenizer, syntax
//! and cost checks, the controller's compiler and evaluator) and discovery over generated sysfs
//! trees (random devices, symlink cycles and escapes, missing files, garbage contents, FIFOs,
//! deep nesting).
//!
//! Each target runs for `KNIC_FUZZ_SECONDS` (default 2 s) with seeded mutations of valid
//! inputs (`knic_e2e::fuzz`); any panic, violated property or input slower than
//! `KNIC_FUZZ_INPUT_MS` (default 2000) fails it with the input and the command that replays
//! it. Longer runs: `KNIC_FUZZ_SECONDS=300 cargo test -p knic-e2e --test fuzz --release`.

#![allow(clippy::unwrap_used)]

use knic_e2e::fuzz::Settings;
use libtest_mimic::{Failed, Trial};

// NetworkConfig parameters.
#[path = "fuzz/netconfig.rs"]
mod netconfig;
use netconfig::netconfig_target;

// CEL selectors.
#[path = "fuzz/cel.rs"]
mod cel;
use cel::cel_target;

// The NRI multiplexer, ttrpc framing and the plugin behind a socket.
#[path = "fuzz/nri.rs"]
mod nri;
use nri::{mux_target, nri_plugin_target, ttrpc_target};

// The checkpoint file.
#[path = "fuzz/checkpoint.rs"]
mod checkpoint;
use checkpoint::checkpoint_target;

// Discovery over generated sysfs trees.
#[path = "fuzz/discovery.rs"]
mod discovery;
use discovery::{discovery_target, fixture_confinement};

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    eprintln!(
        "fuzz: run seed {:#x} (KNIC_FUZZ_SEED to repeat the run), {:?} per target, {:?} per input",
        settings.seed, settings.budget, settings.per_input
    );
    type Target = fn(&Settings) -> Result<String, String>;
    let targets: [(&str, Target); 8] = [
        ("netconfig", netconfig_target),
        ("cel", cel_target),
        ("mux_decoder", mux_target),
        ("ttrpc_decoder", ttrpc_target),
        ("nri_plugin", nri_plugin_target),
        ("checkpoint", checkpoint_target),
        ("discovery", discovery_target),
        ("fixture_confinement", fixture_confinement),
    ];
    let trials = targets
        .into_iter()
        .map(|(name, target)| {
            let settings = settings.clone();
            Trial::test(name, move || {
                let summary = target(&settings).map_err(Failed::from)?;
                eprintln!("fuzz {name}: {summary}");
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

fn describe(s: &knic_e2e::fuzz::Summary) -> String {
    format!(
        "{} inputs, {} accepted, slowest {:?}",
        s.inputs, s.accepted, s.slowest
    )
}
