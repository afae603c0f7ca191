//! NRI's connection multiplexer: several logical byte streams over the one Unix socket.
//!
//! NRI puts two ttrpc connections on a single socket, one in each direction of "who is the
//! server": on [`PLUGIN_SERVICE_CONN`] the runtime calls the plugin, on [`RUNTIME_SERVICE_CONN`]
//! the plugin calls the runtime. Each frame is `conn id (u32 BE) | payload length (u32 BE) |
//! payload`. Opening a logical connection sends nothing: both ends simply agree on the ids.
//! A logical connection is a byte stream, so ttrpc messages are not aligned to frames: containerd
//! 2.3.4 sends a 17,860-byte Synchronize request as frames of 4,096 and 13,774 bytes.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, WriteHalf};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

/// A logical connection's id. 0 is reserved by NRI.
pub type ConnId = u32;

/// The connection on which the plugin is the ttrpc server (service `Plugin`).
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// The connection on which the plugin is the ttrpc client (service `Runtime`).
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Size of a frame header: conn id and payload length.
pub const HEADER_LEN: usize = 8;
/// Largest payload knic puts in one frame. Go's NRI reader hands each frame to ttrpc as one
/// read into a buffer of 10 + 4 MiB, so a frame must never be larger than that; longer writes are
/// split.
pub const MAX_FRAME_PAYLOAD: usize = 4 << 20;
/// Largest payload knic accepts in one frame: Go's limit (ttrpc header + 4 MiB). A larger length
/// means a corrupt stream, and trusting it would mean allocating up to 4 GiB.
pub const MAX_ACCEPTED_PAYLOAD: usize = 10 + (4 << 20);

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The logical connection it belongs to.
    pub conn: ConnId,
    /// Its part of that connection's byte stream.
    pub payload: Vec<u8>,
}

/// Appends `data` for `conn` to `out` as frames of at most [`MAX_FRAME_PAYLOAD`] bytes, so any
/// write size is legal for the peer. Empty data produces no frame (the stream is unchanged).
pub fn encode(conn: ConnId, data: &[u8], out: &mut Vec<u8>) {
    out.reserve(data.len() + HEADER_LEN * data.len().div_ceil(MAX_FRAME_PAYLOAD).max(1));
    for chunk in data.chunks(MAX_FRAME_PAYLOAD) {
        out.extend_from_slice(&conn.to_be_bytes());
        // A chunk is at most MAX_FRAME_PAYLOAD (4 MiB), so it always fits in a u32.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// Incremental frame decoder: bytes go in as the socket delivers them, whole frames come out,
/// whatever the read boundaries were.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// A decoder with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes read from the trunk.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered but not yet returned as a frame (a partial frame at the end of a read).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `Ok(None)` until one has fully arrived, or an error for a length
    /// no NRI peer can send (the stream cannot be resynchronised after that).
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let conn = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let len = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if len > MAX_ACCEPTED_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "NRI mux frame of {len} bytes exceeds the {MAX_ACCEPTED_PAYLOAD}-byte limit"
                ),
            ));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(Frame { conn, payload }))
    }
}

type BoxedWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// The trunk's write side, shared by every logical connection. One lock around each whole write
/// keeps the frames of concurrent writers from interleaving mid-frame.
#[derive(Clone)]
pub struct MuxWriter {
    inner: Arc<Mutex<BoxedWriter>>,
}

impl std::fmt::Debug for MuxWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MuxWriter")
    }
}

impl MuxWriter {
    /// Writes `data` on logical connection `conn`, split into frames as needed.
    pub async fn write(&self, conn: ConnId, data: &[u8]) -> io::Result<()> {
        let mut out = Vec::new();
        encode(conn, data, &mut out);
        if out.is_empty() {
            return Ok(());
        }
        let mut w = self.inner.lock().await;
        w.write_all(&out).await?;
        w.flush().await
    }

    /// Half-closes the trunk: the peer reads end-of-stream, which is how both NRI ends notice
    /// that the other one went away.
    pub async fn shutdown(&self) -> io::Result<()> {
        self.inner.lock().await.shutdown().await
    }
}

/// The write side of one logical connection.
#[derive(Debug, Clone)]
pub struct ConnWriter {
    conn: ConnId,
    writer: MuxWriter,
}

impl ConnWriter {
    /// Writes bytes to this logical connection's stream.
    pub async fn send(&self, data: &[u8]) -> io::Result<()> {
        self.writer.write(self.conn, data).await
    }

    /// This connection's id.
    pub fn id(&self) -> ConnId {
        self.conn
    }
}

/// One logical connection: the payloads the peer sent on it, in order, and a way to write.
/// `recv` returning `None` means the trunk is gone.
#[derive(Debug)]
pub struct MuxConn {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    writer: ConnWriter,
}

impl MuxConn {
    /// The next chunk of this connection's byte stream (not a message boundary), or `None` once
    /// the trunk is closed.
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await
    }

    /// A writer for this connection.
    pub fn writer(&self) -> ConnWriter {
        self.writer.clone()
    }

    /// Splits into the receiving side and the writer, so a reader task can own one and callers
    /// the other.
    pub fn into_parts(self) -> (mpsc::UnboundedReceiver<Vec<u8>>, ConnWriter) {
        (self.rx, self.writer)
    }
}

/// A multiplexed trunk. Dropping it stops the reader; the socket closes once every writer clone
/// is gone too (use [`Mux::close`] to close it at once).
pub struct Mux {
    writer: MuxWriter,
    conns: HashMap<ConnId, MuxConn>,
    reader: Option<JoinHandle<io::Result<()>>>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux")
            .field("unopened", &self.conns.len())
            .finish()
    }
}

impl Mux {
    /// Starts demultiplexing `stream` into the logical connections `conn_ids`. They are all
    /// registered before the first byte is read, so an early frame (the runtime may send
    /// Configure before its RegisterPlugin reply) cannot be dropped as "unknown connection".
    /// Frames for any other id are dropped, as NRI does.
    pub fn new<S>(stream: S, conn_ids: &[ConnId]) -> Mux
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        let write_half: WriteHalf<S> = write_half;
        let writer = MuxWriter {
            inner: Arc::new(Mutex::new(Box::new(write_half))),
        };
        let mut senders = HashMap::new();
        let mut conns = HashMap::new();
        for &id in conn_ids {
            let (tx, rx) = mpsc::unbounded_channel();
            senders.insert(id, tx);
            let conn_writer = ConnWriter {
                conn: id,
                writer: writer.clone(),
            };
            conns.insert(
                id,
                MuxConn {
                    rx,
                    writer: conn_writer,
                },
            );
        }
        let reader = Some(tokio::spawn(read_loop(read_half, senders)));
        Mux {
            writer,
            conns,
            reader,
        }
    }

    /// Takes logical connection `id` (once; `None` if it was not registered or already taken).
    pub fn open(&mut self, id: ConnId) -> Option<MuxConn> {
        self.conns.remove(&id)
    }

    /// The trunk writer, e.g. to close it from elsewhere.
    pub fn writer(&self) -> MuxWriter {
        self.writer.clone()
    }

    /// Closes the trunk and returns why reading stopped: `Ok` for end-of-stream or a close from
    /// this side, the read error otherwise.
    pub async fn close(mut self) -> io::Result<()> {
        let _ = self.writer.shutdown().await;
        match self.reader.take() {
            Some(reader) if reader.is_finished() => match reader.await {
                Ok(result) => result,
                Err(join) => Err(io::Error::other(join.to_string())),
            },
            Some(reader) => {
                reader.abort();
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        if let Some(reader) = &self.reader {
            reader.abort();
        }
    }
}

async fn read_loop<R: AsyncRead>(
    read_half: R,
    senders: HashMap<ConnId, mpsc::UnboundedSender<Vec<u8>>>,
) -> io::Result<()> {
    tokio::pin!(read_half);
    let mut decoder = Decoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = read_half.read(&mut buf).await?;
        if n == 0 {
            if decoder.buffered() > 0 {
                tracing::debug!(
                    bytes = decoder.buffered(),
                    "NRI trunk closed in the middle of a frame"
                );
            }
            return Ok(());
        }
        decoder.push(&buf[..n]);
        while let Some(frame) = decoder.next_frame()? {
            match senders.get(&frame.conn) {
                Some(tx) => {
                    // The receiver may be gone (its user finished); the frame is then moot.
                    let _ = tx.send(frame.payload);
                }
                None => tracing::debug!(
                    conn = frame.conn,
                    bytes = frame.payload.len(),
                    "dropping NRI mux frame for an unknown connection"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_splits_at_the_frame_limit() {
        let data = vec![7u8; MAX_FRAME_PAYLOAD + 5];
        let mut out = Vec::new();
        encode(2, &data, &mut out);
        assert_eq!(out.len(), data.len() + 2 * HEADER_LEN);
        let mut dec = Decoder::new();
        dec.push(&out);
        let a = dec.next_frame().unwrap().unwrap();
        let b = dec.next_frame().unwrap().unwrap();
        assert_eq!((a.conn, a.payload.len()), (2, MAX_FRAME_PAYLOAD));
        assert_eq!((b.conn, b.payload.len()), (2, 5));
        assert!(dec.next_frame().unwrap().is_none());
    }

    #[test]
    fn decoder_waits_for_whole_frames_and_rejects_absurd_lengths() {
        let mut out = Vec::new();
        encode(1, b"hello", &mut out);
        let mut dec = Decoder::new();
        for byte in &out[..out.len() - 1] {
            dec.push(&[*byte]);
            assert!(dec.next_frame().unwrap().is_none());
        }
        dec.push(&out[out.len() - 1..]);
        assert_eq!(dec.next_frame().unwrap().unwrap().payload, b"hello");

        let mut bad = Decoder::new();
        bad.push(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]);
        let err = bad.next_frame().unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }
}
