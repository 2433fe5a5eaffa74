//! One sandbox of a hosted service, as the shared runs drive it: files
//! written in, a command run with the call's limits, a file read back.
//! Each adapter implements it over its service's own API (envd, the
//! sandbox endpoint, the gateway's exec stream); the project runner
//! (`project`), the probe step (`smoke`), the session sweep (`session`)
//! and `node_snippet` are written once against it.

use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::project_report;
use crate::bindings::plimsoll::provider::types::{Artifact, ProcessOutput, RunError};

pub trait Sandbox {
    /// The shell a project's steps and the probe step run through, as
    /// `<SHELL> -c <script>`.
    const SHELL: &'static str = "sh";

    /// Whether a step refused after an earlier one ran is reported as
    /// may-have-run (nothing after a step that ran can say nothing ran).
    /// By default the sandbox's own refusal stands as it is: the host
    /// withholds the not-dispatched mark anyway once a request went out.
    const LATER_STEP_MAY_HAVE_RUN: bool = false;

    /// Makes the directory `dir` (and its parents): where a project's
    /// files go and its steps run.
    fn make_dir(&self, dir: &str, deadline: Instant) -> Result<(), RunError>;

    /// Writes `files` (absolute path, content).
    fn put_files(&self, files: &[(String, &[u8])], deadline: Instant) -> Result<(), RunError>;

    /// Runs `argv` in `cwd` (the service's default without one) to its end
    /// or the deadline, keeping `limit` bytes of each stream. From the send
    /// on, the guest may have run.
    fn exec(
        &self,
        argv: &[&str],
        cwd: Option<&str>,
        limit: u32,
        deadline: Instant,
    ) -> Result<ProcessOutput, RunError>;

    /// A file's bytes, at most `max` of them: `None` when it is absent (or
    /// not a file), `Err` when it was not brought back whole.
    fn get_file(
        &self,
        path: &str,
        max: usize,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, String>;

    /// A project's directory and its files (absolute paths under `dir`),
    /// before its steps: the steps run in the directory, so it must exist
    /// even with no files. By default the directory, then the files.
    fn put_project(
        &self,
        dir: &str,
        files: &[(String, &[u8])],
        deadline: Instant,
    ) -> Result<(), RunError> {
        self.make_dir(dir, deadline)?;
        self.put_files(files, deadline)
    }

    /// Brings back the artifacts at `paths` (relative to `dir`), at most
    /// `budget` bytes in all, each reported to the host as it is learned;
    /// true when any was not brought back whole or the host kept it not.
    /// By default one `get_file` each, under what is left of the budget.
    fn get_artifacts(&self, dir: &str, paths: &[String], budget: usize, deadline: Instant) -> bool {
        let mut total = 0usize;
        let mut truncated = false;
        for path in paths {
            let full = format!("{dir}/{path}");
            match self.get_file(&full, budget.saturating_sub(total), deadline) {
                Ok(Some(content)) => {
                    total += content.len();
                    if !project_report::add_artifact(&Artifact {
                        path: path.clone(),
                        content,
                    }) {
                        truncated = true;
                    }
                }
                // Absent: the steps may not have made it.
                Ok(None) => {}
                Err(_) => truncated = true,
            }
        }
        truncated
    }
}

/// A snippet run with node: written as `snippet.js` into `dir` beside an
/// empty package.json, then run in `cwd`. `.js`, not `.cjs`: node then
/// reads a snippet with module syntax (top-level `await`) as a module, as
/// `node -` does on the docker tiers. The package.json ends node's search
/// for one, so a package.json a session's earlier call left higher up
/// (with a `type`) cannot change how the snippet is read.
pub fn node_snippet<S: Sandbox>(
    sandbox: &S,
    dir: &str,
    cwd: &str,
    code: &str,
    limit: u32,
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    let file = format!("{dir}/snippet.js");
    sandbox.put_files(
        &[
            (format!("{dir}/package.json"), b"{}\n".as_slice()),
            (file.clone(), code.as_bytes()),
        ],
        deadline,
    )?;
    sandbox.exec(&["node", &file], Some(cwd), limit, deadline)
}
