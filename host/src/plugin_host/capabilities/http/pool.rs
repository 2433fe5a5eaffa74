//! Connections one call keeps for its later requests to the same origin.
//!
//! A hosted-service adapter makes a handful of requests per run to one or
//! two origins (create, upload, start, delete); a TLS handshake for each is
//! most of what the host adds to a run. So a call keeps what it opened: an
//! HTTP/2 connection carries the call's later requests as streams, an
//! HTTP/1.1 connection is reused once its previous answer was read to the
//! end. Nothing is shared between calls: the pool lives in the call's
//! state, its connections run on the call's tasks, and both end with the
//! call. Every request is still checked by the policy on its own; a kept
//! connection only saves the connect and the handshake to an origin the
//! policy already allowed for this call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hyper::client::conn::{http1, http2};

/// Idle connections kept per origin: the call's in-flight limit bounds how
/// many could be busy at once anyway.
const PER_ORIGIN: usize = 4;

pub enum Kept<B> {
    H1(http1::SendRequest<B>),
    H2(http2::SendRequest<B>),
}

impl<B> Kept<B> {
    fn is_closed(&self) -> bool {
        match self {
            Kept::H1(s) => s.is_closed(),
            Kept::H2(s) => s.is_closed(),
        }
    }
}

/// The call's kept connections, by origin (`scheme://host:port`).
pub struct CallConnections<B>(Arc<Mutex<Pool<B>>>);

struct Pool<B> {
    /// The call ended: nothing is kept any more.
    closed: bool,
    by_origin: HashMap<String, Vec<Kept<B>>>,
}

impl<B> Clone for CallConnections<B> {
    fn clone(&self) -> Self {
        CallConnections(self.0.clone())
    }
}

impl<B> Default for CallConnections<B> {
    fn default() -> Self {
        CallConnections(Arc::new(Mutex::new(Pool {
            closed: false,
            by_origin: HashMap::new(),
        })))
    }
}

impl<B> CallConnections<B> {
    /// A connection to `origin` that can take a request now, if one is
    /// kept. An HTTP/2 connection stays kept (it carries many streams); an
    /// HTTP/1.1 one is handed out, and comes back through `keep` once its
    /// answer's head arrived.
    pub fn take(&self, origin: &str) -> Option<Kept<B>> {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let list = pool.by_origin.get_mut(origin)?;
        list.retain(|k| !k.is_closed());
        for k in list.iter() {
            if let Kept::H2(s) = k
                && s.is_ready()
            {
                return Some(Kept::H2(s.clone()));
            }
        }
        let i = list
            .iter()
            .position(|k| matches!(k, Kept::H1(s) if s.is_ready()))?;
        Some(list.swap_remove(i))
    }

    /// Keeps a connection to `origin` for later requests of the call
    /// (dropped instead once the call has ended).
    pub fn keep(&self, origin: String, kept: Kept<B>) {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pool.closed {
            return;
        }
        let list = pool.by_origin.entry(origin).or_default();
        list.retain(|k| !k.is_closed());
        if list.len() < PER_ORIGIN {
            list.push(kept);
        }
    }

    /// The call ended: drops every kept connection (their tasks are
    /// aborted with the call's; this lets the handles go too) and keeps
    /// nothing from now on.
    pub fn close(&self) {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pool.closed = true;
        pool.by_origin.clear();
    }
}
