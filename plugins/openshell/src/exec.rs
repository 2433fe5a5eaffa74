//! A command in the sandbox over `ExecSandboxInteractive`: the start
//! message, stdin in 64 KiB frames, then the request's end (the command's
//! end of input); events read as they come, each stream kept to its cap
//! with a flag, the exit event authoritative. At the deadline the stream is
//! dropped, which cancels the call: the gateway's own timeout would report
//! 124 and leave the process running, so it is only a backstop here.

use prost::Message;
use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::types::{ProcessOutput, RunError};
use crate::gateway::{self, Gateway};
use crate::grpc::{self, CallError, Frames};
use crate::messages::{ExecSandboxEvent, ExecSandboxInput, ExecSandboxRequest, workspace_scope};
use crate::wire::Failure;
use crate::wire::capture::{CALL_RECEIVED_CAP, Capture, Stream};

const STDIN_FRAME: usize = 64 << 10;

pub struct Command<'a> {
    pub argv: &'a [&'a str],
    pub workdir: &'a str,
    pub stdin: &'a [u8],
    /// Bytes kept per stream.
    pub limit: usize,
    /// Environment for the process (a granted call's way to its broker).
    pub env: &'a [(String, String)],
}

/// Runs `cmd` in sandbox `name`. From the send on, the guest may have run.
pub fn run(
    gw: &Gateway,
    name: &str,
    cmd: &Command<'_>,
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    let start = ExecSandboxInput {
        start: Some(ExecSandboxRequest {
            sandbox: name.to_string(),
            command: cmd.argv.iter().map(|s| s.to_string()).collect(),
            workdir: cmd.workdir.to_string(),
            environment: cmd.env.iter().cloned().collect(),
            no_login_shell: true,
            workspace_scope: workspace_scope(),
            execution_timeout: Some(gateway::execution_timeout(deadline)),
        }),
        stdin: None,
    };
    let mut messages = vec![start.encode_to_vec()];
    for chunk in cmd.stdin.chunks(STDIN_FRAME) {
        messages.push(
            ExecSandboxInput {
                start: None,
                stdin: Some(chunk.to_vec()),
            }
            .encode_to_vec(),
        );
    }
    let mut out = Capture::new(cmd.limit);
    let mut r = match grpc::start(
        &gw.origin,
        "ExecSandboxInteractive",
        &grpc::frame(&messages),
        deadline,
    ) {
        Ok(r) => r,
        Err(CallError::Wire(Failure::Deadline)) => return Ok(out.timed_out()),
        // The gateway refused to start it ("sandbox is not ready"): from
        // this side nothing ran (the host still withholds the mark).
        Err(CallError::Status(grpc::FAILED_PRECONDITION, m)) => {
            return Err(gateway::not_started(&format!(
                "the gateway did not start the command: {m}"
            )));
        }
        Err(e) => {
            return Err(RunError::MayHaveRun(format!(
                "the exec failed: {}",
                e.say()
            )));
        }
    };
    let mut frames = Frames::default();
    let mut exit = None;
    loop {
        let chunk = match r.next_chunk(deadline) {
            Ok(Some(c)) => c,
            Ok(None) => break,
            // Dropping the answer cancels the call, which ends the process.
            Err(Failure::Deadline) => return Ok(out.timed_out()),
            Err(e) => {
                return Err(RunError::MayHaveRun(format!(
                    "the exec stream failed: {}",
                    CallError::Wire(e).say()
                )));
            }
        };
        // A flood past what the call can carry: dropping the stream cancels
        // the call, and the process with it. (The per-process flood count
        // `add` keeps is not used here: this cap is the one that ends it.)
        if crate::wire::received() > CALL_RECEIVED_CAP {
            return Ok(out.flooded());
        }
        frames
            .push(&chunk)
            .map_err(|e| RunError::MayHaveRun(e.say()))?;
        while let Some(m) = frames.next().map_err(|e| RunError::MayHaveRun(e.say()))? {
            let event = ExecSandboxEvent::decode(m.as_slice())
                .map_err(|_| RunError::MayHaveRun("an exec event does not decode".into()))?;
            if let Some(d) = event.stdout {
                out.add(Stream::Out, &d.data);
            } else if let Some(d) = event.stderr {
                out.add(Stream::Err, &d.data);
            } else if let Some(e) = event.exit {
                exit = Some(e.exit_code);
            }
        }
    }
    match grpc::finish(&mut r, deadline) {
        Ok(()) => {}
        Err(CallError::Wire(Failure::Deadline)) => return Ok(out.timed_out()),
        // The status is what the process's end looked like to the gateway;
        // with an exit event already read, the exit stands.
        Err(e) if exit.is_none() => {
            return Err(RunError::MayHaveRun(format!(
                "the exec failed: {}",
                e.say()
            )));
        }
        Err(_) => {}
    }
    let code = exit.ok_or_else(|| {
        RunError::MayHaveRun("the exec stream ended without an exit status".into())
    })?;
    Ok(out.finish(code, false))
}
