//! One rtnetlink socket, used synchronously.
//!
//! The kernel runs an rtnetlink request inside the `sendmsg` that carries it and queues the
//! answer before that call returns (a dump's later parts are produced inside `recvmsg`), so the
//! answer is always there when it is read: a request is a send and a receive, with no runtime
//! task, channel or wake-up in between. (The async `rtnetlink` connection spent 10–20 µs more
//! per request on those, and a thread of its own per namespace before that: most of knic's
//! cost above the kernel's.) The calling thread blocks only where the kernel makes every
//! caller wait — on RTNL, which a namespace move holds for ~16 ms (`rcu_barrier`) — as the
//! async connection's task blocked its worker thread there too (a move itself first hands the
//! worker's other tasks to another thread, see `rtnl::blocking`).
//!
//! Nothing here awaits, so a session cannot be cancelled half-way through a dump and leave
//! unread answers on its socket.

use std::io;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkBuffer, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_ROUTE;

/// How long a receive waits before the request is reported as unanswered. The kernel answers
/// before `sendmsg` returns, so this only bounds what should never happen.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A request the kernel refused: its errno and, where the kernel says more (extended ack),
/// its message.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub errno: i32,
    pub message: Option<String>,
}

impl Refusal {
    pub(crate) fn to_io(&self) -> io::Error {
        let os = io::Error::from_raw_os_error(self.errno);
        match &self.message {
            Some(m) => io::Error::new(os.kind(), format!("{os}: {m}")),
            None => os,
        }
    }
}

/// An exchange's failure: the transport (socket, parse, timeout) or the kernel's refusal.
#[derive(Debug)]
pub(crate) enum Failure {
    Io(io::Error),
    Refused(Refusal),
}

impl Failure {
    /// The kernel's errno, if the kernel refused.
    pub(crate) fn errno(&self) -> Option<i32> {
        match self {
            Failure::Refused(r) => Some(r.errno),
            Failure::Io(_) => None,
        }
    }

    pub(crate) fn into_io(self) -> io::Error {
        match self {
            Failure::Io(e) => e,
            Failure::Refused(r) => r.to_io(),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

/// A synchronous rtnetlink socket in the namespace of the thread that opened it.
pub(crate) struct Wire {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl Wire {
    /// A socket in the calling thread's network namespace (it stays there for its life).
    pub(crate) fn open() -> io::Result<Wire> {
        let socket = Socket::new(NETLINK_ROUTE)?;
        // The kernel's reason for a refusal ("MTU greater than device maximum"), and acks
        // without a copy of the request.
        socket.set_ext_ack(true)?;
        socket.set_cap_ack(true)?;
        let timeout =
            nix::sys::time::TimeVal::new(i64::try_from(ANSWER_TIMEOUT.as_secs()).unwrap_or(10), 0);
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(io::Error::from)?;
        Ok(Wire {
            socket,
            sequence: 0,
            buf: Vec::with_capacity(32 * 1024),
        })
    }

    /// Sends every request in one `sendmsg` (the kernel handles them in order, each with its
    /// own answer, also after one fails) and returns each one's replies or refusal. Dumps
    /// must go alone through [`Wire::dump`]: a dump's answer would interleave with the others.
    pub(crate) fn requests(
        &mut self,
        requests: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> io::Result<Vec<Result<Vec<RouteNetlinkMessage>, Refusal>>> {
        let count = requests.len();
        if count == 0 {
            return Ok(Vec::new());
        }
        let first = self.sequence.wrapping_add(1);
        let mut out = Vec::new();
        for mut request in requests {
            self.sequence = self.sequence.wrapping_add(1);
            request.header.sequence_number = self.sequence;
            request.header.flags |= NLM_F_REQUEST | NLM_F_ACK;
            request.header.flags &= !NLM_F_DUMP;
            request.finalize();
            let start = out.len();
            out.resize(start + request.buffer_len(), 0);
            request.serialize(&mut out[start..]);
        }
        self.send(&out)?;
        let mut answers: Vec<Option<Result<Vec<RouteNetlinkMessage>, Refusal>>> =
            (0..count).map(|_| None).collect();
        let mut replies: Vec<Vec<RouteNetlinkMessage>> = (0..count).map(|_| Vec::new()).collect();
        let mut open = count;
        while open > 0 {
            self.receive()?;
            for message in parse(&self.buf)? {
                let at = message.header.sequence_number.wrapping_sub(first) as usize;
                if at >= count || answers[at].is_some() {
                    continue; // not ours (a stale answer) or after its end
                }
                match message.payload {
                    NetlinkPayload::InnerMessage(m) => replies[at].push(m),
                    NetlinkPayload::Error(e) => {
                        answers[at] = Some(match e.code {
                            None => Ok(std::mem::take(&mut replies[at])),
                            Some(code) => Err(refusal(code.get(), &e.header)),
                        });
                        open -= 1;
                    }
                    _ => {}
                }
            }
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// One request and its replies.
    pub(crate) fn request(
        &mut self,
        request: NetlinkMessage<RouteNetlinkMessage>,
    ) -> Result<Vec<RouteNetlinkMessage>, Failure> {
        match self.requests(vec![request])?.pop() {
            Some(Ok(replies)) => Ok(replies),
            Some(Err(refused)) => Err(Failure::Refused(refused)),
            None => Err(Failure::Io(io::Error::other("the kernel did not answer"))),
        }
    }

    /// A dump: every reply until the kernel's end-of-dump.
    pub(crate) fn dump(
        &mut self,
        mut request: NetlinkMessage<RouteNetlinkMessage>,
    ) -> Result<Vec<RouteNetlinkMessage>, Failure> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        request.header.sequence_number = sequence;
        request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        request.finalize();
        let mut bytes = vec![0; request.buffer_len()];
        request.serialize(&mut bytes);
        self.send(&bytes)?;
        let mut out = Vec::new();
        loop {
            self.receive()?;
            for message in parse(&self.buf)? {
                if message.header.sequence_number != sequence {
                    continue;
                }
                match message.payload {
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => match e.code {
                        Some(code) => {
                            return Err(Failure::Refused(refusal(code.get(), &e.header)));
                        }
                        None => return Ok(out),
                    },
                    _ => {}
                }
            }
        }
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let sent = self.socket.send(bytes, 0)?;
        if sent != bytes.len() {
            return Err(io::Error::other(format!(
                "netlink sent {sent} of {} bytes",
                bytes.len()
            )));
        }
        Ok(())
    }

    /// Reads the next datagram whole into the buffer: its size is asked first, so a big
    /// answer (a PF's VF table) is never cut.
    fn receive(&mut self) -> io::Result<()> {
        let size = self
            .socket
            .recv(
                &mut &mut [0u8; 0][..],
                libc_flags::MSG_PEEK | libc_flags::MSG_TRUNC,
            )
            .map_err(timed_out)?;
        self.buf.clear();
        self.buf.reserve(size);
        let read = self.socket.recv(&mut self.buf, 0).map_err(timed_out)?;
        if read < size {
            return Err(io::Error::other(format!(
                "a netlink answer was cut at {read} of {size} bytes"
            )));
        }
        Ok(())
    }
}

/// `MSG_PEEK`, `MSG_TRUNC` (Linux values).
mod libc_flags {
    pub const MSG_PEEK: i32 = 2;
    pub const MSG_TRUNC: i32 = 0x20;
}

fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the kernel did not answer a netlink request within {} s",
                ANSWER_TIMEOUT.as_secs()
            ),
        )
    } else {
        e
    }
}

/// The messages of one datagram.
fn parse(mut bytes: &[u8]) -> io::Result<Vec<NetlinkMessage<RouteNetlinkMessage>>> {
    let mut out = Vec::new();
    while bytes.len() >= 16 {
        let length = NetlinkBuffer::new_checked(bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
            .length() as usize;
        if length < 16 || length > bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a netlink message claims {length} bytes of {}", bytes.len()),
            ));
        }
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[..length])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        out.push(message);
        bytes = &bytes[((length + 3) & !3).min(bytes.len())..];
    }
    Ok(out)
}

/// `NLMSGERR_ATTR_MSG`: the kernel's text for a refusal.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// The refusal with `code` (negative errno); `rest` is what follows the code in the error
/// message: the request's header (capped ack: without its payload), then extended-ack
/// attributes.
fn refusal(code: i32, rest: &[u8]) -> Refusal {
    let mut message = None;
    let mut attrs = rest.get(16..).unwrap_or_default();
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            break;
        }
        if kind == NLMSGERR_ATTR_MSG {
            let text = &attrs[4..len];
            let text = text.split(|b| *b == 0).next().unwrap_or_default();
            message = Some(String::from_utf8_lossy(text).into_owned());
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    Refusal {
        errno: code.checked_neg().unwrap_or(i32::MAX),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};

    fn get_link(name: &str) -> NetlinkMessage<RouteNetlinkMessage> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_owned()));
        NetlinkMessage::from(RouteNetlinkMessage::GetLink(m))
    }

    /// Answers come back per request, in one send, the failed one with its errno, the later
    /// one still answered. Reads only the process's own links: no privilege needed.
    #[test]
    fn pipelined_requests_answer_each() {
        let mut wire = Wire::open().unwrap();
        let answers = wire
            .requests(vec![
                get_link("lo"),
                get_link("knt-absent0"),
                get_link("lo"),
            ])
            .unwrap();
        assert_eq!(answers.len(), 3);
        let index = |a: &Result<Vec<RouteNetlinkMessage>, Refusal>| match a {
            Ok(replies) => replies.iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l.header.index),
                _ => None,
            }),
            Err(_) => None,
        };
        assert_eq!(index(&answers[0]), Some(1));
        let Err(refused) = &answers[1] else {
            panic!("knt-absent0 found: {:?}", answers[1]);
        };
        assert_eq!(refused.errno, 19, "ENODEV");
        assert_eq!(index(&answers[2]), Some(1));
    }

    /// A dump is read to its end; the socket is usable after it.
    #[test]
    fn dump_then_request() {
        let mut wire = Wire::open().unwrap();
        let links = wire
            .dump(NetlinkMessage::from(RouteNetlinkMessage::GetLink(
                LinkMessage::default(),
            )))
            .unwrap();
        assert!(
            links
                .iter()
                .any(|m| matches!(m, RouteNetlinkMessage::NewLink(l) if l.header.index == 1))
        );
        assert!(!wire.request(get_link("lo")).unwrap().is_empty());
    }

    /// The kernel's extended-ack text is kept with the errno.
    #[test]
    fn refusal_reads_the_kernels_message() {
        let mut rest = vec![0u8; 16];
        let text = b"MTU greater than device maximum\0";
        let len = u16::try_from(4 + text.len()).unwrap();
        rest.extend_from_slice(&len.to_ne_bytes());
        rest.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        rest.extend_from_slice(text);
        let r = refusal(-22, &rest);
        assert_eq!(r.errno, 22);
        assert_eq!(
            r.message.as_deref(),
            Some("MTU greater than device maximum")
        );
        assert!(
            r.to_io().to_string().contains("Invalid argument"),
            "{}",
            r.to_io()
        );
    }
}
