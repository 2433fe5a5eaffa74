//! How the host sends a plugin's wasi:http request once the policy passed
//! it: on a connection the call opened to the host named in the checked URL
//! (kept for the call's later requests there, see `pool`),
//! with TLS verified against the system's roots and the operator's extra
//! CAs, presenting the operator's client certificate if one is configured,
//! HTTP/2 when the server offers it over TLS, HTTP/1.1 otherwise. Hyper's connection API is used directly:
//! it follows no redirects and reads no proxy settings, so neither can
//! carry a request past the allowlist. Every step is bounded by the call's
//! deadline.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use http::{Request, Response, Uri};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use url::{Host, Url};
use wasmtime_wasi_http::Error;

use super::policy::HttpTls;
use super::pool::{CallConnections, Kept};

trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// The connection's own work, which must keep running while the answer's
/// body is read; wasmtime holds it as long as the plugin holds the body.
pub type Connection = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// The tasks one call's connections run on. HTTP/2 drives a connection
/// (and streams a request body) from tasks hyper spawns, and every
/// connection, kept for the call's later requests, runs on a task of its
/// own; they go through this executor so that the call's end stops them,
/// as wasmtime stops the tasks it spawned itself. A task offered after the
/// end (a send still finishing on another thread) is dropped, not started.
#[derive(Clone, Default)]
pub struct CallTasks(Arc<Mutex<Tasks>>);

#[derive(Default)]
struct Tasks {
    closed: bool,
    running: Vec<tokio::task::AbortHandle>,
}

impl CallTasks {
    pub fn abort_all(&self) {
        let mut tasks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tasks.closed = true;
        for t in tasks.running.drain(..) {
            t.abort();
        }
    }
}

impl<F> hyper::rt::Executor<F> for CallTasks
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        // Checked and spawned under the lock `abort_all` takes, so no task
        // slips in between the end and the aborts.
        let mut tasks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if tasks.closed {
            return;
        }
        let handle = tokio::spawn(fut).abort_handle();
        // Finished tasks are dropped as new ones come, so the list stays
        // as long as what is running.
        tasks.running.retain(|t| !t.is_finished());
        tasks.running.push(handle);
    }
}

/// The TLS settings every plugin request uses: the system's roots and the
/// operator's extra CAs, ALPN offering HTTP/2 and HTTP/1.1, and the
/// operator's client certificate. A file that cannot be read or parsed is a
/// start-up error naming its variable.
pub fn tls_config(files: &HttpTls) -> Result<Arc<ClientConfig>, String> {
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        // A system root this TLS stack cannot parse is skipped, as reqwest
        // does; the rest still verify.
        let _ = roots.add(cert);
    }
    if let Some(ca) = &files.ca {
        let certs = read_certs("SANDBOX_PLUGIN_HTTP_CA", ca)?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("SANDBOX_PLUGIN_HTTP_CA {}: {e}", ca.display()))?;
        }
    }
    // With no roots every https request fails closed; say so at start
    // rather than on the first request.
    if roots.is_empty() {
        tracing::warn!(
            target: "plimsoll::plugin",
            "no trust roots were found: plugin https requests will fail"
        );
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let mut config = match &files.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = read_certs("SANDBOX_PLUGIN_HTTP_CLIENT_CERT", cert)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("SANDBOX_PLUGIN_HTTP_CLIENT_KEY {}: {e}", key.display()))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!("SANDBOX_PLUGIN_HTTP_CLIENT_CERT: the certificate and key do not fit together: {e}")
            })?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_certs(
    variable: &str,
    path: &std::path::Path,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{variable} {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{variable} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{variable} {}: no certificate", path.display()));
    }
    Ok(certs)
}

/// Sends `req` to the origin of `url` (already checked), returning the
/// answer's head as soon as it arrives. A connection the call kept to the
/// same origin is used when one is free; otherwise a new one is opened,
/// run on the call's tasks and kept for the call's later requests.
pub async fn send<B>(
    tls: Arc<ClientConfig>,
    url: &Url,
    req: Request<B>,
    ends: Instant,
    tasks: CallTasks,
    pool: CallConnections<B>,
) -> Result<(Response<Incoming>, Connection), Error>
where
    B: Body<Data = bytes::Bytes, Error = Error> + Send + Unpin + 'static,
{
    let port = url
        .port_or_known_default()
        .ok_or(Error::HttpRequestUriInvalid)?;
    let origin = format!(
        "{}://{}:{port}",
        url.scheme(),
        url.host_str().ok_or(Error::HttpRequestUriInvalid)?
    );
    let mut req = req;
    if let Some(kept) = pool.take(&origin) {
        match send_on(kept, false, req, url, ends, &pool, &origin).await? {
            Sent::Answered(head) => return Ok((head, finished())),
            // The kept connection closed before the request was written to
            // it: nothing was sent, so a new connection may carry it.
            Sent::NotSent(back) => req = back,
        }
    }
    let kept = open(tls, url, port, ends, tasks).await?;
    match send_on(kept, true, req, url, ends, &pool, &origin).await? {
        Sent::Answered(head) => Ok((head, finished())),
        Sent::NotSent(_) => Err(Error::ConnectionTerminated),
    }
}

enum Sent<B> {
    Answered(Response<Incoming>),
    NotSent(Request<B>),
}

/// The request on one connection, shaped for its protocol; the connection
/// is kept for the call's later requests (an HTTP/2 one stays in the pool
/// when taken, so only a new one is added).
async fn send_on<B>(
    kept: Kept<B>,
    fresh: bool,
    req: Request<B>,
    url: &Url,
    ends: Instant,
    pool: &CallConnections<B>,
    origin: &str,
) -> Result<Sent<B>, Error>
where
    B: Body<Data = bytes::Bytes, Error = Error> + Send + Unpin + 'static,
{
    let answer = match kept {
        Kept::H2(mut sender) => {
            let req = for_h2(req, url)?;
            if fresh {
                pool.keep(origin.to_string(), Kept::H2(sender.clone()));
            }
            timeout_at(ends, sender.try_send_request(req)).await
        }
        Kept::H1(mut sender) => {
            let req = for_h1(req, url)?;
            let answer = timeout_at(ends, sender.try_send_request(req)).await;
            if matches!(answer, Ok(Ok(_))) {
                // Free again once this answer's body was read to its end.
                pool.keep(origin.to_string(), Kept::H1(sender));
            }
            answer
        }
    };
    match answer {
        Err(_) => Err(Error::HttpResponseTimeout),
        Ok(Ok(head)) => Ok(Sent::Answered(head)),
        Ok(Err(mut e)) => match e.take_message() {
            Some(back) => Ok(Sent::NotSent(back)),
            None => Err(Error::from(e.into_error())),
        },
    }
}

/// HTTP/2 takes the target from the URI's scheme and authority.
fn for_h2<B>(mut req: Request<B>, url: &Url) -> Result<Request<B>, Error> {
    req.headers_mut().remove(http::header::HOST);
    *req.uri_mut() = Uri::try_from(url.as_str()).map_err(|_| Error::HttpRequestUriInvalid)?;
    Ok(req)
}

/// HTTP/1.1 sends the path alone and the target in Host.
fn for_h1<B>(mut req: Request<B>, url: &Url) -> Result<Request<B>, Error> {
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let host = http::HeaderValue::from_str(&host).map_err(|_| Error::HttpRequestUriInvalid)?;
    req.headers_mut().insert(http::header::HOST, host);
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    *req.uri_mut() = Uri::try_from(path).map_err(|_| Error::HttpRequestUriInvalid)?;
    Ok(req)
}

/// The connection is driven by a task of the call's, not by the answer.
fn finished() -> Connection {
    Box::pin(async { Ok(()) })
}

/// Opens a connection to the origin of `url`: TCP, then TLS for https
/// (HTTP/2 when the server offers it), its work spawned on the call's tasks.
async fn open<B>(
    tls: Arc<ClientConfig>,
    url: &Url,
    port: u16,
    ends: Instant,
    tasks: CallTasks,
) -> Result<Kept<B>, Error>
where
    B: Body<Data = bytes::Bytes, Error = Error> + Send + Unpin + 'static,
{
    let addrs: Vec<SocketAddr> = match url.host() {
        Some(Host::Ipv4(ip)) => vec![SocketAddr::from((ip, port))],
        Some(Host::Ipv6(ip)) => vec![SocketAddr::from((ip, port))],
        Some(Host::Domain(name)) => timeout_at(ends, tokio::net::lookup_host((name, port)))
            .await
            .map_err(|_| Error::DnsTimeout)?
            .map_err(|_| Error::DestinationNotFound)?
            .collect(),
        None => return Err(Error::HttpRequestUriInvalid),
    };
    let tcp = connect(&addrs, ends).await?;
    let _ = tcp.set_nodelay(true);

    let (stream, h2): (Box<dyn Stream>, bool) = if url.scheme() == "https" {
        let name = match url.host() {
            Some(Host::Domain(d)) => {
                ServerName::try_from(d.to_string()).map_err(|_| Error::HttpRequestUriInvalid)?
            }
            Some(Host::Ipv4(ip)) => ServerName::IpAddress(std::net::IpAddr::V4(ip).into()),
            Some(Host::Ipv6(ip)) => ServerName::IpAddress(std::net::IpAddr::V6(ip).into()),
            None => return Err(Error::HttpRequestUriInvalid),
        };
        let tls = timeout_at(ends, TlsConnector::from(tls).connect(name, tcp))
            .await
            .map_err(|_| Error::ConnectionTimeout)?
            .map_err(tls_error)?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        (Box::new(tls), h2)
    } else {
        (Box::new(tcp), false)
    };
    let io = TokioIo::new(stream);

    if h2 {
        let (sender, conn) = timeout_at(
            ends,
            hyper::client::conn::http2::Builder::new(tasks.clone())
                // A plugin that stops reading stops the server sending
                // beyond one window: keep the windows small.
                .initial_stream_window_size(256 << 10)
                .initial_connection_window_size(512 << 10)
                .handshake(io),
        )
        .await
        .map_err(|_| Error::ConnectionTimeout)??;
        hyper::rt::Executor::execute(&tasks, conn);
        Ok(Kept::H2(sender))
    } else {
        let (sender, conn) = timeout_at(
            ends,
            hyper::client::conn::http1::Builder::new()
                .max_headers(128)
                .handshake(io),
        )
        .await
        .map_err(|_| Error::ConnectionTimeout)??;
        hyper::rt::Executor::execute(&tasks, conn);
        Ok(Kept::H1(sender))
    }
}

/// The class of a failed handshake (the text stays with rustls).
fn tls_error(e: std::io::Error) -> Error {
    use tokio_rustls::rustls::Error as Tls;
    match e.get_ref().and_then(|inner| inner.downcast_ref::<Tls>()) {
        Some(Tls::InvalidCertificate(_)) => Error::TlsCertificateError,
        Some(Tls::AlertReceived(_)) => Error::TlsAlertReceived {
            alert_id: None,
            alert_message: None,
        },
        _ => Error::TlsProtocolError,
    }
}

/// Connects to the first address that answers, within the deadline.
async fn connect(addrs: &[SocketAddr], ends: Instant) -> Result<TcpStream, Error> {
    let mut last = Error::DestinationNotFound;
    for addr in addrs {
        match timeout_at(ends, TcpStream::connect(addr)).await {
            Err(_) => return Err(Error::ConnectionTimeout),
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                last = Error::ConnectionRefused
            }
            Ok(Err(_)) => last = Error::DestinationUnavailable,
        }
    }
    Err(last)
}
