//! One sandbox of a hosted service, as the shared runs drive it:
//! directories made, files written in, a command run with the call's
//! limits, a file read back.
//! Each adapter implements it over its service's own API (envd, the
//! sandbox endpoint, the gateway's exec stream); the project runner
//! (`project`), the probe step (`smoke`), the session sweep (`session`)
//! and `node_snippet` are written once against it.

use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::project_report;
use crate::bindings::plimsoll::provider::types::{Artifact, ProcessOutput, RunError};

/// A command to run: the program and its arguments, where, and how much of
/// its output to keep.
pub struct Command<'a> {
    pub argv: &'a [&'a str],
    /// The directory it runs in; the service's default without one.
    pub cwd: Option<&'a str>,
    /// Bytes kept of each stream.
    pub limit: u32,
}

/// A file read back from a sandbox.
pub enum Fetched {
    Whole(Vec<u8>),
    /// Not there, or not a file.
    Absent,
    /// Not brought back whole: larger than allowed, cut, or the read failed.
    NotWhole,
}

/// How a project's directories come to be before its files are written.
pub enum ProjectDirs {
    /// The project's directory on its own, then the files (each write
    /// makes its file's directory).
    First,
    /// The project's directory and every file's parent in one `make_dirs`,
    /// then the files (the writes make no directory).
    WithParents,
    /// The files' upload makes every parent, the project's directory among
    /// them; the directory on its own only when there are no files.
    ByUpload,
}

pub trait Sandbox {
    /// The shell a project's steps and the probe step run through, as
    /// `<SHELL> -c <script>`.
    const SHELL: &'static str = "sh";

    /// Whether a step refused after an earlier one ran is reported as
    /// may-have-run (nothing after a step that ran can say nothing ran).
    /// By default the sandbox's own refusal stands as it is: the host
    /// withholds the not-dispatched mark anyway once a request went out.
    const LATER_STEP_MAY_HAVE_RUN: bool = false;

    /// How `put_project` makes a project's directories.
    const PROJECT_DIRS: ProjectDirs = ProjectDirs::First;

    /// Makes the directories `dirs` (and their parents).
    fn make_dirs(&self, dirs: &[&str], deadline: Instant) -> Result<(), RunError>;

    /// Writes `files` (absolute path, content).
    fn put_files(&self, files: &[(String, &[u8])], deadline: Instant) -> Result<(), RunError>;

    /// Runs `cmd` to its end or the deadline. From the send on, the guest
    /// may have run.
    fn exec(&self, cmd: &Command<'_>, deadline: Instant) -> Result<ProcessOutput, RunError>;

    /// A file's bytes, at most `max` of them.
    fn get_file(&self, path: &str, max: usize, deadline: Instant) -> Fetched;

    /// Makes the directory `dir` (and its parents).
    fn make_dir(&self, dir: &str, deadline: Instant) -> Result<(), RunError> {
        self.make_dirs(&[dir], deadline)
    }

    /// A project's directory and its files (absolute paths under `dir`),
    /// before its steps: the steps run in the directory, so it must exist
    /// even with no files. The directories are made as `PROJECT_DIRS`
    /// says.
    fn put_project(
        &self,
        dir: &str,
        files: &[(String, &[u8])],
        deadline: Instant,
    ) -> Result<(), RunError> {
        match Self::PROJECT_DIRS {
            ProjectDirs::First => {
                self.make_dir(dir, deadline)?;
                self.put_files(files, deadline)
            }
            ProjectDirs::WithParents => {
                let mut dirs: Vec<&str> = files
                    .iter()
                    .filter_map(|(path, _)| path.rsplit_once('/').map(|(d, _)| d))
                    .collect();
                dirs.push(dir);
                dirs.sort_unstable();
                dirs.dedup();
                self.make_dirs(&dirs, deadline)?;
                self.put_files(files, deadline)
            }
            ProjectDirs::ByUpload if files.is_empty() => self.make_dir(dir, deadline),
            ProjectDirs::ByUpload => self.put_files(files, deadline),
        }
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
                Fetched::Whole(content) => {
                    total += content.len();
                    if !project_report::add_artifact(&Artifact {
                        path: path.clone(),
                        content,
                    }) {
                        truncated = true;
                    }
                }
                // Absent: the steps may not have made it.
                Fetched::Absent => {}
                Fetched::NotWhole => truncated = true,
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
    let argv = ["node", file.as_str()];
    sandbox.exec(
        &Command {
            argv: &argv,
            cwd: Some(cwd),
            limit,
        },
        deadline,
    )
}
