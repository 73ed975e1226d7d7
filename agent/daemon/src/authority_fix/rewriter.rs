//! The client-to-server half of the fix: HTTP/2 frames in, frames for h2 out.

const PREFACE_LEN: usize = 24;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const CONTINUATION: u8 = 0x9;
pub(super) const END_STREAM: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame h2 takes (what the server advertises): a larger one is passed on
/// unbuffered, and h2 answers it with GOAWAY(FRAME_SIZE_ERROR) before reading its payload.
pub(super) const MAX_FRAME: usize = crate::connections::MAX_FRAME_SIZE as usize;
/// The largest decoded header list (names, values, 32 bytes per field) ever held.
pub(super) const MAX_HEADER_LIST: usize = crate::connections::MAX_HEADER_LIST_SIZE as usize;
/// The most a header block may weigh as sent (its frames, headers and padding included) to be
/// buffered: four times the list limit, as h2's "way too large" rule.
pub(super) const MAX_BLOCK: usize = 4 * MAX_HEADER_LIST;
/// The client's dynamic table may never be larger than the server's SETTINGS allow.
const CLIENT_TABLE_MAX: usize = crate::connections::HEADER_TABLE_SIZE;
const REPLACEMENT: &[u8] = b"localhost";

/// The client-to-server rewriter: bytes in, bytes for h2 out. No I/O: testable as it is.
pub struct Rewriter {
    preface_left: usize,
    pending: Vec<u8>,
    /// A HEADERS frame whose block continues in CONTINUATION frames.
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    /// Set by the first block that needed a new authority: every block after it is re-encoded
    /// too, since h2's dynamic table no longer follows the client's.
    rewriting: bool,
    /// The stream could not be followed: everything passes through unchanged.
    passthrough: bool,
    /// A re-encoded connection sent a block it may not: h2 has been told to end the
    /// connection and nothing more is read.
    refused: bool,
}

/// Why a connection's bytes no longer reach h2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request headers refused: {}", self.0)
    }
}

impl std::error::Error for Refused {}

struct Block {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as the client sent them, passed on unchanged when no rewrite is needed.
    raw: Vec<u8>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(CLIENT_TABLE_MAX);
        Rewriter {
            preface_left: PREFACE_LEN,
            pending: Vec::new(),
            block: None,
            decoder,
            rewriting: false,
            passthrough: false,
            refused: false,
        }
    }
}

impl Rewriter {
    /// Takes bytes read from the client and appends what h2 should read to `out`. An error
    /// ends the connection: what `out` holds then makes h2 answer GOAWAY(PROTOCOL_ERROR).
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), Refused> {
        if self.refused {
            return Err(Refused("the connection is closing"));
        }
        if self.preface_left > 0 {
            let n = self.preface_left.min(input.len());
            out.extend_from_slice(&input[..n]);
            self.preface_left -= n;
            input = &input[n..];
        }
        if self.passthrough {
            out.extend_from_slice(input);
            return Ok(());
        }
        self.pending.extend_from_slice(input);
        let mut at = 0;
        while self.pending.len() - at >= 9 {
            let head = &self.pending[at..at + 9];
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            if len > MAX_FRAME {
                self.give_up(at, out);
                return Ok(());
            }
            if self.pending.len() - at < 9 + len {
                break;
            }
            if self.block.is_none() && head[3] != HEADERS {
                // DATA, SETTINGS, WINDOW_UPDATE...: on as they are.
                out.extend_from_slice(&self.pending[at..at + 9 + len]);
                at += 9 + len;
                continue;
            }
            let frame = self.pending[at..at + 9 + len].to_vec();
            at += 9 + len;
            if let Err(e) = self.frame(&frame, out) {
                self.pending = Vec::new();
                self.block = None;
                return Err(e);
            }
            if self.passthrough {
                out.extend_from_slice(&self.pending[at..]);
                self.pending.clear();
                return Ok(());
            }
        }
        self.pending.drain(..at);
        Ok(())
    }

    /// Stops following: what is buffered goes out as it came, and so does the rest.
    pub(super) fn give_up(&mut self, at: usize, out: &mut Vec<u8>) {
        if let Some(b) = self.block.take() {
            out.extend_from_slice(&b.raw);
        }
        out.extend_from_slice(&self.pending[at..]);
        self.pending.clear();
        self.passthrough = true;
    }

    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), Refused> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[9..];
        match (kind, self.block.as_mut()) {
            (HEADERS, None) => match headers_fragment(flags, payload) {
                Some((priority, fragment)) => {
                    self.block = Some(Block {
                        stream,
                        flags,
                        priority,
                        fragment: fragment.to_vec(),
                        raw: frame.to_vec(),
                    });
                }
                None => return self.passthrough_frame(frame, out),
            },
            (CONTINUATION, Some(b)) if b.stream == stream => {
                if b.raw.len() + frame.len() > MAX_BLOCK {
                    // Not buffered further. h2 refuses such a block by its own limits (if it
                    // follows the client's table); a re-encoded connection is ended here.
                    if self.rewriting {
                        return Err(self.refuse(stream, "header block too large", out));
                    }
                    return self.passthrough_frame(frame, out);
                }
                b.fragment.extend_from_slice(payload);
                b.raw.extend_from_slice(frame);
            }
            // Anything else inside a header block breaks the protocol: h2 will say so.
            (_, Some(_)) => return self.passthrough_frame(frame, out),
            (_, None) => {
                out.extend_from_slice(frame);
                return Ok(());
            }
        }
        if flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            return self.finish(block, out);
        }
        Ok(())
    }

    fn passthrough_frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), Refused> {
        if let Some(b) = self.block.take() {
            out.extend_from_slice(&b.raw);
        }
        out.extend_from_slice(frame);
        self.passthrough = true;
        Ok(())
    }

    /// Ends a re-encoded connection: h2's table no longer follows the client's, so the block
    /// cannot be handed on as it came. h2 gets a block it cannot decode (index 0, RFC 7541 6.1)
    /// and answers GOAWAY(PROTOCOL_ERROR); the reader then fails the connection.
    fn refuse(&mut self, stream: u32, why: &'static str, out: &mut Vec<u8>) -> Refused {
        tracing::debug!(why, "request headers refused; closing the connection");
        self.block = None;
        self.refused = true;
        frame_header(1, HEADERS, END_HEADERS, stream, out);
        out.push(0x80);
        Refused(why)
    }

    fn finish(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), Refused> {
        let headers = match decode_bounded(&mut self.decoder, &block.fragment) {
            Ok(Some(h)) => h,
            Ok(None) if !self.rewriting => {
                // Larger than h2 takes: h2, whose table follows the client's as ours does,
                // refuses the stream (or the connection) by its own limits.
                out.extend_from_slice(&block.raw);
                return Ok(());
            }
            Ok(None) => return Err(self.refuse(block.stream, "header list too large", out)),
            Err(e) if !self.rewriting => {
                tracing::debug!(error = %e, "undecodable request headers; passing the connection through");
                out.extend_from_slice(&block.raw);
                self.passthrough = true;
                return Ok(());
            }
            Err(_) => return Err(self.refuse(block.stream, "undecodable header block", out)),
        };
        let bad = headers
            .iter()
            .any(|(n, v)| n == b":authority" && !valid_authority(v));
        if bad && !self.rewriting {
            tracing::debug!(
                "a client sent a socket path as :authority; rewriting its request headers"
            );
            self.rewriting = true;
        }
        if !self.rewriting {
            out.extend_from_slice(&block.raw);
            return Ok(());
        }
        let mut encoded = Vec::new();
        for (name, value) in &headers {
            let value = if name == b":authority" && !valid_authority(value) {
                REPLACEMENT
            } else {
                value.as_slice()
            };
            literal(name, value, &mut encoded);
        }
        write_headers(&block, &encoded, out);
        Ok(())
    }
}

/// A decoded header list.
pub type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

/// Decodes a whole block (the dynamic table must follow every one of them), keeping the fields
/// only while their list stays within [`MAX_HEADER_LIST`]: None once it is larger. Counted per
/// field as it is decoded, before it is copied: an indexed field of one byte can stand for a
/// table entry of 4 KiB, so the block's own size bounds nothing. Its Huffman-coded strings are
/// made plain first (`plain`: the same fields, in a copy less than twice the block's size).
pub fn decode_bounded(
    decoder: &mut loona_hpack::Decoder<'static>,
    fragment: &[u8],
) -> Result<Option<HeaderList>, loona_hpack::decoder::DecoderError> {
    let plain = super::plain::without_huffman(fragment);
    let mut size = 0usize;
    let mut list = Vec::new();
    decoder.decode_with_cb(plain.as_deref().unwrap_or(fragment), |name, value| {
        size = size.saturating_add(name.len() + value.len() + 32);
        if size <= MAX_HEADER_LIST {
            list.push((name.into_owned(), value.into_owned()));
        }
    })?;
    Ok((size <= MAX_HEADER_LIST).then_some(list))
}

/// What h2 accepts as `:authority`.
fn valid_authority(v: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(v).is_ok()
}

/// The priority bytes and the header block fragment of a HEADERS payload.
pub(super) fn headers_fragment(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let (pad, mut rest) = if flags & PADDED != 0 {
        (usize::from(*payload.first()?), payload.get(1..)?)
    } else {
        (0, payload)
    };
    rest = rest.get(..rest.len().checked_sub(pad)?)?;
    let priority = if flags & PRIORITY != 0 {
        let p: [u8; 5] = rest.get(..5)?.try_into().ok()?;
        rest = &rest[5..];
        Some(p)
    } else {
        None
    };
    Some((priority, rest))
}

/// A "literal header field without indexing, new name" (RFC 7541 6.2.2), no Huffman: it leaves
/// h2's dynamic table alone.
pub(super) fn literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0);
    for s in [name, value] {
        integer(s.len(), 7, out);
        out.extend_from_slice(s);
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1); the prefix's other bits are 0.
pub(super) fn integer(mut v: usize, n: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(v as u8);
        return;
    }
    out.push(max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// The block as one HEADERS frame and as many CONTINUATION frames as h2's frame size needs.
fn write_headers(block: &Block, encoded: &[u8], out: &mut Vec<u8>) {
    let mut first = Vec::new();
    let mut flags = block.flags & END_STREAM;
    if let Some(p) = block.priority {
        first.extend_from_slice(&p);
        flags |= PRIORITY;
    }
    let room = MAX_FRAME - first.len();
    let (head, mut rest) = encoded.split_at(encoded.len().min(room));
    first.extend_from_slice(head);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame_header(first.len(), HEADERS, flags, block.stream, out);
    out.extend_from_slice(&first);
    while !rest.is_empty() {
        let (chunk, more) = rest.split_at(rest.len().min(MAX_FRAME));
        let flags = if more.is_empty() { END_HEADERS } else { 0 };
        frame_header(chunk.len(), CONTINUATION, flags, block.stream, out);
        out.extend_from_slice(chunk);
        rest = more;
    }
}

pub(super) fn frame_header(len: usize, kind: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}
