//! What a run produced, or why it produced nothing.
//!
//! These are the values every layer that runs code hands upward: the wasm
//! provider, the plugin host, container backends. The pipeline turns them
//! into an answer. They live in a leaf module (it imports only `refusal`) so
//! that the layers below the pipeline share them without importing each
//! other.

use crate::refusal::Refusal;

/// Why a run produced no result.
#[derive(Debug)]
pub enum RunFailure {
    /// Nothing of the code ran; the host can stand behind that.
    NotDispatched(Refusal),
    /// The run may have started. Answered unmarked.
    MayHaveRun(String),
}

/// Output of one process-like run, as the API reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// A project's result, as the API reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectOutput {
    pub steps: Vec<StepOutput>,
    pub outcome: ProjectOutcome,
    pub outcome_detail: String,
    pub artifacts: Vec<(String, Vec<u8>)>,
    pub artifacts_truncated: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepOutput {
    pub command: String,
    pub output: ProcessOutput,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProjectOutcome {
    #[default]
    Completed,
    SetupFailed,
    TimedOut,
    ProtocolError,
}

/// Why a provider cannot take runs now. `code` is a fixed word, safe to
/// show anyone (`/readyz` needs no token); `detail` may name engine errors,
/// images and paths, and goes to the operator's log only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    pub code: &'static str,
    pub detail: String,
}

impl NotReady {
    pub fn new(code: &'static str, detail: impl Into<String>) -> NotReady {
        NotReady {
            code,
            detail: detail.into(),
        }
    }
}

/// A cell's result: code run in a session's interpreter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CellOutput {
    pub output: ProcessOutput,
    /// This call started a fresh interpreter: nothing earlier cells defined
    /// exists in it.
    pub interpreter_started: bool,
    /// The interpreter ended during this call (its deadline, a crash); the
    /// next cell starts a fresh one, or the session ends with it.
    pub interpreter_ended: bool,
}
