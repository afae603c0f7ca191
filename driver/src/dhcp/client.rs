//! The DHCPv4 client's exchanges (RFC 2131 §4.4): DISCOVER/OFFER/REQUEST/ACK to get a lease,
//! REQUEST to renew (unicast to the server at T1) or rebind (broadcast at T2), and RELEASE.
//! Written against [`Transport`] so the fake in the tests and the UDP socket in the pod's
//! namespace ([`super::socket`]) run the same code; every wait is bounded by the caller's
//! deadline, and every failure names the interface and what the server did (or did not do).

use std::future::Future;
use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use super::codec::{DecodeError, FLAG_BROADCAST, Message, MessageType, opt};

/// Sends and receives DHCP messages on one interface (client port 68).
pub trait Transport: Send {
    /// Sends `bytes` to `to`:67 (255.255.255.255 for a broadcast).
    fn send(&mut self, bytes: &[u8], to: Ipv4Addr) -> impl Future<Output = io::Result<()>> + Send;
    /// The next datagram that arrives on port 68.
    fn recv(&mut self) -> impl Future<Output = io::Result<Vec<u8>>> + Send;
}

/// The parameters knic asks for: mask, router, MTU, lease, server id, T1, T2.
const PARAMETERS: [u8; 7] = [
    opt::SUBNET_MASK,
    opt::ROUTER,
    opt::MTU,
    opt::LEASE_TIME,
    opt::SERVER_ID,
    opt::RENEWAL_TIME,
    opt::REBINDING_TIME,
];

/// Retransmission: 1 s, then doubling up to 4 s (RFC 2131 §4.1 suggests 4 s doubling to 64 s;
/// a pod waits at most [`super::MAX_TIMEOUT`], so knic retries sooner).
fn retransmit_after(attempt: u32) -> Duration {
    Duration::from_secs(1 << attempt.min(2))
}

/// Why an exchange failed; the caller puts it into the claim's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Nothing usable before the deadline.
    Timeout {
        /// The message waited for (DHCPOFFER, DHCPACK).
        waited_for: MessageType,
        /// The message sent, and how often.
        sent: MessageType,
        /// Times sent.
        attempts: u32,
        /// The last malformed reply, if replies were refused.
        malformed: Option<String>,
    },
    /// The server said no.
    Nak {
        /// Its identifier.
        server: Ipv4Addr,
        /// Its option 56, if any.
        message: Option<String>,
    },
    /// A reply that decodes but cannot be a lease (no lease time, a bad address…).
    BadLease(String),
    /// The socket failed.
    Io(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout {
                waited_for,
                sent,
                attempts,
                malformed,
            } => {
                write!(f, "no {waited_for} (sent {sent} {attempts} times)")?;
                if let Some(m) = malformed {
                    write!(f, "; a reply was refused: {m}")?;
                }
                Ok(())
            }
            Failure::Nak { server, message } => {
                write!(f, "server {server} refused the request (DHCPNAK)")?;
                match message {
                    Some(m) => write!(f, ": {m:?}"),
                    None => f.write_str(" without a message"),
                }
            }
            Failure::BadLease(reason) => write!(f, "unusable DHCPACK: {reason}"),
            Failure::Io(e) => write!(f, "socket: {e}"),
        }
    }
}

fn io(e: io::Error) -> Failure {
    Failure::Io(e.to_string())
}

/// A transaction id: not guessable by other hosts on the segment, different per exchange.
pub fn new_xid(mac: [u8; 6]) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in mac.iter().copied().chain(nanos.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 16) as u32
}

/// The client identifier (type 1 = Ethernet, then the MAC), so servers key the lease on it.
fn client_id(mac: [u8; 6]) -> Vec<u8> {
    let mut id = vec![1];
    id.extend_from_slice(&mac);
    id
}

/// Sends `request` to `to` and waits for a reply to it of one of `wanted`, retransmitting,
/// until `deadline`.
async fn exchange<T: Transport>(
    transport: &mut T,
    request: &Message,
    to: Ipv4Addr,
    wanted: &[MessageType],
    from_server: Option<Ipv4Addr>,
    deadline: Instant,
) -> Result<Message, Failure> {
    let bytes = request.encode();
    let sent = request.message_type().unwrap_or(MessageType::Request);
    let mut malformed = None;
    let mut attempts = 0;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(Failure::Timeout {
                waited_for: wanted[0],
                sent,
                attempts,
                malformed,
            });
        }
        transport.send(&bytes, to).await.map_err(io)?;
        attempts += 1;
        let try_until = (now + retransmit_after(attempts - 1)).min(deadline);
        loop {
            let received = match tokio::time::timeout_at(try_until, transport.recv()).await {
                Err(_) => break,
                Ok(r) => r.map_err(io)?,
            };
            let reply = match Message::decode(&received).and_then(|m| {
                if m.op != super::codec::BOOTREPLY {
                    return Err(DecodeError::NotReply(m.op));
                }
                Ok(m)
            }) {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %e, "ignoring a malformed DHCP reply");
                    malformed = Some(e.to_string());
                    continue;
                }
            };
            // Someone else's transaction (another client on the segment).
            if reply.xid != request.xid || reply.chaddr != request.chaddr {
                continue;
            }
            let kind = match reply.message_type() {
                Ok(kind) => kind,
                Err(e) => {
                    malformed = Some(e.to_string());
                    continue;
                }
            };
            if let Some(server) = from_server
                && reply
                    .addr(opt::SERVER_ID)
                    .ok()
                    .flatten()
                    .is_some_and(|s| s != server)
            {
                continue;
            }
            if kind == MessageType::Nak {
                return Err(Failure::Nak {
                    server: reply
                        .addr(opt::SERVER_ID)
                        .ok()
                        .flatten()
                        .unwrap_or(Ipv4Addr::UNSPECIFIED),
                    message: reply.server_message(),
                });
            }
            if wanted.contains(&kind) {
                return Ok(reply);
            }
        }
    }
}

fn request_base(kind: MessageType, xid: u32, mac: [u8; 6]) -> Message {
    Message::request(kind, xid, mac)
        .with(opt::CLIENT_ID, client_id(mac))
        .with(opt::PARAMETER_REQUEST, PARAMETERS.to_vec())
}

/// Gets a lease: DISCOVER, the first OFFER, REQUEST it, ACK. Fails at `timeout` with what was
/// missing, or at once with a NAK's message.
pub async fn acquire<T: Transport>(
    transport: &mut T,
    mac: [u8; 6],
    timeout: Duration,
    now_unix: u64,
) -> Result<Lease, Failure> {
    let deadline = Instant::now() + timeout;
    let xid = new_xid(mac);
    let discover = Message {
        flags: FLAG_BROADCAST,
        ..request_base(MessageType::Discover, xid, mac)
    };
    let offer = exchange(
        transport,
        &discover,
        Ipv4Addr::BROADCAST,
        &[MessageType::Offer],
        None,
        deadline,
    )
    .await?;
    let server = offer
        .addr(opt::SERVER_ID)
        .ok()
        .flatten()
        .ok_or_else(|| Failure::BadLease("the DHCPOFFER has no server identifier".into()))?;
    let request = Message {
        flags: FLAG_BROADCAST,
        ..request_base(MessageType::Request, xid, mac)
            .with(opt::REQUESTED_IP, offer.yiaddr.octets().to_vec())
            .with(opt::SERVER_ID, server.octets().to_vec())
    };
    let ack = exchange(
        transport,
        &request,
        Ipv4Addr::BROADCAST,
        &[MessageType::Ack],
        Some(server),
        deadline,
    )
    .await?;
    Lease::from_ack(&ack, mac, server, now_unix).map_err(Failure::BadLease)
}

/// Extends `lease`: a REQUEST from its address, unicast to its server (`rebind` false, from
/// T1) or broadcast to any server (`rebind` true, from T2).
pub async fn renew<T: Transport>(
    transport: &mut T,
    lease: &Lease,
    rebind: bool,
    timeout: Duration,
    now_unix: u64,
) -> Result<Lease, Failure> {
    let deadline = Instant::now() + timeout;
    let request = Message {
        ciaddr: lease.address,
        ..request_base(MessageType::Request, new_xid(lease.mac), lease.mac)
    };
    let (to, from) = match rebind {
        false => (lease.server, Some(lease.server)),
        true => (Ipv4Addr::BROADCAST, None),
    };
    let ack = exchange(transport, &request, to, &[MessageType::Ack], from, deadline).await?;
    let server = ack
        .addr(opt::SERVER_ID)
        .ok()
        .flatten()
        .unwrap_or(lease.server);
    let renewed = Lease::from_ack(&ack, lease.mac, server, now_unix).map_err(Failure::BadLease)?;
    if renewed.address != lease.address {
        return Err(Failure::BadLease(format!(
            "the server acknowledged {} instead of the leased {}",
            renewed.address, lease.address
        )));
    }
    Ok(renewed)
}

/// Gives `lease` back (RELEASE, unicast to its server; no answer is expected, RFC 2131 §4.4.6).
pub async fn release<T: Transport>(transport: &mut T, lease: &Lease) -> Result<(), Failure> {
    let release = Message {
        ciaddr: lease.address,
        ..Message::request(MessageType::Release, new_xid(lease.mac), lease.mac)
            .with(opt::SERVER_ID, lease.server.octets().to_vec())
            .with(opt::CLIENT_ID, client_id(lease.mac))
    };
    transport
        .send(&release.encode(), lease.server)
        .await
        .map_err(io)
}
