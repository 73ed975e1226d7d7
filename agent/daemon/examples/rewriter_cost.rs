//! The HPACK bound's cost on ordinary requests, measured (never asserted):
//! `cargo run --release -p ebs-node-agent --example rewriter_cost`.
//! A/B pairs, alternated: the unbounded decode the rewriter used before (every field copied
//! into a Vec) and the bounded one, on the header blocks of a kubelet-like sequence of CSI
//! calls as grpc-go encodes them (without Huffman coding); then whole requests through the
//! rewriter; then the Huffman-coded blocks a real h2 client sent (`h2_request_blocks.hex`).

use std::time::Instant;

use ebs_node_agent::authority_fix::{HeaderList, Rewriter, decode_bounded};

const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const END_STREAM: u8 = 0x1;

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

const CALLS: usize = 2_000;
const ROUNDS: usize = 201;

fn blocks() -> Vec<Vec<u8>> {
    let mut enc = loona_hpack::Encoder::new();
    let paths = [
        "/csi.v1.Identity/Probe",
        "/csi.v1.Node/NodeGetCapabilities",
        "/csi.v1.Node/NodeStageVolume",
        "/csi.v1.Node/NodePublishVolume",
        "/csi.v1.Node/NodeGetVolumeStats",
    ];
    (0..CALLS)
        .map(|i| {
            enc.encode([
                (&b":method"[..], &b"POST"[..]),
                (b":scheme", b"http"),
                (b":path", paths[i % paths.len()].as_bytes()),
                (b":authority", b"localhost"),
                (b"content-type", b"application/grpc"),
                (b"user-agent", b"grpc-go/1.65.0"),
                (b"te", b"trailers"),
                (b"grpc-timeout", b"119999883u"),
            ])
        })
        .collect()
}

/// `ROUNDS` pairs of `run(false)` and `run(true)` in alternating order, and the ratio of each
/// pair, so that load from other processes (which comes and goes) weighs on both sides alike.
fn pairs(mut run: impl FnMut(bool) -> f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (x, y) = if round % 2 == 0 {
            let x = run(false);
            (x, run(true))
        } else {
            let y = run(true);
            (run(false), y)
        };
        a.push(x);
        b.push(y);
        ratios.push(y / x);
    }
    (a, b, ratios)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let blocks = blocks();
    let ns_per_block = |bounded: bool| {
        let mut d = loona_hpack::Decoder::new();
        let t = Instant::now();
        let mut fields = 0;
        for b in &blocks {
            fields += if bounded {
                let list: HeaderList = decode_bounded(&mut d, b).unwrap().unwrap();
                list.len()
            } else {
                d.decode(b).unwrap().len()
            };
        }
        assert_eq!(fields, 8 * CALLS);
        t.elapsed().as_nanos() as f64 / CALLS as f64
    };
    let (a, b, ratios) = pairs(ns_per_block);
    println!(
        "decode per block, median of {ROUNDS} pairs: unbounded {:.0} ns, bounded {:.0} ns; \
         median ratio bounded/unbounded {:.3}",
        median(a),
        median(b),
        median(ratios)
    );

    // Whole requests (HEADERS + a 200-byte DATA frame) through the rewriter, as h2 reads them.
    let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    for (i, blk) in blocks.iter().enumerate() {
        let id = 2 * i as u32 + 1;
        frame_header(blk.len(), HEADERS, END_HEADERS, id, &mut stream);
        stream.extend_from_slice(blk);
        frame_header(200, 0x0, END_STREAM, id, &mut stream);
        stream.extend_from_slice(&[0u8; 200]);
    }
    let mut per_request = Vec::new();
    for _ in 0..ROUNDS {
        let mut r = Rewriter::default();
        let mut out = Vec::with_capacity(stream.len());
        let t = Instant::now();
        for chunk in stream.chunks(8192) {
            r.feed(chunk, &mut out).unwrap();
        }
        per_request.push(t.elapsed().as_nanos() as f64 / CALLS as f64);
        assert_eq!(out, stream);
    }
    println!(
        "rewriter per request (headers + 200 B body): {:.0} ns",
        median(per_request)
    );
    huffman_coded();
}

/// The blocks one connection of `client bench` sent (h2 Huffman-codes every literal), decoded
/// by the crate alone (the rewriter before the plain rewrite) and by `decode_bounded`.
fn huffman_coded() {
    let connection: Vec<Vec<u8>> = include_str!("h2_request_blocks.hex")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    const REPEAT: usize = 100;
    let ns_per_block = |plain: bool| {
        let t = Instant::now();
        for _ in 0..REPEAT {
            // A new connection each time: its own table, as the client's.
            let mut d = loona_hpack::Decoder::new();
            for b in &connection {
                if plain {
                    decode_bounded(&mut d, b).unwrap().unwrap();
                } else {
                    d.decode(b).unwrap();
                }
            }
        }
        t.elapsed().as_nanos() as f64 / (REPEAT * connection.len()) as f64
    };
    let (a, b, ratios) = pairs(ns_per_block);
    println!(
        "h2-encoded blocks ({} of one bench connection), per block, median of {ROUNDS} pairs: \
         the crate alone {:.0} ns, made plain first {:.0} ns; median ratio {:.3}",
        connection.len(),
        median(a),
        median(b),
        median(ratios)
    );
}
