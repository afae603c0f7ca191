use super::*;

const KUBELET_AUTHORITY: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fknic.dev-reg.sock";

/// Encodes like grpc-go and gRPC C-core do: literals with incremental indexing, Huffman-coded,
/// and fully indexed references to what an earlier request inserted.
#[derive(Default)]
struct ClientEncoder {
    /// Newest first, as the decoder numbers them from 62.
    table: Vec<(String, String)>,
}

impl ClientEncoder {
    fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(name, value) in fields {
            if let Some(i) = self.table.iter().position(|(n, v)| n == name && v == value) {
                out.push(0x80 | (62 + i) as u8);
                continue;
            }
            out.push(0x40);
            for s in [name, value] {
                let coded = hpack::huffman_encode(s.as_bytes());
                assert!(coded.len() < 127);
                out.push(0x80 | coded.len() as u8);
                out.extend_from_slice(&coded);
            }
            self.table.insert(0, (name.into(), value.into()));
        }
        out
    }
}

fn request(authority: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pluginregistration.Registration/GetInfo"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, kind, flags, stream.to_be_bytes(), payload);
    out
}

/// Splits a byte stream after the preface into frames `(kind, flags, stream, payload)`.
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while bytes.len() >= FRAME_HEADER {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
        out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    assert!(bytes.is_empty(), "trailing partial frame");
    out
}

/// What the server behind the shim sees: every header block decoded with a fresh decoder (the
/// shim must never rely on the server's dynamic table), and every other frame as it is.
type Headers = Vec<(String, String)>;

fn server_view(out: &[u8]) -> (Vec<Headers>, Vec<(u8, Vec<u8>)>) {
    assert_eq!(&out[..24], PREFACE);
    let mut decoder = Decoder::new(0, 1 << 20);
    let mut blocks = Vec::new();
    let mut others = Vec::new();
    let mut open: Option<Vec<u8>> = None;
    for (kind, flags, _, payload) in frames(&out[24..]) {
        match kind {
            TYPE_HEADERS | TYPE_CONTINUATION => {
                let (fragment, _) = if kind == TYPE_HEADERS {
                    headers_payload(&payload, flags).expect("valid HEADERS")
                } else {
                    (&payload[..], None)
                };
                let block = open.get_or_insert_with(Vec::new);
                block.extend_from_slice(fragment);
                if flags & FLAG_END_HEADERS != 0 {
                    let fields = decoder
                        .decode(&open.take().unwrap_or_default())
                        .expect("decodes");
                    blocks.push(
                        fields
                            .into_iter()
                            .map(|f| {
                                (
                                    String::from_utf8_lossy(&f.name).into_owned(),
                                    String::from_utf8_lossy(&f.value).into_owned(),
                                )
                            })
                            .collect(),
                    );
                }
            }
            _ => others.push((kind, payload)),
        }
    }
    (blocks, others)
}

fn authority_of(block: &[(String, String)]) -> &str {
    block
        .iter()
        .find(|(n, _)| n == ":authority")
        .map(|(_, v)| v.as_str())
        .unwrap_or("<none>")
}

fn run(input: &[u8]) -> (Vec<u8>, Rewriter) {
    let mut r = Rewriter::default();
    r.feed(input);
    let mut out = vec![0; input.len() * 2 + 1024];
    let n = r.take(&mut out);
    out.truncate(n);
    (out, r)
}

#[test]
fn kubelet_authority_is_replaced_and_every_other_byte_kept() {
    let mut client = ClientEncoder::default();
    let settings = frame_bytes(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
    let data = frame_bytes(0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(&settings);
    input.extend(frame_bytes(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &client.encode(&request(KUBELET_AUTHORITY)),
    ));
    input.extend(&data);
    // The second request refers to the first one's fields through the dynamic table.
    input.extend(frame_bytes(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        3,
        &client.encode(&request(KUBELET_AUTHORITY)),
    ));
    assert!(
        input.len() < 250,
        "the second block is all indexed references"
    );
    let (out, r) = run(&input);
    let (blocks, others) = server_view(&out);
    assert_eq!(blocks.len(), 2);
    for block in &blocks {
        assert_eq!(authority_of(block), "localhost");
        let want: Vec<(String, String)> = request("localhost")
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(block, &want);
    }
    assert_eq!(
        others,
        vec![(0x4, settings[9..].to_vec()), (0x0, data[9..].to_vec())]
    );
    assert_eq!(r.rewritten(), 2);
    assert!(!r.stepped_aside());
}

#[test]
fn every_refused_authority_is_replaced_and_valid_ones_kept() {
    for (sent, seen) in [
        (KUBELET_AUTHORITY, "localhost"),
        (
            "/var/lib/kubelet/plugins_registry/knic.dev-reg.sock",
            "localhost",
        ),
        ("tmp%2Fknic.sock", "localhost"),
        ("", "localhost"),
        ("localhost", "localhost"),
        ("[::]:50051", "[::]:50051"),
        ("dra.knic.dev:443", "dra.knic.dev:443"),
    ] {
        let mut client = ClientEncoder::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame_bytes(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &client.encode(&request(sent)),
        ));
        let (out, _) = run(&input);
        let (blocks, _) = server_view(&out);
        assert_eq!(authority_of(&blocks[0]), seen, "sent {sent:?}");
    }
}

#[test]
fn byte_by_byte_equals_all_at_once() {
    let mut client = ClientEncoder::default();
    let mut input = PREFACE.to_vec();
    for stream in [1u32, 3, 5] {
        input.extend(frame_bytes(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            stream,
            &client.encode(&request(KUBELET_AUTHORITY)),
        ));
        input.extend(frame_bytes(
            0x0,
            FLAG_END_STREAM,
            stream,
            &[0, 0, 0, 0, 2, 8, 1],
        ));
    }
    let (whole, _) = run(&input);
    let mut r = Rewriter::default();
    let mut trickled = Vec::new();
    let mut buf = [0u8; 3];
    for b in &input {
        r.feed(std::slice::from_ref(b));
        loop {
            let n = r.take(&mut buf);
            if n == 0 {
                break;
            }
            trickled.extend_from_slice(&buf[..n]);
        }
    }
    assert_eq!(trickled, whole);
}

#[test]
fn padding_priority_and_continuations_are_understood() {
    let mut client = ClientEncoder::default();
    let block = client.encode(&request(KUBELET_AUTHORITY));
    let (a, b) = block.split_at(10);
    let mut headers = vec![2u8]; // pad length
    headers.extend([0x80, 0, 0, 0, 15]); // exclusive dependency on stream 0, weight 16
    headers.extend_from_slice(a);
    headers.extend([0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame_bytes(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
        1,
        &headers,
    ));
    input.extend(frame_bytes(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b));
    let (out, r) = run(&input);
    assert!(!r.stepped_aside());
    let written = frames(&out[24..]);
    assert_eq!(
        written.len(),
        1,
        "one HEADERS frame carries the re-encoded block"
    );
    let (kind, flags, stream, payload) = &written[0];
    assert_eq!((*kind, *stream), (TYPE_HEADERS, 1));
    assert_eq!(*flags, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
    assert_eq!(&payload[..5], &[0x80, 0, 0, 0, 15]);
    let (blocks, _) = server_view(&out);
    assert_eq!(authority_of(&blocks[0]), "localhost");
}

#[test]
fn a_large_block_is_split_into_continuations() {
    let big = "x".repeat(40_000);
    let mut fields = request(KUBELET_AUTHORITY);
    fields.push(("x-big", &big));
    let mut plain = Vec::new();
    hpack::encode(
        &fields
            .iter()
            .map(|(n, v)| Field::new(n.as_bytes(), v.as_bytes()))
            .collect::<Vec<_>>(),
        &mut plain,
    );
    let mut input = PREFACE.to_vec();
    let (a, rest) = plain.split_at(16_000);
    let (b, c) = rest.split_at(16_000);
    input.extend(frame_bytes(TYPE_HEADERS, 0, 1, a));
    input.extend(frame_bytes(TYPE_CONTINUATION, 0, 1, b));
    input.extend(frame_bytes(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, c));
    let (out, _) = run(&input);
    let written = frames(&out[24..]);
    assert_eq!(
        written
            .iter()
            .map(|f| (f.0, f.1 & FLAG_END_HEADERS))
            .collect::<Vec<_>>(),
        vec![
            (TYPE_HEADERS, 0),
            (TYPE_CONTINUATION, 0),
            (TYPE_CONTINUATION, FLAG_END_HEADERS)
        ]
    );
    assert!(written.iter().all(|f| f.3.len() <= MAX_FRAME));
    let (blocks, _) = server_view(&out);
    assert_eq!(authority_of(&blocks[0]), "localhost");
    assert_eq!(blocks[0].last().map(|(_, v)| v.len()), Some(40_000));
}

#[test]
fn what_it_cannot_parse_reaches_the_server_unchanged() {
    // Not HTTP/2 at all.
    let http1 = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    let (out, r) = run(&http1);
    assert_eq!(out, http1);
    assert!(r.stepped_aside());

    // A block that does not decode (index 0), then more frames: all as sent.
    let mut input = PREFACE.to_vec();
    input.extend(frame_bytes(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x80]));
    input.extend(frame_bytes(0x0, 0, 1, b"abc"));
    let (out, r) = run(&input);
    assert_eq!(out, input);
    assert!(r.stepped_aside());

    // A header block interrupted by another frame: the server sees exactly the violation.
    let mut client = ClientEncoder::default();
    let block = client.encode(&request(KUBELET_AUTHORITY));
    let mut input = PREFACE.to_vec();
    input.extend(frame_bytes(TYPE_HEADERS, 0, 1, &block[..5]));
    input.extend(frame_bytes(0x0, 0, 1, b"x"));
    input.extend(frame_bytes(
        TYPE_CONTINUATION,
        FLAG_END_HEADERS,
        1,
        &block[5..],
    ));
    let (out, r) = run(&input);
    assert_eq!(out, input);
    assert!(r.stepped_aside());

    // A truncated frame at end of stream.
    let mut r = Rewriter::default();
    let mut input = PREFACE.to_vec();
    input.extend(&frame_bytes(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x82, 0x86])[..10]);
    r.feed(&input);
    r.finish();
    let mut out = vec![0; 100];
    let n = r.take(&mut out);
    assert_eq!(&out[..n], &input[..]);
}

#[test]
fn a_header_frame_over_the_frame_size_reaches_the_server_unchanged() {
    let mut client = ClientEncoder::default();
    let mut block = client.encode(&request(KUBELET_AUTHORITY));
    block.resize(MAX_FRAME + 1, 0x82); // ":method GET" repeated: decodable, just too big
    let mut input = PREFACE.to_vec();
    input.extend(frame_bytes(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    let (out, r) = run(&input);
    assert_eq!(
        out, input,
        "h2 must see the oversized frame to answer FRAME_SIZE_ERROR"
    );
    assert!(r.stepped_aside());
}

#[test]
fn data_frames_stream_through_without_buffering() {
    let mut input = PREFACE.to_vec();
    let payload = vec![7u8; 100_000];
    input.extend(frame_bytes(0x0, 0, 1, &payload));
    let mut r = Rewriter::default();
    r.feed(&input[..24 + 9 + 10]);
    let mut out = vec![0; 200];
    assert_eq!(
        r.take(&mut out),
        24 + 9 + 10,
        "a DATA frame's first bytes go out at once"
    );
}

#[tokio::test]
async fn tonic_announces_no_other_header_table_size() {
    // The shim's decoder allows the client the RFC's default table size; that is only right
    // while the server behind it announces no other (SETTINGS_HEADER_TABLE_SIZE, id 1).
    let (client, server) = tokio::io::duplex(1 << 16);
    let incoming = tokio_stream::once(Ok::<_, std::io::Error>(ConnectedDuplex(server)));
    let svc = knic_proto::pluginregistration::registration_server::RegistrationServer::new(
        super::super::RegistrationService::for_tests(),
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(incoming),
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = client;
    client.write_all(PREFACE).await.expect("preface");
    client
        .write_all(&frame_bytes(0x4, 0, 0, &[]))
        .await
        .expect("settings");
    let mut header = [0u8; 9];
    client
        .read_exact(&mut header)
        .await
        .expect("server settings");
    assert_eq!(header[3], 0x4, "the server speaks first with SETTINGS");
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0; len];
    client
        .read_exact(&mut payload)
        .await
        .expect("settings payload");
    for setting in payload.chunks(6) {
        let id = u16::from_be_bytes([setting[0], setting[1]]);
        let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
        assert!(
            id != 1 || value as usize == hpack::DEFAULT_TABLE_SIZE,
            "header table size {value}"
        );
        // The shim steps aside above the default frame size, as h2 refuses bigger frames.
        assert!(
            id != 5 || value as usize == MAX_FRAME,
            "max frame size {value}"
        );
    }
}

struct ConnectedDuplex(tokio::io::DuplexStream);

impl tonic::transport::server::Connected for ConnectedDuplex {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for ConnectedDuplex {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnectedDuplex {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
