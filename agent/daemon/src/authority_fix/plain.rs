//! Huffman-coded strings made plain before a header block reaches the HPACK decoder.
//!
//! `loona_hpack` builds a new Huffman decoder (two levels of hash maps over the 257 codes) for
//! every Huffman-coded string it meets, and real clients Huffman-code every literal (h2,
//! grpc-go, gRPC C-core): that set-up was the largest user-space cost of a call on this layer
//! (docs/performance.md, "The HPACK decoder's Huffman tables"). Here each worker thread builds the
//! crate's own decoder once, and a block with Huffman-coded strings is rewritten with those
//! strings as plain octets, then decoded by the crate as before.
//!
//! The rewrite changes no field: every representation keeps its kind, its integers and, once
//! decoded, its strings, so the crate's callbacks, its dynamic table (whose entries are sized by
//! the decoded strings) and its errors are what they would have been. Whatever this parser does
//! not take exactly as the crate would (a malformed integer, a string past the block's end, a
//! Huffman code the crate refuses) leaves the block as it came, for the crate to judge it.

use std::cell::RefCell;

use loona_hpack::huffman::HuffmanDecoder;

thread_local! {
    static HUFFMAN: RefCell<HuffmanDecoder> = RefCell::new(HuffmanDecoder::new());
}

/// Blocks up to h2's header list limit are made plain: requests are a few hundred bytes, and the
/// copy (less than twice the block) stays within the connection's memory bound
/// (docs/resources.md). A larger one (whose decoded list, table size updates aside, is then over
/// what h2 accepts) is decoded as it came.
pub const PLAIN_MAX: usize = super::rewriter::MAX_HEADER_LIST;

/// The block with every Huffman-coded string as plain octets; None when it has none, when it is
/// larger than [`PLAIN_MAX`], or when it is not one this parser follows exactly (then the crate
/// decodes it as it came).
pub fn without_huffman(block: &[u8]) -> Option<Vec<u8>> {
    if block.len() > PLAIN_MAX {
        return None;
    }
    HUFFMAN.with(|h| {
        let mut h = h.try_borrow_mut().ok()?;
        Plain::new(block, &mut h).run()
    })
}

struct Plain<'a> {
    block: &'a [u8],
    at: usize,
    /// Made only at the first Huffman-coded string; the block up to `copied` is in it.
    out: Option<Vec<u8>>,
    copied: usize,
    huffman: &'a mut HuffmanDecoder,
}

impl<'a> Plain<'a> {
    fn new(block: &'a [u8], huffman: &'a mut HuffmanDecoder) -> Self {
        Plain {
            block,
            at: 0,
            out: None,
            copied: 0,
            huffman,
        }
    }

    fn run(mut self) -> Option<Vec<u8>> {
        while let Some(&first) = self.block.get(self.at) {
            // The representations of RFC 7541 section 6, told apart as the crate does.
            if first & 0x80 != 0 {
                self.integer(7)?; // indexed field
            } else if first & 0x40 != 0 {
                self.literal(6)?; // with incremental indexing
            } else if first & 0x20 != 0 {
                self.integer(5)?; // dynamic table size update
            } else {
                self.literal(4)?; // without indexing, or never indexed
            }
        }
        let mut out = self.out?;
        out.extend_from_slice(&self.block[self.copied..]);
        Some(out)
    }

    /// A literal field: its name's index, the name itself when that index is 0, its value.
    fn literal(&mut self, prefix: u8) -> Option<()> {
        if self.integer(prefix)? == 0 {
            self.string()?;
        }
        self.string()
    }

    fn integer(&mut self, prefix: u8) -> Option<usize> {
        let (value, used) = integer(&self.block[self.at..], prefix)?;
        self.at += used;
        Some(value)
    }

    /// A string literal (RFC 7541 5.2), written back plain.
    fn string(&mut self) -> Option<()> {
        let rest = &self.block[self.at..];
        let huffman = rest.first()? & 0x80 != 0;
        let (len, used) = integer(rest, 7)?;
        let octets = rest.get(used..used.checked_add(len)?)?;
        if huffman {
            let plain = self.huffman.decode(octets).ok()?;
            let block = self.block;
            let out = self
                .out
                .get_or_insert_with(|| Vec::with_capacity(block.len() + block.len() / 2));
            out.extend_from_slice(&block[self.copied..self.at]);
            super::rewriter::integer(plain.len(), 7, out);
            out.extend_from_slice(&plain);
            self.copied = self.at + used + len;
        }
        self.at += used + len;
        Some(())
    }
}

/// An HPACK integer (RFC 7541 5.1) and the octets it took, under the crate's own limit (five
/// octets at most): what the crate refuses is None here too.
fn integer(buf: &[u8], prefix: u8) -> Option<(usize, usize)> {
    let mask = (1u16 << prefix) - 1;
    let mut value = usize::from(u16::from(*buf.first()?) & mask);
    if value < usize::from(mask) {
        return Some((value, 1));
    }
    let mut shift = 0;
    for (i, &b) in buf.iter().enumerate().skip(1).take(4) {
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
#[path = "plain_tests.rs"]
mod tests;
