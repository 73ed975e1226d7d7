//! The rewriter on hand-made frames.

use super::rewriter::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn request(authority: &[u8], extra_flags: u8) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/csi.v1.Identity/Probe"),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
    ] {
        literal(n, v, &mut block);
    }
    let mut out = Vec::new();
    frame_header(block.len(), HEADERS, END_HEADERS | extra_flags, 1, &mut out);
    out.extend_from_slice(&block);
    out
}

fn authorities(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut d = loona_hpack::Decoder::new();
    let mut at = PREFACE.len();
    let mut found = Vec::new();
    while at + 9 <= bytes.len() {
        let len = usize::from(bytes[at]) << 16
            | usize::from(bytes[at + 1]) << 8
            | usize::from(bytes[at + 2]);
        if bytes[at + 3] == HEADERS {
            let (_, frag) = headers_fragment(bytes[at + 4], &bytes[at + 9..at + 9 + len]).unwrap();
            for (n, v) in d.decode(frag).unwrap() {
                if n == b":authority" {
                    found.push(v);
                }
            }
        }
        at += 9 + len;
    }
    found
}

fn run(chunks: &[&[u8]]) -> Vec<u8> {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    for c in chunks {
        r.feed(c, &mut out);
    }
    out
}

#[test]
fn valid_authorities_pass_byte_for_byte() {
    let input = [PREFACE, &request(b"localhost", END_STREAM)].concat();
    assert_eq!(run(&[&input]), input);
}

#[test]
fn socket_paths_become_localhost_in_any_chunking() {
    let settings = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    for authority in [&b"/run/ebs/csi.sock"[..], b"%2Frun%2Febs%2Fcsi.sock"] {
        let input = [
            PREFACE,
            &settings,
            &request(authority, END_STREAM),
            &request(b"localhost", 0),
        ]
        .concat();
        let whole = run(&[&input]);
        assert_eq!(
            authorities(&whole),
            [b"localhost".to_vec(), b"localhost".to_vec()]
        );
        // Byte by byte gives the same stream.
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(&bytes), whole);
        // The END_STREAM flag and the frames around the headers survive.
        assert_eq!(&whole[PREFACE.len()..PREFACE.len() + 9], &settings);
        assert_eq!(whole[PREFACE.len() + 9 + 4] & END_STREAM, END_STREAM);
    }
}

#[test]
fn undecodable_blocks_pass_through() {
    let mut bad = Vec::new();
    frame_header(1, HEADERS, END_HEADERS, 1, &mut bad);
    bad.push(0xff);
    let input = [PREFACE, &bad, &request(b"/x.sock", 0)].concat();
    assert_eq!(run(&[&input]), input);
}

#[test]
fn integers_with_prefixes() {
    let mut v = Vec::new();
    integer(10, 7, &mut v);
    integer(1337, 5, &mut v);
    assert_eq!(v, [10, 31, 154, 10]);
}
