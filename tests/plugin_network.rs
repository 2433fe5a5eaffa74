//! A plugin's network through the real daemon: the hostile plugin's every
//! off-list request refused before it leaves (through the `http` interface
//! and through wasi:http), wasi:http's streaming budgets, and HTTP/2 with
//! trailers over mutual TLS.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use plimsoll_tests::hostile_plugin::{assert_no_attack_in_log, hostile_with, recording_server};
use plimsoll_tests::{Daemon, call, js_run};
use serde_json::json;

fn hostile(origin: &str) -> Daemon {
    hostile_with(origin, &[])
}

#[tokio::test]
async fn every_off_list_request_is_refused_before_it_leaves() {
    let (origin, hits) = recording_server().await;
    let d = hostile(&origin);
    let a = call(&d, "Run", &js_run("http-attacks")).await;
    let report = a.stdout();
    let lines: Vec<&str> = report.lines().collect();
    assert!(lines.len() >= 19, "{report}");
    for line in &lines {
        assert!(
            line.ends_with(" forbidden"),
            "a request got through: {line}"
        );
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a refused request reached the server"
    );
    d.audit_after_sentinel().await;
    assert!(
        d.log_lines()
            .iter()
            .filter(|l| l.contains("http request refused"))
            .count()
            >= lines.len()
    );
    // The log names the rule broken, never what the plugin sent: none of the
    // URLs, hosts or header values it tried appears in it.
    assert_no_attack_in_log(&d);
}

/// A loopback server for wasi:http's streaming cases: `/small` answers at
/// once, `/endless` never stops sending, `/sink` reads whatever it is sent.
/// It counts what it sent and received, so a test can bound what the host
/// let through; any other path counts as a hit that should never happen.
struct StreamServer {
    origin: String,
    sent: Arc<std::sync::atomic::AtomicU64>,
    received: Arc<std::sync::atomic::AtomicU64>,
    stray: Arc<AtomicUsize>,
}

struct Endless(Arc<std::sync::atomic::AtomicU64>);

impl axum::body::HttpBody for Endless {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        static CHUNK: [u8; 64 << 10] = [b'e'; 64 << 10];
        self.0.fetch_add(CHUNK.len() as u64, Ordering::SeqCst);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(
            axum::body::Bytes::from_static(&CHUNK),
        ))))
    }
}

async fn stream_server() -> StreamServer {
    use http_body_util::BodyExt;
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stray = Arc::new(AtomicUsize::new(0));
    let (s, r, x) = (sent.clone(), received.clone(), stray.clone());
    let app = axum::Router::new()
        .route("/small", axum::routing::get(|| async { "ok" }))
        .route(
            "/endless",
            axum::routing::get(move || {
                let s = s.clone();
                async move { axum::body::Body::new(Endless(s)) }
            }),
        )
        .route(
            "/sink",
            axum::routing::post(move |body: axum::body::Body| {
                let r = r.clone();
                async move {
                    let mut body = body;
                    while let Some(Ok(frame)) = body.frame().await {
                        if let Some(d) = frame.data_ref() {
                            r.fetch_add(d.len() as u64, Ordering::SeqCst);
                        }
                    }
                    "sunk"
                }
            }),
        )
        .fallback(move || {
            let x = x.clone();
            async move {
                x.fetch_add(1, Ordering::SeqCst);
                "stray"
            }
        });
    StreamServer {
        origin: plimsoll_tests::serve_loopback(app).await,
        sent,
        received,
        stray,
    }
}

#[tokio::test]
async fn every_off_list_wasi_http_request_is_refused_before_it_leaves() {
    let (origin, hits) = recording_server().await;
    let d = hostile(&origin);
    let a = call(&d, "Run", &js_run("wasi-http-attacks")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let report = a.stdout();
    let lines: Vec<&str> = report.lines().collect();
    assert!(lines.len() >= 24, "{report}");
    for line in &lines {
        let (_, outcome) = line.rsplit_once(' ').expect("case and outcome");
        assert!(
            [
                "forbidden",
                "denied",
                "invalid",
                "protocol-error",
                "uri-invalid"
            ]
            .contains(&outcome),
            "a request got through or failed for another reason: {line}"
        );
    }
    // Targets the policy sees are refused by it; headers and trailers the
    // host reserves cannot even be built.
    assert!(report.contains("wasi-http:other-port denied"), "{report}");
    assert!(
        report.contains("wasi-http:https-to-listed-host denied"),
        "{report}"
    );
    assert!(
        report.contains("wasi-http-header:authorization forbidden"),
        "{report}"
    );
    assert!(
        report.contains("wasi-http-header:x-forwarded-host forbidden"),
        "{report}"
    );
    assert!(
        report.contains("wasi-http-method:CONNECT denied"),
        "{report}"
    );
    assert!(
        report.contains("wasi-http-trailer:authorization forbidden"),
        "{report}"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a refused request reached the server"
    );
    // Nothing left, so the run is an ordinary answer, and the log names
    // rules, never what the plugin sent.
    d.audit_after_sentinel().await;
    assert!(d.log_lines().join("\n").contains("http request refused"));
    assert_no_attack_in_log(&d);
}

#[tokio::test]
async fn wasi_http_streams_are_held_to_the_calls_budgets() {
    let server = stream_server().await;
    let d = hostile(&server.origin);
    let mut run = js_run("wasi-http-streams");
    run["timeoutMs"] = json!(30_000);
    let a = call(&d, "Run", &run).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let report = a.stdout();
    // Eight requests at once; the ninth is refused without being sent.
    assert!(
        report.contains("wasi-http-stream:in-flight limit after 8"),
        "{report}"
    );
    // An endless answer is cut at the call's 64 MiB, and the server was
    // not allowed to run far ahead of what the plugin read.
    // (wasi:http 0.2 as wasmtime implements it gives a failed body stream
    // no error code, so the plugin sees only that the stream failed.)
    let endless = report
        .lines()
        .find_map(|l| l.strip_prefix("wasi-http-stream:endless-answer "))
        .expect("the endless case ran");
    assert!(
        endless == "io after 63 MiB"
            || endless == "io after 64 MiB"
            || endless.starts_with("response-body-size after 6"),
        "{report}"
    );
    let sent = server.sent.load(Ordering::SeqCst);
    assert!(
        sent < (64 << 20) + (16 << 20),
        "the host read {} MiB of an endless answer",
        sent >> 20
    );
    // A request body past 64 MiB is stopped, and the plugin is told why.
    assert!(
        report.contains("wasi-http-stream:request-past-budget request-body-size"),
        "{report}"
    );
    assert!(server.received.load(Ordering::SeqCst) <= 64 << 20);
    // Slots come back when answers are dropped.
    assert!(
        report.contains("wasi-http-control:after-release sent-200"),
        "{report}"
    );
    assert_eq!(server.stray.load(Ordering::SeqCst), 0);
}

/// A TLS server on loopback that requires a client certificate signed by
/// the test CA and offers HTTP/2 and HTTP/1.1. `/small` answers "ok";
/// `/trailers` answers with the protocol it spoke, the body's length and
/// the trailers it received. Counts completed handshakes.
async fn mtls_server(dir: &plimsoll_tests::Scratch) -> (String, Arc<AtomicUsize>) {
    use http_body_util::BodyExt;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;

    let (cert, key) = plimsoll_tests::certificate(dir);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .expect("cert")
        .collect::<Result<_, _>>()
        .expect("cert");
    let key = PrivateKeyDer::from_pem_file(&key).expect("key");
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(dir.path("ca.pem")).expect("ca") {
        roots.add(ca.expect("ca")).expect("ca");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let app = axum::Router::new()
        .route("/small", axum::routing::get(|| async { "ok" }))
        .route(
            "/trailers",
            axum::routing::post(|req: axum::extract::Request| async move {
                let version = req.version();
                let mut body = req.into_body();
                let (mut len, mut trailers) = (0, Vec::new());
                while let Some(Ok(frame)) = body.frame().await {
                    if let Some(d) = frame.data_ref() {
                        len += d.len();
                    }
                    if let Some(t) = frame.trailers_ref() {
                        for (k, v) in t {
                            trailers.push(format!("{k}:{}", v.to_str().unwrap_or("?")));
                        }
                    }
                }
                format!("{version:?} body={len} trailers={}", trailers.join(","))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, app, counted) = (acceptor.clone(), app.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    });
    (format!("https://127.0.0.1:{port}"), handshakes)
}

#[tokio::test]
async fn wasi_http_speaks_h2_with_trailers_over_mutual_tls() {
    let dir = plimsoll_tests::Scratch::new("plugin-mtls");
    let (origin, handshakes) = mtls_server(&dir).await;
    let (cert, key) = plimsoll_tests::client_certificate(&dir);
    let (ca, cert, key) = (
        dir.path("ca.pem").display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
    );
    let d = hostile_with(
        &origin,
        &[
            ("SANDBOX_PLUGIN_HTTP_CA", ca.as_str()),
            ("SANDBOX_PLUGIN_HTTP_CLIENT_CERT", cert.as_str()),
            ("SANDBOX_PLUGIN_HTTP_CLIENT_KEY", key.as_str()),
        ],
    );
    let a = call(&d, "Run", &js_run("wasi-http-tls")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let report = a.stdout();
    // The host presented the operator's certificate, verified the server
    // against the operator's CA, and spoke HTTP/2, trailers included.
    assert!(report.contains("tls:get 200 ok"), "{report}");
    assert!(
        report.contains("tls:post-with-trailer 200 HTTP/2.0 body=7 trailers=x-checksum:abc"),
        "{report}"
    );
    // Both requests of the call went as HTTP/2 streams of one connection:
    // the call keeps what it opened (and nothing outlives the call).
    assert_eq!(handshakes.load(Ordering::SeqCst), 1);
    // The key never reaches the plugin or the log.
    let secret = std::fs::read_to_string(dir.path("client.key")).expect("key");
    let body = secret
        .lines()
        .find(|l| !l.starts_with("-----"))
        .expect("key body");
    d.audit_after_sentinel().await;
    assert!(!d.log_lines().join("\n").contains(body));

    // Without the client certificate the server refuses the handshake, and
    // without the operator's CA the host refuses the server.
    let no_cert = hostile_with(&origin, &[("SANDBOX_PLUGIN_HTTP_CA", ca.as_str())]);
    let a = call(&no_cert, "Run", &js_run("wasi-http-tls")).await;
    assert!(!a.stdout().contains(" 200 "), "{}", a.stdout());
    let no_ca = hostile_with(
        &origin,
        &[
            ("SANDBOX_PLUGIN_HTTP_CLIENT_CERT", cert.as_str()),
            ("SANDBOX_PLUGIN_HTTP_CLIENT_KEY", key.as_str()),
        ],
    );
    let a = call(&no_ca, "Run", &js_run("wasi-http-tls")).await;
    assert!(
        a.stdout()
            .contains("tls:get OTHER-ErrorCode::TlsCertificateError"),
        "{}",
        a.stdout()
    );
    assert_eq!(
        handshakes.load(Ordering::SeqCst),
        1,
        "no handshake completed"
    );
}
