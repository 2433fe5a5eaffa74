//! The listener: accepts connections and serves a router on each with
//! hyper's auto builder (HTTP/1.1 and prior-knowledge h2c, or either over
//! TLS), under limits that hold before any request is admitted.
//!
//! Anyone who can reach the port can open connections, token or not, so
//! nothing about a connection may be held for long on the strength of a
//! connection alone (`connections`):
//! - connections are capped in total and per peer address; at a cap, the
//!   oldest connection that has not carried an authenticated request is
//!   closed to make room, so a flood of idle, half-sent or half-handshaken
//!   connections cannot lock out callers with a token;
//! - a connection must begin its first request (TLS handshake and protocol
//!   detection included) within `connections::FIRST_REQUEST_TIMEOUT`;
//! - a connection with no request in flight for `connections::IDLE_TIMEOUT` is closed,
//!   HTTP/2 included;
//! - an HTTP/1 request's headers must arrive within a deadline counted
//!   from their first byte (`conn_io`), so a kept-alive connection may wait
//!   for its next request for its whole idle time;
//! - an answer its peer takes nothing of for `connections::ANSWER_STALL_TIMEOUT`
//!   ends its connection, and answers go out in pieces (`delivery`);
//! - HTTP/2 connections carry a bounded number of streams and are pinged
//!   so dead peers are dropped.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::conn_io::Watched;
use super::connections::Table;
pub use super::connections::{Connection, ConnectionLimits};
use super::delivery::Delivery;

/// Bytes hyper may buffer on one HTTP/1 connection, each way.
const H1_MAX_BUFFER: usize = 64 << 10;
/// Streams one HTTP/2 connection may have open at once.
const MAX_H2_STREAMS: u32 = 32;
/// How long shutdown waits for answers in progress.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(35);

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight requests finish (bounded by DRAIN_TIMEOUT).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper's would start as soon as a kept-alive connection goes idle;
        // ours starts at a head's first byte (`conn_io`).
        .header_read_timeout(None)
        // What one connection may buffer of requests read ahead and answers
        // not yet written: hyper's default (about 400 KiB) let a tokenless
        // client that pipelines requests and never reads hold that much per
        // connection, about 700 MB at 1,500 connections. A head still fits
        // (hyper caps headers well below it) and answers go out in 16 KiB
        // pieces (`delivery`).
        .max_buf_size(H1_MAX_BUFFER)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_H2_STREAMS)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let builder = Arc::new(builder);
    let table = Table::new(limits);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Room for it, or it is closed at once (every connection that could
        // make room has carried an authenticated request).
        let Some(conn) = table.admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let router = router.clone();
        let mut stop = stop_rx.clone();
        let tls = tls.clone();
        conns.spawn(async move {
            let watched = conn.clone();
            let served = async {
                match tls {
                    None => serve_one(&builder, stream, router, &conn, &mut stop).await,
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            serve_one(&builder, stream, router, &conn, &mut stop).await;
                        }
                    }
                }
            };
            // Eviction, or a connection that never began a request, or one
            // idle too long, ends it here: dropping the connection closes
            // the socket.
            tokio::select! {
                () = served => {}
                () = watched.ended() => {}
            }
            watched.close();
        });
        // Reap finished connection tasks so the set does not grow.
        while conns.try_join_next().is_some() {}
    }

    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
}

/// Serves one connection until it ends, or shuts it down gracefully once
/// `stop` changes. Every request carries the connection's handle (so the API
/// can mark it as having carried an authenticated request) and counts as in
/// flight until its answer's body is dropped.
async fn serve_one<I>(
    builder: &Builder<TokioExecutor>,
    io: I,
    router: Router,
    conn: &Arc<Connection>,
    stop: &mut watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let handle = conn.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let busy = handle.begin_request();
        req.extensions_mut().insert(handle.clone());
        let router = router.clone();
        let conn = handle.clone();
        async move {
            let resp = router.oneshot(req.map(Body::new)).await?;
            // Still in flight until the whole answer has been taken.
            Ok::<_, std::convert::Infallible>(resp.map(|b| Delivery::new(b, busy, conn)))
        }
    });
    let io = Watched::new(io, conn.clone());
    let conn_fut = builder.serve_connection(TokioIo::new(io), service);
    let mut conn_fut = std::pin::pin!(conn_fut);
    tokio::select! {
        _ = conn_fut.as_mut() => {}
        _ = stop.changed() => {
            conn_fut.as_mut().graceful_shutdown();
            let _ = conn_fut.await;
        }
    }
}
