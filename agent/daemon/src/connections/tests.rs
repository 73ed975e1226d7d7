//! The slot rules on real unix sockets, and the sweep with a clock moved by hand.

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio_stream::StreamExt;

use super::registry::Registry;
use super::*;

struct Socket {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl Socket {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("conns-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        Socket { dir, path }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn clients(path: &std::path::Path, n: usize) -> Vec<UnixStream> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(UnixStream::connect(path).await.unwrap());
    }
    v
}

#[tokio::test]
async fn with_every_connection_busy_the_next_waits_for_a_slot() {
    let s = Socket::new("busy");
    let mut incoming = incoming(UnixListener::bind(&s.path).unwrap(), 2);
    let _clients = clients(&s.path, 3).await;
    let first = incoming.next().await.unwrap().unwrap();
    let second = incoming.next().await.unwrap().unwrap();
    first.conn.begin_call();
    second.conn.begin_call();
    let third = tokio::time::timeout(Duration::from_millis(1500), incoming.next()).await;
    assert!(third.is_err(), "a third connection got past a cap of 2");
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await;
    assert!(
        matches!(third, Ok(Some(Ok(_)))),
        "a freed slot admits the next"
    );
}

#[tokio::test]
async fn at_the_cap_the_longest_idle_connection_gives_up_its_slot() {
    let s = Socket::new("reclaim");
    let mut incoming = incoming(UnixListener::bind(&s.path).unwrap(), 2);
    let mut clients = clients(&s.path, 2).await;
    let mut first = incoming.next().await.unwrap().unwrap();
    let second = incoming.next().await.unwrap().unwrap();
    // The first had a call that ended after the second was accepted: the second is idle longer.
    first.conn.begin_call();
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.conn.end_call();
    clients.push(UnixStream::connect(&s.path).await.unwrap());
    let mut second = second;
    let reader = tokio::spawn(async move {
        let mut b = [0u8; 1];
        second.read(&mut b).await
    });
    let third = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await;
    assert!(matches!(third, Ok(Some(Ok(_)))), "the third got no slot");
    let read = reader.await.unwrap();
    assert_eq!(
        read.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::TimedOut),
        "the longest idle connection was closed"
    );
    let mut b = [0u8; 1];
    let still = tokio::time::timeout(Duration::from_millis(100), first.read(&mut b)).await;
    assert!(
        still.is_err(),
        "the more recently busy connection was kept: {still:?}"
    );
}

#[test]
fn a_late_preface_closes_the_connection_a_complete_one_does_not() {
    let mut r = Registry::new(256);
    let silent = r.register();
    let partial = r.register();
    let complete = r.register();
    partial.received(10);
    complete.received(10);
    complete.received(14);
    let t0 = Instant::now();
    r.sweep_at(t0 + HANDSHAKE_DEADLINE - Duration::from_millis(100));
    let waker = std::task::Waker::noop();
    assert!(
        silent.closed_for(waker).is_none(),
        "closed before the deadline"
    );
    r.sweep_at(t0 + HANDSHAKE_DEADLINE + Duration::from_millis(100));
    assert!(silent.closed_for(waker).is_some());
    assert!(partial.closed_for(waker).is_some());
    assert!(complete.closed_for(waker).is_none());
}

#[test]
fn above_three_quarters_of_the_cap_long_idle_connections_close_longest_idle_first() {
    let mut r = Registry::new(8);
    let conns: Vec<_> = (0..8).map(|_| r.register()).collect();
    for c in &conns {
        c.received(24);
    }
    // Two are busy; the other six idle since their accept, the first ones longest.
    conns[0].begin_call();
    conns[5].begin_call();
    let waker = std::task::Waker::noop();
    let open = |conns: &[std::sync::Arc<registry::Conn>]| {
        conns
            .iter()
            .filter(|c| c.closed_for(waker).is_none())
            .count()
    };
    // Not idle long enough yet: nothing closes.
    r.sweep_at(Instant::now() + IDLE_TIMEOUT - Duration::from_secs(1));
    assert_eq!(open(&conns), 8);
    r.sweep_at(Instant::now() + IDLE_TIMEOUT + Duration::from_secs(1));
    assert_eq!(open(&conns), 6, "down to three quarters of the cap");
    assert!(
        conns[0].closed_for(waker).is_none(),
        "a busy connection closed"
    );
    assert!(conns[1].closed_for(waker).is_some() && conns[2].closed_for(waker).is_some());
    // At or below three quarters, idle connections stay.
    r.sweep_at(Instant::now() + 10 * IDLE_TIMEOUT);
    assert_eq!(open(&conns), 6);
}

/// A request body fed by hand: a frame per message, the end when the sender is dropped.
struct Fed(tokio::sync::mpsc::Receiver<tonic::codegen::Bytes>);

impl http_body::Body for Fed {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|d| d.map(|d| Ok(http_body::Frame::data(d))))
    }
}

#[tokio::test]
async fn a_call_is_busy_from_its_whole_request_until_its_answer_is_gone() {
    use http_body::Body as _;
    use tonic::body::Body;
    use tonic::codegen::http::{Request, Response};
    use tower::{Layer, Service, ServiceExt};

    let mut registry = Registry::new(4);
    let conn = registry.register();
    let (received_tx, received) = tokio::sync::oneshot::channel::<()>();
    let received_tx = std::sync::Mutex::new(Some(received_tx));
    let mut svc = InFlightLayer.layer(tower::service_fn(move |req: Request<Body>| {
        let signal = received_tx.lock().unwrap().take();
        async move {
            let mut body = req.into_body();
            while let Some(f) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            {
                f.unwrap();
            }
            drop(body);
            if let Some(s) = signal {
                let _ = s.send(());
            }
            Ok::<_, std::convert::Infallible>(Response::new(Body::new(Fed(
                tokio::sync::mpsc::channel(1).1,
            ))))
        }
    }));
    let (feed, rx) = tokio::sync::mpsc::channel(4);
    let mut req = Request::new(Body::new(Fed(rx)));
    req.extensions_mut().insert(ConnInfo {
        peer: UdsConnectInfo {
            peer_addr: None,
            peer_cred: None,
        },
        conn: Arc::clone(&conn),
    });
    let call = tokio::spawn(svc.ready().await.unwrap().call(req));
    feed.send("half a request".into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        conn.idle_since().is_some(),
        "busy before its request arrived"
    );
    drop(feed);
    received.await.unwrap();
    assert!(conn.idle_since().is_none(), "idle while served");
    let answer = call.await.unwrap().unwrap();
    assert!(
        conn.idle_since().is_none(),
        "idle before its answer was sent"
    );
    drop(answer);
    assert!(conn.idle_since().is_some(), "still busy after its answer");
}

#[test]
fn an_answer_left_unread_closes_its_connection_calls_in_flight_or_not() {
    let mut r = Registry::new(8);
    let t0 = Instant::now();
    let reader = r.register();
    let stalled = r.register();
    let (close_reader, close_stalled) = (reader.clone(), stalled.clone());
    for c in [&reader, &stalled] {
        c.received(PREFACE_LEN);
    }
    // The reader takes its answer at once; the stalled client leaves one unread while another
    // call of its is still being served (which idle rules alone would never close).
    let taken = reader.answer_ready(t0);
    reader.answer_taken(taken);
    stalled.begin_call();
    stalled.answer_ready(t0);
    r.sweep_at(t0 + ANSWER_DEADLINE - Duration::from_millis(100));
    let waker = std::task::Waker::noop();
    assert!(
        close_stalled.closed_for(waker).is_none(),
        "closed too early"
    );
    r.sweep_at(t0 + ANSWER_DEADLINE + Duration::from_millis(100));
    assert!(
        close_stalled.closed_for(waker).is_some(),
        "the stalled client kept its slot"
    );
    assert!(
        close_reader.closed_for(waker).is_none(),
        "a reading client was closed"
    );
}

#[test]
fn at_the_cap_a_client_that_leaves_an_answer_unread_goes_before_an_idle_one() {
    let mut r = Registry::new(2);
    let t0 = Instant::now();
    let idle = r.register();
    let stalled = r.register();
    stalled.begin_call();
    stalled.answer_ready(t0);
    let waker = std::task::Waker::noop();
    assert!(r.reclaim_one_at(t0 + Duration::from_secs(2)));
    assert!(
        stalled.closed_for(waker).is_some(),
        "the stalled client kept its slot"
    );
    assert!(idle.closed_for(waker).is_none(), "the idle one went first");
}
