//! What every VM trial shares: the machine's emulated SR-IOV PFs (found, not assumed), why a
//! trial cannot run here, and a driver rig (the fake API, the real `knic-driver` on the real
//! `/sys`, a test kubelet and an NRI test runtime).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::nri::PodSandbox;
use knic_driver::nri::runtime::TestRuntime;
use knic_e2e::cluster::{Cluster, TestClaim};
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::harness::{Netns, eventually, ip};
use knic_e2e::kubelet::{self, ClaimId, DraVersion, Plugin, Prepared};
use serde_json::json;

/// Intel 82576 (QEMU's `igb`): the PF and its VFs' PCI ids.
pub const IGB_PF: &str = "8086:10c9";

/// `KNIC_INCLUDE` for every igb function (PFs and VFs), nothing else of the VM.
pub const IGB_ONLY: &str = "pci=8086:10c9,pci=8086:10ca";

/// One SR-IOV PF of the machine, as sysfs shows it now.
#[derive(Debug, Clone)]
pub struct Pf {
    /// `0000:01:00.0`.
    pub address: String,
    /// Its netdev (`eth0`).
    pub name: String,
    /// `sriov_totalvfs`.
    pub total: u32,
}

impl Pf {
    /// The PF's sysfs directory.
    pub fn dir(&self) -> PathBuf {
        Path::new("/sys/bus/pci/devices").join(&self.address)
    }

    /// `sriov_numvfs` as the kernel reads it now.
    pub fn num_vfs(&self) -> anyhow::Result<u32> {
        let text = std::fs::read_to_string(self.dir().join("sriov_numvfs"))?;
        Ok(text.trim().parse()?)
    }

    /// Writes `sriov_numvfs` as an admin (or a PF reset) would, through 0.
    pub fn set_num_vfs(&self, n: u32) -> anyhow::Result<()> {
        let file = self.dir().join("sriov_numvfs");
        if self.num_vfs()? != n {
            std::fs::write(&file, "0").context("writing 0 to sriov_numvfs")?;
            if n > 0 {
                std::fs::write(&file, n.to_string())
                    .with_context(|| format!("writing {n} to sriov_numvfs"))?;
            }
        }
        Ok(())
    }

    /// VF `n`'s PCI address, from the PF's `virtfnN` link.
    pub fn vf_address(&self, n: u32) -> anyhow::Result<String> {
        let link = std::fs::read_link(self.dir().join(format!("virtfn{n}")))
            .with_context(|| format!("{} has no virtfn{n}", self.address))?;
        Ok(link
            .file_name()
            .and_then(|f| f.to_str())
            .context("virtfn link without a name")?
            .to_owned())
    }

    /// The VFs' PCI addresses, by index.
    pub fn vf_addresses(&self) -> anyhow::Result<Vec<String>> {
        (0..self.num_vfs()?).map(|n| self.vf_address(n)).collect()
    }
}

/// knic's device name of a PCI function (`pci-0000-01-10-2`).
pub fn device_name(address: &str) -> String {
    format!("pci-{}", address.replace([':', '.'], "-"))
}

/// The driver a PCI function is bound to now.
pub fn driver_of(address: &str) -> Option<String> {
    let link = std::fs::read_link(
        Path::new("/sys/bus/pci/devices")
            .join(address)
            .join("driver"),
    )
    .ok()?;
    link.file_name()?.to_str().map(str::to_owned)
}

/// A PCI function's netdev in this namespace (sysfs shows a device's `net/` only in the
/// namespace that mounted it).
pub fn netdev_of(address: &str) -> Option<String> {
    let dir = Path::new("/sys/bus/pci/devices").join(address).join("net");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .next()
}

/// A PCI function's IOMMU group.
pub fn iommu_group(address: &str) -> Option<u32> {
    let link = std::fs::read_link(
        Path::new("/sys/bus/pci/devices")
            .join(address)
            .join("iommu_group"),
    )
    .ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// What the machine offers: the igb PFs with SR-IOV, sorted by address.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    pub pfs: Vec<Pf>,
}

/// What a trial needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Two igb PFs with SR-IOV and the igbvf driver.
    Sriov,
    /// That, with each VF in an IOMMU group of its own and vfio-pci loaded.
    Vfio,
    /// Soft-RoCE (rdma_rxe with its crc32 crypto) and the verbs character devices.
    Rdma,
}

impl Machine {
    /// Reads `/sys`.
    pub fn probe() -> Machine {
        let mut pfs = Vec::new();
        let bus = Path::new("/sys/bus/pci/devices");
        for entry in std::fs::read_dir(bus).into_iter().flatten().flatten() {
            let address = entry.file_name().to_string_lossy().into_owned();
            let dir = entry.path();
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let id = format!(
                "{}:{}",
                read("vendor").trim().trim_start_matches("0x"),
                read("device").trim().trim_start_matches("0x")
            );
            if id != IGB_PF || driver_of(&address).as_deref() != Some("igb") {
                continue;
            }
            let Ok(total) = read("sriov_totalvfs").trim().parse::<u32>() else {
                continue;
            };
            let Some(name) = netdev_of(&address) else {
                continue;
            };
            pfs.push(Pf {
                address,
                name,
                total,
            });
        }
        pfs.sort_by(|a, b| a.address.cmp(&b.address));
        Machine { pfs }
    }

    /// Why a trial needing `needs` cannot run here, if it cannot.
    pub fn missing(&self, needs: Needs) -> Option<String> {
        if self.pfs.len() < 2 {
            return Some(format!(
                "{} igb PF(s) with SR-IOV, 2 needed (QEMU 8+ `-machine q35 -device igb` twice, \
                 modules igb and igbvf)",
                self.pfs.len()
            ));
        }
        let loaded = |m: &str| Path::new("/sys/module").join(m).exists();
        if !Path::new("/sys/bus/pci/drivers/igbvf").exists() {
            return Some("the igbvf driver is not loaded".into());
        }
        match needs {
            Needs::Sriov => None,
            Needs::Vfio => {
                if !Path::new("/sys/bus/pci/drivers/vfio-pci").exists() {
                    return Some("the vfio-pci driver is not loaded".into());
                }
                if iommu_group(&self.pfs[1].address).is_none() {
                    return Some(
                        "PCI functions have no IOMMU group (QEMU `-device intel-iommu` first, \
                         kernel `intel_iommu=on`)"
                            .into(),
                    );
                }
                None
            }
            Needs::Rdma => {
                for m in ["rdma_rxe", "ib_uverbs", "rdma_ucm", "crc32_generic"] {
                    if !loaded(m) {
                        return Some(format!("module {m} is not loaded"));
                    }
                }
                None
            }
        }
    }

    /// The PF the pool trials change.
    pub fn pool_pf(&self) -> &Pf {
        &self.pfs[0]
    }

    /// The PF whose VFs the claim trials use.
    pub fn claim_pf(&self) -> &Pf {
        &self.pfs[1]
    }
}

/// The fake API, the real driver on the real `/sys` and, once started, a test kubelet and
/// (optionally) an NRI test runtime.
pub struct Rig {
    pub cluster: Cluster,
    pub config: DriverConfig,
    pub driver: Option<DriverProcess>,
    pub runtime: Option<TestRuntime>,
    pub plugin: Option<Plugin>,
    pub policy: PathBuf,
}

impl Rig {
    /// A rig offering the devices `include` selects (a `KNIC_INCLUDE` list), with a rescan
    /// every second.
    pub async fn new(test: &str, include: &str) -> anyhow::Result<Rig> {
        let cluster = Cluster::fake(test).await?;
        cluster.ensure_node().await?;
        let policy = cluster.tmp.path().join("sriov-policy.yaml");
        let nri = cluster.tmp.path().join("nri.sock");
        let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
            .with_env("KNIC_SYSFS_ROOT", "/")
            .with_env("KNIC_NETLINK", "true")
            .with_env("KNIC_INCLUDE", include)
            .with_env("KNIC_RESCAN_SECONDS", "1")
            .with_env("KNIC_NRI_SOCKET", nri.to_string_lossy());
        Ok(Rig {
            cluster,
            config,
            driver: None,
            runtime: None,
            plugin: None,
            policy,
        })
    }

    /// Starts the driver with `policy` (`None`: no SR-IOV policy) and the stand-in runtime,
    /// and registers the test kubelet.
    pub async fn start(&mut self, policy: Option<&str>) -> anyhow::Result<()> {
        let mut config = self.config.clone();
        if let Some(policy) = policy {
            std::fs::write(&self.policy, policy)?;
            config = config.with_env("KNIC_SRIOV_POLICY", self.policy.to_string_lossy());
        }
        self.driver = Some(DriverProcess::start(&config)?);
        self.plugin = Some(
            kubelet::register(&self.config.registry_dir)
                .await
                .with_context(|| format!("registering the driver\n{}", self.logs()))?,
        );
        Ok(())
    }

    /// Starts the driver with its own NRI test runtime (pods attach through it); a restart
    /// reuses the runtime, which accepts the new driver with `pods` in Synchronize.
    pub async fn start_with_runtime(&mut self, pods: Vec<PodSandbox>) -> anyhow::Result<()> {
        let socket = PathBuf::from(
            self.config
                .env_value("KNIC_NRI_SOCKET")
                .context("no NRI socket")?,
        );
        if self.runtime.is_none() {
            self.runtime = Some(TestRuntime::listen(&socket).await?);
        }
        let config = self.config.clone().without_stand_in_runtime();
        self.driver = Some(DriverProcess::start(&config)?);
        let runtime = self.runtime.as_mut().context("runtime")?;
        tokio::time::timeout(Duration::from_secs(60), runtime.accept(pods))
            .await
            .context("the driver never connected to the NRI runtime")??;
        self.plugin = Some(kubelet::register(&self.config.registry_dir).await?);
        Ok(())
    }

    /// SIGTERM and wait.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut driver) = self.driver.take()
            && driver.is_running()
        {
            driver.terminate().await?;
        }
        Ok(())
    }

    /// `kill -9`.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(driver) = self.driver.as_mut() {
            driver.kill9().await?;
        }
        self.driver = None;
        Ok(())
    }

    /// The driver's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.config.log_file).unwrap_or_default()
    }

    /// The published devices, by name, with their attributes as JSON.
    pub async fn devices(&self) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
        let slices = self.cluster.slices().await?;
        Ok(slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| {
                (
                    d.name.clone(),
                    serde_json::to_value(&d.attributes).unwrap_or_default(),
                )
            })
            .collect())
    }

    /// Waits until the devices published of the PF at `pf` (it and its VFs) are exactly
    /// `want` (in any order).
    pub async fn published(&self, pf: &str, want: &[String]) -> anyhow::Result<()> {
        let mut want = want.to_vec();
        want.sort();
        eventually(
            &format!("slices publish exactly {want:?} of PF {pf}"),
            Duration::from_secs(60),
            || async {
                let mut names: Vec<String> = self
                    .devices()
                    .await?
                    .into_iter()
                    .filter(|(_, a)| {
                        a["pciAddress"]["string"] == pf || a["pfPciAddress"]["string"] == pf
                    })
                    .map(|(n, _)| n)
                    .collect();
                names.sort();
                Ok((names == want).then_some(()))
            },
        )
        .await
    }

    /// A claim allocated `device`, with `config` as its `NetworkConfig` body.
    pub async fn claim(
        &self,
        name: &str,
        device: &str,
        config: Option<serde_json::Value>,
    ) -> anyhow::Result<TestClaim> {
        self.cluster
            .create_claim_with_config(name, Some(&[("knic.dev", device)]), config.map(network))
            .await
    }

    pub fn id(&self, claim: &TestClaim) -> ClaimId {
        ClaimId {
            namespace: self.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        }
    }

    fn plugin(&self) -> anyhow::Result<&Plugin> {
        self.plugin.as_ref().context("the driver is not registered")
    }

    /// `NodePrepareResources` for one claim.
    pub async fn prepare(&self, claim: &TestClaim) -> anyhow::Result<Prepared> {
        let out = self
            .plugin()?
            .prepare(DraVersion::V1, &[self.id(claim)])
            .await?;
        out.get(&claim.uid)
            .cloned()
            .context("no answer for the claim")
    }

    /// `NodeUnprepareResources` for one claim; its error text (empty: success).
    pub async fn unprepare(&self, claim: &TestClaim) -> anyhow::Result<String> {
        let out = self
            .plugin()?
            .unprepare(DraVersion::V1, &[self.id(claim)])
            .await?;
        Ok(out.get(&claim.uid).cloned().unwrap_or_default())
    }

    /// The pod sandbox of `claim`'s pod, in `netns` (`None` for a remove).
    pub fn pod(&self, claim: &TestClaim, netns: Option<&Netns>) -> PodSandbox {
        PodSandbox {
            id: format!("sandbox-{}", claim.name),
            name: format!("{}-pod", claim.name),
            uid: claim.pod_uid.clone(),
            namespace: self.cluster.namespace.clone(),
            netns: netns.map(Netns::path),
            ips: vec!["10.244.0.5".into()],
        }
    }

    pub fn runtime(&self) -> anyhow::Result<&TestRuntime> {
        self.runtime.as_ref().context("no NRI runtime")
    }

    /// The claim's CDI spec as the driver wrote it.
    pub fn cdi_spec(&self, claim: &TestClaim) -> anyhow::Result<serde_json::Value> {
        let dir = PathBuf::from(
            self.config
                .env_value("KNIC_CDI_DIR")
                .context("no CDI dir")?,
        );
        let path = dir.join(format!("knic.dev-{}.json", claim.uid));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Ends the rig: the driver stopped, the fake API's namespace gone; a failure carries the
    /// driver's log.
    pub async fn finish(mut self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let logs = self.logs();
        let stopped = self.stop().await;
        if let Some(mut runtime) = self.runtime.take() {
            runtime.shutdown().await;
        }
        let cleanup = self.cluster.cleanup().await;
        match outcome {
            Ok(()) => cleanup.and(stopped),
            Err(e) => anyhow::bail!(
                "{e:#}\n--- driver log ---\n{logs}\n--- kernel log ---\n{}",
                kernel_log()
            ),
        }
    }
}

/// A `NetworkConfig` with `body`'s fields.
pub fn network(body: serde_json::Value) -> serde_json::Value {
    let mut v = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
    if let (Some(v), Some(b)) = (v.as_object_mut(), body.as_object()) {
        v.extend(b.clone());
    }
    v
}

/// The values of `key` in the driver's JSON log lines.
pub fn log_values(logs: &str, key: &str) -> Vec<String> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get(key).and_then(|m| m.as_str()).map(str::to_owned))
        .collect()
}

/// `ip -o link show dev <pf>`'s line for VF `n` (`vf 0 link/ether … trust off`).
pub fn vf_line(pf: &str, n: u32) -> anyhow::Result<String> {
    let out = ip(&["link", "show", "dev", pf])?;
    let prefix = format!("vf {n} ");
    out.lines()
        .map(str::trim)
        .find(|l| l.starts_with(&prefix))
        .map(str::to_owned)
        .with_context(|| format!("{pf} has no VF {n}:\n{out}"))
}

/// Ensures `claim` prepared without error.
pub fn prepared(claim: &TestClaim, out: &Prepared) -> anyhow::Result<()> {
    ensure!(
        out.error.is_empty(),
        "prepare {}: {}",
        claim.name,
        out.error
    );
    Ok(())
}

/// Host links deleted on drop.
pub struct Links(pub Vec<&'static str>);

impl Drop for Links {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = ip(&["link", "del", l]);
        }
    }
}

/// The kernel's last messages (the PF driver says why it refused something there).
pub fn kernel_log() -> String {
    let out = std::process::Command::new("dmesg").output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Writes `marker` into the kernel log, for [`kernel_log_since`].
pub fn kernel_mark(marker: &str) -> anyhow::Result<()> {
    std::fs::write("/dev/kmsg", format!("knic-test: {marker}\n"))?;
    Ok(())
}

/// The kernel's messages after `marker` (see [`kernel_mark`]).
pub fn kernel_log_since(marker: &str) -> String {
    let out = std::process::Command::new("dmesg").output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let tag = format!("knic-test: {marker}");
    match text.rfind(&tag) {
        Some(at) => text[at + tag.len()..].to_owned(),
        None => text,
    }
}
