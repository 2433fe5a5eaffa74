//! The job vocabulary: what a provider is asked to run, what it hands back,
//! and the two facts a provider's session shares with the pipeline.
//!
//! The pipeline builds a `Job` from a checked request, a provider runs it and
//! answers an `Output`; the plugin host, the wasm provider and the docker
//! backend all speak these words. They live in a leaf beside `outcome` so
//! that every layer below the pipeline can use them without importing the
//! providers module (or each other). The one conversion from the wire's
//! project and cell to a provider's input is here too.

use std::sync::Arc;
use std::time::Duration;

use crate::grants::broker;
use crate::live::Live;
use crate::outcome::{CellOutput, ProcessOutput, ProjectOutput};
use crate::wire::{CellRun, ProjectFile, ProjectRun, SessionEnd};

/// A validated project, as a provider receives it.
#[derive(Debug, Clone)]
pub struct ProjectInput {
    pub files: Vec<(String, String)>,
    pub steps: Vec<String>,
    pub artifacts: Vec<String>,
}

/// A validated cell, as a session's provider receives it.
#[derive(Debug, Clone)]
pub struct CellInput {
    pub language: String,
    pub code: String,
    pub files: Vec<(String, String)>,
}

fn pairs(files: &[ProjectFile]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|f| (f.path.clone(), f.content.clone()))
        .collect()
}

impl From<&ProjectRun> for ProjectInput {
    fn from(p: &ProjectRun) -> Self {
        ProjectInput {
            files: pairs(&p.files),
            steps: p.steps.clone(),
            artifacts: p.artifacts.clone(),
        }
    }
}

impl From<&CellRun> for CellInput {
    fn from(c: &CellRun) -> Self {
        CellInput {
            language: c.language.clone(),
            code: c.code.clone(),
            files: pairs(&c.files),
        }
    }
}

/// Which kind of work a payload is, and so which kind of output answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    JavaScript,
    Project,
    Cell,
}

/// What one admitted run carries.
pub enum Payload {
    JavaScript(String),
    Project(ProjectInput),
    /// Only in a session.
    Cell(CellInput),
}

impl Payload {
    pub fn kind(&self) -> Kind {
        match self {
            Payload::JavaScript(_) => Kind::JavaScript,
            Payload::Project(_) => Kind::Project,
            Payload::Cell(_) => Kind::Cell,
        }
    }
}

/// One admitted run, with its budget and its grant's broker session.
pub struct Job {
    pub payload: Payload,
    pub timeout: Duration,
    /// Bytes kept per output stream.
    pub output_limit: usize,
    pub grant: Option<Arc<broker::Session>>,
    /// Where output goes as it is written, when a caller watches the run.
    /// A provider that cannot pass output on early ignores it: the result
    /// carries everything either way.
    pub live: Option<Live>,
}

/// What a run produced.
pub enum Output {
    JavaScript(ProcessOutput),
    Project(ProjectOutput),
    Cell(CellOutput),
}

impl Output {
    pub fn kind(&self) -> Kind {
        match self {
            Output::JavaScript(_) => Kind::JavaScript,
            Output::Project(_) => Kind::Project,
            Output::Cell(_) => Kind::Cell,
        }
    }
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
