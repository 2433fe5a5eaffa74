//! The `http` capability: outbound requests for hosted-service adapters, to
//! the origins the operator listed (`SANDBOX_PLUGIN_HTTP_ORIGINS`) and
//! nowhere else.
//!
//! A request is copied out of the plugin under a budget, checked by
//! `policy` on the plugin's own strings, and only then sent, with the
//! operator's API key added by the host. A request that passed the checks
//! counts as possible dispatch from the moment it may leave: whatever the
//! plugin reports afterwards may follow execution.

pub mod key_exchange;
pub mod metered;
pub mod outgoing;
pub mod policy;
pub mod pool;
pub mod sender;
pub mod watch;

use std::sync::Arc;

use wasmtime::component::Linker;
use wasmtime::{AsContextMut, StoreContextMut};

use super::{CallContext, CallView};
use crate::plugin_host::bindings::http_if;
use crate::plugin_host::lazy;
use policy::HttpAllowance;

/// What one request's method, URL and headers may cost to copy.
const META_BYTES: usize = 64 << 10;
const MAX_HEADERS: usize = 64;

/// The capability as one plugin holds it: where it may go, and the client
/// that takes it there.
pub struct HttpCapability {
    pub allowance: HttpAllowance,
    pub client: reqwest::Client,
    /// TLS for wasi:http requests, which the host sends itself.
    pub tls: Arc<tokio_rustls::rustls::ClientConfig>,
    /// The trade of the operator's key for an access token, if configured.
    pub exchange: Option<key_exchange::KeyExchange>,
    /// Who is shown each request (`plimsoll plugin check`); none in the
    /// daemon.
    pub watch: Option<Arc<dyn watch::Watch>>,
}

impl HttpCapability {
    /// The capability for `allowance`, with the host's client for the
    /// `http` interface and its TLS settings for wasi:http.
    pub fn new(allowance: HttpAllowance) -> Result<HttpCapability, String> {
        let tls = sender::tls_config(&allowance.tls)?;
        // The trade trusts the system's roots and only the CA named for it,
        // never the plugin's extra CAs (whoever holds a gateway's private CA
        // must not be able to pose as the exchange), and presents no client
        // certificate.
        let exchange = match &allowance.exchange {
            None => None,
            Some(e) => {
                let trade_tls = sender::tls_config(&policy::HttpTls {
                    ca: e.ca.clone(),
                    client: None,
                })?;
                Some(key_exchange::KeyExchange::new(
                    e.url.clone(),
                    &e.identifier,
                    &e.secret,
                    trade_tls,
                ))
            }
        };
        Ok(HttpCapability {
            exchange,
            allowance,
            client: crate::outbound::client().map_err(|e| format!("http client: {e}"))?,
            tls,
            watch: None,
        })
    }

    /// Adds the host's traded token to a checked request that needs it.
    pub async fn add_exchanged_key(
        &self,
        headers: &mut reqwest::header::HeaderMap,
        deadline: tokio::time::Instant,
    ) -> Result<(), String> {
        let Some(exchange) = &self.exchange else {
            return Err("no key exchange is configured".into());
        };
        let bearer = exchange.bearer(deadline).await?;
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
        Ok(())
    }

    /// The origins the plugin may reach, as it is told them.
    pub fn origins(&self) -> Vec<String> {
        self.allowance
            .origins
            .iter()
            .map(policy::Origin::display)
            .collect()
    }
}

pub trait HttpView: CallView {
    /// The capability, if the operator granted it.
    fn http(&self) -> Option<Arc<HttpCapability>>;
}

pub fn add_to_linker<T: HttpView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut http = linker.instance("plimsoll:provider/http@0.1.0")?;
    http.func_wrap_async(
        "send",
        |mut store: StoreContextMut<'_, T>, (request,): (lazy::HttpRequest,)| {
            Box::new(async move { Ok((copy_and_send(&mut store, request).await,)) })
        },
    )?;
    http.func_wrap_async(
        "allowed-origins",
        |store: StoreContextMut<'_, T>, (): ()| {
            let origins = store.data().http().map(|h| h.origins()).unwrap_or_default();
            Box::new(async move { Ok((origins,)) })
        },
    )?;
    Ok(())
}

/// A request copied out of the plugin.
pub struct Request {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

async fn copy_and_send<T: HttpView>(
    store: &mut StoreContextMut<'_, T>,
    request: lazy::HttpRequest,
) -> Result<http_if::Response, http_if::HttpError> {
    let copied = copy(store, &request);
    let capability = store.data().http();
    let call = store.data_mut().call();
    match copied {
        Ok(r) => send(call, capability.as_deref(), r).await,
        Err(rule) => Err(refuse(call, rule)),
    }
}

fn copy<T: HttpView>(
    store: &mut StoreContextMut<'_, T>,
    request: &lazy::HttpRequest,
) -> Result<Request, &'static str> {
    let too_large = "the request's method, URL, headers or body are over the host's limits";
    let mut budget = lazy::Budget::new(META_BYTES, MAX_HEADERS);
    let method = budget
        .string(store, &request.method)
        .map_err(|_| too_large)?;
    let url = budget.string(store, &request.url).map_err(|_| too_large)?;
    if request.headers.len() > MAX_HEADERS {
        return Err(too_large);
    }
    let mut headers = Vec::with_capacity(request.headers.len());
    for i in 0..request.headers.len() {
        let Some(Ok((name, value))) = request.headers.get(store.as_context_mut(), i) else {
            return Err(too_large);
        };
        let name = budget.string(store, &name).map_err(|_| too_large)?;
        let value = budget.string(store, &value).map_err(|_| too_large)?;
        headers.push((name, value));
    }
    let body = match &request.body {
        None => None,
        Some(b) => Some(
            lazy::Budget::new(policy::MAX_REQUEST_BODY, 0)
                .bytes(store, b)
                .map_err(|_| too_large)?,
        ),
    };
    Ok(Request {
        method,
        url,
        headers,
        body,
    })
}

/// Checks and sends one copied request. The mark is set once the request
/// passed every check, before it is sent.
pub async fn send(
    call: &mut CallContext,
    capability: Option<&HttpCapability>,
    request: Request,
) -> Result<http_if::Response, http_if::HttpError> {
    let mut checked = policy::check(
        capability.map(|c| &c.allowance),
        &request.method,
        &request.url,
        &request.headers,
        request.body,
    )
    .map_err(|e| {
        let policy::HttpRefusal::Forbidden(rule) = e;
        if let Some(w) = capability.and_then(|c| c.watch.as_ref()) {
            w.refused(rule);
        }
        refuse(call, rule)
    })?;
    let Some(capability) = capability else {
        return Err(refuse(
            call,
            "this plugin was not granted the http capability",
        ));
    };
    // The host's own trade first: a failed one sent nothing to the service.
    if checked.needs_exchanged_key {
        let deadline = tokio::time::Instant::from_std(call.ends);
        if let Err(why) = capability
            .add_exchanged_key(&mut checked.headers, deadline)
            .await
        {
            tracing::warn!(target: "plimsoll::plugin", plugin = &*call.plugin, why, "key exchange failed");
            return Err(http_if::HttpError::Transport(why));
        }
    }
    // From here on the request may reach the service: anything the plugin
    // reports afterwards may follow execution.
    let _sent = call.mark.before_execution();
    if let Some(w) = &capability.watch {
        w.sent(watch::Sent {
            https: request.url.starts_with("https:"),
            method: &request.method,
            header_names: request.headers.iter().map(|(n, _)| n.as_str()).collect(),
        });
    }
    let answer = policy::send(&capability.client, checked).await;
    if let (Some(w), Ok((status, _, _))) = (&capability.watch, &answer) {
        w.answered(*status);
    }
    match answer {
        Ok((status, headers, body)) => Ok(http_if::Response {
            status,
            headers,
            body,
        }),
        Err(policy::SendError::TooLarge) => Err(http_if::HttpError::TooLarge),
        Err(policy::SendError::Transport(why)) => Err(http_if::HttpError::Transport(why)),
    }
}

/// A refusal: the rule goes to the operator's log and back to the plugin;
/// what the plugin sent (URL, headers) goes nowhere.
fn refuse(call: &CallContext, rule: &str) -> http_if::HttpError {
    tracing::warn!(target: "plimsoll::plugin", plugin = &*call.plugin, rule, "http request refused");
    http_if::HttpError::Forbidden(rule.to_string())
}

#[cfg(test)]
mod tests;
