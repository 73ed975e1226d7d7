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
        r.feed(c, &mut out).expect("not refused");
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

/// A 4,000-byte literal with incremental indexing (dynamic index 62), then `refs` one-byte
/// references to it: ~4 KB decoded per byte sent.
fn bomb(refs: usize) -> Vec<u8> {
    let mut b = vec![0x40];
    integer(6, 7, &mut b);
    b.extend_from_slice(b"x-bomb");
    integer(4000, 7, &mut b);
    b.extend(std::iter::repeat_n(b'a', 4000));
    b.extend(std::iter::repeat_n(0x80 | 62, refs));
    b
}

fn headers_frame(block: &[u8], flags: u8, stream: u32) -> Vec<u8> {
    let mut f = Vec::new();
    frame_header(block.len(), HEADERS, flags, stream, &mut f);
    f.extend_from_slice(block);
    f
}

/// A request whose `:authority` is a socket path: the connection is re-encoded from then on.
fn path_request() -> Vec<u8> {
    request(b"/run/ebs/csi.sock", END_STREAM)
}

#[test]
fn a_list_is_held_only_up_to_h2s_limit_and_the_table_still_follows() {
    let mut d = loona_hpack::Decoder::new();
    // 12,000 references: 48 MB if copied out; nothing past 16 KiB is kept.
    assert_eq!(decode_bounded(&mut d, &bomb(12_000)), Ok(None));
    // The table followed the block: index 62 is the bomb's field.
    let next = decode_bounded(&mut d, &[0x80 | 62]).unwrap().unwrap();
    assert_eq!(next[0].0, b"x-bomb");
    // A list exactly at the limit is kept; one byte more is not.
    let mut exact = Vec::new();
    let value = vec![b'v'; MAX_HEADER_LIST - 32 - 1];
    literal(b"n", &value, &mut exact);
    assert_eq!(
        decode_bounded(&mut d, &exact).unwrap().map(|l| l.len()),
        Some(1)
    );
    let mut over = Vec::new();
    literal(b"n", &[value.as_slice(), b"v"].concat(), &mut over);
    assert_eq!(decode_bounded(&mut d, &over), Ok(None));
}

#[test]
fn a_table_size_update_beyond_the_setting_is_a_decoding_error() {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    // Dynamic table size update to 4097 (RFC 7541 6.3), then an indexed field.
    let block = [0x3f, 0xe2, 0x1f, 0x82];
    let input = [PREFACE, &headers_frame(&block, END_HEADERS, 1)].concat();
    r.feed(&input, &mut out).unwrap();
    // Passed on for h2 to refuse, as it came (h2 holds the same limit).
    assert_eq!(out, input);
    // 4096 is allowed.
    let mut d = loona_hpack::Decoder::new();
    d.set_max_allowed_table_size(4096);
    assert!(decode_bounded(&mut d, &[0x3f, 0xe1, 0x1f, 0x82]).is_ok());
    assert!(decode_bounded(&mut d, &block).is_err());
}

#[test]
fn an_oversize_list_goes_to_h2_as_it_came_while_nothing_is_rewritten() {
    let input = [
        PREFACE,
        &headers_frame(&bomb(12_000), END_HEADERS, 1),
        &request(b"localhost", 0),
    ]
    .concat();
    assert_eq!(run(&[&input]), input);
}

#[test]
fn an_oversize_list_ends_a_rewritten_connection() {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    r.feed(&[PREFACE, &path_request()].concat(), &mut out)
        .unwrap();
    let before = out.len();
    let refused = r.feed(&headers_frame(&bomb(12_000), END_HEADERS, 3), &mut out);
    assert_eq!(refused, Err(Refused("header list too large")));
    // What h2 gets: one block it cannot decode, on the same stream.
    assert_eq!(
        &out[before..],
        [0, 0, 1, HEADERS, END_HEADERS, 0, 0, 0, 3, 0x80]
    );
    // And nothing after it.
    assert!(r.feed(&request(b"localhost", 0), &mut out).is_err());
    assert_eq!(out.len(), before + 10);
}

#[test]
fn a_block_larger_than_four_lists_is_never_buffered() {
    // A HEADERS frame and CONTINUATION frames of 16 KiB of one-byte references each.
    let mut frames = headers_frame(&bomb(10_000), 0, 3);
    for _ in 0..4 {
        frame_header(MAX_FRAME, CONTINUATION, 0, 3, &mut frames);
        frames.extend(std::iter::repeat_n(0x80 | 62, MAX_FRAME));
    }
    assert!(frames.len() > MAX_BLOCK);
    // Unrewritten: the frames go on to h2 (which refuses too many CONTINUATIONs), unbuffered.
    let input = [PREFACE, &frames].concat();
    assert_eq!(run(&[&input]), input);
    // Rewritten: the connection ends.
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    r.feed(&[PREFACE, &path_request()].concat(), &mut out)
        .unwrap();
    assert_eq!(
        r.feed(&frames, &mut out),
        Err(Refused("header block too large"))
    );
}

#[test]
fn a_frame_larger_than_h2_takes_is_passed_on_before_its_payload_arrives() {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    let mut head = Vec::new();
    frame_header(MAX_FRAME + 1, HEADERS, END_HEADERS, 1, &mut head);
    r.feed(&[PREFACE, &head].concat(), &mut out).unwrap();
    // h2 sees the frame's header at once and answers FRAME_SIZE_ERROR; nothing is held.
    assert_eq!(out, [PREFACE, &head].concat());
    r.feed(&[0x80; 100], &mut out).unwrap();
    assert_eq!(out.len(), PREFACE.len() + 9 + 100);
}
