//! The API's side of sessions across replicas (`crate::replicas`): taking
//! a call another replica forwarded, forwarding a call for a session this
//! replica does not hold, and forwarding an open for an owner whose
//! sessions another replica holds.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::session_error::error_response;
use crate::callers::{Caller, Verifier};
use crate::job::Ended;
use crate::pipeline::Daemon;
use crate::pipeline::session::{SessionError, ended_refusal};
use crate::quota::{SessionPlace, Shed};
use crate::refusal::Reason;
use crate::refusal::Refusal;
use crate::replicas::owners::Home;
use crate::replicas::{
    FORWARDED_AT, FORWARDED_BODY, FORWARDED_FOR, FORWARDED_NONCE, FORWARDED_TAG, FirstSight,
    Forwarded, Holder,
};
use crate::wire::SessionEnd;

/// The procedures a replica forwards: calls on an open session, an open
/// for an owner whose sessions another replica holds, and MCP's session
/// tools (internal procedures, taken only when forwarded).
const FORWARDABLE: [&str; 6] = [
    "SessionRun",
    "CloseSession",
    "OpenSession",
    "McpSessionRun",
    "McpRunCell",
    "McpCloseSession",
];

/// A forwarded call's claims, unchecked.
pub struct Forward {
    caller: String,
    at: String,
    nonce: String,
    body_sha256: String,
    tag: String,
}

/// The forwarding headers, if the request has any of them (all of them
/// are then required).
pub fn forwarded(headers: &HeaderMap) -> Option<Forward> {
    let get = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let any = [
        FORWARDED_FOR,
        FORWARDED_AT,
        FORWARDED_NONCE,
        FORWARDED_BODY,
        FORWARDED_TAG,
    ]
    .iter()
    .any(|n| headers.contains_key(*n));
    any.then(|| Forward {
        caller: get(FORWARDED_FOR).unwrap_or_default(),
        at: get(FORWARDED_AT).unwrap_or_default(),
        nonce: get(FORWARDED_NONCE).unwrap_or_default(),
        body_sha256: get(FORWARDED_BODY).unwrap_or_default(),
        tag: get(FORWARDED_TAG).unwrap_or_default(),
    })
}

/// The caller a forwarded call names, if this replica forwards sessions at
/// all, the procedure is one that is forwarded, the headers carry a peer's
/// signature for this replica (fresh, never seen by this process), and the
/// caller exists and may run code. All of it before a body slot is taken
/// or a byte of the body read, so without the secret nobody can spend a
/// caller's slots or learn which callers exist (every failure is the same
/// 401). A call taken here then goes through `first_sight`.
pub fn caller(
    daemon: &Daemon,
    verifier: &Verifier,
    procedure: &str,
    f: &Forward,
) -> Option<Arc<Caller>> {
    let replicas = daemon.replicas()?;
    if !FORWARDABLE.contains(&procedure)
        || !replicas.accept(
            procedure,
            &f.caller,
            &f.at,
            &f.nonce,
            &f.body_sha256,
            &f.tag,
        )
    {
        return None;
    }
    verifier.caller(&f.caller).filter(|c| c.may_run())
}

/// What the shared store says of a forwarded call that `caller` took.
pub enum Sight {
    /// Its first: go on.
    First,
    /// Taken before, by this process or one before it at this replica's
    /// address (a call captured on its way and replayed after a restart):
    /// answered as every other failed forward is, 401.
    Replayed,
    /// The store did not answer: refused, marked `capacity` (nothing ran),
    /// as any call the store cannot vouch for is. Boxed: a response is
    /// large, and this is the rare path.
    Refused(Box<Response>),
}

/// Records a forwarded call's nonce in the shared store, once, so the call
/// is taken once even across this replica's restarts. Only for a call
/// `caller` accepted (its signature is what lets it write to the store),
/// and before a body slot is taken.
pub async fn first_sight(daemon: &Daemon, f: &Forward) -> Sight {
    // Without replicas `caller` takes no forwarded call at all.
    let Some(replicas) = daemon.replicas() else {
        return Sight::Replayed;
    };
    match replicas.first_sight(&f.nonce).await {
        FirstSight::Yes => Sight::First,
        FirstSight::Replayed => {
            // Nothing of the call is logged: the nonce and the tag are
            // bearer material for its window.
            tracing::warn!(
                "a forwarded call this replica had already taken was presented again; refused"
            );
            Sight::Replayed
        }
        FirstSight::Unknown => Sight::Refused(Box::new(store_unavailable(daemon))),
    }
}

/// Whether the body read is the one the signature covers.
pub fn body_matches(f: &Forward, body: &[u8]) -> bool {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(body)) == f.body_sha256
}

/// Forwards a session call to the replica holding the session, if another
/// one does; None means answer it here.
pub async fn elsewhere(
    daemon: &Daemon,
    procedure: &str,
    session_id: &str,
    caller: &Caller,
    relay: Option<Bytes>,
) -> Option<Response> {
    let body = relay?;
    let replicas = daemon.replicas()?;
    if daemon.holds_session(session_id, &caller.id) {
        return None;
    }
    let fingerprint = crate::sessions::fingerprint(session_id);
    let holder = match replicas.holder(&fingerprint).await {
        Holder::Elsewhere(url) => url,
        Holder::NoneElsewhere => return None,
        Holder::Unknown => return Some(store_unavailable(daemon)),
    };
    let forwarded = replicas.forward(&holder, procedure, &caller.id, body).await;
    Some(match forwarded {
        Forwarded::Gone => {
            // Nothing was sent: nothing ran. The session went with its
            // replica; its caller's place in the store expires with the
            // replica's leases.
            replicas.forget(&fingerprint).await;
            error_response(ended_refusal(
                Ended {
                    reason: SessionEnd::Shutdown,
                    detail: "the replica holding this session is gone".into(),
                },
                Reason::Environment,
            ))
        }
        other => answer_of(other, "this session"),
    })
}

/// Where an open for an owner goes, with replicas and a per-owner cap:
/// here (`Ok`, with the new session's place among the owner's), or to the
/// replica holding the owner's other sessions, whose answer is returned
/// (`Err`). An open forwarded here (`relay` None) is never forwarded again.
pub async fn owner_home(
    daemon: &Daemon,
    owner: &str,
    caller: &Caller,
    relay: Option<Bytes>,
) -> Result<Option<SessionPlace>, Response> {
    let Some(replicas) = daemon.replicas() else {
        return Ok(None);
    };
    let s = daemon.session_settings();
    // An invalid owner is refused by the open itself, with its reason.
    if !s.enabled() || s.max_per_owner == 0 || !crate::sessions::valid_owner(owner) {
        return Ok(None);
    }
    let url = match replicas.owner_home(&caller.id, owner).await {
        Home::Here(place) => return Ok(Some(place)),
        Home::Elsewhere(url) => url,
        Home::Unavailable => return Err(store_unavailable(daemon)),
        Home::Unsigned => {
            tracing::warn!(
                "the store names a holder of an owner's sessions that the replicas did not sign"
            );
            return Err(refused(
                "the store's record of where this owner's sessions are is not one the replicas signed",
            ));
        }
    };
    let Some(body) = relay else {
        return Err(refused(
            "this owner's sessions moved to another replica while the open was forwarded; retry",
        ));
    };
    Err(
        match replicas
            .forward(&url, "OpenSession", &caller.id, body)
            .await
        {
            // Not taken as proof the holder is gone (it may be running
            // its sessions behind an address that rejects): its places
            // expire with its leases if it is.
            Forwarded::Gone => refused(
                "the replica holding this owner's sessions refused the connection; retry (a replica that is gone stops holding them within the lease period)",
            ),
            other => answer_of(other, "this owner's sessions"),
        },
    )
}

/// A forwarded call's fate, other than its holder being gone: the
/// holder's answer relayed, or why there is none (`what` names the
/// holder's charge in messages).
fn answer_of(forwarded: Forwarded, what: &str) -> Response {
    match forwarded {
        Forwarded::Answer { status: 401, .. } => {
            // The holder did not take the forward (secrets or clients files
            // that differ, clocks more than 30 s apart): nothing ran there,
            // and the caller's own token is not the problem. Only a 401 says
            // so (`caller` answers every failed forward with one); a 403 is
            // the holder refusing the call itself, relayed below.
            tracing::error!(
                status = 401,
                "the replica holding a session refused a forwarded call; check that every replica has the same secret, clients file and clock"
            );
            refused(&format!(
                "the replica holding {what} refused the forwarded call"
            ))
        }
        Forwarded::Answer {
            status,
            headers,
            body,
        } => relayed(status, headers, body),
        Forwarded::Gone => refused(&format!("the replica holding {what} is gone; retry")),
        Forwarded::Unreachable(detail) => {
            // Nothing was sent; the holder may be there a moment later.
            tracing::warn!(detail = %detail, "the replica holding a session could not be reached");
            refused(&format!(
                "the replica holding {what} could not be reached; retry"
            ))
        }
        Forwarded::Lost(detail) => {
            let id = crate::pipeline::internal_id(&detail);
            tracing::error!(error_id = %id, detail = %detail, "a forwarded session call got no answer");
            error_response(SessionError::Internal { id })
        }
    }
}

/// Nothing ran: marked `environment`, the session not ended.
fn refused(why: &str) -> Response {
    error_response(SessionError::Refused {
        refusal: Refusal::environment(why),
        ended: None,
    })
}

/// The holder's answer, as it gave it.
fn relayed(status: u16, headers: Vec<(String, Vec<u8>)>, body: Bytes) -> Response {
    let mut resp = body.into_response();
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            resp.headers_mut().insert(n, v);
        }
    }
    resp
}

/// The shared store did not answer: counted as shed and refused, marked
/// `capacity`, as admission refuses when it cannot count.
fn store_unavailable(daemon: &Daemon) -> Response {
    error_response(daemon.shed_for(Shed::StoreUnavailable).into())
}
