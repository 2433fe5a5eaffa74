//! The `http` capability's policy: which requests a plugin may send, and
//! what the host adds to them.
//!
//! The order of checks is the point. The allowlist is checked on the URL
//! exactly as the plugin gave it, before anything parses it into another form,
//! resolves it, or adds to it (a proxy rewriting the target after the check is
//! the classic way such an allowlist fails). Only then does the host build the
//! request itself: no redirects are followed, no proxy settings are read from
//! the environment, TLS is verified, size and time are bounded, and the
//! provider's API key is added by the host, so the plugin never holds it.

use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// One allowed origin: scheme, host and port, compared exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// Parses an operator-written origin such as `https://api.e2b.dev` or
    /// `http://127.0.0.1:8080`. Plain http is accepted only for a loopback
    /// address, where there is no network to protect.
    pub fn parse(s: &str) -> Result<Origin, String> {
        let url = Url::parse(s).map_err(|_| format!("{s:?} is not a URL"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("{s:?} carries credentials; origins may not"));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{s:?} is not a bare origin (scheme://host[:port])"));
        }
        let host = url
            .host_str()
            .ok_or_else(|| format!("{s:?} has no host"))?
            .to_ascii_lowercase();
        match url.scheme() {
            "https" => {}
            "http" if is_loopback(&url) => {}
            _ => {
                return Err(format!(
                    "{s:?}: only https origins, or http on a loopback address"
                ));
            }
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("{s:?} has no port"))?;
        Ok(Origin {
            scheme: url.scheme().to_string(),
            host,
            port,
        })
    }

    pub fn is_https(&self) -> bool {
        self.scheme == "https"
    }

    /// `scheme://host:port`, as a plugin is told it.
    pub fn display(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.host, self.port)
    }

    /// Whether `url` is at this origin.
    pub fn matches_url(&self, url: &Url) -> bool {
        self.matches(url)
    }

    fn matches(&self, url: &Url) -> bool {
        url.scheme() == self.scheme
            && url
                .host_str()
                .is_some_and(|h| h.eq_ignore_ascii_case(&self.host))
            && url.port_or_known_default() == Some(self.port)
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        _ => false,
    }
}

/// What the operator allowed one plugin: where it may go, and the key the
/// host adds.
#[derive(Debug, Clone)]
pub struct HttpAllowance {
    pub origins: Vec<Origin>,
    /// Header the host adds to every request, carrying the provider's key.
    pub api_key: Option<(HeaderName, HeaderValue)>,
    /// The origins the key goes to; empty means every origin listed. A
    /// service whose data plane runs the guest's code (E2B's sandbox edge
    /// forwards each request into the sandbox) must not receive the key.
    pub key_origins: Vec<Origin>,
    /// TLS the host uses for the plugin's wasi:http requests.
    pub tls: HttpTls,
    /// Where the key is traded for the access token the host sends in its
    /// place (`key_exchange`); with it, `api_key` is unset.
    pub exchange: Option<ExchangeSettings>,
}

/// The operator's key exchange: the key itself goes only to `url`.
#[derive(Clone)]
pub struct ExchangeSettings {
    pub url: Url,
    pub identifier: String,
    pub secret: String,
    /// An extra CA for the exchange URL alone (a test's private CA).
    pub ca: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for ExchangeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeSettings")
            .field("url", &self.url.as_str())
            .field("identifier", &self.identifier)
            .finish_non_exhaustive()
    }
}

impl HttpAllowance {
    /// Whether the host puts a credential of its own on requests to
    /// `origin`'s URL: a key is configured (as is, or traded) and the
    /// origin is one of those named for it (all, when none are named).
    fn key_goes_to(&self, url: &Url) -> bool {
        (self.api_key.is_some() || self.exchange.is_some())
            && (self.key_origins.is_empty() || self.key_origins.iter().any(|o| o.matches(url)))
    }

    /// Whether the operator named the key's origins, so the others get no
    /// credential from the host: there `Authorization` is the plugin's own
    /// (a token the service minted for the sandbox the plugin made), since
    /// nothing of the operator's can be carried in it. Without that
    /// explicit split (no key at all included) it stays the host's.
    fn plugin_may_authorize_somewhere(&self) -> bool {
        (self.api_key.is_some() || self.exchange.is_some()) && !self.key_origins.is_empty()
    }
}

/// Files the operator named for the plugin's TLS: extra trusted CAs (an
/// origin with a private CA) and a client certificate for mutual TLS, which
/// the host presents and the plugin never holds.
#[derive(Debug, Clone, Default)]
pub struct HttpTls {
    pub ca: Option<std::path::PathBuf>,
    /// Certificate chain and key, PEM.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// Headers a plugin may never set: the host owns framing, the target, and
/// every kind of credential (`authorization` apart, see `check`).
const RESERVED: &[&str] = &[
    "host",
    "proxy-authorization",
    "cookie",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "x-api-key",
    // Headers a proxy in front of an allowed origin may use to pick another
    // backend or method: with the host's key attached, that would carry the
    // key somewhere the operator never listed.
    "forwarded",
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "x-method-override",
    "x-real-ip",
];

/// Whether the host reserves `name`: framing, the target, every kind of
/// credential, and the header that carries the operator's key.
pub fn is_reserved(grant: &HttpAllowance, name: &HeaderName) -> bool {
    (name == reqwest::header::AUTHORIZATION && !grant.plugin_may_authorize_somewhere())
        || RESERVED.contains(&name.as_str())
        || name.as_str().starts_with("proxy-")
        || name.as_str().starts_with("x-forwarded-")
        || grant.api_key.as_ref().is_some_and(|(k, _)| k == name)
}

pub const MAX_REQUEST_BODY: usize = 8 << 20;
pub const MAX_RESPONSE_BODY: usize = 8 << 20;

/// wasi:http streams, so its budgets are per call rather than per message:
/// bytes each way summed over every request of the call, and requests in
/// flight at once. A hosted service's process output streams for as long as
/// the process runs; 64 MiB is far past what an adapter keeps (64 KiB per
/// stream) and still bounds what one call can make the host move.
pub const MAX_CALL_BYTES_OUT: u64 = 64 << 20;
pub const MAX_CALL_BYTES_IN: u64 = 64 << 20;
pub const MAX_CALL_REQUESTS_IN_FLIGHT: usize = 8;
/// Requests one call may send in all: each costs a connection.
pub const MAX_CALL_REQUESTS: u32 = 1024;

/// A refusal, with the rule that was broken (never the URL or headers: a
/// plugin could put a snippet in either).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpRefusal {
    #[error("{0}")]
    Forbidden(&'static str),
}

/// A request that passed every check, ready to send.
pub struct Checked {
    pub method: reqwest::Method,
    pub url: Url,
    pub headers: HeaderMap,
    pub body: Option<Vec<u8>>,
    /// The host's traded token still has to be added (it may need a trade,
    /// which `check` cannot wait for).
    pub needs_exchanged_key: bool,
}

/// Every check, in order, before anything is sent.
pub fn check(
    grant: Option<&HttpAllowance>,
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: Option<Vec<u8>>,
) -> Result<Checked, HttpRefusal> {
    let Some(grant) = grant else {
        return Err(HttpRefusal::Forbidden(
            "this plugin was not granted the http capability",
        ));
    };
    // The allowlist first, on the plugin's own string: parse it once, refuse
    // anything a second parser could read differently.
    if url.bytes().any(|b| b <= b' ' || b == b'\\' || b >= 0x7f) {
        return Err(HttpRefusal::Forbidden(
            "the URL contains whitespace, control, backslash or non-ASCII bytes",
        ));
    }
    let parsed = Url::parse(url).map_err(|_| HttpRefusal::Forbidden("the URL does not parse"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(HttpRefusal::Forbidden("URLs may not carry credentials"));
    }
    if !grant.origins.iter().any(|o| o.matches(&parsed)) {
        return Err(HttpRefusal::Forbidden(
            "the URL's origin is not on this plugin's allowlist",
        ));
    }
    let method = match method.to_ascii_uppercase().as_str() {
        "GET" => reqwest::Method::GET,
        "HEAD" => reqwest::Method::HEAD,
        "POST" => reqwest::Method::POST,
        "PUT" => reqwest::Method::PUT,
        "PATCH" => reqwest::Method::PATCH,
        "DELETE" => reqwest::Method::DELETE,
        _ => {
            return Err(HttpRefusal::Forbidden(
                "the method must be GET, HEAD, POST, PUT, PATCH or DELETE",
            ));
        }
    };
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| HttpRefusal::Forbidden("a header name is not valid"))?;
        // `Authorization` is refused where the host's own credential goes:
        // the plugin may neither replace nor add to it.
        let hosts_credential = name == reqwest::header::AUTHORIZATION && grant.key_goes_to(&parsed);
        // `te: trailers`, and only that, is what gRPC requires of a client
        // (HTTP/2 allows `te` no other value); it names no target and no
        // credential.
        let te_trailers = name == reqwest::header::TE && value.eq_ignore_ascii_case("trailers");
        if !te_trailers && (hosts_credential || is_reserved(grant, &name)) {
            return Err(HttpRefusal::Forbidden(
                "the plugin set a header the host reserves (framing, target or credentials)",
            ));
        }
        let value = HeaderValue::from_str(value)
            .map_err(|_| HttpRefusal::Forbidden("a header value is not valid"))?;
        map.append(name, value);
    }
    if body.as_ref().is_some_and(|b| b.len() > MAX_REQUEST_BODY) {
        return Err(HttpRefusal::Forbidden("the request body exceeds 8 MiB"));
    }
    let gets_key = grant.key_goes_to(&parsed);
    if let Some((k, v)) = &grant.api_key
        && gets_key
    {
        map.insert(k.clone(), v.clone());
    }
    Ok(Checked {
        method,
        needs_exchanged_key: gets_key && grant.exchange.is_some(),
        url: parsed,
        headers: map,
        body,
    })
}

/// Sends a checked request and reads at most MAX_RESPONSE_BODY of the answer.
pub async fn send(
    client: &reqwest::Client,
    req: Checked,
) -> Result<(u16, Vec<(String, String)>, Vec<u8>), SendError> {
    let mut builder = client.request(req.method, req.url).headers(req.headers);
    if let Some(body) = req.body {
        builder = builder.body(body);
    }
    let mut resp = builder
        .send()
        .await
        .map_err(|e| SendError::Transport(describe(&e)))?;
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BODY as u64)
    {
        return Err(SendError::TooLarge);
    }
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| SendError::Transport(describe(&e)))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE_BODY {
            return Err(SendError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok((status, headers, body))
}

#[derive(Debug)]
pub enum SendError {
    Transport(String),
    TooLarge,
}

/// The class of a transport failure, without the URL reqwest would include.
fn describe(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_redirect() {
        "redirect refused"
    } else if e.is_body() || e.is_decode() {
        "the response body failed"
    } else {
        "request failed"
    };
    what.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> HttpAllowance {
        HttpAllowance {
            origins: vec![
                Origin::parse("https://api.example.com").expect("origin"),
                Origin::parse("http://127.0.0.1:8080").expect("origin"),
            ],
            key_origins: vec![],
            api_key: Some((
                HeaderName::from_static("x-provider-key"),
                HeaderValue::from_static("k"),
            )),
            tls: HttpTls::default(),
            exchange: None,
        }
    }

    #[test]
    fn origins_parse_strictly() {
        for bad in [
            "http://api.example.com",
            "https://user:pw@api.example.com",
            // Either half of the credentials alone is refused too.
            "https://user@api.example.com",
            "https://:pw@api.example.com",
            "https://api.example.com/path",
            "https://api.example.com?q",
            "ftp://api.example.com",
            "http://localhost:8080",
            "not a url",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
        assert!(Origin::parse("http://[::1]:9").is_ok());
        // What the plugin is told: scheme, lowercased host and the port,
        // default ports written out.
        let told = |s: &str| Origin::parse(s).expect(s).display();
        assert_eq!(
            told("https://API.Example.com"),
            "https://api.example.com:443"
        );
        assert_eq!(told("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
    }

    #[test]
    fn each_named_method_is_sent_as_itself_and_the_body_cap_is_exact() {
        let g = grant();
        let url = "https://api.example.com/v1/run";
        for (asked, sent) in [
            ("get", reqwest::Method::GET),
            ("HEAD", reqwest::Method::HEAD),
            ("post", reqwest::Method::POST),
            ("Put", reqwest::Method::PUT),
            ("patch", reqwest::Method::PATCH),
            ("DELETE", reqwest::Method::DELETE),
        ] {
            let ok = check(Some(&g), asked, url, &[], None).expect(asked);
            assert_eq!(ok.method, sent);
        }
        assert!(check(Some(&g), "OPTIONS", url, &[], None).is_err());
        // 8 MiB exactly is allowed; a byte more is not.
        assert!(check(Some(&g), "post", url, &[], Some(vec![0; 8 << 20])).is_ok());
        assert!(check(Some(&g), "post", url, &[], Some(vec![0; (8 << 20) + 1])).is_err());
    }

    #[test]
    fn the_key_goes_only_to_the_origins_named_for_it() {
        let mut g = grant();
        g.key_origins = vec![Origin::parse("https://api.example.com").expect("origin")];
        let to_api = check(Some(&g), "GET", "https://api.example.com/x", &[], None).expect("api");
        assert!(to_api.headers.contains_key("x-provider-key"));
        let to_other = check(Some(&g), "GET", "http://127.0.0.1:8080/x", &[], None).expect("other");
        assert!(!to_other.headers.contains_key("x-provider-key"));
        // Still reserved there: the plugin cannot send a key of its own.
        let own = [("x-provider-key".to_string(), "mine".to_string())];
        assert!(check(Some(&g), "GET", "http://127.0.0.1:8080/x", &own, None).is_err());
        // Unnamed, it goes to every origin listed.
        g.key_origins.clear();
        let to_other = check(Some(&g), "GET", "http://127.0.0.1:8080/x", &[], None).expect("other");
        assert!(to_other.headers.contains_key("x-provider-key"));
    }

    #[test]
    fn only_listed_origins_pass_and_the_key_is_added() {
        let g = grant();
        let ok = check(
            Some(&g),
            "post",
            "https://api.example.com/v1/run",
            &[],
            None,
        )
        .expect("allowed");
        assert_eq!(
            ok.headers.get("x-provider-key").map(|v| v.as_bytes()),
            Some(&b"k"[..])
        );
        assert!(check(Some(&g), "GET", "https://API.example.com:443/x", &[], None).is_ok());
        assert!(check(Some(&g), "GET", "http://127.0.0.1:8080/x", &[], None).is_ok());
        for url in [
            "https://api.example.com.evil.net/",
            "https://evil.net/?https://api.example.com",
            "https://api.example.com:8443/",
            "http://api.example.com/",
            "https://user@api.example.com/",
            "https://evil.net\\@api.example.com/",
            "https://api.example.com\t/",
            "http://127.0.0.1:8081/",
            "http://localhost:8080/",
            "http://[::1]:8080/",
            "file:///etc/passwd",
        ] {
            assert!(check(Some(&g), "GET", url, &[], None).is_err(), "{url}");
        }
        assert!(check(None, "GET", "https://api.example.com/", &[], None).is_err());
    }

    #[test]
    fn reserved_headers_and_methods_are_refused() {
        let g = grant();
        for h in [
            "Authorization",
            "Host",
            "Cookie",
            "Proxy-Authorization",
            "Proxy-Foo",
            "X-Provider-Key",
            "Transfer-Encoding",
        ] {
            let headers = vec![(h.to_string(), "x".to_string())];
            assert!(
                check(Some(&g), "GET", "https://api.example.com/", &headers, None).is_err(),
                "{h}"
            );
        }
        // `te` only as gRPC needs it.
        let te = |v: &str| vec![("te".to_string(), v.to_string())];
        assert!(
            check(
                Some(&g),
                "POST",
                "https://api.example.com/",
                &te("trailers"),
                None
            )
            .is_ok()
        );
        assert!(
            check(
                Some(&g),
                "POST",
                "https://api.example.com/",
                &te("gzip"),
                None
            )
            .is_err()
        );
        assert!(check(Some(&g), "CONNECT", "https://api.example.com/", &[], None).is_err());
        assert!(check(Some(&g), "TRACE", "https://api.example.com/", &[], None).is_err());
        let big = vec![0u8; MAX_REQUEST_BODY + 1];
        assert!(check(Some(&g), "POST", "https://api.example.com/", &[], Some(big)).is_err());
    }

    #[test]
    fn authorization_is_the_plugins_own_only_where_no_key_of_the_hosts_goes() {
        let own = [("authorization".to_string(), "Bearer minted".to_string())];
        let mut g = grant();
        // A key for every origin: Authorization is the host's everywhere.
        assert!(check(Some(&g), "GET", "http://127.0.0.1:8080/x", &own, None).is_err());
        assert!(is_reserved(&g, &reqwest::header::AUTHORIZATION));
        // The key named for the API only: the other origin takes the
        // plugin's own token, the API still refuses it.
        g.key_origins = vec![Origin::parse("https://api.example.com").expect("origin")];
        assert!(!is_reserved(&g, &reqwest::header::AUTHORIZATION));
        let to_other = check(Some(&g), "GET", "http://127.0.0.1:8080/x", &own, None).expect("own");
        assert_eq!(to_other.headers["authorization"], "Bearer minted");
        assert!(check(Some(&g), "GET", "https://api.example.com/x", &own, None).is_err());
        // A traded key counts as the host's credential in the same way.
        g.api_key = None;
        g.exchange = Some(ExchangeSettings {
            url: Url::parse("https://hub.example.com/token").expect("url"),
            identifier: "me".into(),
            secret: "pat".into(),
            ca: None,
        });
        let to_api = check(Some(&g), "GET", "https://api.example.com/x", &[], None).expect("api");
        assert!(to_api.needs_exchanged_key);
        assert!(check(Some(&g), "GET", "https://api.example.com/x", &own, None).is_err());
        let to_other = check(Some(&g), "GET", "http://127.0.0.1:8080/x", &[], None).expect("other");
        assert!(!to_other.needs_exchanged_key);
        g.key_origins.clear();
        assert!(is_reserved(&g, &reqwest::header::AUTHORIZATION));
        // No key at all: still the host's, on every origin.
        g.exchange = None;
        assert!(is_reserved(&g, &reqwest::header::AUTHORIZATION));
        assert!(check(Some(&g), "GET", "http://127.0.0.1:8080/x", &own, None).is_err());
        g.exchange = Some(ExchangeSettings {
            url: Url::parse("https://hub.example.com/token").expect("url"),
            identifier: "me".into(),
            secret: "pat".into(),
            ca: None,
        });
        // The secret never prints.
        assert!(!format!("{g:?}").contains("pat\""));
    }
}
