//! The RDMA side of a PCI function: which RDMA devices and verbs character devices it has (for
//! the pod's CDI edits), and the RDMA netlink messages that read the subsystem's network
//! namespace mode and move an RDMA device into a pod's namespace.
//!
//! In the default "shared" mode every RDMA device is usable from every network namespace, so
//! giving the pod `/dev/infiniband/uverbsN` is enough. In "exclusive" mode an RDMA device is
//! visible only in one namespace: it must move with its netdev into the pod and back
//! (`RDMA_NLDEV_CMD_SET` with the device index and a namespace fd, what `rdma dev set <dev>
//! netns <ns>` sends). The encoding is pure so it is tested byte for byte; the constants are
//! those of the kernel's uapi `rdma/rdma_netlink.h` and `linux/netlink.h`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `NETLINK_RDMA`, the netlink protocol of the RDMA subsystem (`linux/netlink.h`).
pub const NETLINK_RDMA: isize = 20;
/// `RDMA_NL_NLDEV`, the RDMA netlink client for device management.
pub const RDMA_NL_NLDEV: u16 = 5;
/// `RDMA_NLDEV_CMD_GET`: one device, or all with `NLM_F_DUMP`.
pub const RDMA_NLDEV_CMD_GET: u16 = 1;
/// `RDMA_NLDEV_CMD_SET`: change a device (name, namespace, …).
pub const RDMA_NLDEV_CMD_SET: u16 = 2;
/// `RDMA_NLDEV_CMD_SYS_GET`: subsystem settings, including the namespace mode.
pub const RDMA_NLDEV_CMD_SYS_GET: u16 = 6;
/// `RDMA_NLDEV_ATTR_DEV_INDEX` (u32).
pub const RDMA_NLDEV_ATTR_DEV_INDEX: u16 = 1;
/// `RDMA_NLDEV_ATTR_DEV_NAME` (NUL-terminated string).
pub const RDMA_NLDEV_ATTR_DEV_NAME: u16 = 2;
/// `RDMA_NLDEV_SYS_ATTR_NETNS_MODE` (u8: 1 shared, 0 exclusive).
pub const RDMA_NLDEV_SYS_ATTR_NETNS_MODE: u16 = 66;
/// `RDMA_NLDEV_NET_NS_FD` (u32 file descriptor of the target network namespace).
pub const RDMA_NLDEV_NET_NS_FD: u16 = 68;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// Character devices of RDMA, as the container sees them.
pub const DEV_DIR: &str = "/dev/infiniband";
/// The RDMA connection manager's device, needed by any `librdmacm` application.
pub const RDMA_CM: &str = "/dev/infiniband/rdma_cm";

/// `RDMA_NL_GET_TYPE(client, op)`: RDMA netlink puts the client in the message type.
pub const fn nl_type(client: u16, op: u16) -> u16 {
    (client << 10) + op
}

/// The RDMA subsystem's network namespace mode (`rdma system show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsMode {
    /// Every RDMA device is usable from every namespace (the kernel's default).
    Shared,
    /// An RDMA device lives in one namespace and must be moved with its netdev.
    Exclusive,
}

/// One RDMA device of a PCI function with its verbs character devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RdmaDevice {
    /// The RDMA device's name (`mlx5_2`).
    pub name: String,
    /// Its verbs character devices' names (`uverbs2`), found under `/dev/infiniband`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uverbs: Vec<String>,
}

/// Names in `dir`, sorted, at most `max`; a missing directory is none.
fn names(dir: &Path, max: usize) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.is_empty() && !n.starts_with('.'))
        .take(max)
        .collect();
    out.sort();
    out
}

/// The RDMA devices of the PCI function `address` under `root` (parent of `sys/`): its
/// `infiniband/<dev>` entries and `infiniband_verbs/uverbs*` character devices, matched by
/// each uverbs' `ibdev` file (or all of them when a capture has none).
pub fn devices(root: &Path, address: &str) -> Vec<RdmaDevice> {
    if !super::is_pci_address(address) {
        return Vec::new();
    }
    let function = root.join("sys/bus/pci/devices").join(address);
    let verbs_dir = function.join("infiniband_verbs");
    let verbs: Vec<(String, Option<String>)> = names(&verbs_dir, 64)
        .into_iter()
        .filter(|n| n.starts_with("uverbs") && n[6..].bytes().all(|b| b.is_ascii_digit()))
        .map(|n| {
            let ibdev = crate::bounded::read_regular(
                &verbs_dir.join(&n).join("ibdev"),
                256,
                crate::bounded::Links::Refuse,
            )
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .map(|s| s.trim().to_owned());
            (n, ibdev)
        })
        .collect();
    names(&function.join("infiniband"), 64)
        .into_iter()
        .map(|name| RdmaDevice {
            uverbs: verbs
                .iter()
                .filter(|(_, ibdev)| ibdev.as_deref().is_none_or(|d| d == name))
                .map(|(n, _)| n.clone())
                .collect(),
            name,
        })
        .collect()
}

fn header(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32) {
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
}

fn attribute(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    // Attribute payloads here are at most a few bytes; the cast cannot truncate.
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

fn finish(mut buf: Vec<u8>) -> Vec<u8> {
    let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    buf[..4].copy_from_slice(&len.to_ne_bytes());
    buf
}

/// `RDMA_NLDEV_CMD_SYS_GET`: asks for the subsystem settings (namespace mode).
pub fn sys_get_request(seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN);
    header(
        &mut buf,
        nl_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SYS_GET),
        NLM_F_REQUEST,
        seq,
    );
    finish(buf)
}

/// `RDMA_NLDEV_CMD_GET` with `NLM_F_DUMP`: every RDMA device's index and name, to find the
/// index of the device to move.
pub fn dump_devices_request(seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN);
    header(
        &mut buf,
        nl_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    finish(buf)
}

/// `RDMA_NLDEV_CMD_SET` moving device `index` into the network namespace open as `netns_fd`
/// (in the sending process), acknowledged.
pub fn set_netns_request(seq: u32, index: u32, netns_fd: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN + 16);
    header(
        &mut buf,
        nl_type(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SET),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
    );
    attribute(&mut buf, RDMA_NLDEV_ATTR_DEV_INDEX, &index.to_ne_bytes());
    attribute(&mut buf, RDMA_NLDEV_NET_NS_FD, &netns_fd.to_ne_bytes());
    finish(buf)
}

fn malformed(what: &str) -> Error {
    Error::io(
        "reading an RDMA netlink answer",
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned()),
    )
}

/// One message of an answer: its type and attributes (type → payload), or the errno of an
/// `NLMSG_ERROR` (0 is an acknowledgement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A data message.
    Data {
        /// `nlmsg_type`.
        kind: u16,
        /// Attributes in order, as (type without flags, payload).
        attributes: Vec<(u16, Vec<u8>)>,
    },
    /// An `NLMSG_ERROR`: 0 acknowledges, otherwise the positive errno.
    Error(i32),
    /// `NLMSG_DONE`, the end of a dump.
    Done,
}

/// Splits a received buffer into messages; a length that runs past the buffer is an error,
/// never a panic.
pub fn parse(mut bytes: &[u8]) -> Result<Vec<Message>> {
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    let mut out = Vec::new();
    while bytes.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if len < NLMSG_HDRLEN || len > bytes.len() {
            return Err(malformed("a message length runs past the buffer"));
        }
        let kind = u16_at(bytes, 4);
        let body = &bytes[NLMSG_HDRLEN..len];
        out.push(match kind {
            NLMSG_ERROR => {
                let code = body
                    .get(..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or_else(|| malformed("an error message without its code"))?;
                Message::Error(-code)
            }
            3 => Message::Done,
            _ => {
                let mut attributes = Vec::new();
                let mut rest = body;
                while rest.len() >= 4 {
                    let alen = u16_at(rest, 0) as usize;
                    if alen < 4 || alen > rest.len() {
                        return Err(malformed("an attribute length runs past its message"));
                    }
                    attributes.push((u16_at(rest, 2) & 0x3fff, rest[4..alen].to_vec()));
                    let padded = (alen + 3) & !3;
                    rest = rest.get(padded..).unwrap_or_default();
                }
                Message::Data { kind, attributes }
            }
        });
        let padded = (len + 3) & !3;
        bytes = bytes.get(padded..).unwrap_or_default();
    }
    Ok(out)
}

/// The namespace mode in a `SYS_GET` answer.
pub fn netns_mode(answer: &[Message]) -> Result<NetnsMode> {
    for m in answer {
        match m {
            Message::Error(errno) if *errno != 0 => {
                return Err(Error::io(
                    "reading the RDMA namespace mode",
                    std::io::Error::from_raw_os_error(*errno),
                ));
            }
            Message::Data { attributes, .. } => {
                if let Some((_, v)) = attributes
                    .iter()
                    .find(|(k, _)| *k == RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
                {
                    return match v.first() {
                        Some(0) => Ok(NetnsMode::Exclusive),
                        Some(_) => Ok(NetnsMode::Shared),
                        None => Err(malformed("an empty namespace mode attribute")),
                    };
                }
            }
            _ => {}
        }
    }
    Err(malformed("no namespace mode in the answer"))
}

/// The index of the RDMA device `name` in a `GET` dump answer.
pub fn device_index(answer: &[Message], name: &str) -> Option<u32> {
    answer.iter().find_map(|m| {
        let Message::Data { attributes, .. } = m else {
            return None;
        };
        let named = attributes.iter().any(|(k, v)| {
            *k == RDMA_NLDEV_ATTR_DEV_NAME && v.split(|b| *b == 0).next() == Some(name.as_bytes())
        });
        let (_, index) = attributes
            .iter()
            .find(|(k, _)| *k == RDMA_NLDEV_ATTR_DEV_INDEX)?;
        let bytes: [u8; 4] = index.get(..4)?.try_into().ok()?;
        named.then(|| u32::from_ne_bytes(bytes))
    })
}

/// Asks this host's kernel for the namespace mode over a `NETLINK_RDMA` socket. Fails when
/// the kernel has no RDMA core (`ib_core` not loaded: the protocol is unsupported).
pub fn query_netns_mode() -> Result<NetnsMode> {
    use netlink_sys::{Socket, SocketAddr};
    let io = |what: &str, e: std::io::Error| Error::io(format!("RDMA netlink: {what}"), e);
    let mut socket = Socket::new(NETLINK_RDMA).map_err(|e| io("opening the socket", e))?;
    socket
        .bind_auto()
        .map_err(|e| io("binding the socket", e))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(|e| io("connecting to the kernel", e))?;
    socket
        .send(&sys_get_request(1), 0)
        .map_err(|e| io("sending SYS_GET", e))?;
    let (answer, _) = socket
        .recv_from_full()
        .map_err(|e| io("receiving the answer", e))?;
    netns_mode(&parse(&answer)?)
}

/// Where RDMA devices change namespace: the kernel, or a recorder in tests. Behind `dyn` so
/// the pod networks can hold either.
pub trait RdmaNamespaces: Send + Sync + 'static {
    /// The subsystem's mode; an error means no RDMA core (nothing to move).
    fn mode(&self) -> Result<NetnsMode>;
    /// Moves the RDMA device `name` from the network namespace at `from` (where it is, and
    /// where an exclusive-mode kernel alone shows it) into the one at `to`. A device already
    /// in `to` is success, so a repeated move (a resumed attach) does not fail.
    fn move_device(&self, name: &str, from: &Path, to: &Path) -> Result<()>;
}

/// The host's RDMA subsystem over `NETLINK_RDMA`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelRdma;

impl KernelRdma {
    fn socket() -> Result<netlink_sys::Socket> {
        let io = |what: &str, e: std::io::Error| Error::io(format!("RDMA netlink: {what}"), e);
        let mut socket =
            netlink_sys::Socket::new(NETLINK_RDMA).map_err(|e| io("opening the socket", e))?;
        socket
            .bind_auto()
            .map_err(|e| io("binding the socket", e))?;
        socket
            .connect(&netlink_sys::SocketAddr::new(0, 0))
            .map_err(|e| io("connecting to the kernel", e))?;
        Ok(socket)
    }

    /// Sends `request` and collects the answer up to its end (`NLMSG_DONE`, an error or an
    /// acknowledgement, or the one answer of a plain request), at most 64 reads.
    fn exchange(request: &[u8], dump: bool) -> Result<Vec<Message>> {
        let io = |what: &str, e: std::io::Error| Error::io(format!("RDMA netlink: {what}"), e);
        let socket = Self::socket()?;
        socket
            .send(request, 0)
            .map_err(|e| io("sending a request", e))?;
        let mut out = Vec::new();
        for _ in 0..64 {
            let (bytes, _) = socket
                .recv_from_full()
                .map_err(|e| io("receiving the answer", e))?;
            let messages = parse(&bytes)?;
            let end = messages
                .iter()
                .any(|m| matches!(m, Message::Done | Message::Error(_)));
            out.extend(messages);
            if end || !dump {
                return Ok(out);
            }
        }
        Err(malformed("the answer did not end within 64 reads"))
    }
}

impl RdmaNamespaces for KernelRdma {
    fn mode(&self) -> Result<NetnsMode> {
        query_netns_mode()
    }

    fn move_device(&self, name: &str, from: &Path, to: &Path) -> Result<()> {
        use std::os::fd::AsRawFd;
        let open = |path: &Path| {
            std::fs::File::open(path)
                .map_err(|e| Error::io(format!("opening {}", path.display()), e))
        };
        let (from_ns, to_ns) = (open(from)?, open(to)?);
        // In exclusive mode the kernel shows (and moves) a device only to sockets of its own
        // namespace, so each request goes out from the namespace it is about, on a thread of
        // its own that dies with the namespace switch.
        let index_in = |ns: &std::fs::File| -> Result<Option<u32>> {
            in_netns(ns, || {
                let answer = Self::exchange(&dump_devices_request(1), true)?;
                Ok(device_index(&answer, name))
            })
        };
        let Some(index) = index_in(&from_ns)? else {
            if index_in(&to_ns)?.is_some() {
                return Ok(());
            }
            return Err(Error::io(
                format!("moving RDMA device {name}"),
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no such RDMA device in {}", from.display()),
                ),
            ));
        };
        let fd = u32::try_from(to_ns.as_raw_fd()).unwrap_or_default();
        let answer = in_netns(&from_ns, || {
            Self::exchange(&set_netns_request(2, index, fd), false)
        })?;
        match answer.first() {
            Some(Message::Error(0)) => Ok(()),
            Some(Message::Error(errno)) => Err(Error::io(
                format!("moving RDMA device {name} to {}", to.display()),
                std::io::Error::from_raw_os_error(*errno),
            )),
            _ => Err(malformed("no acknowledgement of the move")),
        }
    }
}

/// Runs `f` on a new thread that has entered the network namespace `ns` first: its sockets
/// belong to that namespace, and the switch dies with the thread.
fn in_netns<T: Send>(ns: &std::fs::File, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                    Error::io("entering a network namespace for RDMA netlink", e.into())
                })?;
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(malformed("the RDMA netlink thread panicked")))
    })
}

/// Whether `error` means the host has no RDMA core at all (so nothing can need moving).
pub fn no_rdma_core(error: &Error) -> bool {
    matches!(error, Error::Io { source, .. } if source.raw_os_error() == Some(nix::libc::EPROTONOSUPPORT))
}

#[cfg(test)]
mod tests;
