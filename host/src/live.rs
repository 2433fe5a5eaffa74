//! Output passed on while a run runs, for a caller that asked to watch it
//! (`RunStream`, MCP progress, `plimsoll run`).
//!
//! A provider sends the bytes it keeps for the run's result, as it keeps
//! them. The sink itself holds every sender to the run's budget: at most the
//! run's output limit per stream, plus room for the daemon's own closing
//! notice, whatever a provider or plugin sends, across all of its clones. So
//! the channel needs no bound of its own, and a watcher that reads slowly
//! never slows the run. The run's result stays the authority. The streamed
//! bytes are what was written before it, and the record's digests cover the
//! result's output. (When a full stream must make room for the daemon's
//! notice, the result gives up the tail of the guest's output that a watcher
//! has already seen.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// Room past the output limit for the daemon's closing notice (a deadline,
/// the memory cap), which is always kept.
pub const NOTICE_ROOM: usize = 512;

/// Which of the run's streams a chunk was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Stdout = 0,
    Stderr = 1,
}

impl Channel {
    pub fn name(self) -> &'static str {
        match self {
            Channel::Stdout => "stdout",
            Channel::Stderr => "stderr",
        }
    }
}

/// Bytes one stream received, in order.
#[derive(Debug)]
pub struct Chunk {
    pub channel: Channel,
    pub bytes: Vec<u8>,
}

/// The sending side, handed to a provider with the job. Cheap to clone
/// (clones share the budget); a send after the watcher went away is dropped
/// without error (the run goes on and its result is still recorded).
#[derive(Clone, Debug)]
pub struct Live {
    tx: mpsc::UnboundedSender<Chunk>,
    /// Bytes each stream may still pass on: stdout, stderr.
    left: Arc<[AtomicUsize; 2]>,
}

impl Live {
    /// A sink for a run whose streams keep at most `output_limit` bytes.
    pub fn channel(output_limit: usize) -> (Live, mpsc::UnboundedReceiver<Chunk>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = output_limit.saturating_add(NOTICE_ROOM);
        let left = Arc::new([AtomicUsize::new(budget), AtomicUsize::new(budget)]);
        (Live { tx, left }, rx)
    }

    /// Passes on what fits of `bytes` in the stream's budget; the rest is
    /// dropped (the result says the stream was truncated).
    pub fn send(&self, channel: Channel, bytes: &[u8]) {
        let left = &self.left[channel as usize];
        let granted = left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n - n.min(bytes.len()))
            })
            .map_or(0, |before| before.min(bytes.len()));
        if granted > 0 {
            let _ = self.tx.send(Chunk {
                channel,
                bytes: bytes[..granted].to_vec(),
            });
        }
    }
}

/// Turns one stream's chunks into text without splitting a character: a
/// sequence cut at a chunk's end waits for the next chunk; bytes that can
/// never be UTF-8 become U+FFFD, as they do in the run's result.
#[derive(Default)]
pub struct Text {
    pending: Vec<u8>,
}

impl Text {
    /// The text that is whole so far.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // The prefix was just checked.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete sequence at the end: keep it.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// What is left when the stream ends (an unfinished sequence).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_chunks_arrives_whole() {
        let mut t = Text::default();
        let e = "é".as_bytes();
        assert_eq!(t.push(&[b'a', e[0]]), "a");
        assert_eq!(t.push(&[e[1], b'b']), "éb");
        assert_eq!(t.finish(), "");
    }

    #[test]
    fn bytes_that_are_never_text_become_replacement_characters() {
        let mut t = Text::default();
        assert_eq!(t.push(&[b'x', 0xff, b'y']), "x\u{fffd}y");
        assert_eq!(t.push(&[0xe2, 0x82]), "");
        assert_eq!(t.finish(), "\u{fffd}");
    }

    #[test]
    fn sends_after_the_watcher_left_are_dropped() {
        let (live, rx) = Live::channel(16);
        drop(rx);
        live.send(Channel::Stdout, b"still running");
    }

    #[test]
    fn every_sender_together_is_held_to_the_runs_budget_per_stream() {
        let (live, mut rx) = Live::channel(10);
        let other = live.clone();
        let big = vec![b'x'; 300];
        live.send(Channel::Stdout, &big);
        other.send(Channel::Stdout, &big);
        other.send(Channel::Stdout, &big);
        live.send(Channel::Stderr, b"e");
        let mut out = 0;
        let mut err = 0;
        while let Ok(c) = rx.try_recv() {
            match c.channel {
                Channel::Stdout => out += c.bytes.len(),
                Channel::Stderr => err += c.bytes.len(),
            }
        }
        assert_eq!(out, 10 + NOTICE_ROOM);
        assert_eq!(err, 1);
    }
}
