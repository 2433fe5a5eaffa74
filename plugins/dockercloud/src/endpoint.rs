//! The sandbox's own endpoint (the data plane): exec, upload, download,
//! each with the run's one scoped credential. That credential is the
//! service's, minted for this sandbox alone; the host's access token never
//! goes here (the endpoint's origin is kept out of the key's origins).

use serde_json::{Value, json};
use wasi::clocks::monotonic_clock::{self, Instant};
use wasi::http::types::Method;

use crate::api::{self, Sandbox};
use crate::bindings::plimsoll::provider::project_report;
use crate::bindings::plimsoll::provider::types::{Artifact, ProcessOutput, Refusal, RunError};
use crate::multipart;
use crate::wire::sandbox::{Command, Fetched, ProjectDirs};
use crate::wire::{self, Failure};
use crate::wrapper;
use plimsoll_plugin_probe::leftovers;

/// Most of a download answer read: the artifacts' 8 MiB and their framing.
const DOWNLOAD_BYTES: usize = 10 << 20;
/// Most of any other non-exec answer read.
const SMALL_ANSWER: usize = 64 << 10;

pub struct Endpoint<'a> {
    base: &'a str,
    bearer: Vec<u8>,
    /// A session's mark (`NAME=value`), set in the environment of every
    /// command run: what the sweeps find the call's processes by.
    mark: Option<&'a str>,
}

/// The variable a session call's commands carry its mark in.
pub const SESSION_MARK: &str = "PLIMSOLL_SESSION";

/// What a download brought back: each file found, and whether any was
/// left out for the byte budget.
pub struct Downloaded {
    pub files: Vec<(String, Vec<u8>)>,
    pub truncated: bool,
}

impl<'a> Endpoint<'a> {
    pub fn new(sandbox: &'a Sandbox, credential: String) -> Endpoint<'a> {
        Endpoint {
            base: &sandbox.endpoint,
            bearer: format!("Bearer {credential}").into_bytes(),
            mark: None,
        }
    }

    /// The same endpoint, its commands carrying a session's mark
    /// (`NAME=value`) and swept when each ends.
    pub fn marked(&self, mark: &'a str) -> Endpoint<'a> {
        Endpoint {
            base: self.base,
            bearer: self.bearer.clone(),
            mark: Some(mark),
        }
    }

    /// One exec request, its answer's JSON (the process's status and
    /// output, base64).
    fn exec_json(
        &self,
        cmd: &[String],
        cwd: Option<&str>,
        bound: usize,
        deadline: Instant,
    ) -> Result<Value, Failure> {
        let mut body = json!({"cmd": cmd});
        if let Some(dir) = cwd {
            body["workingDir"] = json!(dir);
        }
        let body = body.to_string();
        let (status, bytes) = self.send(
            Method::Post,
            "/v1/processes/exec",
            Some("application/json"),
            body.as_bytes(),
            bound,
            deadline,
        )?;
        if status != 200 {
            return Err(Failure::Transport(format!(
                "the exec answered HTTP {status}"
            )));
        }
        serde_json::from_slice(&bytes)
            .map_err(|_| Failure::Transport("the exec answer is not JSON".into()))
    }

    /// The files at `paths`, in one request, at most `budget` bytes in all.
    /// A path the service could not read is left out; a part for a path
    /// not asked for, a `stream-error` or a cut answer fails the download.
    pub fn download(
        &self,
        paths: &[String],
        budget: usize,
        deadline: Instant,
    ) -> Result<Downloaded, String> {
        let query: Vec<String> = paths
            .iter()
            .map(|p| format!("paths={}", api::encode(p)))
            .collect();
        let mut r = self
            .request(
                Method::Get,
                &format!("/v1/files/download?{}", query.join("&")),
                None,
                b"",
                deadline,
            )
            .map_err(|e| say(&e))?;
        if r.status != 200 {
            return Err(format!("the download answered HTTP {}", r.status));
        }
        let boundary = r
            .header("content-type")
            .and_then(multipart::boundary)
            .ok_or("the download answer is not multipart/mixed")?;
        let body = r.read_all(DOWNLOAD_BYTES, deadline).map_err(|e| say(&e))?;
        let mut out = Downloaded {
            files: Vec::new(),
            truncated: false,
        };
        let mut current: Option<String> = None;
        let mut total = 0usize;
        for part in multipart::parts(&body, &boundary)? {
            match part.name.as_str() {
                "metadata" => {
                    let path = multipart::json(&part)["path"]
                        .as_str()
                        .map(str::to_string)
                        .ok_or("a download metadata part names no path")?;
                    if !paths.contains(&path) {
                        return Err("the download sent a path that was not asked for".into());
                    }
                    current = Some(path);
                }
                "content" => {
                    let path = current
                        .take()
                        .ok_or("download content came before its metadata")?;
                    if total + part.body.len() > budget {
                        out.truncated = true;
                        continue;
                    }
                    total += part.body.len();
                    out.files.push((path, part.body));
                }
                // Not readable (absent, say): that path is left out.
                "error" => current = None,
                "stream-error" => return Err("the download failed part-way (stream-error)".into()),
                _ => return Err("the download sent a part of an unknown kind".into()),
            }
        }
        Ok(out)
    }

    fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
        bound: usize,
        deadline: Instant,
    ) -> Result<(u16, Vec<u8>), Failure> {
        let mut r = self.request(method, path, content_type, body, deadline)?;
        let bytes = r.read_all(bound, deadline)?;
        Ok((r.status, bytes))
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
        deadline: Instant,
    ) -> Result<wire::Response, Failure> {
        let mut headers = vec![
            ("authorization", self.bearer.clone()),
            ("accept", b"application/json, multipart/mixed".to_vec()),
        ];
        if let Some(ct) = content_type {
            headers.push(("content-type", ct.as_bytes().to_vec()));
        }
        wire::send_to(self.base, method, path, headers, body, deadline)
    }
}

/// What the shared runs (projects, the probe step, the session sweep) drive.
impl wire::Sandbox for Endpoint<'_> {
    // The upload makes no directory: the project's and every file's
    // parent are made first, in one `mkdir`.
    const PROJECT_DIRS: ProjectDirs = ProjectDirs::WithParents;

    /// `mkdir -p` of `dirs`, unwrapped (nothing of the guest's runs).
    fn make_dirs(&self, dirs: &[&str], deadline: Instant) -> Result<(), RunError> {
        let mut cmd = vec!["mkdir".to_string(), "-p".to_string(), "--".to_string()];
        cmd.extend(dirs.iter().map(|d| d.to_string()));
        let v = self
            .exec_json(&cmd, None, SMALL_ANSWER, deadline)
            .map_err(|e| api::not_started(&format!("mkdir failed: {}", say(&e))))?;
        match v["exitCode"].as_i64().unwrap_or(0) {
            0 => Ok(()),
            n => Err(api::not_started(&format!(
                "could not create the project directories (mkdir exited {n})"
            ))),
        }
    }

    /// One upload for every file; the service must say it wrote them all.
    fn put_files(&self, files: &[(String, &[u8])], deadline: Instant) -> Result<(), RunError> {
        if files.is_empty() {
            return Ok(());
        }
        let boundary = format!(
            "plimsoll-{:016x}{:016x}",
            wasi::random::random::get_random_u64(),
            wasi::random::random::get_random_u64()
        );
        let (body, content_type) = multipart::form(files, &boundary);
        let (status, bytes) = self
            .send(
                Method::Post,
                "/v1/files/upload",
                Some(&content_type),
                &body,
                SMALL_ANSWER,
                deadline,
            )
            .map_err(|e| api::lost(e, "upload"))?;
        if status != 200 {
            return Err(RunError::NotDispatched(Refusal::Environment(format!(
                "the upload answered HTTP {status}"
            ))));
        }
        let written = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["filesWritten"].as_u64());
        if written != Some(files.len() as u64) {
            return Err(api::not_started(&format!(
                "the upload wrote {} of {} files",
                written.map_or("an unknown number".to_string(), |n| n.to_string()),
                files.len()
            )));
        }
        Ok(())
    }

    /// Runs the command under the wrapper (time limit and output cap inside
    /// the VM), in its directory if it names one. From the send on, the
    /// guest may have run.
    fn exec(&self, cmd: &Command<'_>, deadline: Instant) -> Result<ProcessOutput, RunError> {
        let secs = wrapper::seconds_for(wire::remaining_ms(deadline));
        let sweep = self.mark.map(|_| leftovers::sweep_marked());
        let mark = self.mark.zip(sweep.as_deref());
        let wrapped = wrapper::wrap(cmd.argv, secs, cmd.limit, mark);
        // Both streams base64 (4 bytes per 3) at the cap plus one, and room
        // for the JSON around them.
        let b64 = (cmd.limit as usize + 1).div_ceil(3) * 4;
        let bound = 2 * b64 + SMALL_ANSWER;
        let began = monotonic_clock::now();
        let answer = self.exec_json(&wrapped, cmd.cwd, bound, deadline);
        let elapsed_ms = (monotonic_clock::now() - began) / 1_000_000;
        match answer {
            Ok(v) => wrapper::output(&v, cmd.limit, secs, elapsed_ms).map_err(RunError::MayHaveRun),
            Err(Failure::TooLarge) => Ok(wrapper::flooded()),
            Err(e) => Err(RunError::MayHaveRun(format!(
                "the exec failed: {}",
                say(&e)
            ))),
        }
    }

    /// One path's download.
    fn get_file(&self, path: &str, max: usize, deadline: Instant) -> Fetched {
        match self.download(&[path.to_string()], max, deadline) {
            Ok(got) if got.truncated => Fetched::NotWhole,
            Ok(got) => match got.files.into_iter().next() {
                Some((_, content)) => Fetched::Whole(content),
                None => Fetched::Absent,
            },
            Err(_) => Fetched::NotWhole,
        }
    }

    /// Every artifact in one download, under the one budget.
    fn get_artifacts(&self, dir: &str, paths: &[String], budget: usize, deadline: Instant) -> bool {
        let full: Vec<String> = paths.iter().map(|a| format!("{dir}/{a}")).collect();
        match self.download(&full, budget, deadline) {
            Ok(got) => {
                let mut truncated = got.truncated;
                for (path, content) in got.files {
                    let path = path
                        .strip_prefix(dir)
                        .and_then(|p| p.strip_prefix('/'))
                        .unwrap_or(&path)
                        .to_string();
                    if !project_report::add_artifact(&Artifact { path, content }) {
                        truncated = true;
                    }
                }
                truncated
            }
            // The steps ran; what they made could not be brought back.
            Err(_) => true,
        }
    }
}

fn say(e: &Failure) -> String {
    match e {
        Failure::Refused(why) | Failure::Transport(why) => why.clone(),
        Failure::Deadline => "it did not answer within the run's budget".into(),
        Failure::TooLarge => "its answer was too large".into(),
    }
}
