//! Just enough HPACK (RFC 7541) for [`super::authority`] to read a client's header blocks and
//! write them out again.
//!
//! The decoder tracks the client's dynamic table exactly, because a client (grpc-go, gRPC
//! C-core) refers back to earlier requests' fields by index. The encoder never inserts into the
//! dynamic table, so the server behind the shim decodes what it is given with an empty table and
//! the two tables can never disagree. Every length and count is bounded by the block it came
//! from or by an explicit limit; malformed input is an error value, never a panic.

/// A malformed block; the reason is for debug logs only (the shim then steps aside and lets the
/// HTTP/2 server produce its own protocol error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Name octets (lower-case in HTTP/2, not checked here: the server checks).
    pub name: Vec<u8>,
    /// Value octets.
    pub value: Vec<u8>,
    /// Sent as "never indexed": an intermediary must keep it that way (RFC 7541 §6.2.3).
    pub never_indexed: bool,
}

impl Field {
    /// A field that may be indexed.
    pub fn new(name: &[u8], value: &[u8]) -> Self {
        Field {
            name: name.to_vec(),
            value: value.to_vec(),
            never_indexed: false,
        }
    }
}

/// RFC 7541 Appendix A.
const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The dynamic table size a server that sends no `SETTINGS_HEADER_TABLE_SIZE` allows its
/// clients (RFC 7540 §6.5.2 initial value); tonic's server sends none (checked by a test).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Decodes a client's header blocks in order, keeping its dynamic table.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: index 62 is `entries[0]`.
    entries: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    /// The size the client currently uses (its last size update).
    max_size: usize,
    /// The most a size update may ask for: what the server allows.
    limit: usize,
    /// Bound on the decoded size of one block (names + values + 32 per field, as RFC 7540
    /// counts a header list), because indexed fields let a small block expand a lot.
    max_list: usize,
}

impl Decoder {
    /// A decoder for a connection whose server allows `limit` bytes of dynamic table and whose
    /// header lists may decode to at most `max_list` bytes.
    pub fn new(limit: usize, max_list: usize) -> Self {
        Decoder {
            entries: std::collections::VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
            max_list,
        }
    }

    /// Decodes one complete header block (HEADERS plus its CONTINUATIONs, padding removed).
    pub fn decode(&mut self, mut block: &[u8]) -> Result<Vec<Field>, Malformed> {
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        let mut first = true;
        while let Some(&byte) = block.first() {
            let field = if byte & 0x80 != 0 {
                let index = integer(&mut block, 7)?;
                let (name, value) = self.get(index)?;
                Field::new(&name, &value)
            } else if byte & 0xc0 == 0x40 {
                let field = self.literal(&mut block, 6)?;
                self.insert(field.name.clone(), field.value.clone());
                field
            } else if byte & 0xe0 == 0x20 {
                // RFC 7541 §4.2: size updates only at the start of a block.
                if !first {
                    return Err(Malformed("dynamic table size update after a header field"));
                }
                let size = integer(&mut block, 5)?;
                if size > self.limit {
                    return Err(Malformed(
                        "dynamic table size update above the allowed size",
                    ));
                }
                self.max_size = size;
                self.evict();
                continue;
            } else {
                let never_indexed = byte & 0xf0 == 0x10;
                let mut field = self.literal(&mut block, 4)?;
                field.never_indexed = never_indexed;
                field
            };
            first = false;
            list_size = list_size.saturating_add(field.name.len() + field.value.len() + 32);
            if list_size > self.max_list {
                return Err(Malformed("header list larger than the limit"));
            }
            fields.push(field);
        }
        Ok(fields)
    }

    fn literal(&mut self, block: &mut &[u8], prefix: u8) -> Result<Field, Malformed> {
        let index = integer(block, prefix)?;
        let name = if index == 0 {
            string(block)?
        } else {
            self.get(index)?.0
        };
        let value = string(block)?;
        Ok(Field {
            name,
            value,
            never_indexed: false,
        })
    }

    fn get(&self, index: usize) -> Result<(Vec<u8>, Vec<u8>), Malformed> {
        match index {
            0 => Err(Malformed("header index 0")),
            1..=61 => {
                let (name, value) = STATIC_TABLE[index - 1];
                Ok((name.as_bytes().to_vec(), value.as_bytes().to_vec()))
            }
            _ => self
                .entries
                .get(index - 62)
                .cloned()
                .ok_or(Malformed("header index beyond the dynamic table")),
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        if size > self.max_size {
            // §4.4: an entry larger than the table empties it and is not added.
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.size += size;
        self.entries.push_front((name, value));
        self.evict();
    }

    fn evict(&mut self) {
        while self.size > self.max_size {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => self.size = 0,
            }
        }
    }
}

/// Encodes `fields` using the static table and literals only ("without indexing", or "never
/// indexed" where the client said so), so the receiver's dynamic table stays empty.
pub fn encode(fields: &[Field], out: &mut Vec<u8>) {
    for field in fields {
        let exact = STATIC_TABLE
            .iter()
            .position(|(n, v)| n.as_bytes() == field.name && v.as_bytes() == field.value);
        if let (Some(i), false) = (exact, field.never_indexed) {
            put_integer(out, 0x80, 7, i + 1);
            continue;
        }
        let flags = if field.never_indexed { 0x10 } else { 0x00 };
        match STATIC_TABLE
            .iter()
            .position(|(n, _)| n.as_bytes() == field.name)
        {
            Some(i) => put_integer(out, flags, 4, i + 1),
            None => {
                put_integer(out, flags, 4, 0);
                put_string(out, &field.name);
            }
        }
        put_string(out, &field.value);
    }
}

/// Reads an integer with an `prefix`-bit prefix (§5.1). Values are bounded well below any
/// overflow: nothing in a header block can be larger than 2^28.
fn integer(block: &mut &[u8], prefix: u8) -> Result<usize, Malformed> {
    let (&first, mut rest) = block.split_first().ok_or(Malformed("truncated integer"))?;
    let max_prefix = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max_prefix;
    if value == max_prefix {
        let mut shift = 0;
        loop {
            let (&b, tail) = rest.split_first().ok_or(Malformed("truncated integer"))?;
            rest = tail;
            value += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
            if shift > 21 {
                return Err(Malformed("integer too large"));
            }
        }
    }
    *block = rest;
    Ok(value)
}

fn put_integer(out: &mut Vec<u8>, flags: u8, prefix: u8, mut value: usize) {
    let max_prefix = (1usize << prefix) - 1;
    if value < max_prefix {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a string literal (§5.2), Huffman-coded or not.
fn string(block: &mut &[u8]) -> Result<Vec<u8>, Malformed> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let len = integer(block, 7)?;
    if len > block.len() {
        return Err(Malformed("string longer than the block"));
    }
    let (bytes, rest) = block.split_at(len);
    *block = rest;
    if huffman {
        huffman_decode(bytes)
    } else {
        Ok(bytes.to_vec())
    }
}

/// Writes a plain (not Huffman-coded) string literal: the shim favours simplicity over a few
/// bytes on a local socket.
fn put_string(out: &mut Vec<u8>, value: &[u8]) {
    put_integer(out, 0x00, 7, value.len());
    out.extend_from_slice(value);
}

/// Code lengths of the Huffman code of RFC 7541 Appendix B, by symbol (256 is EOS). The code
/// is canonical (codes of one length are consecutive, in symbol order, each length continuing
/// the previous one), so the lengths alone define it; a test checks the RFC's examples.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

const MAX_CODE_LEN: usize = 30;

/// The canonical code laid out for decoding: per length, the first code and where its symbols
/// start in `symbols` (sorted by length, then symbol).
struct Canonical {
    first_code: [u32; MAX_CODE_LEN + 1],
    first_index: [u16; MAX_CODE_LEN + 1],
    count: [u16; MAX_CODE_LEN + 1],
    symbols: [u16; 257],
    codes: [u32; 257],
}

const CANONICAL: Canonical = build_canonical();

const fn build_canonical() -> Canonical {
    let mut c = Canonical {
        first_code: [0; MAX_CODE_LEN + 1],
        first_index: [0; MAX_CODE_LEN + 1],
        count: [0; MAX_CODE_LEN + 1],
        symbols: [0; 257],
        codes: [0; 257],
    };
    let mut code: u32 = 0;
    let mut next = 0usize;
    let mut len = 1;
    while len <= MAX_CODE_LEN {
        c.first_code[len] = code;
        c.first_index[len] = next as u16;
        let mut sym = 0;
        while sym < 257 {
            if HUFFMAN_LENGTHS[sym] as usize == len {
                c.symbols[next] = sym as u16;
                c.codes[sym] = code;
                next += 1;
                c.count[len] += 1;
                code += 1;
            }
            sym += 1;
        }
        code <<= 1;
        len += 1;
    }
    c
}

/// Decodes a Huffman-coded string (§5.2): at most 7 bits of padding, all ones (a prefix of EOS);
/// EOS itself is an error.
pub fn huffman_decode(bytes: &[u8]) -> Result<Vec<u8>, Malformed> {
    let mut out = Vec::with_capacity(bytes.len() * 8 / 5);
    let mut code: u32 = 0;
    let mut len = 0usize;
    for byte in bytes {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if len > MAX_CODE_LEN {
                return Err(Malformed("invalid Huffman code"));
            }
            let offset = code.wrapping_sub(CANONICAL.first_code[len]);
            if CANONICAL.count[len] > 0 && offset < u32::from(CANONICAL.count[len]) {
                let symbol =
                    CANONICAL.symbols[usize::from(CANONICAL.first_index[len]) + offset as usize];
                let Ok(octet) = u8::try_from(symbol) else {
                    return Err(Malformed("EOS inside a Huffman string"));
                };
                out.push(octet);
                code = 0;
                len = 0;
            }
        }
    }
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(Malformed("invalid Huffman padding"));
    }
    Ok(out)
}

/// Huffman-codes `bytes` (tests play clients that use it).
pub fn huffman_encode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &b in bytes {
        let len = u32::from(HUFFMAN_LENGTHS[usize::from(b)]);
        acc = (acc << len) | u64::from(CANONICAL.codes[usize::from(b)]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) | ((1u64 << (8 - bits)) - 1)) as u8);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn pairs(fields: &[Field]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn p(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn rfc7541_c4_requests_with_huffman_and_dynamic_table() {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE, 1 << 16);
        let first = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .expect("C.4.1");
        let base = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        assert_eq!(pairs(&first), p(&base));
        assert_eq!(d.size, 57);
        // C.4.2 refers to the authority by its dynamic index 62 (0xbe).
        let second = d
            .decode(&hex("8286 84be 5886 a8eb 1064 9cbf"))
            .expect("C.4.2");
        let mut want = base.to_vec();
        want.push(("cache-control", "no-cache"));
        assert_eq!(pairs(&second), p(&want));
        let third = d
            .decode(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .expect("C.4.3");
        assert_eq!(
            pairs(&third),
            p(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.size, 164);
    }

    #[test]
    fn rfc7541_c3_plain_literals() {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE, 1 << 16);
        let got = d
            .decode(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"))
            .expect("C.3.1");
        assert_eq!(got[3].value, b"www.example.com");
    }

    #[test]
    fn huffman_round_trips_every_octet() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)), Ok(all));
        assert_eq!(
            huffman_encode(b"www.example.com"),
            hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")
        );
        assert_eq!(huffman_decode(&[]), Ok(vec![]));
    }

    #[test]
    fn huffman_refuses_bad_padding_and_eos() {
        // 'a' is 00011 (5 bits); padding with zeros is not a prefix of EOS.
        assert_eq!(
            huffman_decode(&[0b0001_1000]),
            Err(Malformed("invalid Huffman padding"))
        );
        // A whole byte of padding is more than 7 bits.
        let mut long = huffman_encode(b"a");
        long.push(0xff);
        assert_eq!(
            huffman_decode(&long),
            Err(Malformed("invalid Huffman padding"))
        );
        // EOS is thirty ones.
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xfc]),
            Err(Malformed("EOS inside a Huffman string"))
        );
    }

    #[test]
    fn encode_uses_no_dynamic_table_and_keeps_never_indexed() {
        let mut secret = Field::new(b"authorization", b"token");
        secret.never_indexed = true;
        let fields = vec![
            Field::new(b":method", b"POST"),
            Field::new(b":authority", b"localhost"),
            Field::new(b"x-custom", b"v"),
            secret,
        ];
        let mut block = Vec::new();
        encode(&fields, &mut block);
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE, 1 << 16);
        assert_eq!(d.decode(&block), Ok(fields.clone()));
        assert_eq!(d.size, 0, "nothing may enter the receiver's dynamic table");
        assert_eq!(block[0], 0x83, ":method POST is static index 3");
    }

    #[test]
    fn size_updates_evict_and_are_bounded() {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE, 1 << 16);
        d.decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .expect("C.4.1");
        assert_eq!(d.entries.len(), 1);
        // Size update to 0 (0x20) empties the table; index 62 is then gone.
        assert_eq!(d.decode(&[0x20]), Ok(vec![]));
        assert_eq!(
            d.decode(&[0xbe]),
            Err(Malformed("header index beyond the dynamic table"))
        );
        // 4097 is more than the server allows.
        let mut over = Vec::new();
        put_integer(&mut over, 0x20, 5, DEFAULT_TABLE_SIZE + 1);
        assert_eq!(
            d.decode(&over),
            Err(Malformed(
                "dynamic table size update above the allowed size"
            ))
        );
        assert_eq!(
            d.decode(&[0x82, 0x20]),
            Err(Malformed("dynamic table size update after a header field"))
        );
    }

    #[test]
    fn malformed_blocks_are_errors_not_panics() {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE, 1 << 16);
        for (block, why) in [
            (vec![0x80], "header index 0"),
            (vec![0xff], "truncated integer"),
            (
                vec![0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                "integer too large",
            ),
            (vec![0x40, 0x05, b'a'], "string longer than the block"),
            (vec![0x00, 0x01], "string longer than the block"),
        ] {
            assert_eq!(d.decode(&block), Err(Malformed(why)), "{block:02x?}");
        }
        // A seeded sweep of random blocks: never a panic, whatever comes out.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 40) as usize;
            let block: Vec<u8> = (0..len).map(|i| (seed >> (i % 8 * 8)) as u8).collect();
            let _ = d.decode(&block);
        }
    }

    #[test]
    fn header_list_size_is_bounded() {
        // One 100-byte literal inserted, then referenced 1,000 times: 1,002 bytes of block
        // would decode to over 130 KB.
        let mut block = vec![0x40, 0x01, b'x', 0x64];
        block.extend(std::iter::repeat_n(b'v', 100));
        block.extend(std::iter::repeat_n(0xbe, 1000));
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE, 64 * 1024);
        assert_eq!(
            d.decode(&block),
            Err(Malformed("header list larger than the limit"))
        );
    }
}
