//! A provider's sessions: one sandbox kept for many calls.
//!
//! The pipeline owns everything a session is to a caller (its ID, chain of
//! records, caps, lifetime, the turn that serializes its calls); a provider
//! owns only the sandbox. A `ProviderSession` runs one call at a time (the
//! pipeline never overlaps them), says when its sandbox ended by itself,
//! and is closed exactly once.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Job, Output};
use crate::outcome::RunFailure;
use crate::wire::SessionEnd;

/// What a provider's sessions can run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionOffer {
    pub javascript: bool,
    pub project: bool,
    /// Languages a cell may name.
    pub cell_languages: Vec<String>,
    pub javascript_grants: bool,
    pub project_grants: bool,
    /// What every session call runs in, when it is not what single runs
    /// run in (docker: the session agent's container); `None` for the same.
    pub software_identity: Option<String>,
}

/// What a provider is told when a session opens.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Interpreters the caller's cells will use: a hint, so a pool can hand
    /// over a sandbox with them already running.
    pub languages: Vec<String>,
    /// The session's whole life; its sandbox must not outlive it.
    pub lifetime: Duration,
    /// How long opening may take.
    pub open_timeout: Duration,
    /// The daemon has grant profiles: a sandbox that can carry a grant into
    /// a call should be made able to (a docker session's broker mount).
    pub grants: bool,
}

/// Why a session's sandbox ended without being closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub reason: SessionEnd,
    /// Operator-safe context for the caller (no paths, no engine text).
    pub detail: String,
}

/// One open session's sandbox.
pub trait ProviderSession: Send + Sync {
    /// Runs one call. Only payloads the session offer names are passed; a
    /// cell arrives as `Payload::Cell`.
    fn run(&self, job: Job) -> BoxFuture<'_, Result<Output, RunFailure>>;

    /// Set once the sandbox ended by itself (its main process died, a trap
    /// or deadline that cannot be recovered): no further call can run.
    fn ended(&self) -> Option<Ended>;

    /// Ends the sandbox and frees what it holds. Called exactly once.
    fn close(&self) -> BoxFuture<'_, ()>;
}
