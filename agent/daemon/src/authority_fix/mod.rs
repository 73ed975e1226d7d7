//! Lets any well-formed gRPC client talk to us over the unix socket, whatever `:authority` it
//! sends.
//!
//! gRPC C-core since 1.57 (Python, C++, Ruby, PHP) and grpc-java send the socket path (plain or
//! percent-encoded) as `:authority` on a unix socket. The HTTP/2 server under tonic (hyperium/h2)
//! parses `:authority` as a URI authority, finds '/' or '%' in the host, and resets the stream
//! with PROTOCOL_ERROR before any service sees the call: every call of such a client fails.
//! grpc-go and kubelet send "localhost", so they were never hit. h2 has no setting for this
//! (hyperium/h2 PR #487 proposes one; hyperium/tonic#243, grpc/grpc#38142 discuss it).
//!
//! The fix sits between the accepted socket and h2: it follows the client's byte stream frame
//! by frame, decodes every request header block with a HPACK decoder that mirrors the client's
//! (so it always knows the client's dynamic table), and, from the first block whose
//! `:authority` is not a valid URI authority on, re-encodes each block with that value replaced
//! by "localhost" (as grpc-go sends), as literals that never touch h2's dynamic table. Until a
//! client sends such a block, its bytes reach h2 unchanged: the clients that already worked see
//! no difference. What the server sends passes through untouched. A header block the decoder
//! cannot read is passed on as it is, and everything after it: h2 then fails the connection
//! with its own error, as it would without this layer.
//!
//! Memory is bounded per connection, whatever the client sends (docs/resources.md): at most one
//! frame of h2's maximum size is buffered (a larger one is handed to h2 unbuffered, which
//! refuses it), a header block at most four times h2's header list limit, and a decoded list at
//! most that limit, counted field by field while decoding (one indexed byte can stand for a
//! 4 KiB field); the block's Huffman-coded strings are made plain in a copy before decoding
//! (`plain`, which spares the crate a Huffman table built per string), less than twice the
//! block's size. A block over a limit goes on to h2 as it came, to be refused by h2's own
//! limits; on a connection already re-encoded (h2's table no longer follows the client's) it
//! ends the connection with GOAWAY(PROTOCOL_ERROR).
//!
//! Dropping it: once h2 accepts such authorities (PR #487 or its successor is released and
//! tonic depends on it), remove `AuthorityFix::new` from `server::serve` and this module; the
//! test `path_authority` in tests/tests/grpc_clients.rs then shows whether h2 alone suffices.

mod plain;
mod rewriter;
#[cfg(test)]
mod tests;

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use rewriter::{HeaderList, Refused, Rewriter, decode_bounded};

/// An accepted connection with the rewriter on its read side.
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    out: Vec<u8>,
    out_at: usize,
    eof: bool,
    /// Once `out` is delivered, reads fail with this: the connection ends.
    refused: Option<Refused>,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            rewriter: Rewriter::default(),
            out: Vec::new(),
            out_at: 0,
            eof: false,
            refused: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_at < this.out.len() {
                let n = (this.out.len() - this.out_at).min(buf.remaining());
                buf.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(why) = this.refused {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            // Uninitialised: h2 polls many times per request, and most polls find nothing to
            // read; zeroing 8 KiB each time was 1 % of a call's CPU.
            let mut chunk = [const { MaybeUninit::<u8>::uninit() }; 8192];
            let mut read = ReadBuf::uninit(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The client is gone: an unfinished frame goes to h2 as it is.
                this.eof = true;
                this.rewriter.give_up(0, &mut this.out);
            } else if let Err(why) = this.rewriter.feed(read.filled(), &mut this.out) {
                this.refused = Some(why);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
