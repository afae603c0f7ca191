//! ttrpc, the RPC protocol NRI runs on each multiplexed connection: framing, a server that
//! dispatches by method name and answers independent calls concurrently ([`serve`]), and a
//! client.
//!
//! Written by hand (no `ttrpc` crate) because it is small and the NRI transport needs it to run
//! over the multiplexer's logical connections rather than over a socket of its own. Frame =
//! `data length (u32 BE) | stream id (u32 BE) | type (u8) | flags (u8) | data`, data at most
//! 4 MiB. Requests and responses carry the protobuf envelopes of [`knic_proto::ttrpc`]; clients
//! use odd stream ids 1, 3, 5, ... Only unary calls exist in NRI, so data frames and streaming
//! flags are ignored.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knic_proto::ttrpc::{Request, Response, Status};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::mux::{ConnWriter, MuxConn};

mod server;
pub use server::{MAX_IN_FLIGHT, Order, serve, serve_with_limit};

/// Size of a ttrpc frame header.
pub const HEADER_LEN: usize = 10;
/// Largest frame data ttrpc allows (Go's `messageLengthMax`); larger messages are refused with
/// ResourceExhausted, which is what makes NRI runtimes split Synchronize into chunks.
pub const MAX_MESSAGE: usize = 4 << 20;
/// Frame type of a request.
pub const TYPE_REQUEST: u8 = 1;
/// Frame type of a response.
pub const TYPE_RESPONSE: u8 = 2;
/// Frame type of stream data (ttrpc streaming; NRI does not use it).
pub const TYPE_DATA: u8 = 3;

/// The gRPC status codes knic sends or interprets; ttrpc reuses gRPC's numbering.
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// What Go's ttrpc reports for a plain error returned by a handler.
    pub const UNKNOWN: i32 = 2;
    /// The request could not be decoded.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// The caller's deadline passed.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// The message is larger than [`super::MAX_MESSAGE`].
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    /// Unknown service or method; NRI >= 0.12 runtimes fall back to StateChange on it.
    pub const UNIMPLEMENTED: i32 = 12;
    /// The handler broke (panicked) instead of answering; only that call fails.
    pub const INTERNAL: i32 = 13;
}

/// A status with `code` and `message` and no details.
pub fn status(code: i32, message: impl Into<String>) -> Status {
    Status {
        code,
        message: message.into(),
        details: Vec::new(),
    }
}

/// One ttrpc frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The call it belongs to; client-initiated streams are odd.
    pub stream_id: u32,
    /// [`TYPE_REQUEST`], [`TYPE_RESPONSE`] or [`TYPE_DATA`].
    pub kind: u8,
    /// Stream flags (remote-closed, remote-open, no-data); unused by unary calls.
    pub flags: u8,
    /// The protobuf payload (a `Request` or `Response`).
    pub data: Vec<u8>,
}

/// Encodes one frame; `None` if `data` exceeds [`MAX_MESSAGE`] (the peer would reject it).
pub fn encode_frame(stream_id: u32, kind: u8, flags: u8, data: &[u8]) -> Option<Vec<u8>> {
    if data.len() > MAX_MESSAGE {
        return None;
    }
    let mut out = Vec::with_capacity(HEADER_LEN + data.len());
    // Bounded by MAX_MESSAGE above, so the length fits in a u32.
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(data);
    Some(out)
}

/// Encodes `request` as a request frame on `stream_id`; `None` if it is too large.
pub fn encode_request(stream_id: u32, request: &Request) -> Option<Vec<u8>> {
    encode_frame(stream_id, TYPE_REQUEST, 0, &request.encode_to_vec())
}

/// Encodes `response` as a response frame on `stream_id`; `None` if it is too large.
pub fn encode_response(stream_id: u32, response: &Response) -> Option<Vec<u8>> {
    encode_frame(stream_id, TYPE_RESPONSE, 0, &response.encode_to_vec())
}

/// The envelope for a call, as Go's ttrpc client builds it: the deadline travels as
/// `timeout_nano` so the server knows how long the caller waits.
pub fn request(service: &str, method: &str, payload: Vec<u8>, timeout: Duration) -> Request {
    Request {
        service: service.to_owned(),
        method: method.to_owned(),
        payload,
        timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
        metadata: Vec::new(),
    }
}

/// What the decoder produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A complete frame.
    Frame(Frame),
    /// A frame whose header announced more than [`MAX_MESSAGE`] bytes; its data is skipped so
    /// the stream stays in sync, and a server answers the stream with ResourceExhausted.
    Oversized {
        /// The stream it was sent on.
        stream_id: u32,
        /// Its frame type.
        kind: u8,
        /// The announced length.
        length: u32,
    },
}

/// Incremental ttrpc frame decoder over a logical connection's byte stream.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    discard: usize,
}

impl Decoder {
    /// A decoder with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds stream bytes (any chunking).
    pub fn push(&mut self, bytes: &[u8]) {
        let skip = self.discard.min(bytes.len());
        self.discard -= skip;
        self.buf.extend_from_slice(&bytes[skip..]);
    }

    /// The next complete frame, if one has arrived.
    pub fn next_frame(&mut self) -> Option<Decoded> {
        if self.discard > 0 || self.buf.len() < HEADER_LEN {
            return None;
        }
        let b = &self.buf;
        let length = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let stream_id = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let (kind, flags) = (b[8], b[9]);
        let len = length as usize;
        if len > MAX_MESSAGE {
            let available = (self.buf.len() - HEADER_LEN).min(len);
            self.buf.drain(..HEADER_LEN + available);
            self.discard = len - available;
            return Some(Decoded::Oversized {
                stream_id,
                kind,
                length,
            });
        }
        if self.buf.len() < HEADER_LEN + len {
            return None;
        }
        let data = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Some(Decoded::Frame(Frame {
            stream_id,
            kind,
            flags,
            data,
        }))
    }
}

/// A ttrpc service implementation: one async function from method name and request payload to
/// response payload or error status, and the rule for which calls may overlap.
pub trait Service: Send + Sync {
    /// Handles one call of `method` (the bare name, e.g. `RunPodSandbox`). Unknown methods should
    /// return [`code::UNIMPLEMENTED`], as ttrpc does, so callers can fall back.
    fn call(
        &self,
        method: &str,
        payload: &[u8],
    ) -> impl Future<Output = Result<Vec<u8>, Status>> + Send;

    /// How this request may run relative to the others on the connection, decided when it is
    /// read. The default, [`Order::Exclusive`] for everything, answers one call at a time in
    /// arrival order, which is what a service without its own ordering rules needs.
    fn order(&self, method: &str, payload: &[u8]) -> Order {
        let _ = (method, payload);
        Order::Exclusive
    }

    /// Checked after every exclusive call: `true` ends [`serve`] (NRI's Shutdown).
    fn finished(&self) -> bool {
        false
    }
}

fn error_response(code: i32, message: impl Into<String>) -> Response {
    Response {
        status: Some(status(code, message)),
        payload: Vec::new(),
    }
}

/// Why a client call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The server answered with a non-OK status.
    Status {
        /// The gRPC status code, see [`code`].
        code: i32,
        /// The server's message (for NRI plugins, the handler's error text).
        message: String,
    },
    /// No answer within the timeout.
    Timeout(Duration),
    /// The connection closed before the answer came.
    Closed,
    /// The request exceeds [`MAX_MESSAGE`] and was not sent (Go's client fails the same way,
    /// with ResourceExhausted, which tells NRI to split Synchronize).
    TooLarge(usize),
    /// Writing the request failed.
    Io(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Status { code, message } => write!(f, "status code {code}: {message}"),
            CallError::Timeout(t) => write!(f, "no answer within {t:?} (deadline exceeded)"),
            CallError::Closed => f.write_str("connection closed"),
            CallError::TooLarge(n) => {
                write!(
                    f,
                    "request of {n} bytes exceeds the {MAX_MESSAGE}-byte ttrpc limit"
                )
            }
            CallError::Io(e) => write!(f, "write failed: {e}"),
        }
    }
}

impl std::error::Error for CallError {}

type Pending = Arc<Mutex<Option<HashMap<u32, oneshot::Sender<Response>>>>>;

/// A ttrpc client on one logical connection. Calls may run concurrently; each gets its own odd
/// stream id.
#[derive(Debug)]
pub struct Client {
    writer: ConnWriter,
    next_stream: AtomicU32,
    pending: Pending,
    reader: JoinHandle<()>,
}

impl Client {
    /// Starts reading responses from `conn`.
    pub fn new(conn: MuxConn) -> Client {
        let (rx, writer) = conn.into_parts();
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let reader = tokio::spawn(read_responses(rx, pending.clone()));
        Client {
            writer,
            next_stream: AtomicU32::new(1),
            pending,
            reader,
        }
    }

    /// Calls `service`/`method` with an encoded request and returns the encoded response.
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let request = request(service, method, payload, timeout);
        let stream_id = self.next_stream.fetch_add(2, Ordering::Relaxed);
        let data = request.encode_to_vec();
        let frame = encode_frame(stream_id, TYPE_REQUEST, 0, &data)
            .ok_or(CallError::TooLarge(data.len()))?;
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            match pending.as_mut() {
                Some(map) => map.insert(stream_id, tx),
                None => return Err(CallError::Closed),
            };
        }
        let forget = || {
            if let Some(map) = lock(&self.pending).as_mut() {
                map.remove(&stream_id);
            }
        };
        if let Err(e) = self.writer.send(&frame).await {
            forget();
            return Err(CallError::Io(e.to_string()));
        }
        let response = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(response)) => response,
            Ok(Err(_)) => return Err(CallError::Closed),
            Err(_) => {
                forget();
                return Err(CallError::Timeout(timeout));
            }
        };
        match response.status {
            Some(status) if status.code != code::OK => Err(CallError::Status {
                code: status.code,
                message: status.message,
            }),
            _ => Ok(response.payload),
        }
    }

    /// Whether the connection is gone (every further call fails with [`CallError::Closed`]).
    pub fn is_closed(&self) -> bool {
        lock(&self.pending).is_none()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map inconsistent; keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn read_responses(mut rx: mpsc::UnboundedReceiver<Vec<u8>>, pending: Pending) {
    let mut decoder = Decoder::new();
    while let Some(bytes) = rx.recv().await {
        decoder.push(&bytes);
        while let Some(decoded) = decoder.next_frame() {
            let (stream_id, response) = match decoded {
                Decoded::Frame(frame) if frame.kind == TYPE_RESPONSE => {
                    match Response::decode(frame.data.as_slice()) {
                        Ok(response) => (frame.stream_id, response),
                        Err(e) => (
                            frame.stream_id,
                            error_response(code::UNKNOWN, format!("undecodable response: {e}")),
                        ),
                    }
                }
                Decoded::Oversized {
                    stream_id, length, ..
                } => (
                    stream_id,
                    error_response(
                        code::RESOURCE_EXHAUSTED,
                        format!("response of {length} bytes exceeds {MAX_MESSAGE}"),
                    ),
                ),
                Decoded::Frame(_) => continue,
            };
            let waiter = lock(&pending)
                .as_mut()
                .and_then(|map| map.remove(&stream_id));
            match waiter {
                Some(tx) => {
                    let _ = tx.send(response);
                }
                None => tracing::debug!(stream = stream_id, "ttrpc response for no pending call"),
            }
        }
    }
    // Connection gone: dropping the senders fails every pending call with Closed.
    lock(&pending).take();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_split_input() {
        let bytes = encode_frame(3, TYPE_REQUEST, 0, b"abc").unwrap();
        assert_eq!(bytes, [0, 0, 0, 3, 0, 0, 0, 3, 1, 0, b'a', b'b', b'c']);
        let mut dec = Decoder::new();
        dec.push(&bytes[..4]);
        assert!(dec.next_frame().is_none());
        dec.push(&bytes[4..]);
        assert_eq!(
            dec.next_frame(),
            Some(Decoded::Frame(Frame {
                stream_id: 3,
                kind: TYPE_REQUEST,
                flags: 0,
                data: b"abc".to_vec()
            }))
        );
        assert!(encode_frame(1, TYPE_REQUEST, 0, &vec![0; MAX_MESSAGE + 1]).is_none());
    }

    #[test]
    fn oversized_frames_are_skipped_and_the_stream_stays_in_sync() {
        let len = MAX_MESSAGE + 2;
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(len as u32).to_be_bytes());
        bytes.extend_from_slice(&5u32.to_be_bytes());
        bytes.extend_from_slice(&[TYPE_REQUEST, 0]);
        bytes.extend(std::iter::repeat_n(0xAA, len));
        bytes.extend(encode_frame(7, TYPE_REQUEST, 0, b"ok").unwrap());
        let mut dec = Decoder::new();
        for chunk in bytes.chunks(1 << 20) {
            dec.push(chunk);
        }
        assert_eq!(
            dec.next_frame(),
            Some(Decoded::Oversized {
                stream_id: 5,
                kind: TYPE_REQUEST,
                length: len as u32
            })
        );
        match dec.next_frame() {
            Some(Decoded::Frame(f)) => assert_eq!((f.stream_id, f.data), (7, b"ok".to_vec())),
            other => panic!("{other:?}"),
        }
    }
}
