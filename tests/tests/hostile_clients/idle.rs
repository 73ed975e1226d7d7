//! Connections that hold a slot and do nothing. The CSI socket takes at most a fixed number of
//! connections at once (the descriptor budget's cap, 256 with a large open-file limit); idle ones
//! must never keep kubelet or a Probe out, and a connection that never finishes the HTTP/2
//! preface must not hold its slot for long.

use std::path::Path;
use std::time::{Duration, Instant};

use ebs_tests::*;

use super::*;

/// Past the agent's idle timeout (10 s) and its once-a-second sweep.
const IDLE_WAIT: Duration = Duration::from_secs(14);

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
async fn idle_connections_at_the_cap_never_lock_out_probe() {
    let scratch = Scratch::new("idle-cap");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = connection_cap(&agent);
    // Every slot taken by a connection that finished the preface and then sends nothing (so
    // the handshake deadline does not reclaim them); then one more, which waits for a slot.
    let socket = agent.socket.clone();
    let mut idle: Vec<std::os::unix::net::UnixStream> = tokio::task::spawn_blocking(move || {
        (0..=cap).map(|_| send(&socket, &handshake())).collect()
    })
    .await
    .expect("idle clients");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let probe = tokio::time::timeout(Duration::from_secs(10), async {
        agent.identity().await.probe(csi::ProbeRequest {}).await
    })
    .await;
    assert!(
        matches!(probe, Ok(Ok(_))),
        "Probe with {cap} idle connections open: {probe:?}"
    );
    eprintln!(
        "Probe answered in {} ms with {} idle connections",
        started.elapsed().as_millis(),
        cap + 1
    );
    // Above three quarters of the cap, connections idle for long are closed, longest idle
    // first, down to three quarters.
    tokio::time::sleep(IDLE_WAIT).await;
    let open =
        tokio::task::spawn_blocking(move || idle.iter_mut().map(is_open).filter(|o| *o).count())
            .await
            .expect("count");
    assert!(
        open <= cap * 3 / 4,
        "{open} idle connections still open of a cap of {cap}"
    );
}

#[tokio::test]
async fn a_connection_that_never_finishes_the_preface_is_closed() {
    let scratch = Scratch::new("half-preface");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let socket = agent.socket.clone();
    let (half, whole) = tokio::task::spawn_blocking(move || {
        let mut half = send(&socket, &PREFACE[..10]);
        let mut whole = send(&socket, &handshake());
        let started = Instant::now();
        let half = (
            outcome(&mut half, Duration::from_secs(15)),
            started.elapsed(),
        );
        // The connection that finished its preface is kept (far below the cap, idle is fine).
        std::thread::sleep(Duration::from_secs(7).saturating_sub(started.elapsed()));
        (half, is_open(&mut whole))
    })
    .await
    .expect("clients");
    assert_ne!(
        half.0,
        Outcome::StillOpen,
        "a half-sent preface held its connection"
    );
    eprintln!("half-sent preface closed after {} ms", half.1.as_millis());
    assert!(whole, "a connection that finished its preface was closed");
}

/// A call that is being served keeps its connection, whatever the idle rules do to the others:
/// a call hangs below a FUSE mount that never answers while more idle connections than the cap
/// arrive and sit past the idle timeout.
#[tokio::test]
async fn a_connection_with_a_call_in_flight_is_never_taken() {
    let test = "a_connection_with_a_call_in_flight_is_never_taken";
    if !require_root(test) {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "{test} needs /dev/fuse and CI=true: refusing to skip"
        );
        ebs_tests::skip(test, "no /dev/fuse");
        return;
    }
    let scratch = Scratch::new("busy-conn");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let cap = connection_cap(&agent);
    // Declared after the agent and the scratch directory, so aborted before either is dropped.
    let hung = ebs_tests::hung_mount::HungMount::new(&agent.work.join("hung")).expect("FUSE");
    let mut node = agent.node().await;
    let req = csi_req::unpublish_by_id("busy", &hung.path().join("pod/volumes/mount"));
    let call = tokio::spawn(async move { node.node_unpublish_volume(req).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !call.is_finished(),
        "the call should hang below the dead mount"
    );

    let socket = agent.socket.clone();
    let idle: Vec<std::os::unix::net::UnixStream> = tokio::task::spawn_blocking(move || {
        (0..cap + 8).map(|_| send(&socket, &handshake())).collect()
    })
    .await
    .expect("idle clients");
    tokio::time::sleep(IDLE_WAIT).await;
    assert!(
        !call.is_finished(),
        "the busy connection was closed: {:?}",
        call.await
    );
    drop(hung);
    let answer = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends with the mount")
        .expect("call task");
    // An answer from the agent (whatever it is), not a connection that was cut.
    if let Err(status) = &answer {
        assert!(
            !matches!(
                status.code(),
                tonic::Code::Unknown | tonic::Code::Unavailable
            ),
            "the call's connection was cut: {status:?}"
        );
    }
    drop(idle);
}
