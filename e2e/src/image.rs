//! knic's image as charts/image/build.sh builds it (cargo, then buildah into an OCI archive),
//! shared by the image test (which opens the archive) and the helm install twin (which imports
//! it into the real cluster's containerd).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Why buildah cannot build here, if it cannot: missing, or unable to use a store of its own.
pub fn buildah_unusable() -> Option<String> {
    let store = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => return Some(format!("no temporary directory: {e}")),
    };
    let buildah = |args: &[&str]| {
        Command::new("buildah")
            .arg("--root")
            .arg(store.path().join("root"))
            .arg("--runroot")
            .arg(store.path().join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
    };
    let reason = match buildah(&["from", "--name", "knic-probe", "scratch"]) {
        Err(e) => Some(format!(
            "buildah is not installed ({e}); apt-get install buildah"
        )),
        Ok(out) if !out.status.success() => Some(format!(
            "buildah cannot build here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => None,
    };
    let _ = buildah(&["rm", "knic-probe"]);
    reason
}

/// An image build.sh wrote.
#[derive(Debug, Clone)]
pub struct Built {
    /// The OCI archive.
    pub archive: PathBuf,
    /// The reference it carries (the chart's default image).
    pub reference: String,
    /// How long the build took (cargo and buildah).
    pub took: Duration,
}

/// Runs `command` to its end; its stdout, or an error naming the command, status and output.
pub fn run(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `charts/image/build.sh --profile PROFILE --output ARCHIVE` with cargo's output in
/// `target_dir` (its own: the build's flags, crt-static and an explicit --target, share nothing
/// with the test build, and the running `cargo test` may hold the lock on that one).
pub fn build(profile: &str, archive: &Path, target_dir: &Path) -> anyhow::Result<Built> {
    let started = Instant::now();
    let mut command = Command::new(repo().join("charts/image/build.sh"));
    command
        .args(["--profile", profile, "--output"])
        .arg(archive)
        .env("CARGO_TARGET_DIR", target_dir);
    let stdout = run(&mut command)?;
    let lines: Vec<&str> = stdout.lines().collect();
    let [path, reference] = lines.as_slice() else {
        bail!("build.sh printed {stdout:?}, want the archive path and the reference");
    };
    ensure!(
        Path::new(path) == archive,
        "build.sh wrote {path}, not {}",
        archive.display()
    );
    Ok(Built {
        archive: archive.to_path_buf(),
        reference: (*reference).to_owned(),
        took: started.elapsed(),
    })
}
