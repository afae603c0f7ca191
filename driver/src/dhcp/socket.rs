//! The client's UDP socket (port 68) inside the pod's network namespace, bound to the pod's
//! interface. A socket belongs to the namespace it was created in, so a short-lived thread
//! `setns`es into the pod's namespace, creates it and hands it back; the runtime's threads
//! never change namespace. `SO_BINDTODEVICE` keeps a pod with several interfaces from sending
//! one interface's DISCOVER out of another, and lets the limited broadcast out of an
//! interface that has no address yet. The socket is opened per exchange and closed after it:
//! an open socket would keep a deleted pod's namespace alive.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket as StdUdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::sys::socket::{setsockopt, sockopt};

use super::client::Transport;
use super::codec::MAX_MESSAGE;

/// The client port.
pub const CLIENT_PORT: u16 = 68;
/// The server port.
pub const SERVER_PORT: u16 = 67;

/// A UDP socket on port 68 of one interface in one namespace.
pub struct UdpTransport {
    socket: tokio::net::UdpSocket,
}

fn errno(what: &str, ifname: &str, e: nix::Error) -> io::Error {
    io::Error::other(format!("{what} for {ifname}: {e}"))
}

fn open_here(ifname: &str) -> io::Result<StdUdpSocket> {
    // Bound first (std binds at creation), then tied to the device: the XID and MAC filter
    // drops anything another interface's traffic could slip in between. Without
    // SO_REUSEADDR a second client on port 68 in the same pod (its own dhclient, or knic
    // renewing two interfaces at the same second) is refused with EADDRINUSE, and the
    // exchange is retried.
    let socket = StdUdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, CLIENT_PORT))
        .map_err(|e| io::Error::new(e.kind(), format!("binding UDP port 68 for {ifname}: {e}")))?;
    setsockopt(
        &socket,
        sockopt::BindToDevice,
        &std::ffi::OsString::from(ifname),
    )
    .map_err(|e| errno("SO_BINDTODEVICE", ifname, e))?;
    setsockopt(&socket, sockopt::Broadcast, &true).map_err(|e| errno("SO_BROADCAST", ifname, e))?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

impl UdpTransport {
    /// Opens the socket for `ifname` in the namespace at `netns` (`None`: the caller's own).
    pub async fn open(netns: Option<&Path>, ifname: &str) -> io::Result<Self> {
        let ifname = ifname.to_owned();
        let netns: Option<PathBuf> = netns.map(Path::to_path_buf);
        let socket = tokio::task::spawn_blocking(move || -> io::Result<StdUdpSocket> {
            match netns {
                None => open_here(&ifname),
                // A fresh thread, so no runtime thread ever changes namespace.
                Some(path) => std::thread::spawn(move || {
                    let ns = std::fs::File::open(&path).map_err(|e| {
                        io::Error::new(e.kind(), format!("opening {}: {e}", path.display()))
                    })?;
                    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(
                        |e| io::Error::other(format!("entering {}: {e}", path.display())),
                    )?;
                    open_here(&ifname)
                })
                .join()
                .map_err(|_| io::Error::other("the DHCP socket thread panicked"))?,
            }
        })
        .await
        .map_err(io::Error::other)??;
        let socket = tokio::net::UdpSocket::from_std(socket)?;
        Ok(UdpTransport { socket })
    }
}

impl Transport for UdpTransport {
    async fn send(&mut self, bytes: &[u8], to: Ipv4Addr) -> io::Result<()> {
        self.socket
            .send_to(bytes, SocketAddrV4::new(to, SERVER_PORT))
            .await
            .map(drop)
    }

    async fn recv(&mut self) -> io::Result<Vec<u8>> {
        // One byte more than accepted, so an oversized datagram is seen as such, not cut.
        let mut buf = vec![0u8; MAX_MESSAGE + 1];
        let (n, _) = self.socket.recv_from(&mut buf).await?;
        buf.truncate(n);
        Ok(buf)
    }
}
