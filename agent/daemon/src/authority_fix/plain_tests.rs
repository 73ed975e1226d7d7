//! The plain rewrite against the crate alone: the RFC's Huffman-coded examples, then every
//! single-byte change and every truncation of them, each followed by the rest of its sequence
//! (so a table that went astray would show in the blocks after it).

use super::{PLAIN_MAX, without_huffman};
use crate::authority_fix::rewriter::MAX_HEADER_LIST;
use crate::authority_fix::{HeaderList, decode_bounded};

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// RFC 7541 C.4: three requests with Huffman coding, on one connection.
fn requests() -> Vec<Vec<u8>> {
    [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ]
    .map(hex)
    .to_vec()
}

/// RFC 7541 C.6: three responses with Huffman coding and a 256-octet table (set here by a size
/// update before the first), so entries are evicted by their decoded sizes.
fn responses() -> Vec<Vec<u8>> {
    [
        "3fe101 4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
         2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
         77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
         9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ]
    .map(hex)
    .to_vec()
}

fn list(fields: &[(&str, &str)]) -> HeaderList {
    fields
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// Each block's outcome through `decode_bounded` (which makes it plain first) and through the
/// crate alone, on two decoders that live through the whole sequence.
fn both(blocks: &[Vec<u8>]) -> (Vec<String>, Vec<String>) {
    let (mut ours, mut crate_only) = (loona_hpack::Decoder::new(), loona_hpack::Decoder::new());
    let mut a = Vec::new();
    let mut b = Vec::new();
    for block in blocks {
        a.push(format!("{:?}", decode_bounded(&mut ours, block)));
        let (mut fields, mut size) = (Vec::new(), 0);
        let r = crate_only.decode_with_cb(block, |n, v| {
            size += n.len() + v.len() + 32;
            fields.push((n.into_owned(), v.into_owned()));
        });
        // The same bound as `decode_bounded`'s.
        let bounded = (size <= MAX_HEADER_LIST).then_some(fields);
        b.push(format!("{:?}", r.map(|()| bounded)));
    }
    (a, b)
}

#[test]
fn the_rfc_examples_decode_as_the_rfc_says() {
    let date = "Mon, 21 Oct 2013 20:13:21 GMT";
    let location = "https://www.example.com";
    let expected = [
        list(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]),
        list(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ]),
        list(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]),
        list(&[
            (":status", "302"),
            ("cache-control", "private"),
            ("date", date),
            ("location", location),
        ]),
        list(&[
            (":status", "307"),
            ("cache-control", "private"),
            ("date", date),
            ("location", location),
        ]),
        list(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", location),
            ("content-encoding", "gzip"),
            (
                "set-cookie",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ]),
    ];
    let mut got = Vec::new();
    for blocks in [requests(), responses()] {
        let mut d = loona_hpack::Decoder::new();
        for block in &blocks {
            // Every one of them has Huffman-coded strings, and loses them.
            let plain = without_huffman(block).expect("made plain");
            assert!(plain != *block && plain.len() >= block.len());
            got.push(decode_bounded(&mut d, block).unwrap().unwrap());
        }
    }
    assert_eq!(got, expected);
}

#[test]
fn a_block_without_huffman_is_left_as_it_came() {
    // C.3.1: the first request without Huffman coding.
    let block = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
    assert_eq!(without_huffman(&block), None);
    assert_eq!(without_huffman(&[]), None);
}

#[test]
fn every_changed_byte_and_truncation_decodes_as_the_crate_alone_decodes_it() {
    let mut cases = 0;
    let mut differing_from_the_original = 0;
    for sequence in [requests(), responses()] {
        let original = both(&sequence).1;
        for (i, block) in sequence.iter().enumerate() {
            let mut variants = Vec::new();
            for at in 0..block.len() {
                for v in [
                    0x00,
                    0x7f,
                    0x80,
                    0xff,
                    block[at] ^ 0x01,
                    block[at] ^ 0x80,
                    block[at] ^ 0x40,
                ] {
                    let mut b = block.clone();
                    b[at] = v;
                    variants.push(b);
                }
                variants.push(block[..at].to_vec());
            }
            for variant in variants {
                let mut s = sequence.clone();
                s[i] = variant;
                let (ours, crate_only) = both(&s);
                assert_eq!(ours, crate_only, "block {i} changed to {:02x?}", s[i]);
                differing_from_the_original += usize::from(crate_only != original);
                cases += 1;
            }
        }
    }
    // The changes reached errors, other strings and other table states, not only equal output.
    assert!(
        cases > 1000 && differing_from_the_original > cases / 2,
        "{differing_from_the_original} of {cases}"
    );
}

#[test]
fn a_string_length_is_read_to_the_crates_octet_limit_and_no_further() {
    // "0" is 00000 in the Huffman code: 203 of them and one bit of padding fill 127 octets.
    let mut huffman = vec![0u8; 126];
    huffman.push(0x01);
    for (length, ok) in [
        (vec![0xff, 0x00], true),
        (vec![0xff, 0x80, 0x80, 0x80, 0x00], true),
        // Six octets: more than the crate reads.
        (vec![0xff, 0x80, 0x80, 0x80, 0x80, 0x00], false),
    ] {
        // A literal without indexing, new name "a", its value Huffman-coded.
        let mut block = vec![0x00, 0x01, b'a'];
        block.push(length[0] | 0x80);
        block.extend_from_slice(&length[1..]);
        block.extend_from_slice(&huffman);
        let (ours, crate_only) = both(std::slice::from_ref(&block));
        assert_eq!(ours, crate_only);
        assert_eq!(without_huffman(&block).is_some(), ok);
        assert_eq!(ours[0].starts_with("Ok("), ok, "{}", ours[0]);
    }
}

#[test]
fn a_block_over_the_limit_is_decoded_as_it_came() {
    // C.4.1 after as many plain literals as take it just over the limit: decoded by the crate
    // alone, with the same outcome.
    let pad = |block: &mut Vec<u8>| {
        crate::authority_fix::rewriter::literal(b"x-pad", &[b'p'; 100], block);
    };
    let (request, padding) = (requests()[0].clone(), 108);
    let mut block = Vec::new();
    while block.len() + padding + request.len() <= PLAIN_MAX {
        pad(&mut block);
    }
    assert!(without_huffman(&[block.as_slice(), &request].concat()).is_some());
    pad(&mut block);
    block.extend_from_slice(&request);
    assert!(block.len() > PLAIN_MAX);
    assert_eq!(without_huffman(&block), None);
    let (ours, crate_only) = both(std::slice::from_ref(&block));
    assert!(ours == crate_only && ours[0] == "Ok(None)", "differ");
}
