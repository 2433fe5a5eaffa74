//! The end frame of a pre-booted run: how a pre-booted process says "my
//! output is complete, and this is my exit code" before the engine could.
//!
//! The engine reports an exit only after the process is gone, its streams
//! have drained and the runtime has done its bookkeeping: tens of
//! milliseconds the caller waits for nothing. A pre-booted process may
//! instead end stderr with `\0plimsoll-end:<nonce>\n` and stdout with
//! `\0plimsoll-end:<nonce>:<code>\n`, where the nonce is the host's, fresh
//! for each container. Once both are in, the host answers.
//!
//! What the frame can claim is only what the process could always claim by
//! exiting: that it has no more output, and its exit code. The deadline,
//! the limits and the truncation flags stay the host's, counted on the
//! bytes before the frames. Output after a frame is not the run's (as
//! output after an exit would not be), a wrong nonce is just
//! output, and a malformed frame with the right nonce turns framing off
//! for the run, which then ends the engine's way. A watcher never sees a
//! byte the result will not keep: a tail that could begin a frame is held
//! back until the next bytes decide it.

/// What the host writes before the nonce.
const TAG: &[u8] = b"\0plimsoll-end:";
/// Most digits an exit code may have.
const CODE_DIGITS: usize = 3;

/// Both streams of one run, scanned for their end frames.
pub(super) struct Framer {
    stdout: Scan,
    stderr: Scan,
}

/// One stream's scan.
struct Scan {
    /// The whole frame up to the exit code (stdout) or to its end (stderr).
    marker: Vec<u8>,
    /// Whether an exit code follows the marker.
    coded: bool,
    /// Where the nonce ends in the marker: a held tail that long or longer
    /// is the host's frame, cut short.
    nonce_end: usize,
    /// Bytes that may begin a frame, not yet output.
    held: Vec<u8>,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// The frame arrived (with its code, on stdout).
    Ended(Option<u8>),
    /// A malformed frame: no framing for this run.
    Off,
}

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stream {
    Stdout,
    Stderr,
}

impl Framer {
    pub(super) fn new(nonce: &str) -> Framer {
        let marker = |tail: &str| [TAG, nonce.as_bytes(), tail.as_bytes()].concat();
        let nonce_end = TAG.len() + nonce.len();
        Framer {
            stdout: Scan::new(marker(":"), true, nonce_end),
            stderr: Scan::new(marker("\n"), false, nonce_end),
        }
    }

    /// The part of `data` that is output now, in order; bytes that may
    /// begin a frame wait for the next chunk.
    pub(super) fn feed(&mut self, stream: Stream, data: &[u8]) -> Vec<u8> {
        let out = match stream {
            Stream::Stdout => self.stdout.feed(data),
            Stream::Stderr => self.stderr.feed(data),
        };
        if self.stdout.state == State::Off || self.stderr.state == State::Off {
            self.stdout.state = State::Off;
            self.stderr.state = State::Off;
        }
        out
    }

    /// The exit code, once both frames are in.
    pub(super) fn ended(&self) -> Option<i32> {
        match (self.stdout.state, self.stderr.state) {
            (State::Ended(Some(code)), State::Ended(_)) => Some(i32::from(code)),
            _ => None,
        }
    }

    /// At the end of a stream that had no frame: the bytes held back are
    /// output after all, unless they are a frame cut short (the process
    /// exited mid-write), which no run without frames would print.
    pub(super) fn flush(&mut self, stream: Stream) -> Vec<u8> {
        let scan = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        let held = std::mem::take(&mut scan.held);
        let torn = held.len() >= scan.nonce_end && scan.marker.starts_with(&held[..scan.nonce_end]);
        if torn && scan.state == State::Open {
            return Vec::new();
        }
        held
    }
}

impl Scan {
    fn new(marker: Vec<u8>, coded: bool, nonce_end: usize) -> Scan {
        Scan {
            marker,
            coded,
            nonce_end,
            held: Vec::new(),
            state: State::Open,
        }
    }

    fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        match self.state {
            State::Ended(_) => return Vec::new(),
            State::Off => {
                let mut out = std::mem::take(&mut self.held);
                out.extend_from_slice(data);
                return out;
            }
            State::Open => {}
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(data);
        let Some(at) = find(&buf, &self.marker) else {
            // Hold back the longest tail that could still become a frame.
            let keep = longest_prefix_tail(&buf, &self.marker);
            self.held = buf.split_off(buf.len() - keep);
            return buf;
        };
        if !self.coded {
            self.state = State::Ended(None);
            buf.truncate(at);
            return buf;
        }
        let rest = &buf[at + self.marker.len()..];
        match code(rest) {
            Code::Done(code) => {
                self.state = State::Ended(Some(code));
                buf.truncate(at);
                buf
            }
            Code::More => {
                self.held = buf.split_off(at);
                buf
            }
            Code::Malformed => {
                self.state = State::Off;
                buf
            }
        }
    }
}

enum Code {
    Done(u8),
    More,
    Malformed,
}

/// Reads `<0..255>\n` from the start of `rest`.
fn code(rest: &[u8]) -> Code {
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits > CODE_DIGITS {
        return Code::Malformed;
    }
    match rest.get(digits) {
        None => Code::More,
        Some(b'\n') if digits > 0 => std::str::from_utf8(&rest[..digits])
            .ok()
            .and_then(|d| d.parse::<u8>().ok())
            .map_or(Code::Malformed, Code::Done),
        Some(_) => Code::Malformed,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest tail of `buf` that is a proper prefix of
/// `marker`.
fn longest_prefix_tail(buf: &[u8], marker: &[u8]) -> usize {
    let most = buf.len().min(marker.len() - 1);
    (1..=most)
        .rev()
        .find(|&n| buf[buf.len() - n..] == marker[..n])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "6e6f6e6365";

    fn frames(code: &str) -> (Vec<u8>, Vec<u8>) {
        (
            format!("\0plimsoll-end:{N}:{code}\n").into_bytes(),
            format!("\0plimsoll-end:{N}\n").into_bytes(),
        )
    }

    #[test]
    fn output_before_both_frames_is_the_run_and_the_code_is_the_frames() {
        let mut f = Framer::new(N);
        let (out, err) = frames("3");
        assert_eq!(f.feed(Stream::Stdout, b"hello\n"), b"hello\n");
        assert_eq!(f.feed(Stream::Stdout, &out), b"");
        assert_eq!(f.ended(), None, "stderr may still have output");
        assert_eq!(
            f.feed(Stream::Stderr, &[b"warn\n".as_slice(), &err].concat()),
            b"warn\n"
        );
        assert_eq!(f.ended(), Some(3));
    }

    #[test]
    fn a_frame_split_across_chunks_is_held_back_then_found() {
        let mut f = Framer::new(N);
        let (out, err) = frames("255");
        let all = [b"abc".as_slice(), &out].concat();
        let mut seen = Vec::new();
        for byte in all.chunks(1) {
            seen.extend(f.feed(Stream::Stdout, byte));
        }
        assert_eq!(seen, b"abc", "no byte of the frame reached a watcher");
        f.feed(Stream::Stderr, &err);
        assert_eq!(f.ended(), Some(255));
    }

    #[test]
    fn output_after_a_frame_is_not_the_runs() {
        let mut f = Framer::new(N);
        let (out, err) = frames("0");
        let chunk = [b"kept".as_slice(), &out, b"after"].concat();
        assert_eq!(f.feed(Stream::Stdout, &chunk), b"kept");
        assert_eq!(f.feed(Stream::Stdout, b"more"), b"");
        assert_eq!(
            f.feed(Stream::Stderr, &[err.as_slice(), b"late"].concat()),
            b""
        );
        assert_eq!(f.ended(), Some(0));
    }

    #[test]
    fn a_wrong_nonce_is_just_output() {
        let mut f = Framer::new(N);
        let forged = b"\0plimsoll-end:0000:0\n\0plimsoll-end:0000\n";
        let mut seen = f.feed(Stream::Stdout, forged);
        seen.extend(f.flush(Stream::Stdout));
        assert_eq!(seen, forged);
        assert_eq!(f.ended(), None);
    }

    #[test]
    fn a_malformed_frame_turns_framing_off_for_the_run() {
        for bad in ["x", "1234", "", "-1", "256"] {
            let mut f = Framer::new(N);
            let (_, err) = frames("0");
            let frame = format!("\0plimsoll-end:{N}:{bad}\n").into_bytes();
            let seen = f.feed(Stream::Stdout, &frame);
            assert_eq!(seen, frame, "{bad:?}: the bytes are output");
            assert_eq!(f.feed(Stream::Stderr, &err), err, "{bad:?}: off for both");
            assert_eq!(f.ended(), None, "{bad:?}");
        }
    }

    #[test]
    fn an_incomplete_code_waits_and_a_prefix_at_the_end_is_output() {
        let mut f = Framer::new(N);
        let frame = format!("\0plimsoll-end:{N}:12").into_bytes();
        assert_eq!(f.feed(Stream::Stdout, &frame), b"");
        assert_eq!(
            f.flush(Stream::Stdout),
            b"",
            "a frame cut short is not output"
        );
        let short = format!("\0plimsoll-end:{}", &N[..4]).into_bytes();
        assert_eq!(f.feed(Stream::Stderr, &short), b"");
        assert_eq!(f.flush(Stream::Stderr), short, "too short to be the host's");
        let mut g = Framer::new(N);
        assert_eq!(g.feed(Stream::Stderr, b"x\0plim"), b"x");
        assert_eq!(g.feed(Stream::Stderr, b"ited"), b"\0plimited");
    }
}
