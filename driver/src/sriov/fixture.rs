//! A kernel for fixture trees: writes land in the tree, and the tree then changes the way a live
//! `/sys` would, so SR-IOV provisioning and vfio-pci binding are tested end to end without
//! hardware, through the same [`SysfsWrites`] port the driver uses on a live node.
//!
//! Every write first lands through [`LiveWrites`] (so a missing attribute or a FIFO fails
//! exactly as on a live node), then the fixture does what the kernel would, after
//! `drivers/pci/iov.c` and `drivers/base/bus.c`:
//! - `sriov_numvfs` takes what `kstrtou16` takes (else EINVAL, also above 65535), refuses a
//!   count over `sriov_totalvfs` (ERANGE), a change of a PF without a driver (ENOENT) and a
//!   change between two non-zero counts (EBUSY); enabling creates each VF at routing ID PF +
//!   `sriov_offset` + N × `sriov_stride` with `virtfnN`/`physfn` links, a bus link, its own
//!   IOMMU group, and — unless `sriov_drivers_autoprobe` is 0 — binds it to the VF driver,
//!   which creates its netdev (a new ifindex each time, as the kernel allocates them);
//!   disabling removes them;
//! - `driver_override` reads back `(null)` once cleared;
//! - `drivers/<d>/unbind` (ENODEV unless bound to `d`) removes the binding and the netdev; a
//!   PF's driver disables SR-IOV as it goes (its VFs vanish, `sriov_numvfs` reads 0);
//!   `drivers/<d>/bind` binds a function `d` matches (ENODEV otherwise: an override naming
//!   another driver, vfio-pci without one, a VF driver on a PF), EBUSY when it is bound;
//! - `drivers_probe` binds an unbound function to its override, else the driver it had when
//!   the fixture started (the kernel's id-table match), else, for a VF, the VF driver; a driver
//!   that is not loaded or whose probes are refused ([`FixtureKernel::refuse_probes_by`])
//!   leaves it unbound and the write succeeds, as a failed probe does.
//!
//! Public so the e2e tests drive a real driver process against the same trees
//! ([`FixtureKernel::serve`]: the process sees only the files).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::is_pci_address;
use super::writes::{LiveWrites, SysfsWrites};
use crate::inventory::Sysfs;

const DEVICES: &str = "sys/bus/pci/devices";
const DRIVERS: &str = "sys/bus/pci/drivers";
const PROBE: &str = "sys/bus/pci/drivers_probe";

/// The simulated kernel of one fixture tree.
#[derive(Debug)]
pub struct FixtureKernel {
    /// The tree it was started on (what [`FixtureKernel::serve`] watches).
    sysfs: Sysfs,
    /// The VF netdev driver VFs are bound to by default (`iavf`, `mlx5_core`).
    vf_driver: String,
    /// Accept `sriov_numvfs` writes but never create the VFs (a driver that fails quietly).
    stall: bool,
    /// The driver each function had at start: what a probe without override binds it to.
    native: BTreeMap<String, String>,
    /// Drivers whose probe fails (the function stays unbound), for the error paths.
    refusing: Mutex<BTreeSet<String>>,
    /// Every write, `(root-relative path as written, value)`, for assertions on order.
    log: Mutex<Vec<(PathBuf, String)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl FixtureKernel {
    /// Takes over the tree at `root`, whose VFs bind to `vf_driver`: records each function's
    /// driver and creates the write-only attributes a capture has no content for
    /// (`drivers/*/bind`, `drivers/*/unbind`, `drivers_probe`), which a live sysfs always has.
    pub fn new(root: &Path, vf_driver: &str) -> io::Result<Self> {
        let sysfs = Sysfs::new(root);
        let native = sysfs
            .list(Path::new(DEVICES))
            .into_iter()
            .filter_map(|address| {
                let driver = sysfs.link_name(&Path::new(DEVICES).join(&address).join("driver"))?;
                Some((address, driver))
            })
            .collect();
        let kernel = FixtureKernel {
            sysfs,
            vf_driver: vf_driver.to_owned(),
            stall: false,
            native,
            refusing: Mutex::default(),
            log: Mutex::default(),
        };
        kernel.attributes()?;
        Ok(kernel)
    }

    /// From now on `sriov_numvfs` writes are accepted but create no VFs.
    pub fn stalling(mut self) -> Self {
        self.stall = true;
        self
    }

    /// The root of the tree it simulates.
    pub fn root(&self) -> &Path {
        self.sysfs.root()
    }

    /// `modprobe vfio-pci`: the driver directory appears with its attributes.
    pub fn load_vfio_pci(&self) -> io::Result<()> {
        driver_attributes(self.root(), "vfio-pci")
    }

    /// From now on probes by `driver` fail, leaving the function unbound.
    pub fn refuse_probes_by(&self, driver: &str) {
        lock(&self.refusing).insert(driver.to_owned());
    }

    /// Every write so far, `(root-relative path as written, value)`.
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        lock(&self.log).clone()
    }

    fn attributes(&self) -> io::Result<()> {
        touch(&self.root().join(PROBE))?;
        for driver in self.sysfs.list(Path::new(DRIVERS)) {
            if self.sysfs.is_dir(&Path::new(DRIVERS).join(&driver)) {
                driver_attributes(self.root(), &driver)?;
            }
        }
        Ok(())
    }
}

impl SysfsWrites for FixtureKernel {
    fn write(&self, sysfs: &Sysfs, rel: &Path, value: &str) -> io::Result<()> {
        lock(&self.log).push((rel.to_path_buf(), value.to_owned()));
        // What the attribute held before: a refused `sriov_numvfs` write keeps it.
        let before = sysfs.try_resolve(rel).and_then(|real| sysfs.read(&real));
        LiveWrites.write(sysfs, rel, value)?;
        let real = sysfs.resolve(rel);
        let path = sysfs.root().join(&real);
        let name = file_name(&real);
        let dir = real.parent().map(Path::to_path_buf).unwrap_or_default();
        let value = value.trim();
        match name.as_str() {
            "sriov_numvfs" => {
                let answer = self.numvfs(sysfs, &dir, value, before.as_deref());
                if answer.is_err() {
                    fs::write(&path, format!("{}\n", before.unwrap_or_default()))?;
                }
                answer
            }
            "driver_override" if value.is_empty() => fs::write(&path, "(null)\n"),
            "bind" | "unbind" if dir.parent() == Some(Path::new(DRIVERS)) => {
                // Write-only in the kernel: nothing stays behind to read.
                fs::write(&path, "")?;
                let driver = file_name(&dir);
                match name.as_str() {
                    "bind" => self.bind_request(sysfs, &driver, value),
                    _ => self.unbind_request(sysfs, &driver, value),
                }
            }
            _ if real == Path::new(PROBE) => {
                fs::write(&path, "")?;
                self.probe(sysfs, value)
            }
            _ => Ok(()),
        }
    }
}

impl FixtureKernel {
    /// A `sriov_numvfs` write of `value` to the PF at `pf`, which held `before`.
    fn numvfs(
        &self,
        sysfs: &Sysfs,
        pf: &Path,
        value: &str,
        before: Option<&str>,
    ) -> io::Result<()> {
        let want = u32::from(kstrtou16(value).ok_or_else(|| errno(nix::libc::EINVAL))?);
        let total = sysfs
            .read_i64(&pf.join("sriov_totalvfs"))
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(|| errno(nix::libc::ENOENT))?;
        let now: u32 = before.and_then(|b| b.parse().ok()).unwrap_or(0);
        if want > total {
            return Err(errno(nix::libc::ERANGE));
        }
        if want != now && !sysfs.exists(&pf.join("driver")) {
            // "no driver bound to device; cannot configure SR-IOV"
            return Err(errno(nix::libc::ENOENT));
        }
        if now != 0 && want != 0 && want != now {
            return Err(errno(nix::libc::EBUSY));
        }
        if want != now {
            self.set_vfs(sysfs, pf, want)?;
        }
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
                    self.attach(sysfs, &vf, &self.vf_driver)?;
                }
            }
        }
        Ok(())
    }

    /// The root-relative real directory of the function `address`; ENODEV, as the kernel
    /// answers a name it has no device for, when there is none.
    fn device(sysfs: &Sysfs, address: &str) -> io::Result<PathBuf> {
        if !is_pci_address(address) {
            return Err(errno(nix::libc::ENODEV));
        }
        let device = sysfs.resolve(&Path::new(DEVICES).join(address));
        if !sysfs.is_dir(&device) {
            return Err(errno(nix::libc::ENODEV));
        }
        Ok(device)
    }

    fn unbind_request(&self, sysfs: &Sysfs, driver: &str, address: &str) -> io::Result<()> {
        let device = Self::device(sysfs, address)?;
        if sysfs.link_name(&device.join("driver")).as_deref() != Some(driver) {
            return Err(errno(nix::libc::ENODEV));
        }
        // A PF's driver disables SR-IOV in its remove (igb: "IOV Disabled"): the VFs go.
        if sysfs.list(&device).iter().any(|e| e.starts_with("virtfn")) {
            self.set_vfs(sysfs, &device, 0)?;
            fs::write(sysfs.root().join(&device).join("sriov_numvfs"), "0\n")?;
        }
        unbind(sysfs.root(), &device, driver)
    }

    /// `bind_store`: ENODEV unless `driver` matches the function, then EBUSY if it is bound.
    fn bind_request(&self, sysfs: &Sysfs, driver: &str, address: &str) -> io::Result<()> {
        let device = Self::device(sysfs, address)?;
        if !self.matches(sysfs, &device, driver) {
            return Err(errno(nix::libc::ENODEV));
        }
        if sysfs.exists(&device.join("driver")) {
            return Err(errno(nix::libc::EBUSY));
        }
        self.attach(sysfs, &device, driver)
    }

    /// `pci_bus_match`: an override names the one driver that may take the function;
    /// without one, a driver whose id table has it (here: the driver it had at start, or, for
    /// a VF, the VF driver; vfio-pci has no table).
    fn matches(&self, sysfs: &Sysfs, device: &Path, driver: &str) -> bool {
        if let Some(over) = sysfs
            .read(&device.join("driver_override"))
            .filter(|o| o != "(null)")
        {
            return over == driver;
        }
        self.native.get(&file_name(device)).map(String::as_str) == Some(driver)
            || (driver == self.vf_driver && sysfs.exists(&device.join("physfn")))
    }

    /// The driver a probe binds the function to: its override, else its driver at start, else
    /// (a VF) the VF driver.
    fn wanted(&self, sysfs: &Sysfs, device: &Path) -> Option<String> {
        sysfs
            .read(&device.join("driver_override"))
            .filter(|o| o != "(null)")
            .or_else(|| self.native.get(&file_name(device)).cloned())
            .or_else(|| {
                sysfs
                    .exists(&device.join("physfn"))
                    .then(|| self.vf_driver.clone())
            })
    }

    fn probe(&self, sysfs: &Sysfs, address: &str) -> io::Result<()> {
        let device = Self::device(sysfs, address)?;
        if sysfs.exists(&device.join("driver")) {
            return Ok(());
        }
        // `pci_device_can_probe`: a VF whose PF has `sriov_drivers_autoprobe` 0 is probed only
        // with a `driver_override`.
        let overridden = sysfs
            .read(&device.join("driver_override"))
            .is_some_and(|o| o != "(null)");
        let autoprobe_off = sysfs.link_target(&device.join("physfn")).is_some_and(|pf| {
            sysfs.read(&pf.join("sriov_drivers_autoprobe")).as_deref() == Some("0")
        });
        if autoprobe_off && !overridden {
            return Ok(());
        }
        match self.wanted(sysfs, &device) {
            Some(driver) => self.attach(sysfs, &device, &driver),
            None => Ok(()),
        }
    }

    /// A probe of `device` by `driver`: it binds unless the driver is not loaded (the VF
    /// driver always is) or refuses; either way the function stays unbound and the write that
    /// asked succeeds, as with a real probe error.
    fn attach(&self, sysfs: &Sysfs, device: &Path, driver: &str) -> io::Result<()> {
        if lock(&self.refusing).contains(driver) {
            return Ok(());
        }
        if driver != self.vf_driver && !sysfs.is_dir(&Path::new(DRIVERS).join(driver)) {
            return Ok(());
        }
        self.bind(sysfs, device, driver)
    }

    /// Answers, on a thread, the writes another process makes to the tree (a driver under test
    /// writes with [`LiveWrites`]): a changed `sriov_numvfs`, a BDF in `drivers_probe` or in a
    /// driver's `bind` or `unbind`. Stops when the returned guard is dropped.
    pub fn serve(self: Arc<Self>) -> io::Result<Serving> {
        self.attributes()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                self.settle(&self.sysfs);
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
        let drivers = Path::new(DRIVERS);
        for driver in sysfs.list(drivers) {
            if let Some(address) = take(&root.join(drivers).join(&driver).join("unbind")) {
                let _ = self.unbind_request(sysfs, &driver, &address);
            }
            if let Some(address) = take(&root.join(drivers).join(&driver).join("bind")) {
                let _ = self.bind_request(sysfs, &driver, &address);
            }
        }
        let probe = root.join(PROBE);
        if let Some(address) = take(&probe) {
            let pending = Self::device(sysfs, &address).ok().is_some_and(|device| {
                let bound = sysfs.link_name(&device.join("driver"));
                let wanted = self.wanted(sysfs, &device);
                bound.is_some() && wanted.is_some() && bound != wanted
            });
            if pending {
                // Its unbind was written but not seen yet: a synchronous kernel would have
                // handled it first, so the probe waits for the next round.
                let _ = fs::write(&probe, &address);
            } else {
                let _ = self.probe(sysfs, &address);
            }
        }
        let devices = Path::new(DEVICES);
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

    fn bind(&self, sysfs: &Sysfs, device: &Path, driver: &str) -> io::Result<()> {
        let root = sysfs.root();
        let address = file_name(device);
        let drivers = Path::new(DRIVERS).join(driver);
        driver_attributes(root, driver)?;
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
            ("ifindex", next_ifindex(sysfs).to_string()),
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

/// `kstrtou16(buf, 0, …)`: decimal, `0x` hex or `0` octal, one trailing newline allowed; the
/// kernel answers anything else (and anything above 65535) with EINVAL here.
fn kstrtou16(text: &str) -> Option<u16> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    let (digits, radix) =
        if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
            (hex, 16)
        } else if text.len() > 1 && text.starts_with('0') {
            (&text[1..], 8)
        } else {
            (text, 10)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u16::from_str_radix(digits, radix).ok()
}

/// The ifindex of a new netdev: past every one the tree has, as the kernel never hands out
/// one again while it runs (a rebound VF's netdev has a new one).
fn next_ifindex(sysfs: &Sysfs) -> i64 {
    let net = Path::new("sys/class/net");
    sysfs
        .list(net)
        .iter()
        .filter_map(|n| sysfs.read_i64(&net.join(n).join("ifindex")))
        .chain(std::iter::once(999))
        .max()
        .unwrap_or(999)
        + 1
}

/// A loaded driver's directory with the attributes writers use.
fn driver_attributes(root: &Path, driver: &str) -> io::Result<()> {
    let dir = root.join(DRIVERS).join(driver);
    fs::create_dir_all(&dir)?;
    touch(&dir.join("bind"))?;
    touch(&dir.join("unbind"))
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

/// A symlink at root-relative `at` to root-relative `to`, relative and shortest, as the kernel
/// makes them (`../../../../bus/pci/drivers/vfio-pci`).
fn link(root: &Path, at: &Path, to: &Path) -> io::Result<()> {
    let from: Vec<Component<'_>> = at
        .parent()
        .map(|p| p.components().collect())
        .unwrap_or_default();
    let to: Vec<Component<'_>> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(x, y)| x == y).count();
    let mut target = PathBuf::new();
    for _ in common..from.len() {
        target.push("..");
    }
    for c in &to[common..] {
        target.push(c);
    }
    let path = root.join(at);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let _ = fs::remove_file(&path);
    std::os::unix::fs::symlink(target, path)
}

#[cfg(test)]
mod tests;
