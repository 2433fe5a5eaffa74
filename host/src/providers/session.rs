//! A provider's sessions: one sandbox kept for many calls.
//!
//! The pipeline owns everything a session is to a caller (its ID, chain of
//! records, caps, lifetime, the turn that serializes its calls); a provider
//! owns only the sandbox. A `ProviderSession` runs one call at a time (the
//! pipeline never overlaps them), says when its sandbox ended by itself,
//! and is closed exactly once.

use futures_util::future::BoxFuture;

use crate::job::{Ended, Job, Output};
use crate::outcome::RunFailure;

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
