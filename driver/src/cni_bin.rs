//! The binary's CNI roles: the plugin `knic` Multus runs, and the init container that
//! installs it on the node.

use std::path::PathBuf;

use anyhow::Context;

/// Where the driver's CNI door listens, and where the plugin asks.
const DEFAULT_CNI_SOCKET: &str = "/var/run/knic/cni.sock";

/// The binary run as the CNI plugin `knic` (the chart copies it to `/opt/cni/bin/knic`): the
/// CNI calling convention (environment and stdin, answer on stdout) leaves no room for flags,
/// so the socket comes from `KNIC_CNI_SOCKET` or the default.
pub fn plugin() -> std::process::ExitCode {
    use std::io::Read;
    let mut stdin = Vec::new();
    // A network configuration is a few hundred bytes; Multus never sends more than 1 MiB.
    if let Err(e) = std::io::stdin().take(1 << 20).read_to_end(&mut stdin) {
        eprintln!("reading the network configuration on stdin: {e}");
    }
    let socket = std::env::var_os("KNIC_CNI_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CNI_SOCKET));
    let (out, ok) =
        knic_driver::cni::plugin::run(&knic_driver::cni::plugin::environment(), &stdin, &socket);
    println!("{out}");
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

#[derive(Debug, clap::Args)]
pub struct InstallCniArgs {
    /// The node's CNI binary directory (as mounted).
    #[arg(long, default_value = "/opt/cni/bin")]
    pub dir: PathBuf,
}

/// Copies this binary to `dir/knic`, written beside and renamed, so a runtime never runs half
/// a file (the image has no shell or cp for an init container to use).
pub fn install(dir: &std::path::Path) -> anyhow::Result<()> {
    let target = dir.join(knic_proto::network::nad::CNI_TYPE);
    let temp = dir.join(".knic.tmp");
    std::fs::copy("/proc/self/exe", &temp)
        .with_context(|| format!("copying this binary to {}", temp.display()))?;
    std::fs::set_permissions(&temp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("making {} executable", temp.display()))?;
    std::fs::rename(&temp, &target)
        .with_context(|| format!("renaming {} to {}", temp.display(), target.display()))?;
    tracing::info!(plugin = %target.display(), "CNI plugin installed");
    Ok(())
}
