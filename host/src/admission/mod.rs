//! Admission: the checks a request must pass on its own, before anything
//! about the provider is consulted. Each failure is a `request` refusal.
//!
//! The bounds mirror what the published clients check before sending, so a
//! well-behaved client never sees these; they exist for everyone else.

use std::time::Duration;

use crate::refusal::Refusal;
use crate::tier::Tier;
use crate::wire::{CellRun, ModuleRun, ProjectFile, ProjectRun, RunRequest, SoftwareRule};

pub const MAX_CODE_BYTES: usize = 256 << 10;
pub const MAX_PROJECT_FILES: usize = 200;
pub const MAX_PROJECT_BYTES: usize = 4 << 20;
pub const MAX_PROJECT_STEPS: usize = 20;
pub const MAX_STEP_BYTES: usize = 16 << 10;
pub const MAX_ARTIFACTS: usize = 100;
pub const MAX_PATH_BYTES: usize = 1024;
pub const MAX_PROFILE_BYTES: usize = 128;
const MAX_IDENTITIES: usize = 32;
const MAX_IDENTITY_BYTES: usize = 256;
const MAX_TRACE_ID: usize = 64;

/// Bytes kept per output stream of a run (and of each project step).
pub const OUTPUT_LIMIT: usize = 64 << 10;

/// Per-daemon limits that admission applies (not to be confused with the
/// limits every wasmtime store is held to, in `store_limits`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// Projects run several steps and get a larger budget.
    pub project_default_timeout: Duration,
    pub project_max_timeout: Duration,
    pub max_concurrent: u32,
    /// Bytes kept per output stream.
    pub output_limit: usize,
}

impl Limits {
    /// The same for every provider: snippets 5 s by default and at most
    /// 30 s; projects 30 s by default and at most 120 s.
    pub fn new(max_concurrent: u32) -> Self {
        Limits {
            default_timeout: Duration::from_secs(5),
            max_timeout: Duration::from_secs(30),
            project_default_timeout: Duration::from_secs(30),
            project_max_timeout: Duration::from_secs(120),
            max_concurrent,
            output_limit: OUTPUT_LIMIT,
        }
    }
}

/// The payload of a validated request.
#[derive(Debug, Clone)]
pub enum Payload {
    JavaScript {
        code: String,
        grant_profile: String,
    },
    Project(ProjectRun),
    Module,
    /// Only in a session: code for the session's interpreter of `language`.
    Cell(CellRun),
}

impl Payload {
    pub fn kind(&self) -> &'static str {
        match self {
            Payload::JavaScript { .. } => "javascript",
            Payload::Project(_) => "project",
            Payload::Module => "module",
            Payload::Cell(_) => "cell",
        }
    }
}

/// A request that passed every check that needs nothing but the request.
#[derive(Debug, Clone)]
pub struct Checked {
    pub floor: Option<Tier>,
    pub timeout: Duration,
    pub payload: Payload,
    /// The trace ID when it is well-formed; a malformed one is dropped whole
    /// (never truncated or repaired) and only the fact is logged.
    pub trace_id: Option<String>,
    pub trace_id_rejected: bool,
}

/// The languages a cell may name (the client's table).
pub const CELL_LANGUAGES: [&str; 2] = ["javascript", "python"];

/// A Run request: every payload but a cell.
pub fn validate(req: &RunRequest, limits: &Limits) -> Result<Checked, Refusal> {
    validate_as(req, limits, false)
}

/// A session call, as a Run: a cell is allowed here.
pub fn validate_in_session(req: &RunRequest, limits: &Limits) -> Result<Checked, Refusal> {
    validate_as(req, limits, true)
}

fn validate_as(req: &RunRequest, limits: &Limits, in_session: bool) -> Result<Checked, Refusal> {
    let set = [
        req.javascript.is_some(),
        req.project.is_some(),
        req.module.is_some(),
        req.cell.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if set == 0 {
        return Err(Refusal::request("the request carries no payload"));
    }
    if set > 1 {
        return Err(Refusal::request(
            "the request carries more than one payload",
        ));
    }
    if req.cell.is_some() && !in_session {
        return Err(Refusal::request(
            "a cell runs only inside a session (SessionRun), not through Run",
        ));
    }

    let floor =
        Tier::parse_floor(&req.minimum_isolation).map_err(|e| Refusal::request(e.to_string()))?;
    if let Some(rule) = &req.software_rule {
        validate_rule(rule)?;
    }
    // A cell is budgeted as a project: it is a session's unit of work,
    // often a whole analysis, not a one-line snippet.
    let timeout = if req.project.is_some() || req.cell.is_some() {
        clamp_timeout(
            req.timeout_ms,
            limits.project_default_timeout,
            limits.project_max_timeout,
        )
    } else {
        clamp_timeout(req.timeout_ms, limits.default_timeout, limits.max_timeout)
    };
    let (trace_id, trace_id_rejected) = match req.trace_id.as_str() {
        "" => (None, false),
        t if valid_trace_id(t) => (Some(t.to_string()), false),
        _ => (None, true),
    };

    let payload = if let Some(js) = &req.javascript {
        validate_code(&js.code)?;
        validate_profile(&js.grant_profile)?;
        Payload::JavaScript {
            code: js.code.clone(),
            grant_profile: js.grant_profile.clone(),
        }
    } else if let Some(p) = &req.project {
        validate_project(p)?;
        Payload::Project(p.clone())
    } else if let Some(m) = &req.module {
        validate_module(m)?;
        Payload::Module
    } else if let Some(c) = &req.cell {
        if !CELL_LANGUAGES.contains(&c.language.as_str()) {
            return Err(Refusal::request(
                "a cell's language must be javascript or python",
            ));
        }
        validate_code(&c.code)?;
        validate_files(&c.files)?;
        Payload::Cell(c.clone())
    } else {
        return Err(Refusal::request("the request carries no payload"));
    };
    Ok(Checked {
        floor,
        timeout,
        payload,
        trace_id,
        trace_id_rejected,
    })
}

/// `timeout_ms` of 0 or less asks for the default; anything above the maximum
/// is clamped to it, never refused (the client may not know our maximum).
pub fn clamp_timeout(timeout_ms: i32, default: Duration, max: Duration) -> Duration {
    if timeout_ms <= 0 {
        return default;
    }
    Duration::from_millis(timeout_ms as u64).min(max)
}

fn validate_code(code: &str) -> Result<(), Refusal> {
    if code.is_empty() {
        return Err(Refusal::request("code is required"));
    }
    if code.len() > MAX_CODE_BYTES {
        return Err(Refusal::request(format!(
            "code exceeds {MAX_CODE_BYTES} bytes"
        )));
    }
    if code.contains('\0') {
        return Err(Refusal::request("code must not contain NUL bytes"));
    }
    Ok(())
}

fn validate_profile(p: &str) -> Result<(), Refusal> {
    if p.len() > MAX_PROFILE_BYTES {
        return Err(Refusal::request(format!(
            "grant profile name exceeds {MAX_PROFILE_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Whether a session call's rule keeps the session's: no rule at open
/// allows any; otherwise the call's identities must all be the session's.
/// The daemon refuses a call outside it, and a checker of a session's
/// records holds each call to the same rule.
pub fn rule_within(call: Option<&SoftwareRule>, session: Option<&SoftwareRule>) -> bool {
    match (call, session) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(c), Some(s)) => c.identities.iter().all(|i| s.identities.contains(i)),
    }
}

pub fn validate_rule(rule: &SoftwareRule) -> Result<(), Refusal> {
    let n = rule.identities.len();
    let shape_ok = match rule.mode.as_str() {
        "exact" => n == 1,
        "approved" => (1..=MAX_IDENTITIES).contains(&n),
        _ => false,
    };
    if !shape_ok {
        return Err(Refusal::request(
            "software rule needs mode exact with one identity, or approved with 1 to 32",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for id in &rule.identities {
        let charset_ok = id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/@+-".contains(&b));
        if id.is_empty()
            || id.len() > MAX_IDENTITY_BYTES
            || !charset_ok
            || !seen.insert(id.as_str())
        {
            return Err(Refusal::request(
                "software identity is empty, too long, duplicated or has an invalid character",
            ));
        }
    }
    Ok(())
}

pub fn valid_trace_id(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= MAX_TRACE_ID
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// A relative, clean path: no empty, `.` or `..` segment, no backslash, no
/// control character, not absolute.
pub fn valid_relative_path(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= MAX_PATH_BYTES
        && !p
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        && !p.contains('\\')
        && !p.chars().any(|c| c.is_control())
}

fn validate_project(p: &ProjectRun) -> Result<(), Refusal> {
    if p.steps.is_empty() || p.steps.len() > MAX_PROJECT_STEPS {
        return Err(Refusal::request(format!(
            "a project needs 1 to {MAX_PROJECT_STEPS} steps"
        )));
    }
    for (i, s) in p.steps.iter().enumerate() {
        if s.len() > MAX_STEP_BYTES || s.contains('\0') {
            return Err(Refusal::request(format!(
                "step {i} exceeds {MAX_STEP_BYTES} bytes or contains NUL"
            )));
        }
    }
    validate_files(&p.files)?;
    if p.artifacts.len() > MAX_ARTIFACTS {
        return Err(Refusal::request(format!(
            "too many artifacts (max {MAX_ARTIFACTS})"
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for a in &p.artifacts {
        if !valid_relative_path(a) || !seen.insert(a.as_str()) {
            return Err(Refusal::request("an artifact path is unsafe or repeated"));
        }
    }
    validate_profile(&p.grant_profile)
}

/// A project's or a cell's files: bounded in count and bytes, each path
/// relative, clean and given once.
fn validate_files(files: &[ProjectFile]) -> Result<(), Refusal> {
    if files.len() > MAX_PROJECT_FILES {
        return Err(Refusal::request(format!(
            "too many files (max {MAX_PROJECT_FILES})"
        )));
    }
    let mut total = 0usize;
    let mut seen = std::collections::HashSet::new();
    for f in files {
        if !valid_relative_path(&f.path) || !seen.insert(f.path.as_str()) {
            return Err(Refusal::request("a file path is unsafe or repeated"));
        }
        total += f.content.len();
        if total > MAX_PROJECT_BYTES {
            return Err(Refusal::request(format!(
                "files exceed {MAX_PROJECT_BYTES} bytes"
            )));
        }
    }
    Ok(())
}

fn validate_module(m: &ModuleRun) -> Result<(), Refusal> {
    let id_ok = !m.model.is_empty()
        && m.model.len() <= 64
        && m.model.as_bytes()[0].is_ascii_alphanumeric()
        && m.model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !id_ok {
        return Err(Refusal::request(
            "model must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}",
        ));
    }
    if !(m.end_time > 0.0 && m.end_time.is_finite() && m.step > 0.0 && m.step.is_finite()) {
        return Err(Refusal::request(
            "end_time and step must be positive and finite",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
