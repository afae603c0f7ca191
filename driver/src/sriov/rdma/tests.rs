use super::*;
use crate::inventory::fixture::materialise;

const CX5: &str =
    include_str!("../../../tests/fixtures/sysfs/mellanox-cx5-pf-vfs-rdma.derived.txt");

#[test]
fn the_message_type_carries_the_nldev_client() {
    // RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op) = (5 << 10) + op.
    assert_eq!(nl_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SYS_GET), 5126);
    assert_eq!(nl_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SET), 5122);
    assert_eq!(nl_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET), 5121);
}

#[test]
fn sys_get_is_a_bare_request_header() {
    let m = sys_get_request(7);
    let mut expected = Vec::new();
    expected.extend_from_slice(&16u32.to_ne_bytes()); // nlmsg_len
    expected.extend_from_slice(&5126u16.to_ne_bytes()); // RDMA_NL_NLDEV << 10 | SYS_GET
    expected.extend_from_slice(&1u16.to_ne_bytes()); // NLM_F_REQUEST
    expected.extend_from_slice(&7u32.to_ne_bytes()); // seq
    expected.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it in
    assert_eq!(m, expected);
    let dump = dump_devices_request(8);
    assert_eq!(
        &dump[4..8],
        [&5121u16.to_ne_bytes()[..], &0x301u16.to_ne_bytes()[..]].concat()
    );
}

#[test]
fn set_netns_carries_the_device_index_and_the_namespace_fd() {
    let m = set_netns_request(9, 3, 42);
    assert_eq!(m.len(), 32);
    assert_eq!(&m[..4], 32u32.to_ne_bytes());
    assert_eq!(&m[4..6], 5122u16.to_ne_bytes());
    assert_eq!(&m[6..8], 5u16.to_ne_bytes(), "NLM_F_REQUEST | NLM_F_ACK");
    assert_eq!(&m[8..12], 9u32.to_ne_bytes());
    // RDMA_NLDEV_ATTR_DEV_INDEX (1) = 3, RDMA_NLDEV_NET_NS_FD (68) = 42, u32 each.
    let parsed = parse(&m).expect("parses");
    assert_eq!(
        parsed,
        [Message::Data {
            kind: 5122,
            attributes: vec![
                (1, 3u32.to_ne_bytes().to_vec()),
                (68, 42u32.to_ne_bytes().to_vec())
            ],
        }]
    );
    assert_eq!(&m[16..18], 8u16.to_ne_bytes());
    assert_eq!(&m[18..20], 1u16.to_ne_bytes());
    assert_eq!(&m[24..26], 8u16.to_ne_bytes());
    assert_eq!(&m[26..28], 68u16.to_ne_bytes());
}

fn answer(attributes: &[(u16, &[u8])]) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, 5126, 0, 1);
    for (k, v) in attributes {
        attribute(&mut buf, *k, v);
    }
    finish(buf)
}

#[test]
fn the_namespace_mode_is_read_from_the_sys_get_answer() {
    let exclusive = answer(&[(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, &[0])]);
    assert_eq!(
        netns_mode(&parse(&exclusive).unwrap()).unwrap(),
        NetnsMode::Exclusive
    );
    let shared = answer(&[(RDMA_NLDEV_ATTR_DEV_NAME, b"x\0"), (66, &[1])]);
    assert_eq!(
        netns_mode(&parse(&shared).unwrap()).unwrap(),
        NetnsMode::Shared
    );
    let none = answer(&[]);
    assert_eq!(
        netns_mode(&parse(&none).unwrap()).unwrap_err().to_string(),
        "reading an RDMA netlink answer: no namespace mode in the answer"
    );
    let mut cut = exclusive.clone();
    cut.truncate(18);
    cut[..4].copy_from_slice(&40u32.to_ne_bytes());
    assert_eq!(
        parse(&cut).unwrap_err().to_string(),
        "reading an RDMA netlink answer: a message length runs past the buffer"
    );
    let mut error = Vec::new();
    header(&mut error, 2, 0, 1);
    error.extend_from_slice(&(-13i32).to_ne_bytes());
    assert_eq!(parse(&finish(error)).unwrap(), [Message::Error(13)]);
}

#[test]
fn a_device_index_is_found_by_name_in_a_dump() {
    let mut dump = answer(&[(1, &0u32.to_ne_bytes()), (2, b"mlx5_0\0")]);
    dump.extend(answer(&[(1, &2u32.to_ne_bytes()), (2, b"mlx5_2\0")]));
    let messages = parse(&dump).unwrap();
    assert_eq!(device_index(&messages, "mlx5_2"), Some(2));
    assert_eq!(device_index(&messages, "mlx5_0"), Some(0));
    assert_eq!(device_index(&messages, "mlx5_9"), None);
}

#[test]
fn a_function_lists_its_rdma_devices_and_verbs() {
    let dir = tempfile::tempdir().unwrap();
    materialise(CX5, dir.path()).unwrap();
    assert_eq!(
        devices(dir.path(), "0000:3b:00.2"),
        [RdmaDevice {
            name: "mlx5_2".into(),
            uverbs: vec!["uverbs2".into()]
        }]
    );
    assert!(devices(dir.path(), "0000:3b:00.7").is_empty());
    assert!(devices(dir.path(), "../..").is_empty());
}

#[test]
fn live_namespace_mode_query() {
    match query_netns_mode() {
        // A kernel with RDMA core answers SYS_GET even without devices.
        Ok(mode) => println!("RDMA namespace mode on this host: {mode:?}"),
        Err(Error::Io { source, .. })
            if source.raw_os_error() == Some(nix::libc::EPROTONOSUPPORT) =>
        {
            println!(
                "SKIPPED: live RDMA netlink query: {source} (this kernel has no RDMA core, so no \
                 NETLINK_RDMA; the encoding is covered by the message-level tests)"
            )
        }
        Err(e) => panic!("the RDMA netlink query failed: {e}"),
    }
}

#[test]
fn requests_go_out_from_the_namespace_they_are_about() {
    // In exclusive mode the kernel answers about a device only to a socket of the device's
    // namespace: `in_netns` runs the request on a thread inside it, and leaves the caller's
    // own namespace alone.
    if !nix::unistd::Uid::effective().is_root() {
        println!("SKIPPED: requests_go_out_from_the_namespace_they_are_about needs root");
        return;
    }
    let name = format!("knt-rdma-{}", std::process::id());
    /// Deletes the namespace however the test ends.
    struct Namespace(String);
    impl Drop for Namespace {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "delete", &self.0])
                .status();
        }
    }
    let add = std::process::Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .expect("ip");
    assert!(add.success());
    let _namespace = Namespace(name.clone());
    let inode =
        |path: &str| std::fs::metadata(path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let file = std::fs::File::open(format!("/var/run/netns/{name}")).expect("netns file");
    let want = inode(&format!("/var/run/netns/{name}")).expect("inode");
    let own = inode("/proc/thread-self/ns/net").expect("own");
    let seen = in_netns(&file, || {
        Ok(inode("/proc/thread-self/ns/net").expect("inside"))
    })
    .expect("entered");
    let result = (
        want,
        own,
        seen,
        inode("/proc/thread-self/ns/net").expect("after"),
    );
    let (want, own, seen, after) = result;
    assert_eq!(seen, want, "the request ran in the pod's namespace");
    assert_ne!(seen, own);
    assert_eq!(after, own, "the caller stayed where it was");
}
