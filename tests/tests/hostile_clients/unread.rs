//! Clients that call and never take the answer: a flow-control window of 0 (SETTINGS
//! INITIAL_WINDOW_SIZE = 0, so the server may send no DATA) with several calls per connection,
//! on every slot of the socket. Each of their connections has calls "in flight" for ever; the
//! agent must still let kubelet in and answer it.

use std::time::{Duration, Instant};

use ebs_tests::*;

use super::*;

const DATA: u8 = 0x0;
const END_STREAM: u8 = 0x1;

/// One header field, HPACK "literal without indexing", no Huffman: by static-table name index,
/// or (index 0) with the name spelled out. Values are shorter than 127 bytes.
fn field(index: u8, name: &str, value: &str) -> Vec<u8> {
    let mut f = if index < 15 {
        vec![index]
    } else {
        vec![0x0f, index - 15]
    };
    if index == 0 {
        f.push(name.len() as u8);
        f.extend_from_slice(name.as_bytes());
    }
    f.push(value.len() as u8);
    f.extend_from_slice(value.as_bytes());
    f
}

/// The preface with a zero window, then `calls` Probe calls, whole requests each.
fn zero_window_calls(calls: u32) -> Vec<u8> {
    let initial_window_0 = [0x00, 0x04, 0, 0, 0, 0];
    let mut out = [PREFACE, &frame(SETTINGS, 0, 0, &initial_window_0)].concat();
    for i in 0..calls {
        let stream = 2 * i + 1;
        let headers = [
            vec![0x83, 0x86], // :method POST, :scheme http
            field(4, "", "/csi.v1.Identity/Probe"),
            field(1, "", "localhost"),
            field(31, "", "application/grpc"),
            field(0, "te", "trailers"),
        ]
        .concat();
        out.extend(frame(HEADERS, END_HEADERS, stream, &headers));
        // An empty ProbeRequest: uncompressed, 0 bytes.
        out.extend(frame(DATA, END_STREAM, stream, &[0, 0, 0, 0, 0]));
    }
    out
}

/// The cap the agent logged at start: `grpc_connections=N`.
fn connection_cap(agent: &Agent) -> usize {
    agent
        .log_text()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc_connections="))
        .and_then(|n| n.parse().ok())
        .expect("the agent logs its connection cap")
}

#[tokio::test]
async fn clients_that_never_read_their_answers_never_lock_out_probe() {
    let scratch = Scratch::new("unread");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = connection_cap(&agent);
    // Every slot, and then a steady stream of more: 4 calls each, none of whose answers is ever
    // taken. Each is kept open until the end.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let socket = agent.socket.clone();
    let attacking = std::sync::Arc::clone(&stop);
    let attacker = std::thread::spawn(move || {
        let mut held: Vec<std::os::unix::net::UnixStream> = (0..=cap)
            .map(|_| send(&socket, &zero_window_calls(4)))
            .collect();
        while !attacking.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            held.push(send(&socket, &zero_window_calls(4)));
        }
        held
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A new connection gets a slot and its answers (generous bounds: seconds, not a target).
    let started = Instant::now();
    let fresh = tokio::time::timeout(Duration::from_secs(30), async {
        let mut id = agent.identity().await;
        id.probe(csi::ProbeRequest {}).await?;
        let mut node = agent.node().await;
        node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
            .await
            .map(drop)
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let held = tokio::task::spawn_blocking(move || attacker.join().expect("attacker"))
        .await
        .expect("join");
    assert!(
        matches!(fresh, Ok(Ok(()))),
        "Probe and NodeGetCapabilities on a new connection while {} zero-window clients hold \
         the socket: {fresh:?}",
        held.len()
    );
    eprintln!(
        "a new connection answered in {} ms with {} zero-window clients",
        started.elapsed().as_millis(),
        held.len()
    );
    // Past the answer deadline (5 s) and the sweep: none of them holds a slot any more.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let total = held.len();
    let open = tokio::task::spawn_blocking(move || {
        let mut held = held;
        held.iter_mut().map(is_open).filter(|o| *o).count()
    })
    .await
    .expect("count");
    assert!(
        open < cap / 4,
        "{open} of {total} zero-window connections still open"
    );
    // The agent is still whole.
    agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .expect("Probe after the attack");
}
