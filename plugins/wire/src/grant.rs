//! A granted run in a hosted sandbox: the host's channel to the run's
//! broker (through the daemon's guard), asked for once per call and
//! written into the sandbox before any of the run's code starts.
//!
//! The adapter opens the sandbox's egress to `host:port` alone (its
//! service's way of saying so), writes the files with `put`, and gives
//! `env` to every process of the run. None of it is a credential: the
//! token in `env` is worth this call's broker session and dies with the
//! call.

use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::grant;
use crate::bindings::plimsoll::provider::types::RunError;
use crate::sandbox::Sandbox;

/// Where the channel's files go in a sandbox: every hosted image has /tmp,
/// and the run's user can write and read it.
pub const DIR: &str = "/tmp/.plimsoll-grant";

/// The call's channel, when it carries a grant.
pub struct Channel {
    /// The one destination the sandbox must reach: the guard.
    pub host: String,
    pub port: u16,
    /// `NAME`, `value` for every process of the run.
    pub env: Vec<(String, String)>,
    files: Vec<(String, Vec<u8>)>,
}

/// The call's channel: none when it carries no grant (or the daemon has
/// no guard); a refusal, nothing run, when the host would not make one.
pub fn channel() -> Result<Option<Channel>, RunError> {
    let Some(c) = grant::open_channel(DIR).map_err(|why| crate::not_started(&why))? else {
        return Ok(None);
    };
    let env = c
        .env
        .into_iter()
        .filter_map(|e| {
            e.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let files = c
        .files
        .into_iter()
        .map(|f| (format!("{DIR}/{}", f.name), f.contents))
        .collect();
    Ok(Some(Channel {
        host: c.host,
        port: c.port,
        env,
        files,
    }))
}

/// Where the daemon's guard is, if it has one: what a session's sandbox is
/// opened to for a granted call.
pub fn guard() -> Option<(String, u16)> {
    grant::guard()
}

impl Channel {
    /// Writes the channel's files into `sandbox`.
    pub fn put<S: Sandbox>(&self, sandbox: &S, deadline: Instant) -> Result<(), RunError> {
        let files: Vec<(String, &[u8])> = self
            .files
            .iter()
            .map(|(p, c)| (p.clone(), c.as_slice()))
            .collect();
        sandbox.make_dir(DIR, deadline)?;
        sandbox.put_files(&files, deadline)
    }
}
