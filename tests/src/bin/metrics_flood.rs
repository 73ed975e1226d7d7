//! A hostile neighbour for the flood test: keeps up to CONNECTIONS idle TCP connections open to
//! ADDR for SECONDS, opening a new one a second after the server closes one. Run as an unprivileged
//! user (the test drops to nobody). Prints `established=N max_open=M` when done.
//!   metrics_flood ADDR CONNECTIONS SECONDS

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

#[derive(Default)]
struct Counts {
    established: AtomicUsize,
    open: AtomicUsize,
    max_open: AtomicUsize,
}

async fn hold(addr: String, until: Instant, counts: Arc<Counts>) {
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
        // Send nothing; wait for the server to give up on us (or the end of the flood).
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
    let [_, addr, connections, seconds] = args.as_slice() else {
        eprintln!("usage: metrics_flood ADDR CONNECTIONS SECONDS");
        std::process::exit(2);
    };
    let (Ok(connections), Ok(seconds)) = (connections.parse::<usize>(), seconds.parse::<u64>())
    else {
        eprintln!("CONNECTIONS and SECONDS are numbers");
        std::process::exit(2);
    };
    let until = Instant::now() + Duration::from_secs(seconds);
    let counts = Arc::new(Counts::default());
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(hold(addr.clone(), until, Arc::clone(&counts))))
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
