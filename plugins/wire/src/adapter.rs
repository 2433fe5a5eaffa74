//! What a cloud adapter implements: the world's `adapter` export, with no
//! sessions unless the adapter says otherwise. Every type that implements
//! `CloudAdapter` is the export's `Guest`, so an adapter's crate needs
//! only `impl CloudAdapter for MyAdapter` and
//! `plimsoll_plugin_wire::bindings::export!(MyAdapter);`.

use crate::bindings::exports::plimsoll::provider::adapter::Guest;
use crate::bindings::plimsoll::provider::types::{
    Description, PreflightReport, Refusal, RunError, RunRequest, RunResult, SessionAnswer,
    SessionFailure, SessionOptions,
};

/// The `adapter` interface (wit/provider/adapter.wit), as a cloud adapter
/// implements it.
pub trait CloudAdapter {
    /// Static facts about the plugin. An adapter that keeps the default
    /// session functions states `sessions: None`.
    fn describe() -> Description;

    /// Startup evidence, from a real sandbox.
    fn preflight() -> Result<PreflightReport, String>;

    /// Runs one admitted request.
    fn run(request: RunRequest) -> Result<RunResult, RunError>;

    // No sessions by default: `describe` then states none, so the host
    // never calls these; if it did, the answers would be refusals.

    fn open_session(_options: SessionOptions) -> Result<String, RunError> {
        Err(no_sessions())
    }

    fn session_run(_state: String, _request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        Err(SessionFailure {
            error: no_sessions(),
            ended: None,
        })
    }

    fn close_session(_state: String) {}
}

fn no_sessions() -> RunError {
    RunError::NotDispatched(Refusal::Unsupported("this provider has no sessions".into()))
}

impl<T: CloudAdapter> Guest for T {
    fn describe() -> Description {
        <T as CloudAdapter>::describe()
    }

    fn preflight() -> Result<PreflightReport, String> {
        <T as CloudAdapter>::preflight()
    }

    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        <T as CloudAdapter>::run(request)
    }

    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        <T as CloudAdapter>::open_session(options)
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        <T as CloudAdapter>::session_run(state, request)
    }

    fn close_session(state: String) {
        <T as CloudAdapter>::close_session(state)
    }
}
