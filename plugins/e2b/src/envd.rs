//! envd, the agent inside each sandbox, reached through the service's edge:
//! every request names the sandbox (`E2b-Sandbox-Id`, envd's port) and
//! carries the sandbox's access token. Files go up in one multipart POST and
//! come back one GET each; a process runs over a Connect server stream whose
//! events this side reads until the process ends or the deadline passes.

use base64::Engine as _;
use serde_json::{Value, json};
use wasi::clocks::monotonic_clock::Instant;
use wasi::http::types::Method;

use crate::bindings::plimsoll::provider::types::{ProcessOutput, RunError};
use crate::connect::{self, Decoder, END_STREAM};
use crate::control::{self, Sandbox, Service, not_started};
use crate::wire::capture::{CALL_RECEIVED_CAP, Capture, Stream};
use crate::wire::sandbox::{Command, Fetched, ProjectDirs};
use crate::wire::{self, Failure, Response};

/// envd's port inside the sandbox.
const ENVD_PORT: &str = "49983";
/// The user commands and files act as: the template's default user.
pub const USER: &str = "user";
/// Grace past the run's deadline given to envd's own deadline, so this
/// side's deadline (which kills and reports) fires first.
const ENVD_DEADLINE_SLACK_MS: u64 = 1000;

/// One sandbox's envd.
pub struct Envd<'a> {
    service: &'a Service,
    sandbox: &'a Sandbox,
    /// Whether a process stopped at the deadline or for flooding is killed
    /// by signal: in a session, whose sandbox stays; a run's sandbox is
    /// deleted right after, which ends everything in it, and the cleanup
    /// time is better spent on the delete.
    kill_on_stop: bool,
    /// What every command started here gets in its environment (a granted
    /// call's way to its broker).
    env: Vec<(String, String)>,
}

impl<'a> Envd<'a> {
    /// A run's sandbox, deleted when the run ends.
    pub fn for_run(service: &'a Service, sandbox: &'a Sandbox) -> Envd<'a> {
        Envd {
            service,
            sandbox,
            kill_on_stop: false,
            env: Vec::new(),
        }
    }

    /// A session's sandbox, kept between calls.
    pub fn for_session(service: &'a Service, sandbox: &'a Sandbox) -> Envd<'a> {
        Envd {
            service,
            sandbox,
            kill_on_stop: true,
            env: Vec::new(),
        }
    }

    /// The same sandbox, with `env` for every command started through it.
    pub fn with_env(mut self, env: Vec<(String, String)>) -> Envd<'a> {
        self.env = env;
        self
    }

    fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        extra: Vec<(&'static str, Vec<u8>)>,
        body: &[u8],
        deadline: Instant,
    ) -> Result<Response, Failure> {
        let mut headers = vec![
            ("e2b-sandbox-id", self.sandbox.id.as_bytes().to_vec()),
            ("e2b-sandbox-port", ENVD_PORT.as_bytes().to_vec()),
            ("x-access-token", self.sandbox.token.as_bytes().to_vec()),
            (
                "e2b-traffic-access-token",
                self.sandbox.traffic.as_bytes().to_vec(),
            ),
        ];
        if let Some(ct) = content_type {
            headers.push(("content-type", ct.as_bytes().to_vec()));
        }
        headers.extend(extra);
        wire::send_to(&self.service.edge, method, path, headers, body, deadline)
    }

    /// Runs a command to its end or the deadline, keeping its `limit` bytes
    /// of each stream. At the deadline (or past the flood cap) the process
    /// is killed and the output so far returned, flagged.
    fn run(&self, command: &Command<'_>, deadline: Instant) -> Result<ProcessOutput, RunError> {
        let Some((&program, args)) = command.argv.split_first() else {
            return Err(not_started("a command with no program"));
        };
        // envd takes a directory for every command; `/` is always there.
        let cwd = command.cwd.unwrap_or("/");
        let limit = command.limit;
        let envs: serde_json::Map<String, Value> = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let request = json!({
            "process": {"cmd": program, "args": args, "cwd": cwd, "envs": envs},
            "stdin": false,
        })
        .to_string();
        let envd_deadline = wire::remaining_ms(deadline) + ENVD_DEADLINE_SLACK_MS;
        let extra = vec![
            ("connect-protocol-version", b"1".to_vec()),
            ("connect-timeout-ms", envd_deadline.to_string().into_bytes()),
        ];
        let started = self.send(
            Method::Post,
            "/process.Process/Start",
            Some("application/connect+json"),
            extra,
            &connect::frame(request.as_bytes()),
            deadline,
        );
        // From here on the process may be running.
        let mut r = match started {
            Ok(r) => r,
            Err(Failure::Deadline) => {
                return Ok(Capture::new(limit as usize).timed_out());
            }
            Err(Failure::Refused(why)) => return Err(not_started(&why)),
            Err(e) => return Err(RunError::MayHaveRun(failed("the process start", e))),
        };
        if r.status != 200 {
            let body = r.read_all(64 << 10, deadline).unwrap_or_default();
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            return Err(RunError::MayHaveRun(format!(
                "envd answered the start with {}{}",
                r.status,
                if gone(&v) {
                    " (the sandbox was not found)"
                } else {
                    ""
                }
            )));
        }
        let mut stream = ProcessStream::new(limit);
        match stream.read(&mut r, deadline) {
            Ok(Ended::Exited(code)) => {
                // Read the answer to its end, so the host can carry the
                // next request on the same connection.
                let _ = r.read_all(64 << 10, deadline);
                Ok(stream.capture.finish(code, false))
            }
            Ok(Ended::Flooded) => {
                drop(r);
                self.kill(stream.pid);
                Ok(stream.capture.flooded())
            }
            Err(Failure::Deadline) => {
                drop(r);
                self.kill(stream.pid);
                Ok(stream.capture.timed_out())
            }
            Err(e) => {
                drop(r);
                self.kill(stream.pid);
                Err(RunError::MayHaveRun(failed("the process stream", e)))
            }
        }
    }

    /// Kills a process by PID (SIGKILL) in a session's sandbox: best
    /// effort, inside the call's cleanup time. A run's sandbox is deleted
    /// right after instead, which ends everything in it.
    fn kill(&self, pid: Option<u64>) {
        let Some(pid) = pid.filter(|_| self.kill_on_stop) else {
            return;
        };
        let body = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}).to_string();
        let deadline = wire::cleanup_deadline();
        if let Ok(mut r) = self.send(
            Method::Post,
            "/process.Process/SendSignal",
            Some("application/json"),
            vec![("connect-protocol-version", b"1".to_vec())],
            body.as_bytes(),
            deadline,
        ) {
            let _ = r.read_all(64 << 10, deadline);
        }
    }
}

/// What the shared runs (projects, the probe step, the session sweep) drive.
impl wire::Sandbox for Envd<'_> {
    const SHELL: &'static str = "/bin/sh";

    // The project's files go in one upload, envd making their parents (the
    // project directory among them).
    const PROJECT_DIRS: ProjectDirs = ProjectDirs::ByUpload;

    /// Writes `files` (absolute path, content) in one request; parents are
    /// created by envd.
    fn put_files(&self, files: &[(String, &[u8])], deadline: Instant) -> Result<(), RunError> {
        let boundary = boundary_for(files);
        let mut body = Vec::new();
        for (path, content) in files {
            body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
            body.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\n\
                     Content-Type: application/octet-stream\r\n\r\n",
                    path.replace('"', "%22")
                )
                .as_bytes(),
            );
            body.extend_from_slice(content);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        let ct = format!("multipart/form-data; boundary={boundary}");
        let path = format!("/files?username={USER}");
        let mut r = self
            .send(Method::Post, &path, Some(&ct), vec![], &body, deadline)
            .map_err(|e| not_started(&failed("the upload", e)))?;
        let _ = r.read_all(1 << 20, deadline);
        if r.status != 200 {
            return Err(not_started(&format!(
                "the sandbox refused the files ({})",
                r.status
            )));
        }
        Ok(())
    }

    /// Makes each directory (and its parents), one request each.
    fn make_dirs(&self, dirs: &[&str], deadline: Instant) -> Result<(), RunError> {
        for dir in dirs {
            let body = json!({"path": dir}).to_string();
            let mut r = self
                .send(
                    Method::Post,
                    "/filesystem.Filesystem/MakeDir",
                    Some("application/json"),
                    vec![("connect-protocol-version", b"1".to_vec())],
                    body.as_bytes(),
                    deadline,
                )
                .map_err(|e| not_started(&failed("making a directory", e)))?;
            let _ = r.read_all(64 << 10, deadline);
            // 409: it exists already, which is what was wanted.
            if r.status != 200 && r.status != 409 {
                return Err(not_started(&format!(
                    "the sandbox refused a directory ({})",
                    r.status
                )));
            }
        }
        Ok(())
    }

    /// A file's bytes, at most `max` of them; one that does not exist or
    /// is not a file is absent.
    fn get_file(&self, path: &str, max: usize, deadline: Instant) -> Fetched {
        let q = format!("/files?path={}&username={USER}", control::encode(path));
        let Ok(mut r) = self.send(Method::Get, &q, None, vec![], b"", deadline) else {
            return Fetched::NotWhole;
        };
        match r.status {
            200 => match r.read_all(max, deadline) {
                Ok(b) => Fetched::Whole(b),
                // Past `max`, or cut.
                Err(_) => Fetched::NotWhole,
            },
            400 | 404 => Fetched::Absent,
            _ => Fetched::NotWhole,
        }
    }

    fn exec(&self, cmd: &Command<'_>, deadline: Instant) -> Result<ProcessOutput, RunError> {
        self.run(cmd, deadline)
    }
}

enum Ended {
    Exited(i32),
    Flooded,
}

/// What a Start stream told so far.
struct ProcessStream {
    capture: Capture,
    pid: Option<u64>,
    exit: Option<i32>,
}

impl ProcessStream {
    fn new(limit: u32) -> ProcessStream {
        ProcessStream {
            capture: Capture::new(limit as usize),
            pid: None,
            exit: None,
        }
    }

    /// Reads events until the stream's end message. A stream that ends
    /// without one, or without the process's end event, is an error: the
    /// process's fate is unknown.
    fn read(&mut self, r: &mut Response, deadline: Instant) -> Result<Ended, Failure> {
        let mut decoder = Decoder::default();
        while let Some(chunk) = r.next_chunk(deadline)? {
            decoder.push(&chunk);
            while let Some(message) = decoder.next().map_err(Failure::Transport)? {
                let v: Value = serde_json::from_slice(&message.body)
                    .map_err(|_| Failure::Transport("an event that is not JSON".into()))?;
                if message.flags & END_STREAM != 0 {
                    if v.get("error").is_some() {
                        return Err(Failure::Transport(format!(
                            "the stream ended with {}",
                            v["error"]["code"].as_str().unwrap_or("an error")
                        )));
                    }
                    return self
                        .exit
                        .map(Ended::Exited)
                        .ok_or_else(|| Failure::Transport("no end event".into()));
                }
                if !self.event(&v["event"])? {
                    return Ok(Ended::Flooded);
                }
            }
            // The host cuts a call at 64 MiB of answers; a flood ends here,
            // well before, whatever earlier processes of the call printed.
            if wire::received() > CALL_RECEIVED_CAP {
                return Ok(Ended::Flooded);
            }
        }
        Err(Failure::Transport(if decoder.pending() > 0 {
            "the stream was cut inside a message".into()
        } else {
            "the stream was cut before its end".into()
        }))
    }

    /// One event; false once the output passed the flood cap.
    fn event(&mut self, e: &Value) -> Result<bool, Failure> {
        let b64 = |v: &Value| {
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or(""))
                .map_err(|_| Failure::Transport("output that is not base64".into()))
        };
        if let Some(start) = e.get("start") {
            self.pid = start["pid"].as_u64();
        } else if let Some(data) = e.get("data") {
            if let Some(out) = data.get("stdout") {
                return Ok(self.capture.add(Stream::Out, &b64(out)?));
            }
            if let Some(err) = data.get("stderr") {
                return Ok(self.capture.add(Stream::Err, &b64(err)?));
            }
        } else if let Some(end) = e.get("end") {
            self.exit = Some(exit_code(end));
        }
        Ok(true)
    }
}

/// The process's exit code; one killed by a signal reports 128 + the
/// signal's number, as a shell would.
fn exit_code(end: &Value) -> i32 {
    let code = end["exitCode"]
        .as_i64()
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or(0);
    if end["exited"].as_bool() == Some(false) {
        let status = end["status"].as_str().unwrap_or("");
        return match status {
            s if s.contains("killed") => 137,
            s if s.contains("terminated") => 143,
            _ if code > 0 => code,
            _ => 128,
        };
    }
    code
}

/// Whether an envd error answer says the sandbox is gone.
fn gone(v: &Value) -> bool {
    v["message"]
        .as_str()
        .is_some_and(|m| m.contains("was not found"))
}

fn failed(what: &str, e: Failure) -> String {
    match e {
        Failure::Refused(why) => format!("{what} was refused by the host: {why}"),
        Failure::Transport(why) => format!("{what} failed: {why}"),
        Failure::Deadline => format!("{what} ran out of time"),
        Failure::TooLarge => format!("{what} answered too much"),
    }
}

/// A multipart boundary that occurs in none of the contents.
fn boundary_for(files: &[(String, &[u8])]) -> String {
    loop {
        let b = format!(
            "plimsoll-{:016x}{:016x}",
            wasi::random::random::get_random_u64(),
            wasi::random::random::get_random_u64()
        );
        if !files
            .iter()
            .any(|(_, c)| c.windows(b.len()).any(|w| w == b.as_bytes()))
        {
            return b;
        }
    }
}
