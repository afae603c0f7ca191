//! Lets real gRPC clients reach knic's sockets whatever `:authority` they send.
//!
//! The kubelet's plugin watcher dials the registration socket by its bare path with grpc-go,
//! which sends the percent-encoded path as `:authority` (`%2Fvar%2Flib%2F…-reg.sock`); gRPC
//! C-core (Python `grpcio` ≥ 1.57) does the same for `unix:` targets, other clients send the raw
//! path or nothing. The `h2` crate under tonic checks `:authority` with `http`'s URI parser and
//! resets such a stream with `PROTOCOL_ERROR`, so an unmodified kubelet cannot register knic
//! (hyperium/h2#487, open for years, would relax it).
//!
//! Why a shim and not a patched `h2` or another server: a vendored `h2` fork is 15,000 lines to
//! rebase on every release, and no maintained Rust HTTP/2 server accepts these authorities. The
//! shim sits between the accepted unix stream and tonic and rewrites only what h2 would refuse:
//! it decodes each client header block (HEADERS + CONTINUATION, HPACK with the client's dynamic
//! table), replaces an `:authority` that `http::uri::Authority` refuses (the same check h2 makes)
//! by [`REPLACEMENT_AUTHORITY`], and re-encodes the block with the static table and literals only,
//! so the server's HPACK state never depends on ours. Every other frame, and the whole server →
//! client direction, passes through untouched. Nothing is weakened: on a unix socket the
//! authority names nothing (only root can connect), and anything the shim cannot parse — not
//! HTTP/2, a malformed or oversized header block — makes it step aside and hand the client's
//! bytes to h2 unchanged, so h2 answers with its own protocol error exactly as before.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hpack::{self, Decoder, Field};

/// What an unusable `:authority` becomes: the name a unix socket's server is for.
pub const REPLACEMENT_AUTHORITY: &str = "localhost";

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest compressed header block the shim buffers; beyond it, it steps aside. Far above any
/// gRPC request (a kubelet's is under 300 bytes) and above the server's own header limits.
const MAX_BLOCK: usize = 256 * 1024;
/// Bound on what one block may decode to (see [`Decoder::new`]).
const MAX_DECODED: usize = 1024 * 1024;
/// The frame size every HTTP/2 server must accept (RFC 7540 §4.2), used for frames we write.
const MAX_FRAME: usize = 16_384;

/// What to do with each request's `:authority`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityPolicy {
    /// Replace a value h2 refuses by [`REPLACEMENT_AUTHORITY`]; keep valid ones (the servers).
    Repair,
    /// Set exactly this value, valid or not: a test client playing grpc-go, whose `:authority`
    /// tonic's own client cannot send.
    Set(Vec<u8>),
}

/// The client → server byte stream transformation, pure so it is tested byte for byte.
#[derive(Debug)]
pub struct Rewriter {
    policy: AuthorityPolicy,
    state: State,
    pending: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    decoder: Decoder,
    block: Option<Block>,
    rewritten: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the 24-byte client preface.
    Preface,
    /// Frame by frame; `passthrough` bytes of the current non-header frame are still to copy.
    Frames { passthrough: usize },
    /// Stepped aside: every byte goes through as it came.
    Raw,
}

/// A header block being collected (a HEADERS frame waiting for its CONTINUATIONs).
#[derive(Debug)]
struct Block {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The client's frames as received, handed over unchanged if the shim steps aside.
    original: Vec<u8>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter::new(AuthorityPolicy::Repair)
    }
}

impl Rewriter {
    /// A rewriter for one connection, from its first byte.
    pub fn new(policy: AuthorityPolicy) -> Self {
        Rewriter {
            policy,
            state: State::Preface,
            pending: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            decoder: Decoder::new(hpack::DEFAULT_TABLE_SIZE, MAX_DECODED),
            block: None,
            rewritten: 0,
        }
    }

    /// Takes bytes the client sent.
    pub fn feed(&mut self, input: &[u8]) {
        self.pending.extend_from_slice(input);
        self.process();
    }

    /// The client closed its side: whatever is incomplete goes to the server as it is (h2
    /// reports the truncation).
    pub fn finish(&mut self) {
        self.step_aside("the client closed the connection mid-frame");
    }

    /// Moves transformed bytes into `buf`; returns how many.
    pub fn take(&mut self, buf: &mut [u8]) -> usize {
        let ready = &self.out[self.out_pos..];
        let n = ready.len().min(buf.len());
        buf[..n].copy_from_slice(&ready[..n]);
        self.out_pos += n;
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
        n
    }

    /// Whether transformed bytes are waiting.
    pub fn has_output(&self) -> bool {
        self.out_pos < self.out.len()
    }

    /// How many `:authority` values were replaced on this connection.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Whether the shim has stepped aside for the rest of the connection.
    pub fn stepped_aside(&self) -> bool {
        self.state == State::Raw
    }

    fn process(&mut self) {
        loop {
            match self.state {
                State::Raw => {
                    self.out.append(&mut self.pending);
                    return;
                }
                State::Preface => {
                    let n = self.pending.len().min(PREFACE.len());
                    if self.pending[..n] != PREFACE[..n] {
                        self.step_aside("not an HTTP/2 client preface");
                    } else if n < PREFACE.len() {
                        return;
                    } else {
                        self.out.extend(self.pending.drain(..PREFACE.len()));
                        self.state = State::Frames { passthrough: 0 };
                    }
                }
                State::Frames { passthrough } if passthrough > 0 => {
                    if self.pending.is_empty() {
                        return;
                    }
                    let n = passthrough.min(self.pending.len());
                    self.out.extend(self.pending.drain(..n));
                    self.state = State::Frames {
                        passthrough: passthrough - n,
                    };
                }
                State::Frames { .. } => {
                    if self.pending.len() < FRAME_HEADER {
                        return;
                    }
                    let len = usize::from(self.pending[0]) << 16
                        | usize::from(self.pending[1]) << 8
                        | usize::from(self.pending[2]);
                    let kind = self.pending[3];
                    let is_header = kind == TYPE_HEADERS || kind == TYPE_CONTINUATION;
                    if !is_header && self.block.is_none() {
                        self.out.extend(self.pending.drain(..FRAME_HEADER));
                        self.state = State::Frames { passthrough: len };
                        continue;
                    }
                    if len > MAX_FRAME {
                        // Over the frame size the server announced (it announces the
                        // default): h2 answers FRAME_SIZE_ERROR, so it must see the frame.
                        self.step_aside("header frame larger than the server's frame size");
                        continue;
                    }
                    if self.pending.len() < FRAME_HEADER + len {
                        return;
                    }
                    let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
                    if let Err(why) = self.header_frame(frame) {
                        self.step_aside(why);
                    }
                }
            }
        }
    }

    /// Handles a HEADERS or CONTINUATION frame (or, while a block is open, any frame: only a
    /// CONTINUATION of the same stream may follow).
    fn header_frame(&mut self, frame: Vec<u8>) -> Result<(), &'static str> {
        let kind = frame[3];
        let flags = frame[4];
        let stream: [u8; 4] = [frame[5], frame[6], frame[7], frame[8]];
        let payload = &frame[FRAME_HEADER..];
        match self.block.as_mut() {
            Some(block) => {
                if kind != TYPE_CONTINUATION || stream != block.stream {
                    block.original.extend_from_slice(&frame);
                    return Err("a header block was interrupted by another frame");
                }
                block.fragment.extend_from_slice(payload);
                block.original.extend_from_slice(&frame);
                if block.fragment.len() > MAX_BLOCK {
                    return Err("header block larger than the shim buffers");
                }
            }
            None => {
                if kind != TYPE_HEADERS {
                    self.block = Some(Block::unparsed(frame));
                    return Err("CONTINUATION without a header block");
                }
                let (fragment, priority) = match headers_payload(payload, flags) {
                    Ok(parts) => parts,
                    Err(why) => {
                        self.block = Some(Block::unparsed(frame));
                        return Err(why);
                    }
                };
                self.block = Some(Block {
                    stream,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                    original: frame.clone(),
                });
            }
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let mut fields = match self.decoder.decode(&block.fragment) {
            Ok(fields) => fields,
            Err(malformed) => {
                tracing::debug!(error = %malformed, "gRPC socket: header block not decodable");
                self.block = Some(block);
                return Err("the header block does not decode");
            }
        };
        self.fix_authority(&mut fields);
        let mut encoded = Vec::new();
        hpack::encode(&fields, &mut encoded);
        write_block(&mut self.out, &block, &encoded);
        Ok(())
    }

    fn fix_authority(&mut self, fields: &mut [Field]) {
        for field in fields.iter_mut().filter(|f| f.name == b":authority") {
            if let AuthorityPolicy::Set(value) = &self.policy {
                field.value.clone_from(value);
                self.rewritten += 1;
            } else if http::uri::Authority::try_from(field.value.as_slice()).is_err() {
                let shown: String = String::from_utf8_lossy(&field.value)
                    .chars()
                    .take(128)
                    .collect();
                tracing::debug!(authority = ?shown, replacement = REPLACEMENT_AUTHORITY,
                    "gRPC socket: replacing an :authority HTTP/2 servers refuse");
                field.value = REPLACEMENT_AUTHORITY.as_bytes().to_vec();
                self.rewritten += 1;
            }
        }
    }

    /// Hands everything not yet forwarded to the server unchanged, from now on.
    fn step_aside(&mut self, why: &'static str) {
        if self.state != State::Raw {
            tracing::debug!(reason = why, "gRPC socket: authority shim steps aside");
        }
        if let Some(block) = self.block.take() {
            self.out.extend_from_slice(&block.original);
        }
        self.out.append(&mut self.pending);
        self.state = State::Raw;
    }
}

impl Block {
    fn unparsed(frame: Vec<u8>) -> Self {
        Block {
            stream: [0; 4],
            end_stream: false,
            priority: None,
            fragment: Vec::new(),
            original: frame,
        }
    }
}

/// Splits a HEADERS payload into its block fragment and priority fields, dropping padding.
fn headers_payload(payload: &[u8], flags: u8) -> Result<(&[u8], Option<[u8; 5]>), &'static str> {
    let mut rest = payload;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        let (&len, tail) = rest.split_first().ok_or("HEADERS padding length missing")?;
        pad = usize::from(len);
        rest = tail;
    }
    let priority = if flags & FLAG_PRIORITY != 0 {
        if rest.len() < 5 {
            return Err("HEADERS priority fields missing");
        }
        let (p, tail) = rest.split_at(5);
        rest = tail;
        Some([p[0], p[1], p[2], p[3], p[4]])
    } else {
        None
    };
    if pad > rest.len() {
        return Err("HEADERS padding longer than the frame");
    }
    Ok((&rest[..rest.len() - pad], priority))
}

/// Writes `encoded` as one HEADERS frame and as many CONTINUATIONs as needed.
fn write_block(out: &mut Vec<u8>, block: &Block, encoded: &[u8]) {
    let mut first = Vec::with_capacity(MAX_FRAME);
    if let Some(p) = block.priority {
        first.extend_from_slice(&p);
    }
    let take = encoded.len().min(MAX_FRAME - first.len());
    first.extend_from_slice(&encoded[..take]);
    let mut rest = &encoded[take..];
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    frame(out, TYPE_HEADERS, flags, block.stream, &first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        frame(out, TYPE_CONTINUATION, flags, block.stream, chunk);
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: [u8; 4], payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

/// An accepted connection with its inbound bytes going through a [`Rewriter`].
#[derive(Debug)]
pub struct AuthorityShim<IO> {
    io: IO,
    rewriter: Rewriter,
    scratch: Box<[u8]>,
    eof: bool,
}

impl<IO> AuthorityShim<IO> {
    /// Wraps a freshly accepted connection.
    pub fn new(io: IO) -> Self {
        AuthorityShim {
            io,
            rewriter: Rewriter::default(),
            scratch: vec![0; MAX_FRAME].into_boxed_slice(),
            eof: false,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityShim<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.rewriter.has_output() {
                let n = this.rewriter.take(buf.initialize_unfilled());
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.stepped_aside() {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            let mut scratch = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut scratch))?;
            if scratch.filled().is_empty() {
                this.eof = true;
                this.rewriter.finish();
            } else {
                this.rewriter.feed(scratch.filled());
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityShim<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityShim<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
