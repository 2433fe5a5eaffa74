//! An answer's body on its way to the peer, as the listener watches it.
//!
//! An answer already made costs memory until its peer takes it, and a peer
//! can simply not read: an HTTP/1 client that stops reading, or an HTTP/2
//! client that opens no flow-control window, left 32 answers a connection
//! held for as long as it liked. So every answer body goes out through
//! `Delivery`:
//! - in pieces of at most `PIECE` bytes, so the transport (hyper, h2) takes
//!   and buffers one piece at a time rather than the whole answer at once
//!   and the rest stays where this module can see it;
//! - timed: from the moment a piece is ready until the transport asks for
//!   the next one, the answer is waiting on its peer, and a connection whose
//!   answer waits longer than its `answer_stall` limit is closed
//!   (`Connection::ended`), freeing what it held;
//! - counted: the bytes not yet taken count against the authenticated
//!   caller on all their connections (`Connection::unread_answers`), and
//!   the API refuses a caller new work past its budget.
//!
//! Waiting on the run itself (a stream whose next chunk is not made yet) is
//! not waiting on the peer: only a poll that found data ready starts the
//! clock.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};

use super::connections::{Busy, Connection};

/// Bytes of answers one caller may leave untaken, over all its connections,
/// before the API refuses it new work: a few of the largest answers (a
/// project's artifacts) in flight at once, far below what the daemon holds.
pub(super) const UNREAD_ANSWERS_PER_CALLER: usize = 64 << 20;

/// The most of an answer handed to the transport at once: HTTP/2's default
/// frame size, so flow control bounds what h2 buffers to about a piece.
const PIECE: usize = 16 << 10;

pub(super) struct Delivery {
    inner: Body,
    /// What is left of a frame larger than a piece.
    rest: Bytes,
    conn: Arc<Connection>,
    answer: u64,
    /// Bytes counted now as the caller's unread answers.
    counted: usize,
    /// The request stays in flight on its connection until its answer is
    /// gone.
    _busy: Busy,
}

impl Delivery {
    pub(super) fn new(inner: Body, busy: Busy, conn: Arc<Connection>) -> Delivery {
        let answer = conn.next_answer_id();
        let mut d = Delivery {
            inner,
            rest: Bytes::new(),
            conn,
            answer,
            counted: 0,
            _busy: busy,
        };
        // The head is made: the transport asks for the body when the peer
        // has room for it.
        d.conn.answer_waits(answer, Some(Instant::now()));
        d.recount();
        d
    }

    /// Brings the caller's count of unread bytes to what this answer holds
    /// now: the rest of a cut frame and what the body says it still has.
    fn recount(&mut self) {
        let held = self.rest.len().saturating_add(
            usize::try_from(http_body::Body::size_hint(&self.inner).lower()).unwrap_or(usize::MAX),
        );
        if held > self.counted {
            self.conn.unread_changed(held - self.counted, 0);
        } else if held < self.counted {
            self.conn.unread_changed(0, self.counted - held);
        }
        self.counted = held;
    }

    fn next_piece(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > PIECE {
            self.rest = data.split_off(PIECE);
        }
        data
    }
}

impl http_body::Body for Delivery {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        // Asked for more: the peer took what went before.
        this.conn.answer_waits(this.answer, None);
        let polled = if this.rest.is_empty() {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => Poll::Ready(Some(Ok(Frame::data(this.next_piece(data))))),
                    Err(trailers) => Poll::Ready(Some(Ok(trailers))),
                },
                other => other,
            }
        } else {
            let rest = std::mem::take(&mut this.rest);
            Poll::Ready(Some(Ok(Frame::data(this.next_piece(rest)))))
        };
        if let Poll::Ready(Some(Ok(_))) = &polled {
            this.conn.answer_waits(this.answer, Some(Instant::now()));
        }
        this.recount();
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint.set_lower(inner.lower().saturating_add(rest));
        hint
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.conn.answer_waits(self.answer, None);
        self.conn.unread_changed(0, self.counted);
    }
}
