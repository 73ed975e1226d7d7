//! Marks a connection busy while one of its calls is served: from the moment its request has
//! fully arrived until its answer's body is dropped (sent, or abandoned). Idle-connection rules
//! never close a busy connection. From the moment the answer is ready until its body is dropped,
//! the answer is also "unread": one left so past the answer deadline closes the connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::Bytes;
use tonic::codegen::http::{Request, Response};

use super::ConnInfo;
use super::registry::Conn;

#[derive(Clone, Copy, Debug, Default)]
pub struct InFlightLayer;

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight { inner }
    }
}

#[derive(Clone, Debug)]
pub struct InFlight<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<Request<Body>> for InFlight<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let Some(conn) = req
            .extensions()
            .get::<ConnInfo>()
            .map(|i| Arc::clone(&i.conn))
        else {
            return Box::pin(self.inner.call(req));
        };
        let call = Arc::new(Call {
            conn,
            counted: AtomicBool::new(false),
            answer: AtomicU64::new(NO_ANSWER),
        });
        let req = req.map(|inner| {
            if inner.is_end_stream() {
                call.received();
            }
            Body::new(RequestBody {
                inner,
                call: Arc::clone(&call),
            })
        });
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await?;
            call.answer_ready();
            Ok(response.map(|inner| Body::new(ResponseBody { inner, _call: call })))
        })
    }
}

/// One call on a connection; ends the connection's busy count when the last part of the call
/// (request body, answer future, answer body) is dropped.
struct Call {
    conn: Arc<Conn>,
    counted: AtomicBool,
    /// The number of its ready answer on the connection, NO_ANSWER before.
    answer: AtomicU64,
}

const NO_ANSWER: u64 = u64::MAX;

impl Call {
    fn answer_ready(&self) {
        let n = self.conn.answer_ready(std::time::Instant::now());
        self.answer.store(n, Ordering::SeqCst);
    }

    fn received(&self) {
        if !self.counted.swap(true, Ordering::SeqCst) {
            self.conn.begin_call();
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let answer = self.answer.load(Ordering::SeqCst);
        if answer != NO_ANSWER {
            self.conn.answer_taken(answer);
        }
        if self.counted.load(Ordering::SeqCst) {
            self.conn.end_call();
        }
    }
}

struct RequestBody {
    inner: Body,
    call: Arc<Call>,
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.call.received();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

struct ResponseBody {
    inner: Body,
    _call: Arc<Call>,
}

impl HttpBody for ResponseBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
