//! A kernel for fixture trees: writes land in the tree, and the tree then changes the way a live
//! `/sys` would, so provisioning is tested end to end without SR-IOV hardware.
//!
//! What it reproduces, from the kernel's `drivers/pci/iov.c` and `drivers/pci/bus.c`:
//! `sriov_numvfs` refuses a count over `sriov_totalvfs` (ERANGE) and a change between two
//! non-zero counts (EBUSY); enabling creates each VF at routing ID PF + `sriov_offset` + N ×
//! `sriov_stride` with `virtfnN`/`physfn` links, a bus link, its own IOMMU group, and — unless
//! `sriov_drivers_autoprobe` is 0 — binds it to the VF driver, which creates its netdev;
//! `driver_override` is honoured by `drivers_probe`; a driver's `unbind` removes the binding
//! and the netdev. Public so the e2e tests drive a real driver process against the same trees
//! (through the same writes; the process sees only the files).

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::apply::SysfsWrites;
use crate::inventory::Sysfs;

/// The simulated kernel's knobs.
#[derive(Debug)]
pub struct FixtureKernel {
    /// The VF netdev driver VFs are bound to by default (`iavf`, `mlx5_core`).
    pub vf_driver: String,
    /// Accept `sriov_numvfs` writes but never create the VFs (a driver that fails quietly).
    pub stall: bool,
    /// Every write so far, `(root-relative path, value)`, for assertions on order.
    pub log: Mutex<Vec<(PathBuf, String)>>,
}

impl FixtureKernel {
    /// A kernel whose VFs bind to `vf_driver`.
    pub fn new(vf_driver: &str) -> Self {
        FixtureKernel {
            vf_driver: vf_driver.to_owned(),
            stall: false,
            log: Mutex::new(Vec::new()),
        }
    }

    /// The writes so far.
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl SysfsWrites for FixtureKernel {
    fn write(&self, sysfs: &Sysfs, rel: &Path, value: &str) -> io::Result<()> {
        let real = sysfs.resolve(rel);
        if let Ok(mut log) = self.log.lock() {
            log.push((real.clone(), value.to_owned()));
        }
        let root = sysfs.root();
        let name = real
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let dir = real.parent().map(Path::to_path_buf).unwrap_or_default();
        match name {
            "sriov_numvfs" => self.numvfs(sysfs, &dir, value.trim()),
            "driver_override" => {
                let text = match value.trim() {
                    "" => "(null)",
                    other => other,
                };
                fs::write(root.join(&real), format!("{text}\n"))
            }
            "unbind" => {
                let driver = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                let device = sysfs.resolve(&dir.join(value.trim()));
                if !root.join(&device).is_dir() {
                    return Err(io::Error::from_raw_os_error(nix::libc::ENODEV));
                }
                unbind(root, &device, driver)
            }
            "drivers_probe" => self.probe(sysfs, value.trim()),
            _ => fs::write(root.join(&real), value),
        }
    }
}

impl FixtureKernel {
    fn numvfs(&self, sysfs: &Sysfs, pf: &Path, value: &str) -> io::Result<()> {
        let want: u32 = value
            .parse()
            .map_err(|_| io::Error::from_raw_os_error(nix::libc::EINVAL))?;
        let total = sysfs
            .read_i64(&pf.join("sriov_totalvfs"))
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(|| io::Error::from_raw_os_error(nix::libc::ENOENT))?;
        let now = sysfs
            .read_i64(&pf.join("sriov_numvfs"))
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(0);
        if want > total {
            return Err(io::Error::from_raw_os_error(nix::libc::ERANGE));
        }
        if want == now {
            return Ok(());
        }
        if now != 0 && want != 0 {
            return Err(io::Error::from_raw_os_error(nix::libc::EBUSY));
        }
        self.set_vfs(sysfs, pf, want)?;
        fs::write(
            sysfs.root().join(pf).join("sriov_numvfs"),
            format!("{want}\n"),
        )
    }

    /// Makes the PF's VFs exist as `want` says (from none, or to none).
    fn set_vfs(&self, sysfs: &Sysfs, pf: &Path, want: u32) -> io::Result<()> {
        if want == 0 {
            for entry in sysfs.list(pf) {
                if entry.starts_with("virtfn") {
                    let vf = sysfs.resolve(&pf.join(&entry));
                    remove_vf(sysfs, pf, &entry, &vf)?;
                }
            }
        } else if !self.stall {
            let autoprobe = sysfs.read(&pf.join("sriov_drivers_autoprobe")).as_deref() != Some("0");
            for index in 0..want {
                let vf = create_vf(sysfs, pf, index)?;
                if autoprobe {
                    self.bind(sysfs, &vf, &self.vf_driver)?;
                }
            }
        }
        Ok(())
    }

    /// Answers, on a thread, the writes another process makes to the tree below `root` (a
    /// driver under test writes with [`super::apply::LiveWrites`]): a changed `sriov_numvfs`,
    /// a BDF in `drivers_probe` or in a driver's `unbind`. Files those writes need (which a
    /// live sysfs always has) are created first. Stops when the returned guard is dropped.
    pub fn serve(self: Arc<Self>, root: &Path) -> io::Result<Serving> {
        let sysfs = Sysfs::new(root);
        touch(&root.join("sys/bus/pci/drivers_probe"))?;
        for driver in sysfs.list(Path::new("sys/bus/pci/drivers")) {
            touch(&root.join("sys/bus/pci/drivers").join(driver).join("unbind"))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                self.settle(&sysfs);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        Ok(Serving {
            stop,
            thread: Some(thread),
        })
    }

    fn settle(&self, sysfs: &Sysfs) {
        let root = sysfs.root();
        let take = |path: &Path| -> Option<String> {
            let text = fs::read_to_string(path).ok()?;
            let text = text.trim().to_owned();
            if text.is_empty() {
                return None;
            }
            fs::write(path, "").ok()?;
            Some(text)
        };
        // Unbinds first: a writer unbinds before it probes, and both may be pending.
        let drivers = Path::new("sys/bus/pci/drivers");
        for driver in sysfs.list(drivers) {
            if let Some(address) = take(&root.join(drivers).join(&driver).join("unbind")) {
                let device = sysfs.resolve(&Path::new("sys/bus/pci/devices").join(address));
                let _ = unbind(root, &device, &driver);
            }
        }
        let probe = root.join("sys/bus/pci/drivers_probe");
        if let Some(address) = take(&probe) {
            let device = sysfs.resolve(&Path::new("sys/bus/pci/devices").join(&address));
            let wanted = sysfs
                .read(&device.join("driver_override"))
                .filter(|o| o != "(null)")
                .or_else(|| {
                    sysfs
                        .exists(&device.join("physfn"))
                        .then(|| self.vf_driver.clone())
                });
            let bound = sysfs.link_name(&device.join("driver"));
            if bound.is_some() && wanted.is_some() && bound != wanted {
                // Its unbind was written but not seen yet: a synchronous kernel would have
                // handled it first, so the probe waits for the next round.
                let _ = fs::write(&probe, &address);
            } else {
                let _ = self.probe(sysfs, &address);
            }
        }
        let devices = Path::new("sys/bus/pci/devices");
        for address in sysfs.list(devices) {
            let pf = sysfs.resolve(&devices.join(address));
            if !sysfs.exists(&pf.join("sriov_totalvfs")) {
                continue;
            }
            let want = sysfs
                .read_i64(&pf.join("sriov_numvfs"))
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0);
            let have = sysfs
                .list(&pf)
                .iter()
                .filter(|e| e.starts_with("virtfn"))
                .count();
            // Between two non-zero counts a live kernel refuses the write (EBUSY); a writer
            // that goes through 0, as knic does, never leaves the tree in that state.
            if (want == 0) != (have == 0) {
                let _ = self.set_vfs(sysfs, &pf, want);
            }
        }
    }

    fn probe(&self, sysfs: &Sysfs, address: &str) -> io::Result<()> {
        let device = sysfs.resolve(&Path::new("sys/bus/pci/devices").join(address));
        if !sysfs.root().join(&device).is_dir() {
            return Err(io::Error::from_raw_os_error(nix::libc::ENODEV));
        }
        if sysfs.exists(&device.join("driver")) {
            return Ok(());
        }
        let driver = match sysfs
            .read(&device.join("driver_override"))
            .filter(|o| o != "(null)")
        {
            Some(over) => over,
            None if sysfs.exists(&device.join("physfn")) => self.vf_driver.clone(),
            None => return Ok(()),
        };
        if driver != self.vf_driver
            && !sysfs.is_dir(&Path::new("sys/bus/pci/drivers").join(&driver))
        {
            // No such driver loaded: the device stays unbound, and the write succeeds.
            return Ok(());
        }
        self.bind(sysfs, &device, &driver)
    }

    fn bind(&self, sysfs: &Sysfs, device: &Path, driver: &str) -> io::Result<()> {
        let root = sysfs.root();
        let address = file_name(device);
        let drivers = PathBuf::from("sys/bus/pci/drivers").join(driver);
        fs::create_dir_all(root.join(&drivers))?;
        touch(&root.join(&drivers).join("unbind"))?;
        link(root, &drivers.join(&address), device)?;
        link(root, &device.join("driver"), &drivers)?;
        if driver != self.vf_driver {
            return Ok(());
        }
        let Some(pf) = sysfs.link_target(&device.join("physfn")) else {
            return Ok(());
        };
        let index = sysfs
            .list(&pf)
            .into_iter()
            .find(|e| {
                e.starts_with("virtfn") && sysfs.link_name(&pf.join(e)).as_deref() == Some(&address)
            })
            .and_then(|e| e["virtfn".len()..].parse::<u32>().ok())
            .unwrap_or(0);
        let base = sysfs
            .list(&pf.join("net"))
            .into_iter()
            .next()
            .map(|n| systemd_base(&n))
            .unwrap_or_else(|| "vf".to_owned());
        let name = format!("{base}v{index}");
        let net = device.join("net").join(&name);
        let files = [
            (
                "address",
                format!("02:00:00:00:{:02x}:{:02x}", index >> 8, index & 0xff),
            ),
            ("mtu", "1500".to_owned()),
            ("operstate", "down".to_owned()),
            ("type", "1".to_owned()),
            ("flags", "0x1002".to_owned()),
            ("ifindex", (1000 + index).to_string()),
        ];
        fs::create_dir_all(root.join(&net))?;
        for (file, value) in files {
            fs::write(root.join(&net).join(file), format!("{value}\n"))?;
        }
        link(root, &net.join("device"), device)?;
        fs::create_dir_all(root.join("sys/class/net"))?;
        link(root, &Path::new("sys/class/net").join(&name), &net)
    }
}

/// Stops [`FixtureKernel::serve`]'s thread when dropped.
#[derive(Debug)]
pub struct Serving {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn touch(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    if !path.exists() {
        fs::write(path, "")?;
    }
    Ok(())
}

/// `enp162s0f0np0` → `enp162s0f0`: systemd names VF netdevs after the PF's base name.
fn systemd_base(name: &str) -> String {
    match name.rfind("np") {
        Some(at) if at > 0 && name[at + 2..].bytes().all(|b| b.is_ascii_digit()) => {
            name[..at].to_owned()
        }
        _ => name.to_owned(),
    }
}

fn create_vf(sysfs: &Sysfs, pf: &Path, index: u32) -> io::Result<PathBuf> {
    let root = sysfs.root();
    let pf_address = file_name(pf);
    let offset = sysfs.read_i64(&pf.join("sriov_offset")).unwrap_or(1);
    let stride = sysfs.read_i64(&pf.join("sriov_stride")).unwrap_or(1);
    let address = vf_address(&pf_address, offset + stride * i64::from(index))
        .ok_or_else(|| io::Error::from_raw_os_error(nix::libc::EINVAL))?;
    let parent = pf.parent().map(Path::to_path_buf).unwrap_or_default();
    let vf = parent.join(&address);
    fs::create_dir_all(root.join(&vf))?;
    let copy = |file: &str| sysfs.read(&pf.join(file));
    let device = copy("sriov_vf_device").or_else(|| copy("device"));
    let files = [
        ("class", Some("0x020000".to_owned())),
        ("vendor", copy("vendor")),
        (
            "device",
            device.map(|d| {
                if d.starts_with("0x") {
                    d
                } else {
                    format!("0x{d}")
                }
            }),
        ),
        ("numa_node", copy("numa_node")),
        ("driver_override", Some("(null)".to_owned())),
    ];
    for (file, value) in files {
        if let Some(value) = value {
            fs::write(root.join(&vf).join(file), format!("{value}\n"))?;
        }
    }
    link(root, &vf.join("physfn"), pf)?;
    link(root, &pf.join(format!("virtfn{index}")), &vf)?;
    link(root, &Path::new("sys/bus/pci/devices").join(&address), &vf)?;
    let groups = Path::new("sys/kernel/iommu_groups");
    let group = (1000..)
        .find(|g: &u32| !root.join(groups).join(g.to_string()).exists())
        .unwrap_or(1000);
    let group_dir = groups.join(group.to_string());
    fs::create_dir_all(root.join(&group_dir).join("devices"))?;
    link(root, &group_dir.join("devices").join(&address), &vf)?;
    link(root, &vf.join("iommu_group"), &group_dir)?;
    Ok(vf)
}

fn remove_vf(sysfs: &Sysfs, pf: &Path, virtfn: &str, vf: &Path) -> io::Result<()> {
    let root = sysfs.root();
    if let Some(driver) = sysfs.link_name(&vf.join("driver")) {
        unbind(root, vf, &driver)?;
    }
    if let Some(group) = sysfs.link_target(&vf.join("iommu_group")) {
        let _ = fs::remove_dir_all(root.join(group));
    }
    let address = file_name(vf);
    let _ = fs::remove_file(root.join("sys/bus/pci/devices").join(&address));
    let _ = fs::remove_file(root.join(pf).join(virtfn));
    fs::remove_dir_all(root.join(vf))
}

fn unbind(root: &Path, device: &Path, driver: &str) -> io::Result<()> {
    let address = file_name(device);
    let _ = fs::remove_file(root.join("sys/bus/pci/drivers").join(driver).join(&address));
    let _ = fs::remove_file(root.join(device).join("driver"));
    let net = root.join(device).join("net");
    if let Ok(entries) = fs::read_dir(&net) {
        for entry in entries.flatten() {
            let _ = fs::remove_file(root.join("sys/class/net").join(entry.file_name()));
        }
        fs::remove_dir_all(&net)?;
    }
    Ok(())
}

/// The address of the function `delta` routing IDs after `pf` (`DDDD:BB:DD.F`).
pub fn vf_address(pf: &str, delta: i64) -> Option<String> {
    let (domain, rest) = pf.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let rid = (i64::from_str_radix(bus, 16).ok()? << 8)
        | (i64::from_str_radix(dev, 16).ok()? << 3)
        | i64::from_str_radix(func, 16).ok()?;
    let vf = rid + delta;
    (0..=0xffff).contains(&vf).then(|| {
        format!(
            "{domain}:{:02x}:{:02x}.{}",
            vf >> 8,
            (vf >> 3) & 0x1f,
            vf & 7
        )
    })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned()
}

/// A relative symlink at root-relative `at` pointing to root-relative `to`, as sysfs has them.
fn link(root: &Path, at: &Path, to: &Path) -> io::Result<()> {
    let depth = at
        .parent()
        .map(|p| {
            p.components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .count()
        })
        .unwrap_or(0);
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push(to);
    let path = root.join(at);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let _ = fs::remove_file(&path);
    std::os::unix::fs::symlink(target, path)
}
