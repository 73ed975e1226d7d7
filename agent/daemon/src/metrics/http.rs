//! The scrape endpoint: a minimal HTTP/1.1 responder for `GET /metrics` on a TCP listener that
//! anyone on the host may reach. One request per connection, and every resource a client can
//! tie up is bounded: at most `max_connections` open at once, half of them per peer address;
//! at the cap the oldest connection still waiting for its request head is closed to make room
//! (see `admission`: so half-sent requests cannot keep a scrape out), and a new one is closed
//! on accept only while every slot is answering; 2 s to send a request head of at most 2 KiB,
//! 5 s to take the answer. A flood or a slowloris client costs a few descriptors for a few
//! seconds, never the ones host work needs (see `fd_budget`), and never a scrape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::Sources;
use super::admission::{Admission, Ticket};
use super::families::{REFUSED, TIMED_OUT};

/// Prometheus sends a few hundred bytes of headers.
const MAX_REQUEST: usize = 2 * 1024;
/// For the whole request head, from accept: a client that trickles bytes is dropped at this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// For writing the answer to a client that reads it slowly.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until the process exits: metrics stay scrapable while calls drain after SIGTERM.
pub fn spawn(listener: TcpListener, sources: Arc<Sources>, max_connections: usize) {
    let admission = Admission::new(max_connections);
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let Some((ticket, evicted)) = admission.admit(peer.ip()) else {
                        REFUSED.inc();
                        drop(stream);
                        continue;
                    };
                    let sources = Arc::clone(&sources);
                    tokio::spawn(serve_one(stream, sources, ticket, evicted));
                    // Lets the new connection read its head before the next accept: a scrape's
                    // head is there at once, and once read the scrape can no longer be evicted
                    // by a burst of accepts behind it.
                    tokio::task::yield_now().await;
                }
                // EMFILE and the like: back off rather than spin on a full descriptor table.
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
}

/// One connection, holding its slot (`ticket`) until it ends; `evicted` ends if the slot is
/// taken back while the head is still awaited.
async fn serve_one(
    mut stream: TcpStream,
    sources: Arc<Sources>,
    ticket: Ticket,
    evicted: oneshot::Receiver<()>,
) {
    let head = tokio::select! {
        head = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)) => head,
        _ = evicted => return,
    };
    let request = match head {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) | Ok(Err(_)) => return,
        Err(_) => {
            TIMED_OUT.inc();
            return;
        }
    };
    if !ticket.head_received() {
        return;
    }
    let answer = async {
        let (status, body) = match request {
            Head::TooLarge => ("431 Request Header Fields Too Large", String::new()),
            Head::Request { method, path } => match (method.as_str(), path.as_str()) {
                ("GET", "/metrics") => {
                    let gauges = tokio::task::spawn_blocking(move || sources.gauges())
                        .await
                        .map_err(std::io::Error::other)?;
                    let body = super::render(&gauges);
                    ("200 OK", body)
                }
                ("GET", _) => ("404 Not Found", "try /metrics\n".to_string()),
                _ => ("405 Method Not Allowed", String::new()),
            },
        };
        respond(&mut stream, status, &body).await
    };
    if tokio::time::timeout(RESPONSE_TIMEOUT, answer)
        .await
        .is_err()
    {
        TIMED_OUT.inc();
    }
}

enum Head {
    Request { method: String, path: String },
    TooLarge,
}

/// The request line of a head that ends in an empty line; `None` when the client hangs up first.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Head>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        // Only the new bytes and the three before them can complete the terminator.
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if buf[from..].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
        if buf.len() >= MAX_REQUEST {
            return Ok(Some(Head::TooLarge));
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut request_line = head.lines().next().unwrap_or("").split(' ');
    let method = request_line.next().unwrap_or("").to_string();
    let target = request_line.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("").to_string();
    Ok(Some(Head::Request { method, path }))
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::io::AsyncReadExt;

    async fn listener() -> (SocketAddr, TcpListener) {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        (l.local_addr().unwrap(), l)
    }

    /// Serves a single connection the way `spawn` does, without the gauges' sources.
    async fn one_connection(l: &TcpListener) -> Duration {
        let (mut s, _) = l.accept().await.unwrap();
        let started = Instant::now();
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut s)).await;
        started.elapsed()
    }

    #[tokio::test]
    async fn a_slowloris_client_is_dropped_after_the_request_timeout() {
        let (addr, l) = listener().await;
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            for _ in 0..40 {
                if c.write_all(b"G").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let held = one_connection(&l).await;
        assert!(
            held < REQUEST_TIMEOUT + Duration::from_millis(500),
            "{held:?}"
        );
        client.abort();
    }

    #[tokio::test]
    async fn an_endless_head_is_cut_at_the_size_limit() {
        let (addr, l) = listener().await;
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            let _ = c.write_all(&[b'x'; 3 * MAX_REQUEST]).await;
            let mut answer = String::new();
            let _ = c.read_to_string(&mut answer).await;
            answer
        });
        let (mut s, _) = l.accept().await.unwrap();
        let head = read_head(&mut s).await.unwrap();
        assert!(matches!(head, Some(Head::TooLarge)));
        respond(&mut s, "431 Request Header Fields Too Large", "")
            .await
            .unwrap();
        drop(s);
        assert!(client.await.unwrap().starts_with("HTTP/1.1 431"));
    }

    #[tokio::test]
    async fn a_head_split_across_reads_is_found() {
        let (addr, l) = listener().await;
        tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            for part in [
                &b"GET /metrics?x=1 HTTP/1.1\r"[..],
                b"\n",
                b"Host: a\r\n\r",
                b"\n",
            ] {
                c.write_all(part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        let (mut s, _) = l.accept().await.unwrap();
        match read_head(&mut s).await.unwrap() {
            Some(Head::Request { method, path }) => {
                assert_eq!((method.as_str(), path.as_str()), ("GET", "/metrics"))
            }
            _ => panic!("no request line"),
        }
    }
}
