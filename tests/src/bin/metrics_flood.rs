//! A hostile neighbour for the flood test: keeps up to CONNECTIONS idle TCP connections open to
//! ADDR for SECONDS, opening a new one a second after the server closes one. Run as an unprivileged
//! user (the test drops to nobody). Prints `established=N max_open=M` when done. With `half`, each
//! connection sends the start of a request head and never its end (a half-sent request).
//!   metrics_flood ADDR CONNECTIONS SECONDS [half]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Default)]
struct Counts {
    established: AtomicUsize,
    open: AtomicUsize,
    max_open: AtomicUsize,
}

/// The start of a scrape's request head, without the empty line that ends it.
const HALF_HEAD: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n";

async fn hold(addr: String, until: Instant, counts: Arc<Counts>, half: bool) {
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        let connected = tokio::time::timeout(left, TcpStream::connect(&addr)).await;
        let Ok(Ok(mut stream)) = connected else {
            // EMFILE here, or a full backlog: try again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        counts.established.fetch_add(1, Ordering::Relaxed);
        let now_open = counts.open.fetch_add(1, Ordering::Relaxed) + 1;
        counts.max_open.fetch_max(now_open, Ordering::Relaxed);
        if half {
            let _ = stream.write_all(HALF_HEAD).await;
        }
        // Send nothing (more); wait for the server to give up on us (or the end of the flood).
        let mut byte = [0u8; 1];
        let left = until.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left, stream.read(&mut byte)).await;
        counts.open.fetch_sub(1, Ordering::Relaxed);
        drop(stream);
        // A pause before the next one keeps the churn (and the loopback ports left in
        // TIME_WAIT, which every other test on the host shares) modest.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (addr, connections, seconds, half) = match args.as_slice() {
        [_, addr, connections, seconds] => (addr, connections, seconds, false),
        [_, addr, connections, seconds, half] if half == "half" => {
            (addr, connections, seconds, true)
        }
        _ => {
            eprintln!("usage: metrics_flood ADDR CONNECTIONS SECONDS [half]");
            std::process::exit(2);
        }
    };
    let (Ok(connections), Ok(seconds)) = (connections.parse::<usize>(), seconds.parse::<u64>())
    else {
        eprintln!("CONNECTIONS and SECONDS are numbers");
        std::process::exit(2);
    };
    let until = Instant::now() + Duration::from_secs(seconds);
    let counts = Arc::new(Counts::default());
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(hold(addr.clone(), until, Arc::clone(&counts), half)))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    println!(
        "established={} max_open={}",
        counts.established.load(Ordering::Relaxed),
        counts.max_open.load(Ordering::Relaxed)
    );
}
