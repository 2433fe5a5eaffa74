//! A run watched while it runs: the pipeline's run with a live sink, turned
//! into one ordered sequence of events (output as kept, then the answer).
//! Shared by the Connect `RunStream` procedure and the MCP tools.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::callers::Caller;
use crate::live::{Channel, Chunk, Live};
use crate::pipeline::{Daemon, RunError};
use crate::wire::{RunRequest, RunResponse};

/// One thing a watcher sees, in order: any number of outputs, then `Done`.
pub enum Event {
    Output(Channel, Vec<u8>),
    /// The answer is boxed: it is large and comes once per run.
    Done(Result<Box<RunResponse>, RunError>),
}

/// Events a watcher has not taken yet, at most; more output waits, joined,
/// in the watching task.
const QUEUED: usize = 4;
/// Runs of output waiting to be sent, at most, before they are joined per
/// stream (only a slow watcher of a run that alternates its streams gets
/// there): what waits is then the kept bytes and a constant.
const PENDING_RUNS: usize = 64;

/// Starts `req` and returns its events. The run goes on to its end (and is
/// recorded and audited) even if the receiver is dropped: a watcher that
/// leaves does not stop what it started. A watcher that reads slowly holds
/// at most the run's kept output: the channel is small, and output that
/// waits for room is joined.
pub fn watch(daemon: Arc<Daemon>, req: RunRequest, caller: Arc<Caller>) -> mpsc::Receiver<Event> {
    let (events, rx) = mpsc::channel(QUEUED);
    let (live, mut chunks) = Live::channel(daemon.output_limit());
    tokio::spawn(async move {
        let run = daemon.run_watched(req, caller, Some(live));
        tokio::pin!(run);
        let mut pending = Pending::default();
        let mut answer = None;
        let mut sent_output = false;
        loop {
            if answer.is_some() {
                // Output kept before the run ended, not yet taken.
                while let Ok(chunk) = chunks.try_recv() {
                    pending.push(chunk);
                }
                if pending.is_empty() {
                    break;
                }
            }
            tokio::select! {
                biased;
                permit = events.reserve(), if !pending.is_empty() => {
                    let Ok(permit) = permit else { break };
                    if let Some((channel, bytes)) = pending.pop() {
                        sent_output = true;
                        permit.send(Event::Output(channel, bytes));
                    }
                }
                Some(chunk) = chunks.recv() => pending.push(chunk),
                done = &mut run, if answer.is_none() => answer = Some(done),
            }
        }
        let Some(answer) = answer else {
            // The watcher left; the run still ends, recorded, on its own.
            return;
        };
        let answer = match answer {
            // Nothing a refusal says may follow output: if any was sent,
            // the answer cannot be "nothing ran" (no path does this; the
            // rule is kept here so none can).
            Err(RunError::Refused(r)) if sent_output => Err(RunError::Internal {
                id: crate::pipeline::internal_id(&r.message),
                detail: "a refusal after output".into(),
            }),
            other => other.map(Box::new),
        };
        let _ = events.send(Event::Done(answer)).await;
    });
    rx
}

/// Output waiting for the watcher, in order, each run of one stream joined.
#[derive(Default)]
struct Pending(std::collections::VecDeque<(Channel, Vec<u8>)>);

impl Pending {
    fn push(&mut self, chunk: Chunk) {
        match self.0.back_mut() {
            Some((channel, bytes)) if *channel == chunk.channel => {
                bytes.extend_from_slice(&chunk.bytes);
            }
            _ => self.0.push_back((chunk.channel, chunk.bytes)),
        }
        if self.0.len() > PENDING_RUNS {
            // Join per stream: the order between the two streams is given
            // up, never a byte.
            let (mut out, mut err) = (Vec::new(), Vec::new());
            for (channel, bytes) in self.0.drain(..) {
                match channel {
                    Channel::Stdout => out.extend_from_slice(&bytes),
                    Channel::Stderr => err.extend_from_slice(&bytes),
                }
            }
            self.0.push_back((Channel::Stdout, out));
            self.0.push_back((Channel::Stderr, err));
        }
    }

    fn pop(&mut self) -> Option<(Channel, Vec<u8>)> {
        self.0.pop_front()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(channel: Channel, b: &[u8]) -> Chunk {
        Chunk {
            channel,
            bytes: b.to_vec(),
        }
    }

    #[test]
    fn waiting_output_is_joined_and_never_grows_past_its_bytes() {
        let mut p = Pending::default();
        for i in 0..10_000 {
            let channel = if i % 2 == 0 {
                Channel::Stdout
            } else {
                Channel::Stderr
            };
            p.push(chunk(channel, b"x"));
            assert!(p.0.len() <= PENDING_RUNS + 1);
        }
        let total: usize = p.0.iter().map(|(_, b)| b.len()).sum();
        assert_eq!(total, 10_000, "no byte lost");
        let mut q = Pending::default();
        q.push(chunk(Channel::Stdout, b"a"));
        q.push(chunk(Channel::Stdout, b"b"));
        q.push(chunk(Channel::Stderr, b"c"));
        assert_eq!(q.pop(), Some((Channel::Stdout, b"ab".to_vec())));
        assert_eq!(q.pop(), Some((Channel::Stderr, b"c".to_vec())));
    }
}
