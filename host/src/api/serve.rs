//! The listener: accepts connections and serves the API on each with hyper's
//! auto builder (HTTP/1.1 and prior-knowledge h2c), under limits that hold
//! before any request is admitted.
//!
//! A client that opens connections and never finishes a request must not be
//! able to use up the daemon's file descriptors or memory: connections are
//! capped, headers must arrive within a deadline, HTTP/2 connections carry a
//! bounded number of streams and are pinged so dead peers are dropped.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// Connections held open at once; more wait in the kernel's accept queue.
pub const MAX_CONNECTIONS: usize = 1024;
/// A request's headers must be complete this long after its first byte.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
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
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_H2_STREAMS)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, _peer) = tokio::select! {
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
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        let tls = tls.clone();
        conns.spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_one(&builder, stream, service, &mut stop).await,
                Some(acceptor) => {
                    // The handshake gets the header deadline too: a client
                    // that opens and stalls holds a slot no longer.
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(stream)).await
                    {
                        serve_one(&builder, stream, service, &mut stop).await;
                    }
                }
            }
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
/// `stop` changes.
async fn serve_one<I>(
    builder: &Builder<TokioExecutor>,
    io: I,
    service: TowerToHyperService<Router>,
    stop: &mut watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
