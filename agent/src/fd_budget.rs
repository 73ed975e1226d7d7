//! Where the agent's file descriptors go. Host work (mkfs, fsck, mount, the state file, udev)
//! needs descriptors at unpredictable moments, and a peer must never be able to use them up:
//! every listener caps its connections, and the caps together take at most a quarter of
//! RLIMIT_NOFILE, so three quarters always remain for host work however the ports are flooded.
//! The soft limit is first raised to the hard one (systemd's default soft limit is 1024).

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// How many connections each listener may hold open, derived from the descriptor limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub limit: u64,
    /// The metrics port: scrapers use one or two connections; the rest are closed at once.
    pub metrics_connections: usize,
    /// Each gRPC socket (CSI, CSI-Addons): further clients wait in the kernel's backlog.
    pub grpc_connections: usize,
}

impl Budget {
    pub fn for_limit(limit: u64) -> Self {
        let peers = usize::try_from(limit / 4).unwrap_or(usize::MAX);
        Budget {
            limit,
            metrics_connections: (peers / 8).clamp(4, 64),
            grpc_connections: (peers * 7 / 16).clamp(8, 256),
        }
    }

    /// What peers can never take: the limit less every listener's cap.
    pub fn reserve(&self) -> u64 {
        let peers = self.metrics_connections + 2 * self.grpc_connections;
        self.limit.saturating_sub(peers as u64)
    }
}

/// Raises RLIMIT_NOFILE's soft limit to its hard limit, logs the budget that follows and returns
/// it. A failure (a hard limit of "unlimited" the kernel refuses, a seccomp filter) keeps the
/// current limit and says so.
pub fn raise_nofile_limit() -> Budget {
    let before = getrlimit(Resource::Nofile);
    let soft = before.current.unwrap_or(u64::MAX);
    let raised = match before.maximum {
        Some(hard) if hard > soft => match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        ) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit");
                soft
            }
        },
        _ => soft,
    };
    let budget = Budget::for_limit(raised);
    tracing::info!(
        before = soft,
        limit = raised,
        metrics_connections = budget.metrics_connections,
        grpc_connections = budget.grpc_connections,
        reserved_for_host_work = budget.reserve(),
        "open-file limit"
    );
    if budget.reserve() < 512 {
        tracing::warn!(
            limit = raised,
            "open-file limit is low: raise LimitNOFILE (systemd) or the container's nofile ulimit"
        );
    }
    budget
}

/// A connection that holds one of its listener's slots until it is dropped.
pub struct Capped<IO> {
    io: IO,
    _slot: OwnedSemaphorePermit,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Capped<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Capped<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Capped<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A gRPC socket's incoming connections, at most `cap` open at once: the next client waits in
/// the kernel's backlog until one closes (a CO retries; nothing is refused). Accept errors
/// (EMFILE) back off instead of spinning. The accept task ends when the server drops the stream.
pub fn capped_incoming(
    listener: UnixListener,
    cap: usize,
) -> ReceiverStream<io::Result<Capped<UnixStream>>> {
    let (tx, rx) = mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(cap));
    tokio::spawn(async move {
        loop {
            let slot = tokio::select! {
                _ = tx.closed() => return,
                slot = Arc::clone(&slots).acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => return,
                },
            };
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((io, _)) => {
                    if tx.send(Ok(Capped { io, _slot: slot })).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_a_small_limit_goes_to_peers() {
        let b = Budget::for_limit(1024);
        assert_eq!((b.metrics_connections, b.grpc_connections), (32, 112));
        assert_eq!(b.reserve(), 768);
    }

    #[test]
    fn large_limits_keep_small_caps_and_tiny_ones_keep_a_few_slots() {
        let b = Budget::for_limit(1 << 20);
        assert_eq!((b.metrics_connections, b.grpc_connections), (64, 256));
        let b = Budget::for_limit(64);
        assert_eq!((b.metrics_connections, b.grpc_connections), (4, 8));
        assert_eq!(Budget::for_limit(8).reserve(), 0);
    }

    #[tokio::test]
    async fn the_cap_holds_further_clients_in_the_backlog() {
        use tokio_stream::StreamExt;
        let dir = std::env::temp_dir().join(format!("fd-budget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let mut incoming = capped_incoming(UnixListener::bind(&path).unwrap(), 2);
        let _clients: Vec<_> = futures_connect(&path, 3).await;
        let first = incoming.next().await.unwrap().unwrap();
        let _second = incoming.next().await.unwrap().unwrap();
        let third = tokio::time::timeout(Duration::from_millis(300), incoming.next()).await;
        assert!(third.is_err(), "a third connection got past a cap of 2");
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await;
        assert!(
            matches!(third, Ok(Some(Ok(_)))),
            "a freed slot admits the next"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    async fn futures_connect(path: &std::path::Path, n: usize) -> Vec<UnixStream> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(UnixStream::connect(path).await.unwrap());
        }
        v
    }
}
