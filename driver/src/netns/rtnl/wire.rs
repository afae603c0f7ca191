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
    NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
    NetlinkBuffer, NetlinkMessage, NetlinkPayload,
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
    /// Set when a datagram of an exchange could not be read (a timeout, a cut, a broken frame):
    /// answers of it may still be queued, and a later exchange would have to read past them
    /// (or take a stale one that parses for its own). The socket is then refused, and the
    /// session's owner opens a new one (sessions are per attach or detach; a socket cannot be
    /// reopened here, in a namespace the thread has left).
    out_of_step: bool,
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
            out_of_step: false,
        })
    }

    /// Sends the requests in as few `sendmsg` calls as the answers' room allows (the kernel
    /// handles them in order, each with its own answer, also after one fails) and returns each
    /// one's replies or refusal. Dumps must go alone through [`Wire::dump`]: a dump's answer
    /// would interleave with the others.
    pub(crate) fn requests(
        &mut self,
        requests: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> io::Result<Vec<Result<Vec<RouteNetlinkMessage>, Refusal>>> {
        self.in_step()?;
        let mut out = Vec::with_capacity(requests.len());
        let mut requests = requests.into_iter().peekable();
        while requests.peek().is_some() {
            let batch: Vec<_> = requests.by_ref().take(BATCH).collect();
            out.extend(self.batch(batch)?);
        }
        Ok(out)
    }

    fn in_step(&self) -> io::Result<()> {
        if self.out_of_step {
            return Err(io::Error::other(
                "this netlink socket is out of step after an earlier failed exchange; \
                 a new session opens a new one",
            ));
        }
        Ok(())
    }

    /// One `sendmsg` of requests and all their answers. Every answer is read, also after one
    /// could not be decoded, so the socket stays in step for the next exchange.
    fn batch(
        &mut self,
        requests: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> io::Result<Vec<Result<Vec<RouteNetlinkMessage>, Refusal>>> {
        let count = requests.len();
        let first = self.sequence.wrapping_add(1);
        let (bytes, last) = frame(requests, self.sequence);
        self.sequence = last;
        self.send(&bytes)?;
        let mut answers: Vec<Option<Result<Vec<RouteNetlinkMessage>, Refusal>>> =
            (0..count).map(|_| None).collect();
        let mut replies: Vec<Vec<RouteNetlinkMessage>> = (0..count).map(|_| Vec::new()).collect();
        let mut undecodable = None;
        let mut open = count;
        while open > 0 {
            for parsed in self.next_datagram()? {
                let at = parsed.sequence.wrapping_sub(first) as usize;
                if at >= count || answers[at].is_some() {
                    continue; // not ours (a stale answer) or after its end
                }
                let message = match parsed.message {
                    Ok(message) => message,
                    Err(e) => {
                        // An answer's end that cannot be read still ends it.
                        if parsed.kind == NLMSG_ERROR {
                            answers[at] = Some(Ok(Vec::new()));
                            open -= 1;
                        }
                        undecodable.get_or_insert(e);
                        continue;
                    }
                };
                if let NetlinkPayload::Error(e) = message.payload {
                    answers[at] = Some(match e.code {
                        None => Ok(std::mem::take(&mut replies[at])),
                        Some(code) => Err(refusal(code.get(), &e.header, message.header.flags)),
                    });
                    open -= 1;
                } else if let NetlinkPayload::InnerMessage(m) = message.payload {
                    replies[at].push(m);
                }
            }
        }
        match undecodable {
            Some(e) => Err(e),
            None => Ok(answers.into_iter().flatten().collect()),
        }
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

    /// A dump: every reply until the kernel's end-of-dump. A dump the kernel marks as
    /// interrupted (the table changed while it was read, `NLM_F_DUMP_INTR`) is read again, up
    /// to [`DUMP_TRIES`] times: a partial table would look like a missing address or link.
    pub(crate) fn dump(
        &mut self,
        request: NetlinkMessage<RouteNetlinkMessage>,
    ) -> Result<Vec<RouteNetlinkMessage>, Failure> {
        self.in_step()?;
        for _ in 0..DUMP_TRIES {
            if let Dumped::Whole(out) = self.dump_once(request.clone())? {
                return Ok(out);
            }
        }
        Err(Failure::Io(io::Error::other(format!(
            "a netlink dump was interrupted by changes {DUMP_TRIES} times in a row"
        ))))
    }

    /// One dump, read to its end (also past a message that cannot be decoded, so the socket
    /// can run the next one).
    fn dump_once(
        &mut self,
        mut request: NetlinkMessage<RouteNetlinkMessage>,
    ) -> Result<Dumped, Failure> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut bytes = Vec::new();
        encode(request, sequence, &mut bytes);
        self.send(&bytes)?;
        let mut read = DumpRead::default();
        while !read.take(self.next_datagram()?, sequence) {}
        read.outcome()
    }

    /// The next datagram's messages. A datagram that cannot be read (a timeout, a cut, a
    /// broken frame) leaves the exchange's other answers unread, queued for whatever comes
    /// next on this socket: it is then out of step for good.
    fn next_datagram(&mut self) -> io::Result<Vec<Parsed>> {
        let parsed = self.receive().and_then(|()| parse(&self.buf));
        if parsed.is_err() {
            self.out_of_step = true;
        }
        parsed
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let sent = retry_interrupted(|| self.socket.send(bytes, 0))?;
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
        let size = retry_interrupted(|| {
            self.socket.recv(
                &mut &mut [0u8; 0][..],
                nix::libc::MSG_PEEK | nix::libc::MSG_TRUNC,
            )
        })?;
        self.buf.clear();
        self.buf.reserve(size);
        let read = retry_interrupted(|| self.socket.recv(&mut self.buf, 0))?;
        if read < size {
            return Err(io::Error::other(format!(
                "a netlink answer was cut at {read} of {size} bytes"
            )));
        }
        Ok(())
    }
}

/// How many requests go in one `sendmsg`: their answers queue on the socket until read, and a
/// receive buffer that overflows loses them (`ENOBUFS`). Batches are changes (adds of
/// addresses and routes), answered by acks of a few dozen bytes, so 32 stay far inside the
/// default 208 KiB; a lookup of a PF with its VF table (tens of KiB) goes alone.
const BATCH: usize = 32;

/// How many times a dump the kernel interrupted is read again: the host's link table changes
/// whenever a runtime adds a veth, so on a busy node one read in a row may not be enough.
const DUMP_TRIES: usize = 8;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

/// A dump's outcome: its replies, or a mark that the table changed while it was read.
enum Dumped {
    Whole(Vec<RouteNetlinkMessage>),
    Interrupted,
}

/// A dump's answer as its datagrams come in.
#[derive(Default)]
struct DumpRead {
    out: Vec<RouteNetlinkMessage>,
    interrupted: bool,
    undecodable: Option<io::Error>,
    end: Option<Result<(), Refusal>>,
}

impl DumpRead {
    /// Takes one datagram's messages of the dump numbered `sequence`; true once it has ended.
    fn take(&mut self, parsed: Vec<Parsed>, sequence: u32) -> bool {
        for parsed in parsed {
            if parsed.sequence != sequence {
                continue;
            }
            self.interrupted |= parsed.flags & NLM_F_DUMP_INTR != 0;
            let message = match parsed.message {
                Ok(message) => message,
                Err(e) => {
                    if matches!(parsed.kind, NLMSG_DONE | NLMSG_ERROR) {
                        self.end = Some(Ok(()));
                    }
                    self.undecodable.get_or_insert(e);
                    continue;
                }
            };
            let flags = message.header.flags;
            match message.payload {
                NetlinkPayload::InnerMessage(m) => self.out.push(m),
                // The kernel ends a dump that failed half-way with a negative code; its
                // ext-ack attributes follow the code directly.
                NetlinkPayload::Done(d) if d.code < 0 => {
                    self.end = Some(Err(Refusal {
                        errno: d.code.checked_neg().unwrap_or(i32::MAX),
                        message: ext_ack_text(&d.extended_ack),
                    }));
                }
                NetlinkPayload::Done(_) => self.end = Some(Ok(())),
                NetlinkPayload::Error(e) => {
                    self.end = Some(match e.code {
                        Some(code) => Err(refusal(code.get(), &e.header, flags)),
                        None => Ok(()),
                    });
                }
                _ => {}
            }
        }
        self.end.is_some()
    }

    /// The ended dump: the kernel's refusal first, then an unreadable part, then whether the
    /// table changed while it was read.
    fn outcome(self) -> Result<Dumped, Failure> {
        if let Some(Err(refused)) = self.end {
            return Err(Failure::Refused(refused));
        }
        if let Some(e) = self.undecodable {
            return Err(Failure::Io(e));
        }
        Ok(if self.interrupted {
            Dumped::Interrupted
        } else {
            Dumped::Whole(self.out)
        })
    }
}

/// A send or receive, again after a signal.
fn retry_interrupted(mut f: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other.map_err(timed_out),
        }
    }
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

/// The bytes of requests numbered from `after + 1`, and the last number used. Each asks for an
/// ack. Flags are the caller's: `NLM_F_DUMP` shares its bits with `NLM_F_EXCL`/`NLM_F_REPLACE`,
/// so it is cleared only from a `RTM_GET*` (type ≡ 2 mod 4), which must not dump here.
fn frame(requests: Vec<NetlinkMessage<RouteNetlinkMessage>>, after: u32) -> (Vec<u8>, u32) {
    let mut sequence = after;
    let mut out = Vec::new();
    for mut request in requests {
        sequence = sequence.wrapping_add(1);
        request.finalize();
        request.header.flags |= NLM_F_REQUEST | NLM_F_ACK;
        if request.header.message_type % 4 == 2 {
            request.header.flags &= !NLM_F_DUMP;
        }
        encode(request, sequence, &mut out);
    }
    (out, sequence)
}

/// Appends `request`, numbered `sequence`, with its flags as they are, to `out`.
fn encode(mut request: NetlinkMessage<RouteNetlinkMessage>, sequence: u32, out: &mut Vec<u8>) {
    request.header.sequence_number = sequence;
    request.finalize();
    let start = out.len();
    out.resize(start + request.buffer_len(), 0);
    request.serialize(&mut out[start..]);
}

/// One message of a datagram: its header's facts, and the message, or why it could not be
/// decoded (kept apart, so one odd message does not hide the others' answers).
struct Parsed {
    sequence: u32,
    kind: u16,
    flags: u16,
    message: io::Result<NetlinkMessage<RouteNetlinkMessage>>,
}

/// The messages of one datagram. Only a broken frame (a length that does not fit) fails the
/// whole datagram: past it nothing can be found.
fn parse(mut bytes: &[u8]) -> io::Result<Vec<Parsed>> {
    let mut out = Vec::new();
    while bytes.len() >= 16 {
        let header = NetlinkBuffer::new_checked(bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let length = header.length() as usize;
        if length < 16 || length > bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a netlink message claims {length} bytes of {}", bytes.len()),
            ));
        }
        out.push(Parsed {
            sequence: header.sequence_number(),
            kind: header.message_type(),
            flags: header.flags(),
            message: NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[..length]).map_err(
                |e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("an undecodable netlink answer: {e}"),
                    )
                },
            ),
        });
        bytes = &bytes[((length + 3) & !3).min(bytes.len())..];
    }
    Ok(out)
}

/// `NLMSGERR_ATTR_MSG`: the kernel's text for a refusal.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// The refusal with `code` (negative errno). `rest` is what follows the code in the error
/// message: the request (its header only when the error's `flags` say `NLM_F_CAPPED`), then,
/// with `NLM_F_ACK_TLVS`, extended-ack attributes.
pub(crate) fn refusal(code: i32, rest: &[u8], flags: u16) -> Refusal {
    let request = if flags & NLM_F_CAPPED != 0 {
        16
    } else {
        rest.get(..4)
            .map(|l| u32::from_ne_bytes([l[0], l[1], l[2], l[3]]) as usize)
            .map_or(rest.len(), |l| (l + 3) & !3)
    };
    let attrs = if flags & NLM_F_ACK_TLVS != 0 {
        rest.get(request..).unwrap_or_default()
    } else {
        &[]
    };
    Refusal {
        errno: code.checked_neg().unwrap_or(i32::MAX),
        message: ext_ack_text(attrs),
    }
}

/// The kernel's text (`NLMSGERR_ATTR_MSG`) among ext-ack attributes.
fn ext_ack_text(mut attrs: &[u8]) -> Option<String> {
    let mut message = None;
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
    message
}

#[cfg(test)]
mod tests;
