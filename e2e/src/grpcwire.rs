//! gRPC clients that behave like the real ones on the wire, where tonic's client cannot: tonic
//! only sends an `:authority` that `http::Uri` accepts, while the kubelet's grpc-go sends the
//! percent-encoded socket path and other clients the raw path or nothing.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use anyhow::{Context as _, bail};
use knic_driver::kubelet::authority::{AuthorityPolicy, Rewriter};
use knic_driver::kubelet::hpack::{self, Field};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;

/// The `:authority` grpc-go derives from a bare socket path (its `encodeAuthority`): every
/// byte outside RFC 3986's unreserved and sub-delims (and `:`/`@`) percent-encoded, so `/`
/// becomes `%2F`.
pub fn grpc_go_authority(path: &Path) -> String {
    let mut out = String::new();
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A connection whose outgoing requests carry exactly `authority`, however the HTTP/2 client
/// above it encoded them (it rewrites the client's header blocks on the way out).
pub struct SendsAuthority<IO> {
    io: IO,
    rewriter: Rewriter,
    out: Vec<u8>,
    pos: usize,
}

impl<IO> SendsAuthority<IO> {
    /// Wraps a fresh client connection.
    pub fn new(io: IO, authority: &str) -> Self {
        SendsAuthority {
            io,
            rewriter: Rewriter::new(AuthorityPolicy::Set(authority.as_bytes().to_vec())),
            out: Vec::new(),
            pos: 0,
        }
    }
}

impl<IO: AsyncWrite + Unpin> SendsAuthority<IO> {
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pos < self.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pos += n;
        }
        self.out.clear();
        self.pos = 0;
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for SendsAuthority<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SendsAuthority<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.out.len() > 1 << 16 {
            ready!(this.drain(cx))?;
        }
        this.rewriter.feed(buf);
        let mut chunk = [0u8; 4096];
        loop {
            let n = this.rewriter.take(&mut chunk);
            if n == 0 {
                break;
            }
            this.out.extend_from_slice(&chunk[..n]);
        }
        // Written bytes are ours now; a pending socket is retried by the flush h2 always sends.
        let _ = this.drain(cx)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// What a raw call got back.
#[derive(Debug)]
pub struct RawReply {
    /// `grpc-status` from the trailers (or a trailers-only answer); `None` if the stream ended
    /// without one.
    pub status: Option<String>,
    /// `grpc-message`, if any.
    pub message: String,
    /// The response message (without the gRPC length prefix).
    pub body: Vec<u8>,
    /// `RST_STREAM` error code, if the server reset the stream (h2 answers a refused
    /// `:authority` with 1, `PROTOCOL_ERROR`).
    pub reset: Option<u32>,
}

/// One unary gRPC call written frame by frame, with `:authority` exactly as given.
pub async fn raw_call(
    socket: &Path,
    authority: &[u8],
    method: &str,
    request: &[u8],
) -> anyhow::Result<RawReply> {
    tokio::time::timeout(
        Duration::from_secs(10),
        raw_call_inner(socket, authority, method, request),
    )
    .await
    .with_context(|| format!("raw gRPC call {method} on {} timed out", socket.display()))?
}

async fn raw_call_inner(
    socket: &Path,
    authority: &[u8],
    method: &str,
    request: &[u8],
) -> anyhow::Result<RawReply> {
    let mut conn = UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting {}", socket.display()))?;
    let fields = [
        Field::new(b":method", b"POST"),
        Field::new(b":scheme", b"http"),
        Field::new(b":path", method.as_bytes()),
        Field::new(b":authority", authority),
        Field::new(b"content-type", b"application/grpc"),
        Field::new(b"te", b"trailers"),
    ];
    let mut block = Vec::new();
    hpack::encode(&fields, &mut block);
    let mut message = vec![0u8];
    message.extend_from_slice(&u32::try_from(request.len())?.to_be_bytes());
    message.extend_from_slice(request);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    put_frame(&mut out, 0x4, 0, 0, &[]);
    put_frame(&mut out, 0x1, 0x4, 1, &block);
    put_frame(&mut out, 0x0, 0x1, 1, &message);
    conn.write_all(&out).await?;

    let mut decoder = hpack::Decoder::new(hpack::DEFAULT_TABLE_SIZE, 1 << 20);
    let mut reply = RawReply {
        status: None,
        message: String::new(),
        body: Vec::new(),
        reset: None,
    };
    let mut data = Vec::new();
    loop {
        let mut header = [0u8; 9];
        if conn.read_exact(&mut header).await.is_err() {
            break;
        }
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await?;
        match kind {
            0x4 if flags & 0x1 == 0 => {
                let mut ack = Vec::new();
                put_frame(&mut ack, 0x4, 0x1, 0, &[]);
                conn.write_all(&ack).await?;
            }
            0x0 if stream == 1 => {
                data.extend_from_slice(&payload);
                if flags & 0x1 != 0 {
                    break;
                }
            }
            0x1 if stream == 1 => {
                if flags & 0x4 == 0 {
                    bail!("the server split its headers into CONTINUATION frames");
                }
                let mut fragment = &payload[..];
                if flags & 0x8 != 0 {
                    let pad = usize::from(payload[0]);
                    fragment = &payload[1..payload.len() - pad];
                }
                if flags & 0x20 != 0 {
                    fragment = &fragment[5..];
                }
                for field in decoder
                    .decode(fragment)
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                {
                    match field.name.as_slice() {
                        b"grpc-status" => {
                            reply.status = Some(String::from_utf8_lossy(&field.value).into())
                        }
                        b"grpc-message" => {
                            reply.message = String::from_utf8_lossy(&field.value).into()
                        }
                        _ => {}
                    }
                }
                if flags & 0x1 != 0 {
                    break;
                }
            }
            0x3 if stream == 1 => {
                reply.reset = Some(u32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]));
                break;
            }
            0x7 => bail!("the server sent GOAWAY: {payload:02x?}"),
            _ => {}
        }
    }
    if data.len() >= 5 {
        reply.body = data[5..].to_vec();
    }
    Ok(reply)
}

fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The grpcio version `python_call` uses. Only grpcio >= 1.57 sends the percent-encoded
/// socket path as `:authority` for `unix:` targets (grpc/grpc#38142), which is what the tests
/// need it for; an older one would pass without exercising the shim.
pub fn python_grpcio_version() -> anyhow::Result<(u32, u32)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/grpc_call.py");
    let out = std::process::Command::new("python3")
        .args([script, "--version"])
        .output()
        .context("running python3 (needed for the grpcio client tests)")?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let mut parts = text.split('.').map(str::parse::<u32>);
    match (out.status.success(), parts.next(), parts.next()) {
        (true, Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
        _ => bail!(
            "python grpcio not usable ({text:?}, {}): `pip install grpcio` (.ci/run installs it)",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Calls `method` on `target` (`unix:/path`) through Python's `grpcio` (gRPC C-core), the way
/// any non-Go client would: its `:authority` for a unix target is the percent-encoded path.
/// Returns the response bytes, or the status code name and details on failure.
pub fn python_call(
    target: &str,
    method: &str,
    request: &[u8],
) -> anyhow::Result<Result<Vec<u8>, String>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/grpc_call.py");
    let hex: String = request.iter().map(|b| format!("{b:02x}")).collect();
    let out = std::process::Command::new("python3")
        .args([script, target, method, &hex])
        .output()
        .context("running python3 (needed for the grpcio client tests)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "python3 {script} failed ({}): {stderr}{stdout}\nthese tests need Python's grpcio: \
             `pip install grpcio` (.ci/run installs it)",
            out.status
        );
    }
    let line = stdout.trim();
    if let Some(hex) = line.strip_prefix("ok ") {
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()?;
        return Ok(Ok(bytes));
    }
    if line == "ok" {
        return Ok(Ok(Vec::new()));
    }
    Ok(Err(line.to_string()))
}
