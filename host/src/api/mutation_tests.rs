//! Mangled requests through the parser and admission: whatever the
//! bytes, the answer is a clean refusal or a request that validates, and
//! nothing panics. A deterministic generator, so a failure reproduces.

use super::connect::parse_run;
use crate::admission::{Limits, validate};
use crate::refusal::Reason;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: enough spread for mutation, and reproducible.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const SEEDS: &[&str] = &[
    r#"{"protocol":4,"javascript":{"code":"console.log(1)","grantProfile":"p"}}"#,
    r#"{"protocol":"4","minimumIsolation":"kernel","traceId":"a:b","timeoutMs":"1500","softwareRule":{"mode":"approved","identities":["a:1","b:2"]},"javascript":{"code":"x"}}"#,
    r#"{"protocol":4,"project":{"files":[{"path":"a/b.txt","content":"hi"}],"steps":["cat a/b.txt"],"artifacts":["a/b.txt"]}}"#,
    r#"{"protocol":4,"module":{"model":"m1","rows":[{"values":[1,2.5,"NaN"]}],"endTime":1,"step":0.1}}"#,
    r#"{"protocol":4,"cell":{"language":"javascript","code":"1","files":[]}}"#,
];
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "-0",
    "1e309",
    "4.0",
    "\"4\"",
    "\\u0000",
    "\\ud800",
    "\"javascript\"",
    "\"protocol\"",
    "\"files\"",
    "[[]]",
    "{}",
    "9223372036854775808",
    "\u{feff}",
];

#[test]
fn mangled_requests_never_panic() {
    let limits = Limits::new(8);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut accepted = 0usize;
    for round in 0..60_000 {
        let seed = SEEDS[round % SEEDS.len()].as_bytes();
        let mut body = seed.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(body.len() + 1);
            match rng.below(4) {
                0 if !body.is_empty() => {
                    let end = (at + 1 + rng.below(8)).min(body.len());
                    body.drain(at.min(end)..end);
                }
                1 => {
                    let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                    body.splice(at..at, t.iter().copied()).for_each(drop);
                }
                2 if at < body.len() => body[at] = rng.next() as u8,
                _ => body.insert(at, rng.next() as u8),
            };
        }
        match parse_run(&body) {
            Ok(req) => {
                // A request that parses either validates or is refused
                // as a request; it never reaches anything else.
                if let Err(r) = validate(&req, &limits) {
                    assert_eq!(
                        r.reason,
                        Reason::Request,
                        "{}",
                        String::from_utf8_lossy(&body)
                    );
                } else {
                    accepted += 1;
                }
            }
            Err(r) => assert!(
                matches!(r.reason, Reason::Request | Reason::Protocol),
                "{:?} for {}",
                r.reason,
                String::from_utf8_lossy(&body)
            ),
        }
    }
    // The generator is not so destructive that nothing gets through.
    assert!(
        accepted > 1_000,
        "only {accepted} mutated requests were valid"
    );
}
