//! Signed runs: the same HTTP Run, answered and read as JSON, alternated
//! run by run with the same Run whose answer is then signed into a bundle
//! (`bundle::Appender`, held open as a long-lived signer holds it: the
//! record checked, two statements signed, the line and a new checkpoint
//! written, synced when the signer says). The one-shot append that
//! `plimsoll attest run` makes (open, check, sign, write, sync) is timed
//! on its own.
//! The difference of the medians is what signing and appending add to a
//! run; the append alone is timed too, to say where it goes.

use std::time::Instant;

use plimsoll::attest::bundle::{self, Appender, Durability, Sharing};
use plimsoll::attest::keys::{self, SigningKey};
use plimsoll_tests::{Daemon, js_run};
use serde_json::Value;

use crate::SNIPPET;
use crate::stats::summary;

pub async fn attest(d: &Daemon, n: usize) {
    let dir = plimsoll_tests::Scratch::new("bench-attest");
    keys::generate(&dir.path("signer")).expect("keygen");
    let key = SigningKey::load(&dir.path("signer.key")).expect("key");
    let bundle_path = dir.path("runs.jsonl");
    let c = plimsoll_tests::client();
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let request = js_run(SNIPPET);
    let body = serde_json::to_vec(&request).expect("json");
    let run = || async {
        let r = c
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("sent");
        assert!(r.status().is_success(), "a benchmark run was refused");
        r.json::<Value>().await.expect("a JSON answer")
    };
    // As a long-lived signer holds it (an agent platform signing each run
    // it makes): the checkpoint checked once, the file kept locked.
    let mut bundle =
        Appender::open(&bundle_path, &key, Sharing::Private, Durability::Buffered).expect("bundle");
    let (mut plain, mut signed, mut append) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        std::hint::black_box(run().await);
        plain.push(t.elapsed());

        let t = Instant::now();
        let answer = run().await;
        let a = Instant::now();
        bundle.append_run(&request, &answer).expect("signed");
        append.push(a.elapsed());
        signed.push(t.elapsed());
    }
    bundle.sync().expect("synced");
    drop(bundle);
    // What `plimsoll attest run` does per run: open, lock, check the
    // checkpoint, sign, write, sync.
    let answer = run().await;
    let mut one_shot = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        bundle::append_run(&bundle_path, &key, Sharing::Private, &request, &answer)
            .expect("signed");
        one_shot.push(t.elapsed());
    }
    let plain = summary("HTTP Run, answer read as JSON (unsigned)", plain);
    let signed = summary("the same, signed into a bundle", signed);
    summary("  the append alone (check, two signatures, write)", append);
    summary(
        "  one append as `attest run` makes it (open, check the checkpoint, sign, write, sync)",
        one_shot,
    );
    println!(
        "|   signing and appending add | | {:+.3} ms | | |",
        (signed.as_secs_f64() - plain.as_secs_f64()) * 1e3
    );
    let bytes = std::fs::metadata(&bundle_path).map_or(0, |m| m.len());
    println!(
        "|   bundle after {} runs | | {:.1} KiB | | |",
        2 * n,
        bytes as f64 / 1024.0
    );
}
