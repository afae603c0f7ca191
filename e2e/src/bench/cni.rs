//! A CNI plugin exec'd the way a container runtime (libcni) does: `CNI_*` environment, the
//! network configuration on stdin, the result on stdout. The benchmarks time it from spawn to
//! exit, which is what a runtime waits for.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Where Debian's containernetworking-plugins and the upstream tarball put the plugins.
pub const CNI_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];

/// One plugin binary and the directory it and its IPAM plugins live in (`CNI_PATH`).
#[derive(Debug, Clone)]
pub struct Plugin {
    /// The plugin binary.
    pub path: PathBuf,
    /// `CNI_PATH`: where the plugin finds the IPAM plugin it execs.
    pub dir: PathBuf,
}

/// Which namespace, interface and container a call is about.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// `CNI_NETNS`.
    pub netns: &'a Path,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
}

impl Plugin {
    /// `name` with every plugin in `also` (its IPAM) beside it, in `KNIC_BENCH_CNI_PATH` when
    /// set, else in [`CNI_DIRS`]; the error lists the paths tried, for the skip message.
    pub fn find(name: &str, also: &[&str]) -> Result<Plugin, Vec<PathBuf>> {
        let dirs: Vec<PathBuf> = match std::env::var_os("KNIC_BENCH_CNI_PATH") {
            Some(d) => vec![PathBuf::from(d)],
            None => CNI_DIRS.iter().map(PathBuf::from).collect(),
        };
        Self::find_in(&dirs, name, also)
    }

    /// [`Plugin::find`] over explicit directories.
    pub fn find_in(dirs: &[PathBuf], name: &str, also: &[&str]) -> Result<Plugin, Vec<PathBuf>> {
        dirs.iter()
            .find(|d| d.join(name).is_file() && also.iter().all(|a| d.join(a).is_file()))
            .map(|d| Plugin {
                path: d.join(name),
                dir: d.clone(),
            })
            .ok_or_else(|| dirs.iter().map(|d| d.join(name)).collect())
    }

    /// The plugin's file name (`host-device`, `macvlan`), for messages.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Runs the plugin with `command` (`ADD`, `DEL`) on `target` with `stdin`; returns its
    /// stdout. A non-zero exit is an error carrying the plugin's output (a CNI error is JSON
    /// on stdout).
    pub fn run(&self, command: &str, target: Target<'_>, stdin: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut child = Command::new(&self.path)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", target.container_id)
            .env("CNI_NETNS", target.netns)
            .env("CNI_IFNAME", target.ifname)
            .env("CNI_PATH", &self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.path.display()))?;
        let written = child
            .stdin
            .take()
            .context("the plugin's stdin")?
            .write_all(stdin);
        // A plugin that fails before reading its configuration closes stdin: its own error,
        // on stdout, says more than the broken pipe.
        match written {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other?,
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "{} {command}: {}: {}{}",
                self.name(),
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    }

    /// The plugin's own version line (printed to stderr when run without CNI_COMMAND) and,
    /// when it comes from a Debian package, that package's version.
    pub fn about(&self) -> String {
        let own = Command::new(&self.path)
            .output()
            .ok()
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stderr).into_owned();
                text.lines().next().map(|l| l.trim().to_string())
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "version unknown".into());
        let package = Command::new("dpkg")
            .arg("-S")
            .arg(&self.path)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let name = text.split(':').next()?.trim().to_string();
                let version = Command::new("dpkg-query")
                    .args(["-W", "-f=${Version}", &name])
                    .output()
                    .ok()?;
                Some(format!(
                    "{name} {}",
                    String::from_utf8_lossy(&version.stdout).trim()
                ))
            });
        match package {
            Some(p) => format!("{own}; Debian {p}"),
            None => own,
        }
    }

    /// The line a benchmark prints about its peer: found (path, version, `CNI_PATH`) or not
    /// (the paths tried, and that only knic is measured).
    pub fn describe(found: &Result<Plugin, Vec<PathBuf>>, name: &str) -> String {
        match found {
            Ok(p) => format!(
                "{name}: {} ({}), static IPAM, CNI_PATH={}",
                p.path.display(),
                p.about(),
                p.dir.display()
            ),
            Err(tried) => format!(
                "{name} not found at {}; install Debian's containernetworking-plugins \
                 (measuring knic only)",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The IP addresses (`ips[].address`) of a CNI result.
pub fn result_ips(result: &serde_json::Value) -> Vec<&str> {
    result["ips"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["address"].as_str()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_is_found_only_with_its_ipam_beside_it() {
        let only_plugin = tempfile::tempdir().unwrap();
        let both = tempfile::tempdir().unwrap();
        std::fs::write(only_plugin.path().join("macvlan"), "").unwrap();
        std::fs::write(both.path().join("macvlan"), "").unwrap();
        std::fs::write(both.path().join("static"), "").unwrap();
        let dirs = vec![only_plugin.path().to_path_buf(), both.path().to_path_buf()];
        let found = Plugin::find_in(&dirs, "macvlan", &["static"]).unwrap();
        assert_eq!(found.dir, both.path());
        assert_eq!(found.name(), "macvlan");
        let tried = Plugin::find_in(&dirs[..1], "macvlan", &["static"]).unwrap_err();
        assert_eq!(tried, vec![only_plugin.path().join("macvlan")]);
        let line = Plugin::describe(&Err(tried), "macvlan");
        assert!(line.contains("macvlan not found at "), "{line}");
        assert!(line.ends_with("(measuring knic only)"), "{line}");
    }

    #[test]
    fn a_failing_plugin_reports_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fails");
        std::fs::write(
            &path,
            concat!(
                "#!/bin/sh\n",
                r#"echo "{\"code\":7,\"msg\":\"$CNI_COMMAND $CNI_IFNAME\"}""#,
                "\nexit 1\n"
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plugin = Plugin {
            path,
            dir: dir.path().to_path_buf(),
        };
        let target = Target {
            netns: Path::new("/nonexistent"),
            ifname: "net1",
            container_id: "knt-test",
        };
        let err = plugin.run("ADD", target, b"{}").unwrap_err().to_string();
        assert!(err.starts_with("fails ADD: exit status: 1: "), "{err}");
        assert!(err.contains(r#""msg":"ADD net1""#), "{err}");
    }

    #[test]
    fn result_ips_reads_the_addresses() {
        let result = serde_json::json!({"ips": [{"address": "192.0.2.10/24"}, {"gateway": "x"}]});
        assert_eq!(result_ips(&result), vec!["192.0.2.10/24"]);
        assert!(result_ips(&serde_json::json!({})).is_empty());
    }
}
