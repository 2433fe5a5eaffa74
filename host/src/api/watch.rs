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

/// Starts `req` and returns its events. The run goes on to its end (and is
/// recorded and audited) even if the receiver is dropped: a watcher that
/// leaves does not stop what it started.
pub fn watch(
    daemon: Arc<Daemon>,
    req: RunRequest,
    caller: Arc<Caller>,
) -> mpsc::UnboundedReceiver<Event> {
    let (events, rx) = mpsc::unbounded_channel();
    let (live, mut chunks) = Live::channel();
    tokio::spawn(async move {
        let run = daemon.run_watched(req, caller, Some(live));
        tokio::pin!(run);
        let answer = loop {
            tokio::select! {
                // Output before the answer, whenever both are ready.
                biased;
                Some(chunk) = chunks.recv() => forward(&events, chunk, &mut chunks),
                answer = &mut run => break answer,
            }
        };
        // Output kept before the run ended but not yet forwarded.
        if let Ok(chunk) = chunks.try_recv() {
            forward(&events, chunk, &mut chunks);
        }
        let _ = events.send(Event::Done(answer.map(Box::new)));
    });
    rx
}

/// Sends `first` joined with every chunk already waiting, one event per run
/// of the same stream: a guest that writes a line in pieces costs a watcher
/// one message, not one per piece, and nothing waits to be joined.
fn forward(
    events: &mpsc::UnboundedSender<Event>,
    first: Chunk,
    chunks: &mut mpsc::UnboundedReceiver<Chunk>,
) {
    let (mut channel, mut bytes) = (first.channel, first.bytes);
    while let Ok(next) = chunks.try_recv() {
        if next.channel == channel {
            bytes.extend_from_slice(&next.bytes);
        } else {
            let _ = events.send(Event::Output(channel, std::mem::take(&mut bytes)));
            (channel, bytes) = (next.channel, next.bytes);
        }
    }
    let _ = events.send(Event::Output(channel, bytes));
}
