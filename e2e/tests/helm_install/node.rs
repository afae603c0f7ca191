//! The node as the chart touches it, read from the host before the install and after the
//! uninstall: knic's files in the host directories the DaemonSet mounts, those directories
//! themselves (the kubelet makes missing hostPath directories), links, network namespaces and
//! the harness's service DNAT table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use knic_e2e::harness::ip;

/// The CDI directories a runtime reads (containerd's and CRI-O's defaults); the chart writes
/// to the first.
pub const CDI_DIRS: [&str; 2] = ["/var/run/cdi", "/etc/cdi"];

/// What the node looks like where the chart reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// knic's files: everything below `<kubelet>/plugins/knic.dev`, `knic.dev*` in the plugin
    /// registry, `knic.dev-*` CDI specs (and their temp files).
    pub files: BTreeSet<PathBuf>,
    /// The chart's hostPath directories, and whether each exists.
    pub dirs: BTreeMap<PathBuf, bool>,
    /// Host link names.
    pub links: BTreeSet<String>,
    /// Named network namespaces (`/var/run/netns`: the runtime's pod namespaces too).
    pub netns: BTreeSet<String>,
    /// `nft list table ip knic_harness`: the harness's service DNAT rules.
    pub nft: String,
}

/// The entries of `dir`, none when it does not exist.
fn entries(dir: &Path) -> anyhow::Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .collect::<std::io::Result<Vec<_>>>()
            .with_context(|| format!("listing {}", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("listing {}", dir.display())),
    }
}

/// Every file below `dir` (none when it does not exist).
fn files_below(dir: &Path, out: &mut BTreeSet<PathBuf>) -> anyhow::Result<()> {
    for entry in entries(dir)? {
        if entry.file_type()?.is_dir() {
            files_below(&entry.path(), out)?;
        } else {
            out.insert(entry.path());
        }
    }
    Ok(())
}

/// Entries of `dir` whose names start with `prefix` or `.prefix`.
fn named(dir: &Path, prefix: &str, out: &mut BTreeSet<PathBuf>) -> anyhow::Result<()> {
    for entry in entries(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) || name.starts_with(&format!(".{prefix}")) {
            out.insert(entry.path());
        }
    }
    Ok(())
}

/// The chart's hostPath directories for a kubelet rooted at `kubelet_dir` (the DaemonSet's
/// volumes with the chart's default values).
pub fn host_dirs(kubelet_dir: &Path) -> Vec<PathBuf> {
    vec![
        kubelet_dir.join("plugins/knic.dev"),
        kubelet_dir.join("plugins_registry"),
        PathBuf::from("/var/run/nri"),
        PathBuf::from(CDI_DIRS[0]),
        PathBuf::from("/var/run/netns"),
    ]
}

/// The node now.
pub fn read(kubelet_dir: &Path) -> anyhow::Result<Node> {
    let mut files = BTreeSet::new();
    files_below(&kubelet_dir.join("plugins/knic.dev"), &mut files)?;
    named(
        &kubelet_dir.join("plugins_registry"),
        "knic.dev",
        &mut files,
    )?;
    for dir in CDI_DIRS {
        named(Path::new(dir), "knic.dev-", &mut files)?;
    }
    let dirs = host_dirs(kubelet_dir)
        .into_iter()
        .map(|d| {
            let exists = d.is_dir();
            (d, exists)
        })
        .collect();
    // The pod network's bridge comes with the node's first pod (the CNI bridge plugin makes
    // it then and never removes it): on a freshly started cluster that is the release's pod,
    // but the bridge is the cluster's, not something the release left.
    let pod_network = cni_bridges();
    let links = ip(&["-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .filter(|n| !pod_network.contains(n))
        .collect();
    let netns = match std::fs::read_dir("/var/run/netns") {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => BTreeSet::new(),
    };
    Ok(Node {
        files,
        dirs,
        links,
        netns,
        nft: nft_table()?,
    })
}

/// The harness's DNAT table, as nft prints it (its rules carry no counters).
pub fn nft_table() -> anyhow::Result<String> {
    let out = std::process::Command::new("nft")
        .args(["list", "table", "ip", "knic_harness"])
        .output()
        .context("running nft")?;
    anyhow::ensure!(
        out.status.success(),
        "nft list table ip knic_harness: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes the DNAT rules `route-service` added for `vip` (it has no removal of its own): the
/// same rules it replaces when it runs again, found by their handles.
pub fn unroute(vip: &str) -> anyhow::Result<()> {
    for chain in ["services_pre", "services_out"] {
        let out = std::process::Command::new("nft")
            .args(["-a", "list", "chain", "ip", "knic_harness", chain])
            .output()
            .context("running nft")?;
        anyhow::ensure!(
            out.status.success(),
            "nft list chain {chain}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        for line in listing.lines() {
            if !line.contains(&format!("daddr {vip} ")) {
                continue;
            }
            let Some(handle) = line.rsplit("# handle ").next().filter(|h| *h != line) else {
                continue;
            };
            let out = std::process::Command::new("nft")
                .args(["delete", "rule", "ip", "knic_harness", chain, "handle"])
                .arg(handle.trim())
                .output()
                .context("running nft")?;
            anyhow::ensure!(
                out.status.success(),
                "nft delete rule {chain} handle {handle}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

/// The bridges the node's CNI configurations name (`type: bridge`, `bridge` defaulting to
/// `cni0` as the plugin does), from the harness's CNI directory and the usual one.
fn cni_bridges() -> BTreeSet<String> {
    let mut dirs = vec![PathBuf::from("/etc/cni/net.d")];
    if let Some(harness) = std::env::var_os("HARNESS_DIR") {
        dirs.push(Path::new(&harness).join("conf/cni"));
    }
    let mut out = BTreeSet::new();
    for dir in dirs {
        for entry in entries(&dir).unwrap_or_default() {
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            let plugins = match config.get("plugins").and_then(|p| p.as_array()) {
                Some(plugins) => plugins.clone(),
                None => vec![config],
            };
            for plugin in plugins.iter().filter(|p| p["type"] == "bridge") {
                out.insert(plugin["bridge"].as_str().unwrap_or("cni0").to_owned());
            }
        }
    }
    out
}

/// What differs between the node `before` the install and `after` the uninstall, as lines a
/// person can act on; empty when the node is as it was. Files, links and namespaces that were
/// there before and are gone now are not differences the release made (a leftover of an
/// earlier test the driver cleaned up); directories the kubelet made for the DaemonSet's
/// hostPath volumes are reported apart ([`made_dirs`]).
pub fn differences(before: &Node, after: &Node) -> Vec<String> {
    let mut out = Vec::new();
    for file in after.files.difference(&before.files) {
        out.push(format!("file left behind: {}", file.display()));
    }
    for link in after.links.difference(&before.links) {
        out.push(format!("link left behind: {link}"));
    }
    for ns in after.netns.difference(&before.netns) {
        out.push(format!("network namespace left behind: {ns}"));
    }
    if after.nft != before.nft {
        out.push(format!(
            "nft table ip knic_harness differs:\n--- before\n{}--- after\n{}",
            before.nft, after.nft
        ));
    }
    out
}

/// The hostPath directories that did not exist before and do now: the kubelet made them
/// (`DirectoryOrCreate`) and never removes them; each must be empty.
pub fn made_dirs(before: &Node, after: &Node) -> Vec<PathBuf> {
    after
        .dirs
        .iter()
        .filter(|(dir, exists)| **exists && !before.dirs.get(*dir).copied().unwrap_or(false))
        .map(|(dir, _)| dir.clone())
        .collect()
}

/// `ip -o link show NAME` reduced to what detach must restore: name, MTU, MAC, up or down.
pub fn link_state(name: &str) -> anyhow::Result<String> {
    let out = ip(&["-o", "link", "show", name])?;
    let fields: Vec<&str> = out.split_whitespace().collect();
    let after = |key: &str| {
        fields
            .iter()
            .position(|f| *f == key)
            .and_then(|i| fields.get(i + 1))
            .copied()
            .unwrap_or_default()
    };
    let up = out.contains(",UP") || out.contains("<UP");
    Ok(format!(
        "{name} mtu {} mac {} up {up}",
        after("mtu"),
        after("link/ether")
    ))
}
