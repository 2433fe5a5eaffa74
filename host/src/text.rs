//! Bounding text that crosses a trust boundary (a plugin's message into a
//! log line or an answer, an error's detail into the log).

/// At most `max` bytes of `s`, cut on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `truncate`, with control characters replaced, so untrusted text cannot
/// forge a log line or a terminal escape.
pub fn sanitize(s: &str, max: usize) -> String {
    truncate(s, max)
        .chars()
        .map(|c| {
            if c.is_control() || invisible(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// Characters that change how surrounding text reads without showing
/// themselves: line and paragraph separators, zero-width and bidi controls.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_boundaries_and_replaces_controls() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(sanitize("a\nb\u{1b}[31m", 100), "a b [31m");
        assert_eq!(sanitize("x\u{2028}y\u{202E}z", 100), "x y z");
    }
}
