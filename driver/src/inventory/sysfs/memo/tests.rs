//! The memoised reader must answer exactly as the plain one, and ask the kernel once per path.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::lock;
use crate::inventory::Sysfs;

/// A tree with every shape discovery meets: relative, absolute, chained, dangling and looping
/// links, a link escaping the root, missing files, an empty file, a FIFO, a directory where a
/// file is expected, a file where a directory is expected.
fn tree(root: &Path) {
    let dev = root.join("sys/devices/pci0000:00/0000:00:03.0");
    fs::create_dir_all(dev.join("net/eth0")).unwrap();
    fs::create_dir_all(root.join("sys/class/net")).unwrap();
    fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
    fs::write(dev.join("vendor"), "0x8086\n").unwrap();
    fs::write(dev.join("numa_node"), "-1\n").unwrap();
    fs::write(dev.join("empty"), "\n").unwrap();
    fs::write(dev.join("big"), "x".repeat(10_000)).unwrap();
    fs::write(dev.join("net/eth0/mtu"), "1500\n").unwrap();
    fs::create_dir_all(dev.join("net/eth0/speed")).unwrap();
    nix::unistd::mkfifo(&dev.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    symlink("../..", dev.join("net/eth0/device")).unwrap();
    symlink("../../bus/pci/drivers/ice", dev.join("driver")).unwrap();
    symlink("/sys/class/net/eth0", root.join("sys/abs")).unwrap();
    symlink("../../../../../../../../etc", root.join("sys/escape")).unwrap();
    symlink("loop2", root.join("sys/loop1")).unwrap();
    symlink("loop1", root.join("sys/loop2")).unwrap();
    symlink("vendor", dev.join("alias")).unwrap();
    symlink(
        "../../devices/pci0000:00/0000:00:03.0/net/eth0",
        root.join("sys/class/net/eth0"),
    )
    .unwrap();
    symlink(
        "../../../devices/pci0000:00/0000:00:03.0",
        root.join("sys/bus/pci/devices/0000:00:03.0"),
    )
    .unwrap();
}

const PATHS: &[&str] = &[
    "",
    "sys",
    "sys/class/net",
    "sys/class/net/eth0",
    "sys/class/net/eth0/mtu",
    "sys/class/net/eth0/speed",
    "sys/class/net/eth0/missing",
    "sys/class/net/eth0/device",
    "sys/class/net/eth0/device/vendor",
    "sys/class/net/eth0/device/alias",
    "sys/class/net/eth0/device/numa_node",
    "sys/class/net/eth0/device/empty",
    "sys/class/net/eth0/device/big",
    "sys/class/net/eth0/device/fifo",
    "sys/class/net/eth0/device/driver",
    "sys/class/net/eth0/device/driver/module",
    "sys/class/net/eth0/device/vendor/below-a-file",
    "sys/class/net/eth0/device/net",
    "sys/class/net/eth0/device/net/eth0/../../vendor",
    "sys/bus/pci/devices/0000:00:03.0",
    "sys/bus/pci/devices/0000:00:03.0/vendor",
    "sys/abs",
    "sys/abs/mtu",
    "sys/escape",
    "sys/escape/passwd",
    "sys/loop1",
    "sys/loop1/x",
    "sys/nope/deeper",
];

/// Everything a reader says about `rel`, as text, errors included.
fn answers(sysfs: &Sysfs, rel: &str) -> String {
    let rel = Path::new(rel);
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {} {}",
        sysfs.resolve(rel),
        sysfs.try_resolve(rel),
        sysfs.link_target(rel),
        sysfs.link_name(rel),
        sysfs.try_read(rel).map_err(|e| e.to_string()),
        sysfs.read_i64(rel),
        sysfs.read_hex(rel),
        sysfs.list(rel),
        sysfs.is_dir(rel),
        sysfs.exists(rel),
    )
}

#[test]
fn inventory_sysfs_memoised_answers_as_the_plain_reader() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let fault = PathBuf::from("sys/devices/pci0000:00/0000:00:03.0/numa_node");
    let plain = Sysfs::new(dir.path()).with_fault(&fault, 22);
    // In both orders of first touch: a path first met as a prefix of another, or first met
    // itself, must answer the same.
    for order in [PATHS.to_vec(), PATHS.iter().rev().copied().collect()] {
        let memoised = plain.memoised();
        for rel in &order {
            let want = answers(&plain, rel);
            assert_eq!(answers(&memoised, rel), want, "{rel:?}");
            // Asked again, from the memo alone.
            assert_eq!(answers(&memoised, rel), want, "{rel:?} again");
        }
    }
    let memoised = plain.memoised();
    // The injected fault wins over the listing that says the file is there.
    let err = memoised.try_read(&fault).unwrap_err().to_string();
    assert!(err.ends_with("Invalid argument (os error 22)"), "{err}");
    // A FIFO is refused with the plain reader's words, without hanging.
    let err = memoised
        .try_read(Path::new("sys/class/net/eth0/device/fifo"))
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("not a regular file (it is a FIFO)"), "{err}");
    // Larger than one read chunk: read in full.
    assert_eq!(
        memoised
            .read(Path::new("sys/class/net/eth0/device/big"))
            .map(|t| t.len()),
        Some(10_000)
    );
    // Nothing outside the root is ever read.
    assert_eq!(memoised.read(Path::new("sys/escape/passwd")), None);
}

#[test]
fn inventory_sysfs_memoised_asks_the_kernel_once_per_path() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let dev = dir.path().join("sys/devices/pci0000:00/0000:00:03.0");
    for i in 0..50 {
        fs::write(dev.join(format!("attr{i}")), format!("{i}\n")).unwrap();
    }
    let memoised = Sysfs::new(dir.path()).memoised();
    let asked = || *lock(&memoised.memo.as_ref().unwrap().asked);
    for _ in 0..3 {
        for i in 0..50 {
            let rel = format!("sys/bus/pci/devices/0000:00:03.0/attr{i}");
            assert_eq!(memoised.read_i64(Path::new(&rel)), Some(i));
        }
    }
    // Listed once each: the root, sys, sys/bus, sys/bus/pci, sys/bus/pci/devices,
    // sys/devices, sys/devices/pci0000:00 and the function's directory; one link read (the
    // bus entry), however many attributes are read below it and however often.
    assert_eq!(asked(), (8, 1));
    // Contents are read afresh, but the listings are the pass's view: an entry that appears
    // later is not seen until the next pass.
    fs::write(dev.join("attr0"), "7\n").unwrap();
    fs::write(dev.join("late"), "1\n").unwrap();
    let rel = Path::new("sys/bus/pci/devices/0000:00:03.0");
    assert_eq!(memoised.read_i64(&rel.join("attr0")), Some(7));
    assert_eq!(memoised.read_i64(&rel.join("late")), None);
    assert_eq!(Sysfs::new(dir.path()).read_i64(&rel.join("late")), Some(1));
    assert_eq!(
        Sysfs::new(dir.path())
            .memoised()
            .read_i64(&rel.join("late")),
        Some(1)
    );
}

/// Everything a [`Sysfs::dir`] of `dir` says about its entry `name`, in the words of
/// [`answers`]' path-based calls for `dir/name`.
fn dir_answers(sysfs: &Sysfs, dir: &str, name: &str) -> String {
    let opened = sysfs.dir(Path::new(dir));
    let child = opened.child(name);
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {} {} {:?} {:?} {:?} {:?} {:?} {:?}",
        opened.read(name),
        opened.read_i64(name),
        opened.read_hex(name),
        opened.link_name(name),
        opened.link_target(name),
        opened.list(name),
        opened.is_dir(name),
        opened.exists(name),
        opened.names(),
        opened.resolve(name),
        (
            opened.names_with_prefix("n"),
            sysfs.list_with_prefix(Path::new(dir), "n")
        ),
        child.real(),
        child.names(),
        ["mtu", "vendor", "device", "missing"]
            .map(|file| (child.read(file), child.link_name(file))),
    )
}

fn path_answers(sysfs: &Sysfs, dir: &str, name: &str) -> String {
    let rel = Path::new(dir).join(name);
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {} {} {:?} {:?} {:?} {:?} {:?} {:?}",
        sysfs.read(&rel),
        sysfs.read_i64(&rel),
        sysfs.read_hex(&rel),
        sysfs.link_name(&rel),
        sysfs.link_target(&rel),
        sysfs.list(&rel),
        sysfs.is_dir(&rel),
        sysfs.exists(&rel),
        sysfs.list(Path::new(dir)),
        sysfs.try_resolve(&rel),
        {
            let mut n = sysfs.list(Path::new(dir));
            n.retain(|e| e.starts_with('n'));
            (n.clone(), n)
        },
        sysfs.try_resolve(&rel).as_deref(),
        sysfs.list(&rel),
        ["mtu", "vendor", "device", "missing"].map(|file| (
            sysfs.read(&rel.join(file)),
            sysfs.link_name(&rel.join(file))
        )),
    )
}

#[test]
fn inventory_sysfs_dir_answers_as_paths_do() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let names = [
        "vendor",
        "numa_node",
        "empty",
        "big",
        "fifo",
        "driver",
        "alias",
        "mtu",
        "speed",
        "device",
        "missing",
        "net",
        "eth0",
        "mtu",
        "passwd",
        "x",
        "0000:00:03.0",
    ];
    let plain = Sysfs::new(dir.path());
    let faulty = plain
        .clone()
        .with_fault("sys/devices/pci0000:00/0000:00:03.0/vendor", 22);
    for reader in [&plain, &faulty] {
        // Fresh memo per directory and shared across all: a directory first met through
        // `dir` or first listed by a path-based read must answer the same.
        let shared = reader.memoised();
        for rel in PATHS {
            for name in names {
                let want = path_answers(reader, rel, name);
                assert_eq!(dir_answers(reader, rel, name), want, "{rel:?} {name}");
                let fresh = reader.memoised();
                assert_eq!(dir_answers(&fresh, rel, name), want, "{rel:?} {name} fresh");
                assert_eq!(
                    dir_answers(&shared, rel, name),
                    want,
                    "{rel:?} {name} shared"
                );
                assert_eq!(
                    path_answers(&shared, rel, name),
                    want,
                    "{rel:?} {name} again"
                );
            }
        }
    }
}

#[test]
fn inventory_sysfs_dir_lists_once_and_reads_each_link_once() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let memoised = Sysfs::new(dir.path()).memoised();
    let asked = || *lock(&memoised.memo.as_ref().unwrap().asked);
    let rel = Path::new("sys/devices/pci0000:00/0000:00:03.0");
    let before = asked();
    for _ in 0..3 {
        let opened = memoised.dir(rel);
        assert_eq!(opened.read_hex("vendor"), Some(0x8086));
        assert_eq!(opened.link_name("driver").as_deref(), Some("ice"));
        assert_eq!(opened.real(), Some(rel));
    }
    let after = asked();
    // The root, sys, sys/devices, the root complex and the function listed once each, the
    // driver link read once, however often the directory is opened.
    assert_eq!((after.0 - before.0, after.1 - before.1), (5, 1));
}
