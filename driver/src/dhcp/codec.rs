//! DHCPv4 messages (RFC 2131 / RFC 2132) as bytes and back: the fixed 236-byte BOOTP header,
//! the magic cookie and the options knic reads or writes. Hand-written because the client
//! needs a dozen fields and a dozen options; a general DHCP crate would bring far more than
//! that. Decoding is strict and bounded: a reply is at most [`MAX_MESSAGE`] bytes, every
//! option length is checked against what is left, and each refusal says what was wrong, so a
//! broken or hostile server shows up in the claim's error instead of as a panic or a hang.

use std::fmt;
use std::net::Ipv4Addr;

/// BOOTREQUEST / BOOTREPLY (`op`).
pub const BOOTREQUEST: u8 = 1;
/// A server's answer.
pub const BOOTREPLY: u8 = 2;
/// The fixed header before the cookie.
const HEADER: usize = 236;
/// RFC 2131's magic cookie, 99.130.83.99.
const COOKIE: [u8; 4] = [99, 130, 83, 99];
/// Largest reply knic reads: an Ethernet frame's worth (1500 − IP − UDP headers). Servers
/// keep to 576 unless asked for more (option 57, which knic does not send).
pub const MAX_MESSAGE: usize = 1472;
/// The broadcast bit of `flags`: the client has no address yet, so replies must be broadcast.
pub const FLAG_BROADCAST: u16 = 0x8000;

/// Option codes used here (RFC 2132).
pub mod opt {
    /// Pad (no length byte).
    pub const PAD: u8 = 0;
    /// Subnet mask.
    pub const SUBNET_MASK: u8 = 1;
    /// Routers, in order of preference.
    pub const ROUTER: u8 = 3;
    /// Interface MTU.
    pub const MTU: u8 = 26;
    /// Requested IP address (REQUEST in SELECTING/INIT-REBOOT).
    pub const REQUESTED_IP: u8 = 50;
    /// Lease time in seconds.
    pub const LEASE_TIME: u8 = 51;
    /// Overload (sname/file carry options); knic does not read those fields.
    pub const OVERLOAD: u8 = 52;
    /// DHCP message type.
    pub const MESSAGE_TYPE: u8 = 53;
    /// Server identifier.
    pub const SERVER_ID: u8 = 54;
    /// Parameter request list.
    pub const PARAMETER_REQUEST: u8 = 55;
    /// A server's explanation (in a NAK).
    pub const MESSAGE: u8 = 56;
    /// Renewal (T1) time.
    pub const RENEWAL_TIME: u8 = 58;
    /// Rebinding (T2) time.
    pub const REBINDING_TIME: u8 = 59;
    /// Client identifier.
    pub const CLIENT_ID: u8 = 61;
    /// End.
    pub const END: u8 = 255;
}

/// DHCP message types (option 53).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// 1
    Discover,
    /// 2
    Offer,
    /// 3
    Request,
    /// 4
    Decline,
    /// 5
    Ack,
    /// 6
    Nak,
    /// 7
    Release,
    /// 8
    Inform,
}

impl MessageType {
    fn code(self) -> u8 {
        match self {
            MessageType::Discover => 1,
            MessageType::Offer => 2,
            MessageType::Request => 3,
            MessageType::Decline => 4,
            MessageType::Ack => 5,
            MessageType::Nak => 6,
            MessageType::Release => 7,
            MessageType::Inform => 8,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => MessageType::Discover,
            2 => MessageType::Offer,
            3 => MessageType::Request,
            4 => MessageType::Decline,
            5 => MessageType::Ack,
            6 => MessageType::Nak,
            7 => MessageType::Release,
            8 => MessageType::Inform,
            _ => return None,
        })
    }
}

impl fmt::Display for MessageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageType::Discover => "DHCPDISCOVER",
            MessageType::Offer => "DHCPOFFER",
            MessageType::Request => "DHCPREQUEST",
            MessageType::Decline => "DHCPDECLINE",
            MessageType::Ack => "DHCPACK",
            MessageType::Nak => "DHCPNAK",
            MessageType::Release => "DHCPRELEASE",
            MessageType::Inform => "DHCPINFORM",
        })
    }
}

/// Why bytes are not a DHCP message knic accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than header + cookie.
    #[error("{0} bytes is too short for a DHCP message (at least 240)")]
    TooShort(usize),
    /// Longer than [`MAX_MESSAGE`].
    #[error("{0} bytes is longer than the {MAX_MESSAGE} bytes knic reads")]
    TooLong(usize),
    /// Not 99.130.83.99 after the header.
    #[error("no DHCP magic cookie (found {0:?})")]
    Cookie([u8; 4]),
    /// Hardware type/length not Ethernet's.
    #[error("hardware type {htype} length {hlen} is not Ethernet (1, 6)")]
    Hardware {
        /// htype
        htype: u8,
        /// hlen
        hlen: u8,
    },
    /// An option's length runs past the message.
    #[error("option {code} at byte {at} claims {len} bytes but only {left} remain")]
    Truncated {
        /// Option code.
        code: u8,
        /// Offset of the option.
        at: usize,
        /// Claimed length.
        len: usize,
        /// Bytes left.
        left: usize,
    },
    /// No END option (255) before the end.
    #[error("options do not end with option 255")]
    NoEnd,
    /// A known option with the wrong size.
    #[error("option {code} has {len} bytes; expected {expected}")]
    OptionSize {
        /// Option code.
        code: u8,
        /// Its length.
        len: usize,
        /// What RFC 2132 says.
        expected: &'static str,
    },
    /// Option 53 missing or unknown.
    #[error("message type (option 53) missing or unknown")]
    MessageType,
    /// A request where a reply was expected.
    #[error("op {0} is not a reply (2)")]
    NotReply(u8),
}

/// One message, with its options in the order sent (duplicates kept: RFC 3396 concatenation
/// is not needed for the options knic reads, so the first of a code wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// [`BOOTREQUEST`] or [`BOOTREPLY`].
    pub op: u8,
    /// Transaction id, matching replies to requests.
    pub xid: u32,
    /// Seconds since the client began.
    pub secs: u16,
    /// [`FLAG_BROADCAST`] or 0.
    pub flags: u16,
    /// The client's address when it has one (renew, release).
    pub ciaddr: Ipv4Addr,
    /// "Your" address: what the server offers or acknowledges.
    pub yiaddr: Ipv4Addr,
    /// Next server (boot); unused.
    pub siaddr: Ipv4Addr,
    /// Relay agent; unused by the client.
    pub giaddr: Ipv4Addr,
    /// The client's MAC.
    pub chaddr: [u8; 6],
    /// Options after the cookie, END excluded.
    pub options: Vec<(u8, Vec<u8>)>,
}

impl Message {
    /// A client request of `kind` from `mac`, options to be added.
    pub fn request(kind: MessageType, xid: u32, mac: [u8; 6]) -> Self {
        Message {
            op: BOOTREQUEST,
            xid,
            secs: 0,
            flags: 0,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            yiaddr: Ipv4Addr::UNSPECIFIED,
            siaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            chaddr: mac,
            options: vec![(opt::MESSAGE_TYPE, vec![kind.code()])],
        }
    }

    /// Adds an option (builder style).
    pub fn with(mut self, code: u8, value: impl Into<Vec<u8>>) -> Self {
        self.options.push((code, value.into()));
        self
    }

    /// The bytes on the wire: header, cookie, options, END, padded to the 300 bytes BOOTP
    /// relays and old servers expect at least.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(300);
        b.extend_from_slice(&[self.op, 1, 6, 0]);
        b.extend_from_slice(&self.xid.to_be_bytes());
        b.extend_from_slice(&self.secs.to_be_bytes());
        b.extend_from_slice(&self.flags.to_be_bytes());
        for a in [self.ciaddr, self.yiaddr, self.siaddr, self.giaddr] {
            b.extend_from_slice(&a.octets());
        }
        b.extend_from_slice(&self.chaddr);
        b.resize(HEADER, 0); // chaddr padding, sname, file
        b.extend_from_slice(&COOKIE);
        for (code, value) in &self.options {
            // Values longer than 255 are split into several options of the same code
            // (RFC 3396); none of knic's are.
            for chunk in value.chunks(255) {
                b.push(*code);
                b.push(chunk.len() as u8);
                b.extend_from_slice(chunk);
            }
        }
        b.push(opt::END);
        if b.len() < 300 {
            b.resize(300, 0);
        }
        b
    }

    /// Parses a message (either direction); see [`DecodeError`] for what is refused.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < HEADER + COOKIE.len() {
            return Err(DecodeError::TooShort(bytes.len()));
        }
        if bytes.len() > MAX_MESSAGE {
            return Err(DecodeError::TooLong(bytes.len()));
        }
        let (htype, hlen) = (bytes[1], bytes[2]);
        if htype != 1 || hlen != 6 {
            return Err(DecodeError::Hardware { htype, hlen });
        }
        let cookie: [u8; 4] = bytes[HEADER..HEADER + 4].try_into().unwrap_or_default();
        if cookie != COOKIE {
            return Err(DecodeError::Cookie(cookie));
        }
        let ip = |at: usize| Ipv4Addr::new(bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]);
        let mut chaddr = [0u8; 6];
        chaddr.copy_from_slice(&bytes[28..34]);
        let mut options = Vec::new();
        let mut at = HEADER + 4;
        let mut ended = false;
        while at < bytes.len() {
            let code = bytes[at];
            if code == opt::PAD {
                at += 1;
                continue;
            }
            if code == opt::END {
                ended = true;
                break;
            }
            let Some(&len) = bytes.get(at + 1) else {
                return Err(DecodeError::Truncated {
                    code,
                    at,
                    len: 1,
                    left: 0,
                });
            };
            let len = usize::from(len);
            let left = bytes.len() - at - 2;
            if len > left {
                return Err(DecodeError::Truncated {
                    code,
                    at,
                    len,
                    left,
                });
            }
            options.push((code, bytes[at + 2..at + 2 + len].to_vec()));
            at += 2 + len;
        }
        if !ended {
            return Err(DecodeError::NoEnd);
        }
        Ok(Message {
            op: bytes[0],
            xid: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            secs: u16::from_be_bytes([bytes[8], bytes[9]]),
            flags: u16::from_be_bytes([bytes[10], bytes[11]]),
            ciaddr: ip(12),
            yiaddr: ip(16),
            siaddr: ip(20),
            giaddr: ip(24),
            chaddr,
            options,
        })
    }

    /// The first value of option `code`.
    pub fn option(&self, code: u8) -> Option<&[u8]> {
        self.options
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, v)| v.as_slice())
    }

    /// Option 53.
    pub fn message_type(&self) -> Result<MessageType, DecodeError> {
        match self.option(opt::MESSAGE_TYPE) {
            Some([code]) => MessageType::from_code(*code).ok_or(DecodeError::MessageType),
            _ => Err(DecodeError::MessageType),
        }
    }

    /// An address option (exactly 4 bytes when present).
    pub fn addr(&self, code: u8) -> Result<Option<Ipv4Addr>, DecodeError> {
        match self.option(code) {
            None => Ok(None),
            Some(&[a, b, c, d]) => Ok(Some(Ipv4Addr::new(a, b, c, d))),
            Some(v) => Err(DecodeError::OptionSize {
                code,
                len: v.len(),
                expected: "4",
            }),
        }
    }

    /// The first router of option 3 (a multiple of 4 bytes, at least one).
    pub fn router(&self) -> Result<Option<Ipv4Addr>, DecodeError> {
        match self.option(opt::ROUTER) {
            None => Ok(None),
            Some(v) if !v.is_empty() && v.len() % 4 == 0 => {
                Ok(Some(Ipv4Addr::new(v[0], v[1], v[2], v[3])))
            }
            Some(v) => Err(DecodeError::OptionSize {
                code: opt::ROUTER,
                len: v.len(),
                expected: "a multiple of 4",
            }),
        }
    }

    /// A 32-bit seconds option (51, 58, 59).
    pub fn seconds(&self, code: u8) -> Result<Option<u32>, DecodeError> {
        match self.option(code) {
            None => Ok(None),
            Some(&[a, b, c, d]) => Ok(Some(u32::from_be_bytes([a, b, c, d]))),
            Some(v) => Err(DecodeError::OptionSize {
                code,
                len: v.len(),
                expected: "4",
            }),
        }
    }

    /// Option 26.
    pub fn mtu(&self) -> Result<Option<u16>, DecodeError> {
        match self.option(opt::MTU) {
            None => Ok(None),
            Some(&[a, b]) => Ok(Some(u16::from_be_bytes([a, b]))),
            Some(v) => Err(DecodeError::OptionSize {
                code: opt::MTU,
                len: v.len(),
                expected: "2",
            }),
        }
    }

    /// Option 56, as printable text (control characters dropped, at most 120 characters), for
    /// an error message.
    pub fn server_message(&self) -> Option<String> {
        let v = self.option(opt::MESSAGE)?;
        let text: String = String::from_utf8_lossy(v)
            .chars()
            .filter(|c| !c.is_control())
            .take(120)
            .collect();
        Some(text)
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
