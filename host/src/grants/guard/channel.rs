//! What a granted run's hosted sandbox is given to reach its broker: the
//! clients, the profile's SDK, the guard's authority if the operator named
//! one, and the environment that points node and python at them with the
//! run's token. The plugin writes the files where it said it would and
//! opens the sandbox's egress to the guard alone; nothing here holds a
//! credential, only a token worth this run's broker session.

use std::sync::Arc;

use super::{Guard, Ticket};
use crate::grants::broker::Session;
use crate::grants::clients;

/// Longest sandbox directory a plugin may name.
const MAX_DIR: usize = 200;

/// A sandbox's way to its run's broker.
pub struct Channel {
    /// The one destination its egress must allow.
    pub host: String,
    pub port: u16,
    /// Files to write under the plugin's directory: name, contents.
    pub files: Vec<(String, Vec<u8>)>,
    /// NAME=value for every process of the run.
    pub env: Vec<String>,
}

#[derive(Debug)]
pub enum ChannelError {
    /// The directory is not one the environment can name safely.
    BadDir,
    /// No randomness for the token.
    Token(std::io::Error),
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelError::BadDir => f.write_str(
                "the sandbox directory must be absolute, at most 200 bytes of letters, digits and /._-, with no `..`",
            ),
            ChannelError::Token(e) => write!(f, "no token could be made: {e}"),
        }
    }
}

/// An absolute path of plain characters: it goes into NODE_OPTIONS and
/// PYTHONPATH, where a space, a colon or a quote would change their
/// meaning.
fn valid_dir(dir: &str) -> bool {
    dir.len() <= MAX_DIR
        && dir.starts_with('/')
        && dir
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
        && !dir.split('/').any(|part| part == "..")
}

impl Guard {
    /// Admits `session`'s run and says how its sandbox reaches it, with
    /// files the plugin writes under `dir`. The token dies with the
    /// ticket, which the plugin host drops when the call ends.
    pub fn channel(
        self: &Arc<Self>,
        session: &Arc<Session>,
        dir: &str,
    ) -> Result<(Ticket, Channel), ChannelError> {
        if !valid_dir(dir) {
            return Err(ChannelError::BadDir);
        }
        let dir = dir.trim_end_matches('/');
        let ticket = self.admit(session).map_err(ChannelError::Token)?;
        let profile = session.profile();
        let mut files = vec![
            ("host.cjs".to_string(), clients::NODE.as_bytes().to_vec()),
            (
                "sitecustomize.py".to_string(),
                clients::PYTHON.as_bytes().to_vec(),
            ),
        ];
        let mut env = vec![
            format!("PLIMSOLL_GUARD_URL={}", self.dial.url),
            format!("PLIMSOLL_GUARD_TOKEN={}", ticket.token.expose()),
            format!("PLIMSOLL_GRANT_GLOBAL={}", profile.global),
            format!("NODE_OPTIONS=--require={dir}/host.cjs"),
            format!("PYTHONPATH={dir}"),
        ];
        if let Some(pem) = &self.dial.ca_pem {
            files.push(("guard-ca.pem".into(), pem.as_bytes().to_vec()));
            env.push(format!("PLIMSOLL_GUARD_CA={dir}/guard-ca.pem"));
        }
        if let Some(text) = &profile.preamble {
            files.push(("preamble.js".into(), text.as_bytes().to_vec()));
            env.push(format!("PLIMSOLL_GRANT_PREAMBLE={dir}/preamble.js"));
        }
        let channel = Channel {
            host: self.dial.host.clone(),
            port: self.dial.port,
            files,
            env,
        };
        Ok((ticket, channel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_absolute_directories() {
        for ok in ["/tmp/plimsoll", "/home/user/.plimsoll-grant/", "/a_b-c.d"] {
            assert!(valid_dir(ok), "{ok}");
        }
        for bad in [
            "tmp/x",
            "/tmp/a b",
            "/tmp/a:b",
            "/tmp/../etc",
            "/tmp/$(x)",
            "/tmp/'x'",
            "",
        ] {
            assert!(!valid_dir(bad), "{bad}");
        }
        assert!(!valid_dir(&format!("/{}", "a".repeat(MAX_DIR))));
    }
}
