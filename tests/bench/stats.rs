//! How the benchmark reports: percentiles of a batch as one table row, and
//! the minor page faults a batch took, read from the kernel's count for
//! the thread that ran it.

use std::time::Duration;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Prints one row; returns the p50.
pub fn summary(name: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let p50 = percentile(&v, 0.5);
    println!(
        "| {name} | {} | {:.3} ms | {:.3} ms | {:.3} ms |",
        v.len(),
        p50.as_secs_f64() * 1e3,
        percentile(&v, 0.99).as_secs_f64() * 1e3,
        v[0].as_secs_f64() * 1e3
    );
    p50
}

/// Minor page faults this thread has taken so far (`/proc/thread-self/stat`,
/// field 10): a wasm run's faults are the pages its instance touched.
pub fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name, which is in parentheses: state is the
    // first, minflt the eighth.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(7)?.parse().ok()
}

/// The row under a timing: minor faults per run since `before`.
pub fn faults_row(before: Option<u64>, n: usize) {
    let per_run = match (before, minor_faults()) {
        (Some(b), Some(a)) => (a - b) as f64 / n as f64,
        _ => f64::NAN,
    };
    println!("|   page faults per run | {n} | {per_run:.1} | | |");
}
