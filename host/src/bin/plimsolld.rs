//! `plimsolld`: the daemon. Configuration comes only from the environment
//! (`plimsolld -h` lists it); any other argument is refused, so a flag that
//! looks like it sets something cannot be silently ignored.

use std::process::ExitCode;
use std::sync::Arc;

use plimsoll::admission::Limits;
use plimsoll::callers::Verifier;
use plimsoll::callers::settings::Auth;
use plimsoll::config::{self, Config, LogFormat};
use plimsoll::{Daemon, api};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {}
        [a] if a == "-h" || a == "--help" || a == "help" => {
            print!("{}", config::help_text());
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!(
                "plimsolld takes no arguments; configuration comes from the environment (see plimsolld -h)"
            );
            return ExitCode::from(2);
        }
    }
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("plimsolld: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(cfg.log_format);
    for name in &cfg.unknown {
        tracing::warn!(variable = %name, "unknown configuration variable ignored (see plimsolld -h)");
    }
    // Hardened mode: every safeguard that can be checked before a provider
    // starts, all named at once; nothing is started if any fails.
    if cfg.hardened {
        let violations = plimsoll::hardened::violations(&cfg);
        if !violations.is_empty() {
            eprintln!(
                "plimsolld: hardened mode refuses to start ({} problems):",
                violations.len()
            );
            for v in &violations {
                eprintln!("  - {v}");
            }
            return ExitCode::from(2);
        }
    }

    // wasm runs are async calls on fibers of their own (see
    // `providers::wasm`), so no run waits for a thread between its floor
    // check and its dispatch, and the runtime's defaults serve.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("plimsolld: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "plimsolld stopped");
            ExitCode::FAILURE
        }
    }
}

/// Start-up, top to bottom. Long on purpose: the order (limits, store,
/// provider, listeners, then readiness) is what a reader must check, and it
/// reads best as one sequence.
async fn serve(cfg: Config) -> anyhow::Result<()> {
    // Connections may use at most part of the open-file limit, raised to
    // its hard limit first, so idle connections cannot starve every other
    // open (docs/callers.md).
    let nofile = plimsoll::fd_limit::raise();
    let ceiling = plimsoll::fd_limit::connection_ceiling(nofile);
    // The guard's connections come out of the same share, before the API's.
    let guard_limits = cfg.guard.as_ref().map(|_| {
        let total = GUARD_CONNECTIONS.min(ceiling / 4).max(1);
        api::serve::ConnectionLimits::new(total, GUARD_CONNECTIONS_PER_PEER.min(total))
    });
    let ceiling = ceiling - guard_limits.as_ref().map_or(0, |l| l.total);
    let total = match cfg.listeners.max_connections {
        None => ceiling,
        Some(n) if n as usize <= ceiling => n as usize,
        Some(n) => anyhow::bail!(
            "PLIMSOLL_MAX_CONNECTIONS={n} is above what the open-file limit ({nofile}) leaves room for ({ceiling})"
        ),
    };
    let api_limits = api::serve::ConnectionLimits::new(
        total,
        (cfg.listeners.max_connections_per_peer as usize).min(total),
    );

    // TLS material is read before any provider starts: a bad certificate
    // is a configuration error, not a half-started daemon.
    let tls = match &cfg.listeners.tls {
        Some((cert, key)) => Some(plimsoll::tls::acceptor(cert, key).map_err(anyhow::Error::msg)?),
        None => None,
    };
    // Both listeners are bound before any provider starts: a port in use is
    // a configuration error, not a daemon with warm containers and no API.
    let addr = cfg.listeners.addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("PLIMSOLL_ADDR {addr}: {e}"))?;
    let metrics_listener = match cfg.listeners.metrics_addr {
        None => None,
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("PLIMSOLL_METRICS_ADDR {addr}: {e}"))?,
        ),
    };
    // The guard, where hosted sandboxes reach granted runs' brokers: its
    // TLS read and its port bound before any provider starts, as the API's.
    let guard = match &cfg.guard {
        None => None,
        Some(g) => {
            let tls = match &g.tls {
                Some((cert, key)) => Some(
                    plimsoll::tls::acceptor(cert, key)
                        .map_err(|e| anyhow::anyhow!("the guard's TLS: {e}"))?,
                ),
                None => None,
            };
            let listener = tokio::net::TcpListener::bind(g.addr)
                .await
                .map_err(|e| anyhow::anyhow!("PLIMSOLL_GUARD_ADDR {}: {e}", g.addr))?;
            let guard = plimsoll::grants::guard::Guard::new(
                plimsoll::grants::guard::Dial::from_settings(g),
            );
            Some((guard, listener, tls))
        }
    };
    let provider = plimsoll::providers::start(
        &cfg.providers,
        &cfg.grants,
        guard.as_ref().map(|(g, _, _)| g.clone()),
    )
    .await?;
    let limits = Limits::new(cfg.providers.max_concurrent);
    release_startup_memory();
    if !cfg.grants.is_empty() {
        tracing::info!(profiles = cfg.grants.len(), "grant profiles loaded");
        for name in cfg.grants.open_to_all() {
            tracing::warn!(
                profile = name,
                "grant profile is open to every caller (\"*\")"
            );
        }
    }
    let metrics = Arc::new(plimsoll::metrics::Metrics::new()?);
    // The store is opened once: its counters go to the quotas and, when
    // the replicas share it, the store itself to the replicas.
    let store = plimsoll::state::opened::open(&cfg.state, cfg.quotas.metered)
        .map_err(anyhow::Error::msg)?;
    let shared = store.shared.clone();
    let quotas = plimsoll::quota::Quotas::with(cfg.quotas.clone(), store);
    let replicas = match (&cfg.replicas, shared) {
        (Some(s), Some(store)) => {
            Some(plimsoll::replicas::Replicas::open(s, store).map_err(anyhow::Error::msg)?)
        }
        (Some(_), None) => anyhow::bail!(
            "PLIMSOLL_REPLICA_URL needs the shared store (PLIMSOLL_STATE_URL) to find sessions in"
        ),
        (None, _) => None,
    };
    let daemon = Arc::new(Daemon::with(
        provider,
        plimsoll::pipeline::Options {
            limits,
            grants: cfg.grants.clone(),
            quotas: quotas.clone(),
            metrics: metrics.clone(),
            sessions: cfg.sessions.clone(),
            replicas,
            receipts: cfg.receipts.clone(),
        },
    ));
    let ev = daemon.evidence();
    if cfg.sessions.enabled() && !daemon.has_sessions() {
        daemon.shutdown().await;
        anyhow::bail!(
            "SANDBOX_MAX_SESSIONS is set, but the {} provider has no sessions; unset it",
            ev.sandbox
        );
    }
    if cfg.hardened
        && let Some(v) = plimsoll::hardened::tier_violation(ev.tier)
    {
        daemon.shutdown().await;
        anyhow::bail!("hardened mode refuses to start: {v}");
    }
    let verifier = Arc::new(match &cfg.callers.auth {
        Auth::Clients(_, file) => Verifier::clients(file),
        Auth::Shared(token) => Verifier::shared(token),
        Auth::Open => Verifier::open(),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let metrics_task = match metrics_listener {
        None => None,
        Some(listener) => {
            tracing::info!(addr = %listener.local_addr()?, tls = tls.is_some(), "metrics listening");
            Some(tokio::spawn(api::serve::serve(
                listener,
                plimsoll::metrics::router(metrics),
                stopped(stop_rx.clone()),
                tls.clone(),
                METRICS_CONNECTIONS,
            )))
        }
    };
    let guard_task = match (guard, guard_limits) {
        (Some((guard, listener, tls)), Some(limits)) => {
            tracing::info!(
                addr = %listener.local_addr()?,
                tls = tls.is_some(),
                max_connections = limits.total,
                "guard listening for hosted sandboxes"
            );
            Some(tokio::spawn(api::serve::serve(
                listener,
                api::guard::router(guard),
                stopped(stop_rx.clone()),
                tls,
                limits,
            )))
        }
        _ => None,
    };
    tracing::info!(
        addr = %listener.local_addr()?,
        sandbox = ev.sandbox,
        isolation = ev.tier.as_str(),
        environment = %ev.environment,
        memory_mb = cfg.providers.memory_mb,
        max_concurrent = cfg.providers.max_concurrent,
        per_caller_concurrency = cfg.quotas.per_caller_concurrency,
        rate_per_min = cfg.quotas.rate_per_min,
        rate_burst = cfg.quotas.burst,
        limits_store = quotas.store_label(),
        auth = verifier.mode(),
        tls = tls.is_some(),
        hardened = cfg.hardened,
        max_connections = api_limits.total,
        max_connections_per_peer = api_limits.per_peer,
        open_file_limit = nofile,
        "plimsolld listening"
    );
    if verifier.is_open() && !matches!(ev.tier, plimsoll::tier::Tier::None) {
        tracing::warn!(
            "open development mode: no caller authentication; anyone who can reach the API can run code"
        );
    }
    if !cfg.listeners.addr.ip().is_loopback() && tls.is_none() {
        tracing::warn!(addr = %cfg.listeners.addr, "the API listens beyond loopback without TLS");
    }
    // Two bodies may be in reading per run slot, as a client can send its
    // next request while the previous one runs.
    let body_slots = 2 * cfg.providers.max_concurrent as usize;
    // At the signal: stop accepting (both listeners), and at once release
    // what would outlive the process (warm containers) while answers in
    // progress drain: a client that keeps an idle connection open must not
    // hold that cleanup.
    let releasing = Arc::new(tokio::sync::Mutex::new(None));
    let release_slot = releasing.clone();
    let for_release = daemon.clone();
    let signal = async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
        *release_slot.lock().await =
            Some(tokio::spawn(async move { for_release.shutdown().await }));
    };
    api::serve::serve(
        listener,
        api::router(daemon.clone(), body_slots, verifier),
        signal,
        tls,
        api_limits,
    )
    .await;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    if let Some(t) = guard_task {
        let _ = t.await;
    }
    match releasing.lock().await.take() {
        Some(release) => {
            let _ = release.await;
        }
        None => daemon.shutdown().await,
    }
    Ok(())
}

/// The guard's connections: hosted sandboxes of many runs may share one
/// vendor NAT address, so the per-peer cap is most of the total; a
/// connection that carried a live token is kept over strangers'.
const GUARD_CONNECTIONS: usize = 1024;
const GUARD_CONNECTIONS_PER_PEER: usize = 768;

/// /metrics has no callers: a scraper needs a few connections, and an
/// attacker's idle ones are always the first to go.
const METRICS_CONNECTIONS: api::serve::ConnectionLimits = api::serve::ConnectionLimits::new(64, 16);

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down");
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::filter::{LevelFilter, filter_fn};
    use tracing_subscriber::prelude::*;
    // The MCP SDK's own lines carry what clients sent (their notifications,
    // their client info): the log is metadata only, so they are dropped,
    // and the daemon logs what it needs about MCP requests itself.
    let ours = filter_fn(|m| !m.target().starts_with("rmcp"));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(true);
    let registry = tracing_subscriber::registry().with(LevelFilter::INFO);
    match format {
        LogFormat::Json => registry
            .with(layer.json().flatten_event(true).with_filter(ours))
            .init(),
        LogFormat::Text => registry
            .with(layer.with_ansi(false).with_filter(ours))
            .init(),
    }
}

/// Compiling the guest component at start allocates tens of MiB across
/// Cranelift's worker threads; glibc keeps the freed memory in per-thread
/// arenas, where it would sit in the daemon's RSS for its whole life. Hand it
/// back once, now that compilation is over.
fn release_startup_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: malloc_trim only returns free heap pages to the kernel; it
        // has no preconditions and touches no memory the program owns.
        unsafe {
            malloc_trim(0);
        }
    }
}
