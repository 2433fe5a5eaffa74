//! A run's output streams, capped as they are written.

/// An output stream that keeps at most `limit` bytes and remembers whether it
/// dropped any. Cut on a UTF-8 boundary so the kept part stays text.
pub(super) struct Capped {
    pub(super) buf: Vec<u8>,
    limit: usize,
    pub(super) truncated: bool,
}

impl Capped {
    pub(super) fn new(limit: usize) -> Self {
        Capped {
            buf: Vec::new(),
            limit,
            truncated: false,
        }
    }

    pub(super) fn push_str(&mut self, s: &str) {
        if self.truncated {
            return;
        }
        let room = self.limit - self.buf.len();
        if s.len() <= room {
            self.buf.extend_from_slice(s.as_bytes());
            return;
        }
        let mut cut = room;
        while cut > 0 && !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.buf.extend_from_slice(&s.as_bytes()[..cut]);
        self.truncated = true;
    }

    /// The daemon's own closing line (deadline, memory cap): always kept,
    /// even on a full stream, by giving up the end of the guest's output,
    /// which the truncated flag already says is incomplete.
    pub(super) fn push_notice(&mut self, notice: &str) {
        let notice = &notice.as_bytes()[..notice.len().min(self.limit)];
        if notice.len() > self.limit - self.buf.len() {
            // The buffer holds whole UTF-8 text, so a cut that does not land
            // on a continuation byte (0b10xx_xxxx) leaves it whole.
            let mut keep = self.limit - notice.len();
            while keep > 0 && keep < self.buf.len() && (self.buf[keep] & 0xC0) == 0x80 {
                keep -= 1;
            }
            self.buf.truncate(keep);
            self.truncated = true;
        }
        self.buf.extend_from_slice(notice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_keeps_limit_and_flags() {
        let mut c = Capped::new(5);
        c.push_str("abc");
        c.push_str("déf");
        assert_eq!(c.buf, b"abcd");
        assert!(c.truncated);
        c.push_str("x");
        assert_eq!(c.buf, b"abcd");
    }

    #[test]
    fn notices_survive_a_full_stream() {
        let mut c = Capped::new(10);
        c.push_str("ééééé");
        c.push_notice("stop\n");
        assert_eq!(c.buf.len(), 9, "{:?}", String::from_utf8_lossy(&c.buf));
        assert_eq!(
            std::str::from_utf8(&c.buf).expect("utf-8"),
            "éé".to_string() + "stop\n"
        );
        assert!(c.truncated);
        let mut c = Capped::new(10);
        c.push_str("ab");
        c.push_notice("stop\n");
        assert_eq!(c.buf, b"abstop\n");
        assert!(!c.truncated);
    }

    #[test]
    fn capped_exact_fit_is_not_truncated() {
        let mut c = Capped::new(3);
        c.push_str("abc");
        assert!(!c.truncated);
        assert_eq!(c.buf, b"abc");
    }
}
