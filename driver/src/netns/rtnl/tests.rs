//! The executor against the kernel, on the process's own links (no privilege needed).

use super::*;

/// Every session has its own socket: the kernel answers a second dump on one netlink
/// socket with EBUSY while the first is unread, so sessions of pods handled at once must
/// not share one. Twelve host sessions held open together each dump (the dumps run one
/// after another: the sockets are synchronous). Reads only the process's own links, so it
/// needs no privilege.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_host_sessions_dump_at_once() {
    let kernel = Rtnl::new(None);
    let mut sessions = Vec::new();
    for _ in 0..12 {
        sessions.push(kernel.open(&Ns::Host).await.unwrap().unwrap());
    }
    let dumps = sessions.iter_mut().map(|s| s.links());
    for links in futures::future::join_all(dumps).await {
        let links = links.expect("a host session's dump failed");
        assert!(links.iter().any(|l| l.name == "lo"), "no lo in {links:?}");
    }
}

/// A lookup of a missing link is "not there", not an error; a request on a missing index
/// names the request and the kernel's errno.
#[tokio::test(flavor = "current_thread")]
async fn missing_links_and_refusals() {
    let kernel = Rtnl::new(None);
    let mut host = kernel.open(&Ns::Host).await.unwrap().unwrap();
    assert_eq!(host.find_link("knt-absent0").await.unwrap(), None);
    let lo = host.find_link("lo").await.unwrap().expect("lo");
    assert_eq!(lo.index, 1);
    let e = host
        .set_link("knt-absent0", &LinkChange::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("interface knt-absent0 does not exist"), "{e}");
    assert_eq!(kernel.requests(), 3);
}

#[test]
fn kernel_releases_compare_by_major_and_minor() {
    assert!(release_at_least("6.1.0-27-amd64", (5, 6)));
    assert!(release_at_least("5.6.0", (5, 6)));
    assert!(release_at_least("5.10.2", (5, 6)));
    assert!(!release_at_least("5.4.0-150-generic", (5, 6)));
    assert!(!release_at_least("4.18.0-553.el8_10.x86_64", (5, 6)));
    assert!(!release_at_least("", (5, 6)));
    assert!(!release_at_least("garbage", (5, 6)));
}
