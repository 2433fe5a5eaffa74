//! `wasi:http/outgoing-handler` for plugins, policed by the host: the
//! standard interface plugin authors' HTTP crates target, with the same
//! rules as the `http` interface, from the same `policy`.
//!
//! wasmtime-wasi-http builds the request from the plugin's resources and
//! hands it to these hooks inside the plugin's `handle` call, before
//! anything is sent. Here, in that synchronous step, the request is checked
//! (the allowlist on the scheme, host and port it will be sent to, the
//! method, every header) and given the operator's key; it takes one of the
//! call's in-flight slots; and the call is marked as possibly dispatched.
//! Only then is the send started, as a task wasmtime aborts when the plugin
//! drops the request or the call ends. A refused request gets
//! `http-request-denied` and the rule goes to the operator's log; the URL
//! and headers go nowhere (a plugin could hide a snippet in either).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

use super::HttpCapability;
use super::metered::{Budget, Direction, Flags, Metered};
use super::policy;
use super::pool::CallConnections;
use super::sender;
use crate::plugin_host::dispatch_mark::Elsewhere;

/// Largest write the plugin may hand the host at once into a request body;
/// with wasi:http's one buffered chunk, what a request body can hold in the
/// host before the connection takes it.
const BODY_CHUNK: usize = 64 << 10;
/// Bytes the host keeps for one fields resource (headers or trailers): what
/// HTTP/2 allows a header list by default. The call's resource cap bounds
/// how many a plugin can hold.
pub const FIELDS_LIMIT: usize = 16 << 10;

type SendFuture = Box<
    dyn std::future::Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn std::future::Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

/// One call's wasi:http state: what it may reach and what it has left.
pub struct OutgoingHooks {
    capability: Option<Arc<HttpCapability>>,
    plugin: Arc<str>,
    ends: Instant,
    mark: Elsewhere,
    in_flight: Arc<Semaphore>,
    /// Requests the call has sent (at most `MAX_CALL_REQUESTS`).
    sent: u32,
    out: Budget,
    back: Budget,
    /// Set when the call ends; see `Flags::call_closed`.
    closed: Arc<std::sync::atomic::AtomicBool>,
    /// Tasks the sender spawned for the call's connections (HTTP/2 drives
    /// each connection from a task of its own), ended with the call.
    tasks: sender::CallTasks,
    /// Connections kept for the call's later requests to the same origin.
    pool: CallConnections<Metered<WasiBody>>,
}

impl OutgoingHooks {
    pub fn new(
        capability: Option<Arc<HttpCapability>>,
        plugin: Arc<str>,
        ends: Instant,
        mark: Elsewhere,
    ) -> OutgoingHooks {
        OutgoingHooks {
            capability,
            plugin,
            ends,
            mark,
            in_flight: Arc::new(Semaphore::new(policy::MAX_CALL_REQUESTS_IN_FLIGHT)),
            sent: 0,
            out: Budget::new(policy::MAX_CALL_BYTES_OUT),
            back: Budget::new(policy::MAX_CALL_BYTES_IN),
            closed: Default::default(),
            tasks: sender::CallTasks::default(),
            pool: CallConnections::default(),
        }
    }

    /// The call is over: no request body it left unfinished is sent as
    /// finished, and every connection task it started is stopped. Called
    /// before the store's resources are dropped.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.tasks.abort_all();
        self.pool.close();
    }

    fn refuse(&self, rule: &str, why: Error) -> SendFuture {
        tracing::warn!(target: "plimsoll::plugin", plugin = &*self.plugin, rule, "http request refused");
        if let Some(w) = self.capability.as_ref().and_then(|c| c.watch.as_ref()) {
            w.refused(rule);
        }
        Box::new(async move { Err(why) })
    }
}

impl WasiHttpHooks for OutgoingHooks {
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        // Refused where the plugin builds its headers and trailers, not
        // only when it sends them: reserved names never reach a request.
        // `te` is let through to the send, where only `te: trailers` (what
        // gRPC needs) passes the policy; a trailer never carries it.
        let capability = self.capability.clone();
        Arc::new(move |name| {
            DEFAULT_FORBIDDEN_HEADERS.contains(name)
                || (name != http::header::TE
                    && capability
                        .as_ref()
                        .is_none_or(|c| policy::is_reserved(&c.allowance, name)))
        })
    }

    fn is_supported_scheme(&mut self, scheme: &http::uri::Scheme) -> bool {
        *scheme == http::uri::Scheme::HTTPS || *scheme == http::uri::Scheme::HTTP
    }

    /// The sender writes the target itself, from the checked URL.
    fn set_host_header(&mut self) -> bool {
        false
    }

    /// A request must say where it goes; nothing is guessed for it.
    fn default_scheme(&mut self) -> Option<http::uri::Scheme> {
        None
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        BODY_CHUNK
    }

    // Long on purpose: every check a plugin's request meets before a byte
    // leaves the host, in the order they are made, in one place.
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = Result<(), Error>> + Send>,
    ) -> SendFuture {
        let Some(capability) = self.capability.clone() else {
            return self.refuse(
                "this plugin was not granted the http capability",
                Error::HttpRequestDenied,
            );
        };
        let (parts, body) = request.into_parts();
        let mut headers = Vec::with_capacity(parts.headers.len());
        let mut head_bytes = 0u64;
        for (name, value) in &parts.headers {
            let Ok(value) = value.to_str() else {
                return self.refuse("a header value is not valid", Error::HttpRequestDenied);
            };
            head_bytes += (name.as_str().len() + value.len()) as u64;
            headers.push((name.as_str().to_string(), value.to_string()));
        }
        // The URL as hyper will send it: scheme, authority and path from
        // the one URI the request carries.
        let url = parts.uri.to_string();
        let checked = match policy::check(
            Some(&capability.allowance),
            parts.method.as_str(),
            &url,
            &headers,
            None,
        ) {
            Ok(c) => c,
            Err(policy::HttpRefusal::Forbidden(rule)) => {
                return self.refuse(rule, Error::HttpRequestDenied);
            }
        };
        let Ok(uri) = checked.url.as_str().parse::<http::Uri>() else {
            return self.refuse("the URL does not parse", Error::HttpRequestUriInvalid);
        };
        if self.sent >= policy::MAX_CALL_REQUESTS {
            return self.refuse(
                "too many requests for one call",
                Error::ConnectionLimitReached,
            );
        }
        // The URL and headers count against what the call may send, as its
        // bodies do.
        if !self.out.take(url.len() as u64 + head_bytes) {
            return self.refuse(
                "the call's outgoing byte budget is spent",
                Error::HttpRequestHeaderSectionSize(None),
            );
        }
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            return self.refuse(
                "too many requests in flight for one call",
                Error::ConnectionLimitReached,
            );
        };
        // From here the request may reach the service.
        self.mark.before_execution();
        self.sent += 1;
        if let Some(w) = &capability.watch {
            w.sent(super::watch::Sent {
                https: parts.uri.scheme_str() == Some("https"),
                method: parts.method.as_str(),
                header_names: headers.iter().map(|(n, _)| n.as_str()).collect(),
            });
        }

        // A request holds its slot while its body is still being sent (it
        // may be, after the answer came) and while its answer streams. Its
        // connection may outlive it, kept for the call's next request; it
        // runs on the call's tasks and ends with the call.
        let permit = Arc::new(permit);
        let ends = tokio::time::Instant::from_std(self.ends);
        let flags = Flags {
            overflowed: Default::default(),
            call_closed: self.closed.clone(),
        };
        let back = self.back.clone();
        let mut req = http::Request::new(Metered::new(
            body,
            Direction::Out,
            self.out.clone(),
            flags.clone(),
            ends,
            capability.clone(),
            Some(permit.clone()),
        ));
        *req.method_mut() = checked.method;
        *req.headers_mut() = checked.headers;
        *req.uri_mut() = uri;
        let url = checked.url;
        let needs_exchanged_key = checked.needs_exchanged_key;
        let tasks = self.tasks.clone();
        let pool = self.pool.clone();
        let plugin = self.plugin.clone();
        Box::new(async move {
            // The traded token may need a trade first; the request waits for
            // it under the call's deadline.
            if needs_exchanged_key
                && let Err(why) = capability.add_exchanged_key(req.headers_mut(), ends).await
            {
                tracing::warn!(target: "plimsoll::plugin", plugin = &*plugin, why, "key exchange failed");
                return Err(Error::InternalError(Some(why)));
            }
            let tls = capability.tls.clone();
            let sent = sender::send(tls, &url, req, ends, tasks, pool).await;
            let (head, conn) = match sent {
                Ok(s) => s,
                // hyper reports a request body that failed as a protocol
                // error; say which budget ran out instead.
                Err(_) if flags.overflowed.load(Ordering::SeqCst) => {
                    return Err(Error::HttpRequestBodySize(Some(policy::MAX_CALL_BYTES_OUT)));
                }
                Err(e) => return Err(e),
            };
            if let Some(w) = &capability.watch {
                w.answered(head.status().as_u16());
            }
            let answer = head.map(|incoming| {
                Metered::new(
                    incoming,
                    Direction::In,
                    back,
                    flags,
                    ends,
                    capability,
                    Some(permit),
                )
                .boxed_unsync()
            });
            // The connection's own errors reach the plugin through the
            // answer's body; the result here would only reach wasmtime's log.
            let conn = async move {
                let _ = conn.await;
                Ok(())
            };
            Ok((
                answer,
                Box::new(conn) as Box<dyn std::future::Future<Output = _> + Send>,
            ))
        })
    }
}

#[cfg(test)]
#[path = "outgoing_tests.rs"]
mod tests;
