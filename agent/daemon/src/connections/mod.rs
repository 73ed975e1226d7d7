//! The gRPC sockets' connections: how many at once, how long one may sit idle, and the HTTP/2
//! limits that every layer reading a client's bytes shares with h2.
//!
//! Each socket admits at most `cap` connections (the descriptor budget, `fd_budget`). A slot is
//! never left to a client that does nothing while another waits:
//! - a connection that has not sent the whole client preface [`HANDSHAKE_DEADLINE`] after its
//!   accept is closed;
//! - while more than three quarters of the cap are in use, connections idle (no call being
//!   served) for [`IDLE_TIMEOUT`] are closed, longest idle first, down to three quarters;
//! - at the cap, the next connection is accepted and takes the slot of the longest idle one at
//!   once (so the socket holds at most cap + 1 descriptors).
//!
//! A connection with a call being served (its request received, its answer not yet sent) is
//! never closed for idling. A request that is still arriving does not count: a client that starts
//! a call and stalls is idle. But a client that does not take an answer (a flow-control window of
//! 0, a socket it never reads) has its connection closed [`ANSWER_DEADLINE`] after the answer was
//! ready, calls in flight or not: otherwise a few such clients hold every slot for ever. HTTP/2
//! streams per connection are capped too ([`MAX_CONCURRENT_STREAMS`]).

mod in_flight;
mod registry;
#[cfg(test)]
mod tests;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::UdsConnectInfo;
use tower::layer::util::{Identity, Stack};

pub use in_flight::InFlightLayer;
use registry::{Conn, Registry};

/// SETTINGS_MAX_FRAME_SIZE: h2's default, set explicitly so that h2 and the `:authority`
/// rewriter (which buffers at most one frame) agree.
pub const MAX_FRAME_SIZE: u32 = 16_384;
/// SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113: names, values and 32 bytes per field): hyper's
/// default for h2, set explicitly; the rewriter never holds a decoded list larger than this.
pub const MAX_HEADER_LIST_SIZE: u32 = 16_384;
/// SETTINGS_HEADER_TABLE_SIZE: h2's default (tonic does not expose it). The client's dynamic
/// table may never be larger; a size update above it is a decoding error.
pub const HEADER_TABLE_SIZE: usize = 4_096;
/// How long a client has from the accept to send the 24-byte HTTP/2 client preface.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// How long a ready answer may wait for the client to take it before its connection is closed.
/// A gRPC client reads continuously; one that leaves an answer for seconds does not read at all.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// SETTINGS_MAX_CONCURRENT_STREAMS: calls at once on one connection (h2's default is 200, each
/// a task and buffers); kubelet and the sidecars make a few. Further calls wait client-side.
pub const MAX_CONCURRENT_STREAMS: u32 = 32;
/// Above three quarters of the cap, how long a connection may sit without a call.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the deadlines are checked.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
const PREFACE_LEN: usize = 24;

/// tonic's server with this module's limits and call tracking.
pub type Server = tonic::transport::Server<Stack<InFlightLayer, Identity>>;
pub type Router = tonic::transport::server::Router<Stack<InFlightLayer, Identity>>;

pub fn server() -> Server {
    tonic::transport::Server::builder()
        .max_frame_size(MAX_FRAME_SIZE)
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .layer(InFlightLayer)
}

/// What tonic puts in every request's extensions: the peer, and the connection the call is
/// counted on.
#[derive(Clone)]
pub struct ConnInfo {
    pub peer: UdsConnectInfo,
    conn: Arc<Conn>,
}

/// An accepted connection: holds its slot until dropped, and fails its next read or write
/// once it is closed for idling or for a late preface.
pub struct Tracked {
    io: UnixStream,
    conn: Arc<Conn>,
    _slot: OwnedSemaphorePermit,
}

impl Tracked {
    fn check(&self, cx: &Context<'_>) -> io::Result<()> {
        if let Some(why) = self.conn.closed_for(cx.waker()) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, why));
        }
        Ok(())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.conn.gone();
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        self.conn.received(buf.filled().len() - before);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Tracked {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            peer: self.io.connect_info(),
            conn: Arc::clone(&self.conn),
        }
    }
}

/// A gRPC socket's incoming connections, at most `cap` open at once (see the module's rules).
/// Accept errors (EMFILE) back off instead of spinning. The accept task ends when the server
/// drops the stream.
pub fn incoming(listener: UnixListener, cap: usize) -> ReceiverStream<io::Result<Tracked>> {
    let (tx, rx) = mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(cap));
    let mut registry = Registry::new(cap);
    tokio::spawn(async move {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                _ = sweep.tick() => {
                    registry.sweep();
                    continue;
                }
                accepted = listener.accept() => accepted,
            };
            let io = match accepted {
                Ok((io, _)) => io,
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(slot) = slot(&slots, &mut registry, &mut sweep, &tx).await else {
                return;
            };
            let conn = registry.register();
            if tx
                .send(Ok(Tracked {
                    io,
                    conn,
                    _slot: slot,
                }))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// A free slot, or the slot of the longest idle connection (closed for it; one more each
/// second in case it lingers). With every connection busy, waits (still applying the
/// deadlines) until one ends. None once the server is gone.
async fn slot<T>(
    slots: &Arc<Semaphore>,
    registry: &mut Registry,
    sweep: &mut tokio::time::Interval,
    tx: &mpsc::Sender<T>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
        return Some(slot);
    }
    loop {
        registry.reclaim_one();
        let retry = tokio::time::sleep(SWEEP_EVERY);
        tokio::pin!(retry);
        loop {
            tokio::select! {
                _ = tx.closed() => return None,
                slot = Arc::clone(slots).acquire_owned() => return slot.ok(),
                _ = sweep.tick() => registry.sweep(),
                _ = &mut retry => break,
            }
        }
    }
}
