//! "Nothing ran", proved rather than assumed. A refused request carries a
//! canary trace ID; a later sentinel run is answered and its audit line
//! read. Lines arrive in order on one stream, so every line logged before
//! the sentinel's is in by then, and none may carry a canary: every run
//! that may have started gets an audit line, answered or failed.

use std::time::{Duration, Instant};

use crate::{Answer, Daemon, metrics_text};

/// A trace ID no other request of this test process carries.
pub fn canary(what: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "canary-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Whether any line of the daemon's log carries `trace` (quoted, as the
/// JSON audit line writes it, so one canary is never another's prefix).
pub fn logged(d: &Daemon, trace: &str) -> bool {
    let quoted = format!("\"{trace}\"");
    d.log_lines().iter().any(|l| l.contains(&quoted))
}

/// Asserts no request tagged with one of `traces` ran: `send` sends a
/// sentinel run tagged with the trace it is given (tried again while it is
/// refused for capacity, as it may be until a place given back elsewhere
/// is seen, for up to 10 s), then its audit line is waited for.
pub async fn assert_never_ran<F, Fut>(d: &Daemon, traces: &[&str], mut send: F)
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let tag = canary("sentinel");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let a = send(tag.clone()).await;
        if a.status == 200 {
            break;
        }
        assert_eq!(a.mark(), Some("capacity"), "the sentinel run: {:?}", a.body);
        assert!(
            Instant::now() < deadline,
            "the sentinel run was refused for 10 s: {:?}",
            a.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !logged(d, &tag) {
        assert!(
            Instant::now() < deadline,
            "the sentinel's audit line never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for trace in traces {
        assert!(!logged(d, trace), "a refused request ran: {trace}");
    }
}

/// The value of a counter or gauge on the daemon's `/metrics` now.
pub async fn metric(d: &Daemon, series: &str) -> u64 {
    let text = metrics_text(d).await;
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} is not served:\n{text}"))
}
