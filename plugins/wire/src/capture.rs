//! A process's output as the API reports it: the first `limit` bytes of
//! each stream, a flag when more came, and a count of everything read so a
//! flood can end the process instead of the run's byte budget. The exit
//! codes every adapter reports a stopped process with are here too.

use crate::bindings::plimsoll::provider::types::ProcessOutput;

/// Everything read from one process, both streams together; past it the
/// process is killed and reported as flooded (by an adapter that counts).
pub const FLOOD_BYTES: u64 = 32 << 20;
/// The exit code of a process ended for flooding its output (or whose
/// output could not be carried whole).
pub const EXIT_FLOODED: i32 = 153;
/// The exit code of a process ended at the run's deadline.
pub const EXIT_TIMED_OUT: i32 = 124;
/// Answer bytes a call may take in before a process's output counts as a
/// flood, whatever its own size: 16 MiB short of the host's 64 MiB per
/// call, so the cleanup's answers (a kill, a delete) still fit.
pub const CALL_RECEIVED_CAP: u64 = 48 << 20;

pub struct Capture {
    limit: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    seen: u64,
}

pub enum Stream {
    Out,
    Err,
}

impl Capture {
    /// Keeps `limit` bytes of each stream.
    pub fn new(limit: usize) -> Capture {
        Capture {
            limit,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            seen: 0,
        }
    }

    /// Keeps what fits of `bytes`; false once the flood cap is passed.
    pub fn add(&mut self, stream: Stream, bytes: &[u8]) -> bool {
        self.seen += bytes.len() as u64;
        let (buf, cut) = match stream {
            Stream::Out => (&mut self.stdout, &mut self.stdout_truncated),
            Stream::Err => (&mut self.stderr, &mut self.stderr_truncated),
        };
        let room = self.limit.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..room.min(bytes.len())]);
        if bytes.len() > room {
            *cut = true;
        }
        self.seen <= FLOOD_BYTES
    }

    pub fn finish(self, exit_code: i32, timed_out: bool) -> ProcessOutput {
        ProcessOutput {
            stdout: self.stdout,
            stderr: self.stderr,
            exit_code,
            timed_out,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
        }
    }

    /// A process ended at the deadline: what it printed so far, flagged.
    pub fn timed_out(self) -> ProcessOutput {
        self.finish(EXIT_TIMED_OUT, true)
    }

    /// A flooded process: both streams flagged, as the reference reports it.
    pub fn flooded(mut self) -> ProcessOutput {
        self.stdout_truncated = true;
        self.stderr_truncated = true;
        self.finish(EXIT_FLOODED, false)
    }
}
