//! A connection's bytes as they arrive, seen by the listener before hyper
//! parses them: on HTTP/1, the first byte of a request head starts that
//! head's deadline (`Connection::head_bytes_arrived`).
//!
//! hyper's own header timeout starts when it begins waiting for a head,
//! which on a kept-alive connection is as soon as the previous answer is
//! written: an idle keep-alive connection was closed after 5 s instead of
//! its 60 s idle time. Counting from the first byte keeps both rules: a
//! connection may wait for its next request, and a request, once begun,
//! must finish its headers in time. HTTP/2 carries frames (pings, window
//! updates) between requests, so its bytes start no head deadline; its
//! streams are bounded by the idle time and the stream cap instead.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connections::Connection;

/// What a client sends first to speak HTTP/2 with prior knowledge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

enum Protocol {
    /// Every byte so far is the start of the HTTP/2 preface.
    Undecided {
        matched: usize,
    },
    Http1,
    Http2,
}

pub(super) struct Watched<I> {
    io: I,
    conn: Arc<Connection>,
    protocol: Protocol,
}

impl<I> Watched<I> {
    pub(super) fn new(io: I, conn: Arc<Connection>) -> Watched<I> {
        Watched {
            io,
            conn,
            protocol: Protocol::Undecided { matched: 0 },
        }
    }

    fn arrived(&mut self, bytes: &[u8]) {
        if let Protocol::Undecided { matched } = self.protocol {
            let want = &H2_PREFACE[matched..];
            let n = want.len().min(bytes.len());
            self.protocol = if bytes[..n] != want[..n] {
                Protocol::Http1
            } else if matched + n == H2_PREFACE.len() {
                Protocol::Http2
            } else {
                Protocol::Undecided {
                    matched: matched + n,
                }
            };
        }
        if let Protocol::Http1 = self.protocol {
            self.conn.head_bytes_arrived();
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = &buf.filled()[before..];
            if !new.is_empty() {
                this.arrived(new);
            }
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
