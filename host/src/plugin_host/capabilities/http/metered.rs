//! A wasi:http body as it streams through the host, in either direction:
//! every data frame is charged to the call's byte budget for that direction,
//! every trailer is checked against the reserved names, and the call's
//! deadline ends the stream. Nothing is buffered here: a frame is passed on
//! when the reader asks for the next one, so a plugin that stops reading
//! stops the host reading too (hyper's own buffers are bounded).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;
use wasmtime_wasi_http::Error;

use super::HttpCapability;
use super::policy;

/// Which way a body flows, for the error each overflow gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The plugin's request body, on its way out.
    Out,
    /// A service's answer, on its way to the plugin.
    In,
}

/// What one direction of one call may still move, shared by every request
/// of the call.
#[derive(Clone, Debug)]
pub struct Budget {
    remaining: Arc<AtomicU64>,
}

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        Budget {
            remaining: Arc::new(AtomicU64::new(bytes)),
        }
    }

    /// Takes `n` bytes, or none at all if fewer remain.
    pub fn take(&self, n: u64) -> bool {
        self.remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }
}

/// What the rest of the host needs to know about one request's body.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    /// This body ran past the call's budget (hyper reports a failed request
    /// body as a generic error; the sender uses this to say why).
    pub overflowed: Arc<AtomicBool>,
    /// The call is over. A request body the plugin never finished must not
    /// look finished: its end is turned into an error, so nothing sends it
    /// as complete after the call.
    pub call_closed: Arc<AtomicBool>,
}

pub struct Metered<B> {
    inner: B,
    direction: Direction,
    budget: Budget,
    flags: Flags,
    deadline: Pin<Box<Sleep>>,
    capability: Arc<HttpCapability>,
    // Held until the answer's body is done or dropped: a request counts
    // against the call's in-flight limit for as long as it streams.
    permit: Option<Arc<OwnedSemaphorePermit>>,
    done: bool,
}

impl<B> Metered<B> {
    pub fn new(
        inner: B,
        direction: Direction,
        budget: Budget,
        flags: Flags,
        ends: tokio::time::Instant,
        capability: Arc<HttpCapability>,
        permit: Option<Arc<OwnedSemaphorePermit>>,
    ) -> Metered<B> {
        Metered {
            inner,
            direction,
            budget,
            flags,
            deadline: Box::pin(tokio::time::sleep_until(ends)),
            capability,
            permit,
            done: false,
        }
    }
}

impl<B> Metered<B> {
    /// Ends the stream: nothing more is read, and the in-flight slot is free.
    fn end(&mut self) {
        self.done = true;
        self.permit = None;
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Error>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.end();
            return Poll::Ready(Some(Err(match this.direction {
                Direction::Out => Error::ConnectionWriteTimeout,
                Direction::In => Error::HttpResponseTimeout,
            })));
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            None if this.direction == Direction::Out
                && this.flags.call_closed.load(Ordering::SeqCst) =>
            {
                this.end();
                return Poll::Ready(Some(Err(Error::HttpRequestDenied)));
            }
            None => {
                this.end();
                return Poll::Ready(None);
            }
            Some(Err(e)) => {
                this.end();
                return Poll::Ready(Some(Err(e.into())));
            }
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref()
            && !this.budget.take(data.len() as u64)
        {
            this.flags.overflowed.store(true, Ordering::SeqCst);
            this.end();
            return Poll::Ready(Some(Err(match this.direction {
                Direction::Out => Error::HttpRequestBodySize(Some(policy::MAX_CALL_BYTES_OUT)),
                Direction::In => Error::HttpResponseBodySize(Some(policy::MAX_CALL_BYTES_IN)),
            })));
        }
        if let Some(trailers) = frame.trailers_ref()
            && this.direction == Direction::Out
            && trailers.keys().any(|name| {
                // Trailers never carry a credential, the plugin's own included.
                name == http::header::AUTHORIZATION
                    || policy::is_reserved(&this.capability.allowance, name)
            })
        {
            this.end();
            tracing::warn!(
                target: "plimsoll::plugin",
                rule = "a trailer carries a header the host reserves",
                "http request refused"
            );
            return Poll::Ready(Some(Err(Error::HttpRequestDenied)));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
