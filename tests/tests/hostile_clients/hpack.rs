//! HPACK bombs: one 4,000-byte header put in the client's dynamic table, then referenced again
//! and again with one byte each. Decoded in full, a 1 MB block is 4 GB. The agent runs with
//! its address space limited to 1 GiB, so a decoder that copies every header out dies; it must
//! instead close the attacker's connection, keep answering, and its peak RSS must grow by less
//! than 64 MiB.

use std::process::{Command, Stdio};
use std::time::Duration;

use ebs_tests::*;

use super::*;

const ADDRESS_SPACE: u64 = 1 << 30;
const MAX_GROWTH_KIB: u64 = 64 * 1024;
/// Connections that send the small bomb at once: what one connection may hold, times many.
const PARALLEL: usize = 16;

/// A HPACK integer with an `n`-bit prefix whose other bits are `flags` (RFC 7541 5.1).
fn integer(mut v: usize, n: u8, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// A 4,000-byte literal with incremental indexing (it becomes dynamic index 62), then `refs`
/// indexed references to it, one byte each (0x80 | 62).
fn bomb(refs: usize) -> Vec<u8> {
    let mut b = vec![0x40];
    integer(6, 7, 0, &mut b);
    b.extend_from_slice(b"x-bomb");
    integer(4000, 7, 0, &mut b);
    b.extend(std::iter::repeat_n(b'a', 4000));
    b.extend(std::iter::repeat_n(0x80 | 62, refs));
    b
}

/// The block in one HEADERS frame and CONTINUATION frames of at most `max` bytes each.
fn frames(block: &[u8], stream: u32, max: usize) -> Vec<u8> {
    let chunks: Vec<&[u8]> = block.chunks(max).collect();
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if i + 1 == chunks.len() {
            END_HEADERS
        } else {
            0
        };
        out.extend(frame(kind, flags, stream, c));
    }
    out
}

/// A Probe whose `:authority` is the socket path (as gRPC C-core sends it): from here on the
/// agent re-encodes this connection's header blocks.
fn path_authority_probe(socket: &Path) -> Vec<u8> {
    let mut block = Vec::new();
    let authority = socket.display().to_string();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/csi.v1.Identity/Probe"),
        (":authority", authority.as_str()),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0);
        integer(n.len(), 7, 0, &mut block);
        block.extend_from_slice(n.as_bytes());
        integer(v.len(), 7, 0, &mut block);
        block.extend_from_slice(v.as_bytes());
    }
    [
        frame(HEADERS, END_HEADERS, 1, &block),
        frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]),
    ]
    .concat()
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The agent under `prlimit --as=1GiB` (prlimit execs it: the child is the agent).
async fn start_limited(scratch: &Scratch) -> Agent {
    let mut agent = Agent::unstarted(scratch, AgentOpts::default());
    let log = std::fs::File::create(&agent.log).expect("log file");
    let child = Command::new("prlimit")
        .arg(format!("--as={ADDRESS_SPACE}"))
        .arg("--")
        .arg(agent_bin())
        .args(agent.serve_args())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn agent under prlimit");
    agent.child = Some(child);
    agent.wait_ready().await;
    agent
}

#[tokio::test]
async fn hpack_bombs_close_the_connection_and_nothing_else() {
    let scratch = Scratch::new("hpack-bomb");
    let mut agent = start_limited(&scratch).await;
    agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .expect("probe");
    let before = peak_rss_kib(agent.pid());
    let socket = agent.socket.clone();

    // (what, bytes after the handshake, connections at once)
    let big = bomb(1_000_000);
    // 4,000 + ~12,000 one-byte references: one frame of h2's maximum size, ~48 MB decoded.
    let small = bomb(16_384 - 4_010);
    let attacks: Vec<(&str, Vec<u8>, usize)> = vec![
        ("a 1 MB HEADERS frame", frames(&big, 1, big.len()), 1),
        (
            "1 MB in 16 KiB CONTINUATION frames",
            frames(&big, 1, 16_384),
            1,
        ),
        (
            "a 16 KiB HEADERS frame",
            frames(&small, 1, 16_384),
            PARALLEL,
        ),
        (
            "a 16 KiB HEADERS frame after a rewritten request",
            [path_authority_probe(&socket), frames(&small, 3, 16_384)].concat(),
            PARALLEL,
        ),
    ];
    for (what, bytes, n) in attacks {
        let socket = socket.clone();
        let outcomes = tokio::task::spawn_blocking(move || {
            let payload = [handshake(), bytes].concat();
            let threads: Vec<_> = (0..n)
                .map(|_| {
                    let (socket, payload) = (socket.clone(), payload.clone());
                    std::thread::spawn(move || {
                        let mut s = send(&socket, &payload);
                        outcome(&mut s, Duration::from_secs(20))
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("attacker thread"))
                .collect::<Vec<_>>()
        })
        .await
        .expect("attack");
        let probe = tokio::time::timeout(Duration::from_secs(10), async {
            agent.identity().await.probe(csi::ProbeRequest {}).await
        })
        .await;
        if !matches!(probe, Ok(Ok(_))) {
            let exit = agent.wait_exit(Duration::from_secs(5)).await;
            let log = agent.log_text();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            panic!(
                "{what}: no Probe afterwards ({probe:?}); agent exit: {exit:?}; log tail: {tail:?}"
            );
        }
        for o in &outcomes {
            assert_ne!(o, &Outcome::StillOpen, "{what}: the connection stayed open");
        }
        eprintln!("{what}: {:?}", outcomes[0]);
    }
    let after = peak_rss_kib(agent.pid());
    eprintln!("peak RSS {before} KiB before, {after} KiB after");
    assert!(
        after.saturating_sub(before) < MAX_GROWTH_KIB,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
    agent.terminate().await;
}
