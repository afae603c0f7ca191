//! The fixture kernel against the real one: the pool PF is captured into a fixture tree, and
//! the same sysfs writes go to the real `/sys` (igb and igbvf answering) and to the fixture
//! kernel on that tree (`knic_driver::sriov::fixture::FixtureKernel`, which every fixture-tree
//! test of provisioning and vfio-pci relies on). Each write must get the same answer (success
//! or errno) and leave the same PCI state (the count, each VF's address, driver and override),
//! so the fixture cannot drift from what the real driver says. Runs last: it unbinds and
//! rebinds the PF's driver.

use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};
use knic_driver::inventory::Sysfs;
use knic_driver::sriov::fixture::FixtureKernel;
use knic_driver::sriov::writes::{LiveWrites, SysfsWrites};

use super::rig::{Machine, Pf};

/// The PF's subtree as fixture text (the format of `driver/tests/fixtures/sysfs/`), at its
/// real paths with its real links, so relative links resolve in the tree as on the machine.
fn capture(pf: &Pf) -> anyhow::Result<String> {
    let rel = |p: &Path| -> anyhow::Result<String> {
        Ok(p.strip_prefix("/")?.to_string_lossy().into_owned())
    };
    let link = |at: &Path| -> anyhow::Result<String> {
        Ok(format!(
            "{} -> {}",
            rel(at)?,
            std::fs::read_link(at)?.to_string_lossy()
        ))
    };
    let bus = PathBuf::from("/sys/bus/pci/devices").join(&pf.address);
    let real = std::fs::canonicalize(&bus)?;
    let mut lines = vec![
        "sys/bus/pci/devices/".to_owned(),
        link(&bus)?,
        format!("{}/", rel(&real)?),
    ];
    for file in [
        "class",
        "vendor",
        "device",
        "numa_node",
        "driver_override",
        "sriov_totalvfs",
        "sriov_numvfs",
        "sriov_offset",
        "sriov_stride",
        "sriov_vf_device",
        "sriov_drivers_autoprobe",
    ] {
        let value = std::fs::read_to_string(real.join(file))
            .with_context(|| format!("reading {file} of {}", pf.address))?;
        lines.push(format!("{}/{file} = {}", rel(&real)?, value.trim()));
    }
    lines.push(link(&real.join("driver"))?);
    for driver in ["igb", "igbvf", "vfio-pci"] {
        lines.push(format!("sys/bus/pci/drivers/{driver}/"));
    }
    lines.push(link(
        &Path::new("/sys/bus/pci/drivers/igb").join(&pf.address),
    )?);
    let net = real.join("net").join(&pf.name);
    lines.push(format!("{}/", rel(&net)?));
    for file in ["address", "ifindex", "mtu"] {
        let value = std::fs::read_to_string(net.join(file))?;
        lines.push(format!("{}/{file} = {}", rel(&net)?, value.trim()));
    }
    lines.push("sys/class/net/".to_owned());
    lines.push(link(&Path::new("/sys/class/net").join(&pf.name))?);
    Ok(lines.join("\n") + "\n")
}

/// The PCI state the two kernels are compared on.
#[derive(Debug, PartialEq, Eq)]
struct State {
    pf_driver: Option<String>,
    num_vfs: Option<String>,
    /// (index, address, driver, driver_override) per VF.
    vfs: Vec<(u32, String, Option<String>, Option<String>)>,
}

fn state(sysfs: &Sysfs, pf: &str) -> State {
    let dir = sysfs.resolve(&Path::new("sys/bus/pci/devices").join(pf));
    let mut vfs: Vec<_> = sysfs
        .list(&dir)
        .into_iter()
        .filter_map(|e| {
            let index = e.strip_prefix("virtfn")?.parse::<u32>().ok()?;
            let address = sysfs.link_name(&dir.join(&e))?;
            let vf = Path::new("sys/bus/pci/devices").join(&address);
            Some((
                index,
                address,
                sysfs.link_name(&vf.join("driver")),
                sysfs.read(&vf.join("driver_override")),
            ))
        })
        .collect();
    vfs.sort();
    State {
        pf_driver: sysfs.link_name(&dir.join("driver")),
        num_vfs: sysfs.read(&dir.join("sriov_numvfs")),
        vfs,
    }
}

/// The ifindex of VF `n`'s netdev, if it has one.
fn vf_ifindex(sysfs: &Sysfs, pf: &str, n: u32) -> Option<i64> {
    let dir = sysfs.resolve(
        &Path::new("sys/bus/pci/devices")
            .join(pf)
            .join(format!("virtfn{n}")),
    );
    let name = sysfs.list(&dir.join("net")).into_iter().next()?;
    sysfs.read_i64(&dir.join("net").join(name).join("ifindex"))
}

/// The errno of a write's error: raw from the fixture, in the text of knic's own write port
/// (which names the path: `… (os error 16)`) for the real one.
fn errno_of(e: &std::io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        let text = e.to_string();
        let at = text.rfind("(os error ")?;
        text[at + 10..].trim_end_matches(')').parse().ok()
    })
}

pub async fn fixture_kernel_answers_like_igb(m: Machine) -> anyhow::Result<()> {
    let pf = m.pool_pf().clone();
    pf.set_num_vfs(0)?;
    let tmp = tempfile::tempdir()?;
    knic_driver::inventory::fixture::materialise(&capture(&pf)?, tmp.path())?;
    let fixture = FixtureKernel::new(tmp.path(), "igbvf")?;
    fixture.load_vfio_pci()?;
    let (live, tree) = (Sysfs::new("/"), Sysfs::new(tmp.path()));
    let bdf = |n: u32| {
        knic_driver::sriov::fixture::vf_address(&pf.address, 128 + 2 * i64::from(n))
            .unwrap_or_default()
    };
    let (vf0, vf1) = (bdf(0), bdf(1));
    let numvfs = format!("sys/bus/pci/devices/{}/sriov_numvfs", pf.address);
    let autoprobe = format!("sys/bus/pci/devices/{}/sriov_drivers_autoprobe", pf.address);
    let over = |vf: &str| format!("sys/bus/pci/devices/{vf}/driver_override");
    let drv = |d: &str, op: &str| format!("sys/bus/pci/drivers/{d}/{op}");
    let probe = "sys/bus/pci/drivers_probe".to_owned();
    let steps: Vec<(String, String)> = vec![
        (numvfs.clone(), (pf.total + 1).to_string()),
        (numvfs.clone(), "2".into()),
        (numvfs.clone(), "3".into()),
        (numvfs.clone(), "70000".into()),
        (numvfs.clone(), "two".into()),
        (numvfs.clone(), "2".into()),
        (over(&vf0), "vfio-pci".into()),
        (drv("igbvf", "unbind"), vf0.clone()),
        (drv("igbvf", "unbind"), vf0.clone()),
        (probe.clone(), vf0.clone()),
        (drv("igbvf", "bind"), vf1.clone()),
        (drv("igbvf", "unbind"), vf1.clone()),
        (drv("vfio-pci", "bind"), vf1.clone()),
        (drv("igbvf", "bind"), vf1.clone()),
        (over(&vf0), "\n".into()),
        (drv("vfio-pci", "unbind"), vf0.clone()),
        (probe.clone(), vf0.clone()),
        (probe.clone(), bdf(7)),
        (numvfs.clone(), "0".into()),
        (autoprobe.clone(), "0".into()),
        (numvfs.clone(), "2".into()),
        (probe.clone(), vf0.clone()),
        (autoprobe.clone(), "1".into()),
        (drv("igb", "unbind"), pf.address.clone()),
        (numvfs.clone(), "1".into()),
        (drv("igbvf", "bind"), pf.address.clone()),
        (drv("igb", "bind"), pf.address.clone()),
        (numvfs.clone(), "0".into()),
    ];
    let mut differences = Vec::new();
    let mut ifindexes = Vec::new();
    for (n, (path, value)) in steps.iter().enumerate() {
        let real = LiveWrites.write(&live, Path::new(path), value);
        let fake = fixture.write(&tree, Path::new(path), value);
        let errno = |r: &std::io::Result<()>| r.as_ref().err().map(errno_of);
        let what = format!("step {n}: {value:?} > {path}");
        if errno(&real) != errno(&fake) {
            differences.push(format!(
                "{what}: the kernel said {real:?}, the fixture {fake:?}"
            ));
        }
        let (a, b) = (state(&live, &pf.address), state(&tree, &pf.address));
        if a != b {
            differences.push(format!("{what}: the kernel has {a:?}, the fixture {b:?}"));
        }
        ifindexes.push((
            vf_ifindex(&live, &pf.address, 0),
            vf_ifindex(&tree, &pf.address, 0),
        ));
    }
    // VF 0's netdev after its rebind to igbvf (step 16) is a new one: a new ifindex, on both.
    let (first, rebound) = (ifindexes[5], ifindexes[16]);
    ensure!(
        first.0.is_some() && rebound.0.is_some() && first.0 != rebound.0,
        "the kernel's ifindexes of VF 0: {first:?} then {rebound:?}"
    );
    if first.1.is_none() || rebound.1.is_none() || first.1 == rebound.1 {
        differences.push(format!(
            "VF 0's netdev rebound to igbvf: the kernel gave it ifindex {:?} then {:?}, the \
             fixture {:?} then {:?}",
            first.0, rebound.0, first.1, rebound.1
        ));
    }
    ensure!(
        differences.is_empty(),
        "the fixture kernel differs from the real one:\n{}",
        differences.join("\n")
    );
    Ok(())
}
