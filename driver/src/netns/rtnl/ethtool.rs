//! ethtool netlink (generic netlink family `ethtool`, Linux 5.6+), by hand on a synchronous
//! socket like [`super::wire`]'s: the messages are a few attributes each, and the `ethtool`
//! crate's async connection would cost a runtime task per namespace for four requests. The
//! socket is opened inside the session's namespace for each call (the family id is resolved
//! on it: one more request), never kept, like the rtnetlink one.
//!
//! Features go by name (verbose bitsets), so knic does not depend on the kernel's bit order;
//! a GET asks for verbose bitsets too and reads `hw`, `active` and `nochange`.

use std::collections::BTreeSet;
use std::io;
use std::time::Duration;

use knic_proto::netconfig::{Channels, Coalesce, EthtoolSettings, Rings};
use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_GENERIC;

use super::super::ethtool::{DeviceFeatures, EthtoolState};
use super::wire::{Failure, Refusal, refusal};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_VERSION: u8 = 2;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const ETHTOOL_GENL_NAME: &str = "ethtool";
const ETHTOOL_GENL_VERSION: u8 = 1;

const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;

/// `ETHTOOL_MSG_*` requests (include/uapi/linux/ethtool_netlink.h).
pub(crate) const FEATURES_GET: u8 = 11;
pub(crate) const FEATURES_SET: u8 = 12;
pub(crate) const RINGS_GET: u8 = 15;
pub(crate) const RINGS_SET: u8 = 16;
pub(crate) const CHANNELS_GET: u8 = 17;
pub(crate) const CHANNELS_SET: u8 = 18;
pub(crate) const COALESCE_GET: u8 = 19;
pub(crate) const COALESCE_SET: u8 = 20;

/// Every request's first attribute (`ETHTOOL_A_*_HEADER`), and its `DEV_NAME`.
const A_HEADER: u16 = 1;
const A_HEADER_DEV_NAME: u16 = 2;

const A_FEATURES_HW: u16 = 2;
const A_FEATURES_WANTED: u16 = 3;
const A_FEATURES_ACTIVE: u16 = 4;
const A_FEATURES_NOCHANGE: u16 = 5;

const A_BITSET_NOMASK: u16 = 1;
const A_BITSET_BITS: u16 = 3;
const A_BITSET_BITS_BIT: u16 = 1;
const A_BITSET_BIT_NAME: u16 = 2;
const A_BITSET_BIT_VALUE: u16 = 3;

/// `ETHTOOL_A_RINGS_*`: maxima 2..=5, values 6..=9 (rx, rx-mini, rx-jumbo, tx).
const A_RINGS_RX_MAX: u16 = 2;
const A_RINGS_RX: u16 = 6;
const A_RINGS_RX_MINI: u16 = 7;
const A_RINGS_RX_JUMBO: u16 = 8;
const A_RINGS_TX: u16 = 9;
/// `ETHTOOL_A_CHANNELS_*`: maxima 2..=5, counts 6..=9 (rx, tx, other, combined).
const A_CHANNELS_RX_MAX: u16 = 2;
const A_CHANNELS_RX: u16 = 6;
const A_CHANNELS_TX: u16 = 7;
const A_CHANNELS_OTHER: u16 = 8;
const A_CHANNELS_COMBINED: u16 = 9;
const A_COALESCE_RX_USECS: u16 = 2;
const A_COALESCE_RX_MAX_FRAMES: u16 = 3;
const A_COALESCE_TX_USECS: u16 = 6;
const A_COALESCE_TX_MAX_FRAMES: u16 = 7;
const A_COALESCE_USE_ADAPTIVE_RX: u16 = 11;
const A_COALESCE_USE_ADAPTIVE_TX: u16 = 12;

const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Netlink attributes being built.
#[derive(Default)]
pub(crate) struct Attrs(Vec<u8>);

impl Attrs {
    fn raw(&mut self, kind: u16, payload: &[u8]) -> &mut Self {
        let len = u16::try_from(4 + payload.len()).unwrap_or(u16::MAX);
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
        self
    }
    fn u32(&mut self, kind: u16, v: u32) -> &mut Self {
        self.raw(kind, &v.to_ne_bytes())
    }
    fn u8(&mut self, kind: u16, v: u8) -> &mut Self {
        self.raw(kind, &[v])
    }
    fn flag(&mut self, kind: u16) -> &mut Self {
        self.raw(kind, &[])
    }
    fn string(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        self.raw(kind, &bytes)
    }
    fn nested(&mut self, kind: u16, inner: &Attrs) -> &mut Self {
        self.raw(kind | NLA_F_NESTED, &inner.0)
    }
}

/// A generic netlink request: `nlmsghdr` (type = family, request + ack), `genlmsghdr`, attrs.
pub(crate) fn message(family: u16, cmd: u8, version: u8, sequence: u32, attrs: &Attrs) -> Vec<u8> {
    let len = u32::try_from(20 + attrs.0.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&family.to_ne_bytes());
    out.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    out.extend_from_slice(&sequence.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[cmd, version, 0, 0]);
    out.extend_from_slice(&attrs.0);
    out
}

/// `CTRL_CMD_GETFAMILY` for `ethtool`.
pub(crate) fn family_request(sequence: u32) -> Vec<u8> {
    let mut a = Attrs::default();
    a.string(CTRL_ATTR_FAMILY_NAME, ETHTOOL_GENL_NAME);
    message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_VERSION, sequence, &a)
}

fn with_header(device: &str) -> Attrs {
    let mut header = Attrs::default();
    header.string(A_HEADER_DEV_NAME, device);
    let mut a = Attrs::default();
    a.nested(A_HEADER, &header);
    a
}

/// A `*_GET` of `device` (verbose bitsets: no flags).
pub(crate) fn get_request(family: u16, cmd: u8, sequence: u32, device: &str) -> Vec<u8> {
    message(
        family,
        cmd,
        ETHTOOL_GENL_VERSION,
        sequence,
        &with_header(device),
    )
}

/// `FEATURES_SET`: the wanted features by name, each listed bit set (`VALUE`) or cleared; the
/// others stay as they are (no `NOMASK`).
pub(crate) fn features_request(
    family: u16,
    sequence: u32,
    device: &str,
    features: &std::collections::BTreeMap<String, bool>,
) -> Vec<u8> {
    let mut bits = Attrs::default();
    for (name, on) in features {
        let mut bit = Attrs::default();
        bit.string(A_BITSET_BIT_NAME, name);
        if *on {
            bit.flag(A_BITSET_BIT_VALUE);
        }
        bits.nested(A_BITSET_BITS_BIT, &bit);
    }
    let mut bitset = Attrs::default();
    bitset.nested(A_BITSET_BITS, &bits);
    let mut a = with_header(device);
    a.nested(A_FEATURES_WANTED, &bitset);
    message(family, FEATURES_SET, ETHTOOL_GENL_VERSION, sequence, &a)
}

fn put_u32s(a: &mut Attrs, fields: &[(u16, Option<u32>)]) {
    for (kind, v) in fields {
        if let Some(v) = v {
            a.u32(*kind, *v);
        }
    }
}

/// `RINGS_SET` with the given sizes only.
pub(crate) fn rings_request(family: u16, sequence: u32, device: &str, r: &Rings) -> Vec<u8> {
    let mut a = with_header(device);
    put_u32s(
        &mut a,
        &[
            (A_RINGS_RX, r.rx),
            (A_RINGS_RX_MINI, r.rx_mini),
            (A_RINGS_RX_JUMBO, r.rx_jumbo),
            (A_RINGS_TX, r.tx),
        ],
    );
    message(family, RINGS_SET, ETHTOOL_GENL_VERSION, sequence, &a)
}

/// `CHANNELS_SET` with the given counts only.
pub(crate) fn channels_request(family: u16, sequence: u32, device: &str, c: &Channels) -> Vec<u8> {
    let mut a = with_header(device);
    put_u32s(
        &mut a,
        &[
            (A_CHANNELS_RX, c.rx),
            (A_CHANNELS_TX, c.tx),
            (A_CHANNELS_OTHER, c.other),
            (A_CHANNELS_COMBINED, c.combined),
        ],
    );
    message(family, CHANNELS_SET, ETHTOOL_GENL_VERSION, sequence, &a)
}

/// `COALESCE_SET` with the given parameters only.
pub(crate) fn coalesce_request(family: u16, sequence: u32, device: &str, c: &Coalesce) -> Vec<u8> {
    let mut a = with_header(device);
    put_u32s(
        &mut a,
        &[
            (A_COALESCE_RX_USECS, c.rx_usecs),
            (A_COALESCE_RX_MAX_FRAMES, c.rx_frames),
            (A_COALESCE_TX_USECS, c.tx_usecs),
            (A_COALESCE_TX_MAX_FRAMES, c.tx_frames),
        ],
    );
    for (kind, v) in [
        (A_COALESCE_USE_ADAPTIVE_RX, c.adaptive_rx),
        (A_COALESCE_USE_ADAPTIVE_TX, c.adaptive_tx),
    ] {
        if let Some(v) = v {
            a.u8(kind, u8::from(v));
        }
    }
    message(family, COALESCE_SET, ETHTOOL_GENL_VERSION, sequence, &a)
}

/// The attributes in `bytes`, as (type without flags, payload).
pub(crate) fn attrs(mut bytes: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([bytes[0], bytes[1]]));
        let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & 0x3fff;
        if len < 4 || len > bytes.len() {
            break;
        }
        out.push((kind, &bytes[4..len]));
        bytes = &bytes[((len + 3) & !3).min(bytes.len())..];
    }
    out
}

fn get_u32(payload: &[u8]) -> Option<u32> {
    payload
        .get(..4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn find(attrs: &[(u16, &[u8])], kind: u16) -> Option<u32> {
    attrs
        .iter()
        .find(|(k, _)| *k == kind)
        .and_then(|(_, p)| get_u32(p))
}

/// The family id in a `CTRL_CMD_NEWFAMILY` answer.
pub(crate) fn family_id(payload: &[u8]) -> Option<u16> {
    attrs(payload)
        .into_iter()
        .find(|(k, _)| *k == CTRL_ATTR_FAMILY_ID)
        .and_then(|(_, p)| p.get(..2).map(|b| u16::from_ne_bytes([b[0], b[1]])))
}

/// A verbose bitset: (the bits it lists, the bits it says are set). A list without a mask
/// (`NOMASK`) lists only set bits.
pub(crate) fn bitset(payload: &[u8]) -> (BTreeSet<String>, BTreeSet<String>) {
    let top = attrs(payload);
    let nomask = top.iter().any(|(k, _)| *k == A_BITSET_NOMASK);
    let mut listed = BTreeSet::new();
    let mut set = BTreeSet::new();
    for (_, bits) in top.iter().filter(|(k, _)| *k == A_BITSET_BITS) {
        for (_, bit) in attrs(bits)
            .into_iter()
            .filter(|(k, _)| *k == A_BITSET_BITS_BIT)
        {
            let fields = attrs(bit);
            let Some(name) = fields
                .iter()
                .find(|(k, _)| *k == A_BITSET_BIT_NAME)
                .map(|(_, p)| {
                    String::from_utf8_lossy(p.split(|b| *b == 0).next().unwrap_or_default())
                        .into_owned()
                })
            else {
                continue;
            };
            if nomask || fields.iter().any(|(k, _)| *k == A_BITSET_BIT_VALUE) {
                set.insert(name.clone());
            }
            listed.insert(name);
        }
    }
    (listed, set)
}

/// A `FEATURES_GET` answer: changeable = `hw` − `nochange`, and `active`.
pub(crate) fn features(payload: &[u8]) -> DeviceFeatures {
    let mut hw = BTreeSet::new();
    let mut nochange = BTreeSet::new();
    let mut active = BTreeSet::new();
    for (kind, p) in attrs(payload) {
        match kind {
            A_FEATURES_HW => hw = bitset(p).1,
            A_FEATURES_ACTIVE => active = bitset(p).1,
            A_FEATURES_NOCHANGE => nochange = bitset(p).1,
            _ => {}
        }
    }
    DeviceFeatures {
        changeable: hw.difference(&nochange).cloned().collect(),
        active,
    }
}

/// The features a `FEATURES_SET` answer says the kernel did not take as asked (its `WANTED`
/// bitset lists where the request and the resulting wanted set differ).
pub(crate) fn not_taken(payload: &[u8]) -> BTreeSet<String> {
    attrs(payload)
        .into_iter()
        .find(|(k, _)| *k == A_FEATURES_WANTED)
        .map(|(_, p)| bitset(p).0)
        .unwrap_or_default()
}

/// A `RINGS_GET` answer: (current sizes, maxima). A ring kind the device lacks is absent.
pub(crate) fn rings(payload: &[u8]) -> (Rings, Rings) {
    let a = attrs(payload);
    let at = |base: u16| Rings {
        rx: find(&a, base),
        rx_mini: find(&a, base + 1),
        rx_jumbo: find(&a, base + 2),
        tx: find(&a, base + 3),
    };
    (at(A_RINGS_RX), at(A_RINGS_RX_MAX))
}

/// A `CHANNELS_GET` answer: (current counts, maxima).
pub(crate) fn channels(payload: &[u8]) -> (Channels, Channels) {
    let a = attrs(payload);
    let at = |base: u16| Channels {
        rx: find(&a, base),
        tx: find(&a, base + 1),
        other: find(&a, base + 2),
        combined: find(&a, base + 3),
    };
    (at(A_CHANNELS_RX), at(A_CHANNELS_RX_MAX))
}

/// A `COALESCE_GET` answer (the parameters the driver supports).
pub(crate) fn coalesce(payload: &[u8]) -> Coalesce {
    let a = attrs(payload);
    let flag = |kind: u16| {
        a.iter()
            .find(|(k, _)| *k == kind)
            .and_then(|(_, p)| p.first())
            .map(|b| *b != 0)
    };
    Coalesce {
        rx_usecs: find(&a, A_COALESCE_RX_USECS),
        tx_usecs: find(&a, A_COALESCE_TX_USECS),
        rx_frames: find(&a, A_COALESCE_RX_MAX_FRAMES),
        tx_frames: find(&a, A_COALESCE_TX_MAX_FRAMES),
        adaptive_rx: flag(A_COALESCE_USE_ADAPTIVE_RX),
        adaptive_tx: flag(A_COALESCE_USE_ADAPTIVE_TX),
    }
}

/// One generic netlink socket with the `ethtool` family resolved.
pub(crate) struct Genl {
    socket: Socket,
    family: u16,
    sequence: u32,
    buf: Vec<u8>,
}

impl Genl {
    /// A socket in the calling thread's namespace, the family resolved on it. `Ok(None)`: the
    /// kernel has no ethtool netlink.
    pub(crate) fn open() -> io::Result<Result<Genl, Failure>> {
        let socket = Socket::new(NETLINK_GENERIC)?;
        socket.set_ext_ack(true)?;
        socket.set_cap_ack(true)?;
        let timeout =
            nix::sys::time::TimeVal::new(i64::try_from(ANSWER_TIMEOUT.as_secs()).unwrap_or(10), 0);
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(io::Error::from)?;
        let mut genl = Genl {
            socket,
            family: 0,
            sequence: 0,
            buf: Vec::with_capacity(16 * 1024),
        };
        let sequence = genl.next();
        let replies = match genl.exchange(&family_request(sequence), sequence) {
            Ok(replies) => replies,
            Err(e) => return Ok(Err(e)),
        };
        match replies.iter().find_map(|r| family_id(r)) {
            Some(id) => {
                genl.family = id;
                Ok(Ok(genl))
            }
            None => Err(io::Error::other(
                "the kernel's answer about the ethtool family has no id",
            )),
        }
    }

    pub(crate) fn family(&self) -> u16 {
        self.family
    }

    pub(crate) fn next(&mut self) -> u32 {
        self.sequence = self.sequence.wrapping_add(1);
        self.sequence
    }

    /// Sends one request numbered `sequence` and returns its replies' payloads (after the
    /// genetlink header), or the kernel's refusal.
    pub(crate) fn exchange(
        &mut self,
        request: &[u8],
        sequence: u32,
    ) -> Result<Vec<Vec<u8>>, Failure> {
        let sent = self.socket.send(request, 0)?;
        if sent != request.len() {
            return Err(Failure::Io(io::Error::other(format!(
                "netlink sent {sent} of {} bytes",
                request.len()
            ))));
        }
        let mut replies = Vec::new();
        loop {
            let size = self
                .socket
                .recv(&mut &mut [0u8; 0][..], libc_flags())
                .map_err(timed_out)?;
            self.buf.clear();
            self.buf.reserve(size);
            let read = self.socket.recv(&mut self.buf, 0).map_err(timed_out)?;
            let mut bytes = &self.buf[..read];
            while bytes.len() >= 16 {
                let len = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
                if len < 16 || len > bytes.len() {
                    return Err(Failure::Io(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a netlink message claims {len} bytes of {}", bytes.len()),
                    )));
                }
                let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
                let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
                let seq = u32::from_ne_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
                let message = &bytes[16..len];
                bytes = &bytes[((len + 3) & !3).min(bytes.len())..];
                if seq != sequence {
                    continue;
                }
                if kind == NLMSG_ERROR {
                    let code = message
                        .get(..4)
                        .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                    if code == 0 {
                        return Ok(replies);
                    }
                    return Err(Failure::Refused(refusal(code, &message[4..], flags)));
                }
                replies.push(message.get(4..).unwrap_or_default().to_vec());
            }
        }
    }
}

fn libc_flags() -> i32 {
    nix::libc::MSG_PEEK | nix::libc::MSG_TRUNC
}

fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the kernel did not answer an ethtool request within {} s",
                ANSWER_TIMEOUT.as_secs()
            ),
        )
    } else {
        e
    }
}

/// The kernel's refusal as text: errno and, where given, its ext-ack message.
pub(crate) fn text(refused: &Refusal) -> String {
    refused.to_io().to_string()
}

/// Reads what `asked` needs of `device`: one GET per part asked for. The error is the part
/// (`features`, `rings`…) and the failure.
pub(crate) fn read(
    genl: &mut Genl,
    device: &str,
    asked: &EthtoolSettings,
) -> Result<EthtoolState, (&'static str, Failure)> {
    let mut state = EthtoolState::default();
    let mut get = |cmd: u8, part: &'static str| {
        let sequence = genl.next();
        let request = get_request(genl.family(), cmd, sequence, device);
        genl.exchange(&request, sequence)
            .map(|r| r.into_iter().next().unwrap_or_default())
            .map_err(|e| (part, e))
    };
    if !asked.features.is_empty() {
        state.features = Some(features(&get(FEATURES_GET, "features")?));
    }
    if asked.rings.is_some() {
        state.rings = Some(rings(&get(RINGS_GET, "rings")?).0);
    }
    if asked.channels.is_some() {
        state.channels = Some(channels(&get(CHANNELS_GET, "channels")?).0);
    }
    if asked.coalesce.is_some() {
        state.coalesce = Some(coalesce(&get(COALESCE_GET, "coalesce")?));
    }
    Ok(state)
}

/// The maxima of rings or channels, for an error about a size the device refused.
pub(crate) fn maxima(genl: &mut Genl, device: &str, cmd: u8) -> Option<String> {
    let sequence = genl.next();
    let request = get_request(genl.family(), cmd, sequence, device);
    let reply = genl.exchange(&request, sequence).ok()?.into_iter().next()?;
    let text = if cmd == RINGS_GET {
        super::super::ethtool::rings_text(&rings(&reply).1)
    } else {
        super::super::ethtool::channels_text(&channels(&reply).1)
    };
    Some(format!("the device's maxima:{text}"))
}

/// `EOPNOTSUPP`: the device's driver has no such ethtool operation.
const EOPNOTSUPP: i32 = 95;

impl super::RtnlSession {
    /// A generic netlink socket in this session's namespace.
    fn genl(&self, what: &str) -> crate::error::Result<Genl> {
        let ns = self.describe();
        match super::in_namespace(self.ns_path.as_deref(), Genl::open) {
            Ok(Ok(genl)) => {
                self.sent(1);
                Ok(genl)
            }
            Ok(Err(e)) if matches!(e.errno(), Some(2)) => Err(crate::error::Error::kernel(
                ns,
                what.to_owned(),
                "the kernel has no ethtool netlink (Linux 5.6+ with CONFIG_ETHTOOL_NETLINK)",
            )),
            Ok(Err(e)) => Err(crate::error::Error::io(
                format!("{what} in namespace {ns}: resolving the ethtool family"),
                e.into_io(),
            )),
            Err(e) => Err(crate::error::Error::io(
                format!("{what}: opening generic netlink in namespace {ns}"),
                e,
            )),
        }
    }

    pub(super) async fn ethtool_state_now(
        &mut self,
        name: &str,
        asked: &EthtoolSettings,
    ) -> crate::error::Result<EthtoolState> {
        let what = format!("reading the ethtool settings of {name}");
        let mut genl = self.genl(&what)?;
        let parts = u64::from(!asked.features.is_empty())
            + u64::from(asked.rings.is_some())
            + u64::from(asked.channels.is_some())
            + u64::from(asked.coalesce.is_some());
        self.sent(parts);
        read(&mut genl, name, asked).map_err(|(part, e)| {
            let reason = match &e {
                Failure::Refused(r) if r.errno == EOPNOTSUPP => format!(
                    "the device's driver does not support ethtool {part} ({})",
                    text(r)
                ),
                Failure::Refused(r) => text(r),
                Failure::Io(e) => e.to_string(),
            };
            crate::error::Error::kernel(
                self.describe(),
                format!("reading ethtool {part} of {name}"),
                reason,
            )
        })
    }

    pub(super) async fn set_ethtool_now(
        &mut self,
        name: &str,
        settings: &EthtoolSettings,
    ) -> crate::error::Result<()> {
        use super::super::ethtool::{channels_text, coalesce_text, rings_text};
        let what = format!("setting the ethtool settings of {name}");
        let mut genl = self.genl(&what)?;
        let family = genl.family();
        let ns = self.describe();
        let refused = |part: &str, values: String, e: Failure, extra: Option<String>| {
            let mut reason = match &e {
                Failure::Refused(r) if r.errno == EOPNOTSUPP => format!(
                    "the device's driver does not support changing ethtool {part} ({})",
                    text(r)
                ),
                Failure::Refused(r) => text(r),
                Failure::Io(e) => e.to_string(),
            };
            if let Some(extra) = extra {
                reason = format!("{reason}; {extra}");
            }
            crate::error::Error::kernel(
                ns.clone(),
                format!("setting ethtool {part} of {name} ({values})"),
                reason,
            )
        };
        if !settings.features.is_empty() {
            self.sent(1);
            let sequence = genl.next();
            let request = features_request(family, sequence, name, &settings.features);
            let values = super::super::ethtool::describe(&EthtoolSettings {
                features: settings.features.clone(),
                ..EthtoolSettings::default()
            });
            let replies = genl
                .exchange(&request, sequence)
                .map_err(|e| refused("features", values.clone(), e, None))?;
            let missed: Vec<String> = replies
                .iter()
                .flat_map(|r| not_taken(r))
                .filter(|f| settings.features.contains_key(f))
                .collect();
            if !missed.is_empty() {
                return Err(crate::error::Error::kernel(
                    ns.clone(),
                    format!("setting ethtool features of {name} ({values})"),
                    format!(
                        "the kernel did not take {}: the device cannot change it",
                        missed.join(", ")
                    ),
                ));
            }
        }
        type Build<'a> = Box<dyn Fn(u32) -> Vec<u8> + 'a>;
        let mut parts: Vec<(&str, u8, String, Build<'_>)> = Vec::new();
        if let Some(r) = settings.rings {
            parts.push((
                "rings",
                RINGS_GET,
                rings_text(&r),
                Box::new(move |s| rings_request(family, s, name, &r)),
            ));
        }
        if let Some(c) = settings.channels {
            parts.push((
                "channels",
                CHANNELS_GET,
                channels_text(&c),
                Box::new(move |s| channels_request(family, s, name, &c)),
            ));
        }
        if let Some(c) = settings.coalesce {
            parts.push((
                "coalesce",
                COALESCE_GET,
                coalesce_text(&c),
                Box::new(move |s| coalesce_request(family, s, name, &c)),
            ));
        }
        for (part, get, values, build) in parts {
            self.sent(1);
            let sequence = genl.next();
            if let Err(e) = genl.exchange(&build(sequence), sequence) {
                let extra = match (&e, get) {
                    (Failure::Refused(r), RINGS_GET | CHANNELS_GET) if r.errno != EOPNOTSUPP => {
                        maxima(&mut genl, name, get)
                    }
                    _ => None,
                };
                return Err(refused(part, values.trim().to_owned(), e, extra));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
