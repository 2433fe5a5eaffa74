//! A sandbox as the shared runs (projects, the probe step, the session
//! sweep) drive it. OpenShell has no file API, so each file goes in on a
//! command's stdin (`cat >` under `/tmp/work`, the one writable tree), and
//! each artifact comes back as a `cat`'s output.

use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::types::{ProcessOutput, RunError};
use crate::exec;
use crate::gateway::{self, Gateway};
use crate::wire;
use crate::wire::sandbox::{Command, Fetched};

pub const WORK_DIR: &str = "/tmp/work";
/// Writes stdin to the file named by $1, making its directory first.
const PUT: &str = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;

/// A sandbox of the gateway's, by name.
pub struct Target<'a> {
    pub gw: &'a Gateway,
    pub name: &'a str,
    /// The environment a project's steps get (a granted call's); the
    /// plugin's own commands (files in and out) get none.
    pub env: &'a [(String, String)],
}

impl Target<'_> {
    fn run(&self, cmd: &exec::Command<'_>, deadline: Instant) -> Result<ProcessOutput, RunError> {
        exec::run(self.gw, self.name, cmd, deadline)
    }
}

impl wire::Sandbox for Target<'_> {
    // Once a step ran, nothing after it can say nothing ran.
    const LATER_STEP_MAY_HAVE_RUN: bool = true;

    fn make_dirs(&self, dirs: &[&str], deadline: Instant) -> Result<(), RunError> {
        let mut argv = vec!["mkdir", "-p"];
        argv.extend(dirs);
        let made = self.run(
            &exec::Command {
                argv: &argv,
                workdir: "",
                stdin: b"",
                limit: 4096,
                env: &[],
            },
            deadline,
        )?;
        if made.exit_code != 0 {
            return Err(gateway::not_started(
                "the project directory could not be made",
            ));
        }
        Ok(())
    }

    /// Each file on its own command's stdin, its directory made first.
    fn put_files(&self, files: &[(String, &[u8])], deadline: Instant) -> Result<(), RunError> {
        for (path, content) in files {
            let out = self.run(
                &exec::Command {
                    argv: &["sh", "-c", PUT, "plimsoll-put", path],
                    workdir: "",
                    stdin: content,
                    limit: 4096,
                    env: &[],
                },
                deadline,
            )?;
            if out.exit_code != 0 || out.timed_out {
                return Err(gateway::not_started("a project file could not be written"));
            }
        }
        Ok(())
    }

    fn exec(&self, cmd: &Command<'_>, deadline: Instant) -> Result<ProcessOutput, RunError> {
        self.run(
            &exec::Command {
                argv: cmd.argv,
                // The gateway's default directory when none is named.
                workdir: cmd.cwd.unwrap_or(""),
                stdin: b"",
                limit: cmd.limit as usize,
                env: self.env,
            },
            deadline,
        )
    }

    /// A `cat` of the file, `max` bytes kept.
    fn get_file(&self, path: &str, max: usize, deadline: Instant) -> Fetched {
        let got = self.run(
            &exec::Command {
                argv: &["cat", "--", path],
                workdir: "",
                stdin: b"",
                limit: max,
                env: &[],
            },
            deadline,
        );
        match got {
            Ok(o) if o.exit_code == 0 && !o.timed_out && !o.stdout_truncated => {
                Fetched::Whole(o.stdout)
            }
            // Cut, or not read within the budget: not brought back whole.
            Ok(o) if o.exit_code == 0 || o.timed_out => Fetched::NotWhole,
            // Absent: the steps may not have made it.
            Ok(_) => Fetched::Absent,
            Err(_) => Fetched::NotWhole,
        }
    }
}
