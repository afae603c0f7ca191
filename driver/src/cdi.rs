//! Fail-closed at container creation: no container of a pod whose claim knic prepared starts
//! without its interface, even when the NRI hook never ran (knic disconnected or restarting
//! when the sandbox started, or an event lost).
//!
//! Two guards, because NRI alone cannot promise it: the runtime does not wait for plugins, so a
//! sandbox created while knic is not connected simply starts without knic.
//! * Prepare refuses while knic is not registered with the runtime, after waiting up to
//!   [`crate::claims::RUNTIME_HOOKS_WAIT`] for it (see
//!   [`crate::claims::Preparer::with_runtime_hooks`]); the kubelet retries prepare, and the pod
//!   waits instead of starting bare. This closes the window before prepare.
//! * Every prepared device comes with a CDI device (a per-claim spec file in the runtime's CDI
//!   directory) whose only edit is a `createRuntime` OCI hook: the runtime runs
//!   `knic-driver check-interface` for every container that uses the claim, after the
//!   container's namespaces exist and before it starts. The check fails unless the interface is
//!   in the container's network namespace and up, and a failed hook fails the container's
//!   creation; the kubelet retries it. Meanwhile, when knic reconnects, the runtime's
//!   Synchronize lists the running sandbox and knic attaches what is missing
//!   ([`crate::pods::PodNetworks`]), after which the retry succeeds. This closes the window
//!   between prepare and sandbox start.
//!
//! The hook runs the driver's own binary, copied by the driver at start-up to a host path
//! under its plugin directory ([`install_hook`]), because the runtime executes hooks in the
//! host's mount namespace, where the image's files are not.

use std::path::{Path, PathBuf};

use serde_json::json;

pub mod metadata;

use crate::claims::checkpoint::PreparedClaim;
use crate::error::{Error, Result};
use crate::netns::{Kernel, Ns, Session};

/// The CDI kind of knic's devices (`vendor/class`).
pub const CDI_KIND: &str = "knic.dev/interface";

/// The subcommand the hook runs.
pub const CHECK_COMMAND: &str = "check-interface";

/// How long the runtime lets the hook run; a netlink lookup takes milliseconds.
pub const HOOK_TIMEOUT_SECONDS: u32 = 5;

/// Where CDI specs go and which binary their hooks run.
#[derive(Debug, Clone)]
pub struct CdiSpecs {
    dir: PathBuf,
    hook: PathBuf,
    metadata: Option<metadata::Metadata>,
}

impl CdiSpecs {
    /// Specs in `dir` (the runtime's, usually `/var/run/cdi`), hooks running `hook` (a host
    /// path).
    pub fn new(dir: impl Into<PathBuf>, hook: impl Into<PathBuf>) -> Self {
        CdiSpecs {
            dir: dir.into(),
            hook: hook.into(),
            metadata: None,
        }
    }

    /// Also gives containers their devices' metadata files (KEP-5304, see [`metadata`]).
    pub fn with_metadata(mut self, metadata: metadata::Metadata) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// The device metadata files, when written.
    pub fn metadata(&self) -> Option<&metadata::Metadata> {
        self.metadata.as_ref()
    }

    /// The fully qualified CDI device ID of a claim request's metadata mount.
    pub fn metadata_device_id(claim_uid: &str, request: &str) -> String {
        format!("{CDI_KIND}={claim_uid}-meta-{request}")
    }

    /// The spec file of a claim.
    pub fn path(&self, claim_uid: &str) -> PathBuf {
        self.dir.join(format!("knic.dev-{claim_uid}.json"))
    }

    /// A claim UID is part of a file name and a CDI device name: Kubernetes UIDs are RFC 4122
    /// text, so anything else (a `/`, `..`) is refused rather than turned into a path.
    fn checked(claim_uid: &str) -> Result<&str> {
        let ok = !claim_uid.is_empty()
            && claim_uid.len() <= 128
            && claim_uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if ok {
            Ok(claim_uid)
        } else {
            Err(Error::io(
                "naming a CDI spec",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "claim UID {} is not a Kubernetes UID (letters, digits and '-')",
                        crate::bounded::quote(claim_uid, 64)
                    ),
                ),
            ))
        }
    }

    /// The fully qualified CDI device ID of a claim's `index`th attachment.
    pub fn device_id(claim_uid: &str, index: usize) -> String {
        format!("{CDI_KIND}={claim_uid}-{index}")
    }

    /// The fully qualified CDI device ID of a claim's `index`th PCI function (a vfio-pci one).
    pub fn vfio_device_id(claim_uid: &str, index: usize) -> String {
        format!("{CDI_KIND}={claim_uid}-vfio-{index}")
    }

    /// Writes (or rewrites: a repeated prepare must be able to repair a spec lost in a crash)
    /// the spec of `claim`, atomically, with its metadata files first where they are written
    /// (`pod_claim_name`: the claim's annotation, known at first prepare; see
    /// [`metadata::Metadata::ensure`]). A claim with neither attachments nor vfio-pci functions
    /// gets none. Returns the requests that got a metadata device.
    pub fn write(
        &self,
        claim: &PreparedClaim,
        pod_claim_name: Option<&str>,
    ) -> Result<Vec<String>> {
        if claim.attachments.is_empty() && !claim.functions.iter().any(|f| f.vfio.is_some()) {
            return Ok(Vec::new());
        }
        Self::checked(&claim.uid)?;
        let mounts = match &self.metadata {
            Some(m) => m.ensure(claim, pod_claim_name)?,
            None => Vec::new(),
        };
        let mut spec = spec(claim, &self.hook);
        if let Some(devices) = spec["devices"].as_array_mut() {
            devices.extend(mounts.iter().map(|m| metadata_device(&claim.uid, m)));
        }
        let bytes = serde_json::to_vec_pretty(&spec)
            .map_err(|e| Error::io("encoding a CDI spec", std::io::Error::other(e)))?;
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::io(format!("creating {}", self.dir.display()), e))?;
        let path = self.path(&claim.uid);
        let tmp = self.dir.join(format!(".knic.dev-{}.json.tmp", claim.uid));
        std::fs::write(&tmp, &bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        Ok(mounts.into_iter().map(|m| m.request).collect())
    }

    /// The binary the specs' hooks run (a host path).
    pub fn hook(&self) -> &Path {
        &self.hook
    }

    /// knic's specs in the directory (finished or being written), by file name.
    pub fn knic_specs(&self) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", self.dir.display()), e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("knic.dev-") || name.starts_with(".knic.dev-") {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Removes the hook binary (and its directory, when that is left empty: [`install_hook`]
    /// made it) unless a knic spec is still in the directory: only a knic spec names the
    /// binary, and a runtime creating a container from such a spec needs it, so any knic spec,
    /// even a stale one, keeps it. Returns the specs that kept it (empty: it was removed, or
    /// was not there). For a graceful stop with nothing prepared; the next start installs it
    /// again.
    pub fn remove_unused_hook(&self) -> Result<Vec<String>> {
        let specs = self.knic_specs()?;
        if !specs.is_empty() {
            return Ok(specs);
        }
        for path in [self.hook.with_extension("tmp"), self.hook.clone()] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", path.display()), e)),
            }
        }
        if let Some(dir) = self.hook.parent() {
            // Only when empty: rmdir refuses otherwise, and a busy mount point stays too.
            let _ = std::fs::remove_dir(dir);
        }
        if let Some(m) = &self.metadata {
            // Empty with nothing prepared (unprepare removed each claim's files); rmdir
            // leaves it otherwise.
            let _ = std::fs::remove_dir(m.dir());
        }
        Ok(Vec::new())
    }

    /// Removes a claim's spec and metadata files; missing ones are fine (never written, or
    /// already removed).
    pub fn remove(&self, claim_uid: &str) -> Result<()> {
        if let Some(m) = &self.metadata {
            m.remove(Self::checked(claim_uid)?)?;
        }
        let path = self.path(Self::checked(claim_uid)?);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("removing {}", path.display()), e))
            }
            _ => Ok(()),
        }
    }
}

/// The CDI device of a request's metadata file: a read-only bind mount of it.
fn metadata_device(claim_uid: &str, mount: &metadata::Mount) -> serde_json::Value {
    json!({
        "name": format!("{claim_uid}-meta-{}", mount.request),
        "containerEdits": {
            "mounts": [{
                "hostPath": mount.host_path,
                "containerPath": mount.container_path,
                "options": ["ro", "bind"],
            }],
        },
    })
}

/// The VFIO container device every vfio-pci user opens besides its group.
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";

/// The env name suffix for a request: its base name upper-cased, `-` as `_`.
fn env_suffix(request: &str) -> String {
    request
        .split('/')
        .next()
        .unwrap_or(request)
        .chars()
        .map(|c| match c {
            'a'..='z' => c.to_ascii_uppercase(),
            'A'..='Z' | '0'..='9' => c,
            _ => '_',
        })
        .collect()
}

/// The CDI spec of a claim: one device per attachment, whose hook checks that attachment's
/// interface in the container's network namespace (plus the RDMA character devices of its
/// function), and one per vfio-pci function, which has no interface to check: its VFIO group
/// and container devices, its request's PCI addresses as `KNIC_PCI_ADDRESS_<REQUEST>` (comma
/// separated when a request has several devices), and the claim's
/// vfio addresses as `PCIDEVICE_KNIC_DEV` (the SR-IOV device plugin's convention,
/// `PCIDEVICE_<resource name>`, which KubeVirt and DPDK tooling read).
pub fn spec(claim: &PreparedClaim, hook: &Path) -> serde_json::Value {
    let vfio_addresses: Vec<&str> = claim
        .functions
        .iter()
        .filter(|f| f.vfio.is_some())
        .map(|f| f.pci_address.as_str())
        .collect();
    // One value per request, whatever the number of its devices (`count: 2`, `All`): every
    // device of a request sets the same variable, so all of them must carry all values.
    let mut vfio_by_request: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for f in claim.functions.iter().filter(|f| f.vfio.is_some()) {
        vfio_by_request
            .entry(f.request.as_str())
            .or_default()
            .push(f.pci_address.as_str());
    }
    let mut rdma_by_request: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for a in &claim.attachments {
        for f in claim.functions.iter().filter(|f| f.device == a.plan.device) {
            rdma_by_request
                .entry(a.plan.request.as_str())
                .or_default()
                .extend(f.rdma.iter().map(|r| r.name.as_str()));
        }
    }
    let mut devices: Vec<serde_json::Value> = claim
        .attachments
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let mut edits = json!({
                    "hooks": [{
                        "hookName": "createRuntime",
                        "path": hook,
                        "args": [
                            "knic-driver",
                            CHECK_COMMAND,
                            "--claim",
                            format!("{}/{}", claim.namespace, claim.name),
                            "--interface",
                            a.plan.pod_ifname,
                        ],
                        "timeout": HOOK_TIMEOUT_SECONDS,
                    }]
            });
            let rdma: Vec<&crate::sriov::rdma::RdmaDevice> = claim
                .functions
                .iter()
                .filter(|f| f.device == a.plan.device)
                .flat_map(|f| &f.rdma)
                .collect();
            if !rdma.is_empty() {
                let mut nodes: Vec<serde_json::Value> = rdma
                    .iter()
                    .flat_map(|r| &r.uverbs)
                    .map(|u| json!({"path": format!("{}/{u}", crate::sriov::rdma::DEV_DIR)}))
                    .collect();
                nodes.push(json!({"path": crate::sriov::rdma::RDMA_CM}));
                let names = rdma_by_request
                    .get(a.plan.request.as_str())
                    .map(|n| n.join(","))
                    .unwrap_or_default();
                edits["deviceNodes"] = nodes.into();
                edits["env"] = json!([format!(
                    "KNIC_RDMA_DEVICES_{}={names}",
                    env_suffix(&a.plan.request)
                )]);
            }
            json!({"name": format!("{}-{index}", claim.uid), "containerEdits": edits})
        })
        .collect();
    for (index, f) in claim.functions.iter().enumerate() {
        let Some(vfio) = &f.vfio else { continue };
        devices.push(json!({
            "name": format!("{}-vfio-{index}", claim.uid),
            "containerEdits": {
                "deviceNodes": [
                    {"path": format!("/dev/vfio/{}", vfio.group)},
                    {"path": VFIO_CONTAINER},
                ],
                "env": [
                    format!(
                        "KNIC_PCI_ADDRESS_{}={}",
                        env_suffix(&f.request),
                        vfio_by_request
                            .get(f.request.as_str())
                            .map(|a| a.join(","))
                            .unwrap_or_default()
                    ),
                    format!("PCIDEVICE_KNIC_DEV={}", vfio_addresses.join(",")),
                ],
            }
        }));
    }
    json!({
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": devices,
    })
}

/// Copies the running binary to `to` (atomically, mode 0755) so hooks can run it from the
/// host's mount namespace.
pub fn install_hook(to: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().map_err(|e| Error::io("finding the driver binary", e))?;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    let tmp = to.with_extension("tmp");
    std::fs::copy(&me, &tmp)
        .and_then(|_| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| std::fs::rename(&tmp, to))
        .map_err(|e| Error::io(format!("installing the CDI hook at {}", to.display()), e))
}

/// The process id in the OCI state a runtime passes a hook on stdin.
pub fn hook_pid(state: &str) -> Result<u32> {
    let value: serde_json::Value = serde_json::from_str(state).map_err(|e| {
        Error::io(
            "reading the OCI state on stdin",
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })?;
    value
        .get("pid")
        .and_then(serde_json::Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            Error::io(
                "reading the OCI state on stdin",
                std::io::Error::new(std::io::ErrorKind::InvalidData, "no \"pid\" in the state"),
            )
        })
}

/// The hook as the runtime runs it: the OCI state on `stdin` names the container's process,
/// whose network namespace must hold `ifname`, up.
pub async fn run_check(claim: &str, ifname: &str, stdin: &str) -> Result<()> {
    let pid = hook_pid(stdin)?;
    let ns = Ns::Pod(PathBuf::from(format!("/proc/{pid}/ns/net")));
    check_interface(&crate::netns::rtnl::Rtnl::new(None), &ns, claim, ifname).await
}

/// The hook's check: `ifname` is in the network namespace `ns` and up.
pub async fn check_interface<K: Kernel>(
    kernel: &K,
    ns: &Ns,
    claim: &str,
    ifname: &str,
) -> Result<()> {
    let missing = |why: &str| Error::InterfaceMissing {
        claim: claim.to_owned(),
        ifname: ifname.to_owned(),
        why: why.to_owned(),
    };
    let Some(mut session) = kernel.open(ns).await? else {
        return Err(missing("the container's network namespace is gone"));
    };
    match session.find_link(ifname).await? {
        Some(link) if link.up => Ok(()),
        Some(_) => Err(missing("it is in the pod but down")),
        None => Err(missing("it is not in the pod's network namespace")),
    }
}

#[cfg(test)]
pub(crate) mod pci_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::checkpoint::Attachment;
    use crate::netns::fake::{FakeKernel, plan};

    fn claim() -> PreparedClaim {
        PreparedClaim {
            network_label: None,
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
            pod_uid: "p".into(),
            pod_name: "pod".into(),
            devices: vec![],
            configs: vec![],
            prepared_at: 0,
            attachments: vec![
                Attachment::planned(plan("dev-0", "eth0", "net1", &[])),
                Attachment::planned(plan("dev-1", "eth1", "data0", &[])),
            ],
            allocations: vec![],
            functions: vec![],
        }
    }

    #[test]
    fn one_cdi_device_per_attachment_with_a_create_runtime_hook() {
        let spec = spec(
            &claim(),
            Path::new("/var/lib/kubelet/plugins/knic.dev/bin/knic-driver"),
        );
        assert_eq!(spec["kind"], "knic.dev/interface");
        assert_eq!(spec["devices"][0]["name"], "u1-0");
        assert_eq!(spec["devices"][1]["name"], "u1-1");
        let hook = &spec["devices"][1]["containerEdits"]["hooks"][0];
        assert_eq!(hook["hookName"], "createRuntime");
        assert_eq!(
            hook["args"],
            json!([
                "knic-driver",
                "check-interface",
                "--claim",
                "ns/c",
                "--interface",
                "data0"
            ])
        );
        assert_eq!(CdiSpecs::device_id("u1", 1), "knic.dev/interface=u1-1");
    }

    #[test]
    fn specs_are_written_atomically_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let specs = CdiSpecs::new(dir.path().join("cdi"), "/hook");
        specs.write(&claim(), None).expect("write");
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(specs.path("u1")).expect("read")).expect("json");
        assert_eq!(written["devices"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            std::fs::read_dir(dir.path().join("cdi"))
                .expect("dir")
                .count(),
            1
        );
        specs.remove("u1").expect("remove");
        let err = specs.remove("../etc/x").expect_err("not a UID");
        assert_eq!(
            err.to_string(),
            "naming a CDI spec: claim UID \"../etc/x\" is not a Kubernetes UID (letters, digits \
             and '-')"
        );
        specs.remove("u1").expect("a second remove is fine");
        assert!(!specs.path("u1").exists());
    }

    #[test]
    fn the_pid_comes_from_the_oci_state() {
        let state =
            r#"{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":4242,"bundle":"/b"}"#;
        assert_eq!(hook_pid(state).expect("pid"), 4242);
        let err = hook_pid(r#"{"ociVersion":"1.2.0","id":"c1"}"#).expect_err("no pid");
        assert_eq!(
            err.to_string(),
            "reading the OCI state on stdin: no \"pid\" in the state"
        );
    }

    #[tokio::test]
    async fn the_check_fails_unless_the_interface_is_there_and_up() {
        let k = FakeKernel::new();
        let pod = Ns::Pod("/proc/4242/ns/net".into());
        k.add_namespace(&pod);
        let err = check_interface(&k, &pod, "ns/c", "net1")
            .await
            .expect_err("missing");
        assert_eq!(
            err.to_string(),
            "claim ns/c: interface net1 is not configured: it is not in the pod's network \
             namespace; the container must not start without it (knic attaches it as soon as \
             its NRI plugin is connected; the kubelet retries)"
        );
        k.add_link(&pod, "net1", 1500, [2, 0, 0, 0, 0, 1], None, &[]);
        check_interface(&k, &pod, "ns/c", "net1")
            .await
            .expect("present and up");
        let gone = Ns::Pod("/proc/1/ns/none".into());
        let err = check_interface(&k, &gone, "ns/c", "net1")
            .await
            .expect_err("no namespace");
        assert!(
            err.to_string()
                .contains("the container's network namespace is gone"),
            "{err}"
        );
    }
}
