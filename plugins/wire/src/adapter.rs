//! What a cloud adapter implements: the world's `adapter` export, one
//! trait per concern so each is implemented beside the code it rests on.
//! `Startup` (what the adapter states, and the startup evidence for it:
//! its smoke test), `CloudAdapter` (a run) and `Sessions` (none unless the
//! adapter says otherwise: its session module). Every type that implements
//! `CloudAdapter` (and so the other two) is the export's `Guest`, so an
//! adapter's crate needs only the three impls and
//! `plimsoll_plugin_wire::bindings::export!(MyAdapter);`.
//!
//! Also here, for the hosted sandbox adapters: the description they all
//! give, and their service configured from the origins the operator
//! allowed.

use crate::bindings::exports::plimsoll::provider::adapter::Guest;
use crate::bindings::plimsoll::provider::http;
use crate::bindings::plimsoll::provider::types::{
    Description, PayloadKind, PreflightReport, Refusal, RunError, RunRequest, RunResult,
    SessionAnswer, SessionFailure, SessionOptions, Tier,
};

/// What the host asks an adapter at start.
pub trait Startup {
    /// The configuration keys the adapter reads (none by default): declared
    /// and checked before `describe`, so `describe` may name their values.
    fn config_keys() -> &'static [crate::config::Key] {
        &[]
    }

    /// Static facts about the plugin. An adapter that keeps the default
    /// `Sessions` states `sessions: None`.
    fn describe() -> Description;

    /// Startup evidence, from a real sandbox.
    fn preflight() -> Result<PreflightReport, String>;
}

/// The `adapter` interface (wit/provider/adapter.wit), as a cloud adapter
/// implements it: the run here, the rest in `Startup` and `Sessions`.
pub trait CloudAdapter: Startup + Sessions {
    /// Runs one admitted request.
    fn run(request: RunRequest) -> Result<RunResult, RunError>;
}

/// Sessions. None by default: `describe` then states none, so the host
/// never calls these; if it did, the answers would be refusals.
pub trait Sessions {
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

/// What a hosted sandbox adapter states: snippets and projects, and
/// sessions that keep no interpreter (`session::support`).
pub fn hosted(name: &str, tier: Tier, environment: String) -> Description {
    Description {
        name: name.to_string(),
        tier,
        payloads: vec![PayloadKind::Javascript, PayloadKind::Project],
        environment,
        sessions: Some(crate::session::support()),
    }
}

/// The adapter's service, `configured` from the origins the operator
/// allowed. Origins that do not say where it is are a refusal: nothing was
/// sent.
pub fn configured<S>(
    configured: impl FnOnce(Vec<String>) -> Result<S, String>,
) -> Result<S, RunError> {
    configured(http::allowed_origins()).map_err(|why| crate::not_started(&why))
}

impl<T: CloudAdapter> Guest for T {
    fn describe() -> Description {
        crate::config::declare_all(<T as Startup>::config_keys());
        <T as Startup>::describe()
    }

    fn preflight() -> Result<PreflightReport, String> {
        <T as Startup>::preflight()
    }

    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        <T as CloudAdapter>::run(request)
    }

    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        <T as Sessions>::open_session(options)
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        <T as Sessions>::session_run(state, request)
    }

    fn close_session(state: String) {
        <T as Sessions>::close_session(state)
    }
}
