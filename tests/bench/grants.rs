//! What a grant's SDK and its advice cost a run.
//!
//! - preamble: the same granted wasm run in this process, once with the
//!   profile the generator made from the Petstore document (its SDK runs
//!   before the snippet) and once with the same profile without it,
//!   alternated run by run so drift hits both alike; the difference of the
//!   medians is what the SDK adds.
//! - advice: working out the findings of a full 256-call trace against a
//!   20-route profile, alone (it runs after the run, on its trace).

use std::sync::Arc;
use std::time::{Duration, Instant};

use plimsoll::grants::advice;
use plimsoll::grants::broker::{CallRow, CallTrace, Session};
use plimsoll::grants::specgen::{Format, Options, generate};
use plimsoll::grants::{ANONYMOUS, Grants, Profile};
use plimsoll::providers::wasm::WasmProvider;

use crate::stats::summary;

fn petstore_profile(with_sdk: bool) -> Arc<Profile> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/openapi/petstore.yaml"
    ))
    .expect("fixture");
    let out = generate(
        &text,
        Format::Yaml,
        &Options {
            base_url: "http://127.0.0.1:9".into(),
            profile: "petstore".into(),
            global: "petstore".into(),
            callers: vec![ANONYMOUS.into()],
            renames: Default::default(),
            health_check: None,
            batches: Default::default(),
            skip_refs: false,
        },
    )
    .expect("generates");
    let mut profile: serde_json::Value = serde_json::from_str(&out.profile_json).expect("json");
    let p = profile["profiles"]["petstore"]
        .as_object_mut()
        .expect("profile");
    p.remove("preamble_file");
    if with_sdk {
        p.insert("preamble".into(), out.sdk_js.into());
    }
    let grants = Grants::parse(&profile.to_string(), &|_| None, None).expect("loads");
    grants.for_caller("petstore", ANONYMOUS).expect("profile")
}

pub async fn preamble(n: usize) {
    let w = WasmProvider::new(256, 8, 64 << 10).expect("wasm provider");
    let client = plimsoll::outbound::client().expect("client");
    let (with, without) = (petstore_profile(true), petstore_profile(false));
    let code = "console.log(typeof petstore.getPetById)";
    let run = |p: &Arc<Profile>| {
        let session = Session::open(p.clone(), ANONYMOUS, Duration::from_secs(5), client.clone())
            .expect("session");
        let w = &w;
        async move {
            let t = Instant::now();
            let out = w
                .run_granted(code, Duration::from_secs(5), Some(Arc::new(session)), None)
                .await
                .expect("run");
            (t.elapsed(), out.stdout)
        }
    };
    for _ in 0..200 {
        run(&with).await;
        run(&without).await;
    }
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (t, out) = run(&with).await;
        assert_eq!(out, b"function\n");
        a.push(t);
        let (t, out) = run(&without).await;
        assert_eq!(out, b"undefined\n");
        b.push(t);
    }
    let with_p50 = summary("granted wasm run with the Petstore SDK", a);
    let without_p50 = summary("the same run, profile without the SDK", b);
    println!(
        "| what the SDK adds to a run (p50 difference) | | {:.3} ms | | |",
        (with_p50.as_secs_f64() - without_p50.as_secs_f64()) * 1e3
    );
}

pub fn advice(n: usize) {
    let routes: Vec<String> = (0..10)
        .flat_map(|i| [format!("GET /r{i}/*"), format!("GET /r{i}")])
        .collect();
    let text = serde_json::json!({"profiles": {"p": {
        "base_url": "https://api.example.com", "allow": routes,
        "allowed_callers": ["*"], "advice": "caller",
        "batch_of": {"GET /r0": ["GET /r0/*"]},
    }}});
    let grants = Grants::parse(&text.to_string(), &|_| None, None).expect("loads");
    let profile = grants.for_caller("p", ANONYMOUS).expect("profile");
    // A full trace: fan-out, repeats, failures, spread over the routes.
    let trace = CallTrace {
        calls: (0..256u32)
            .map(|i| CallRow {
                seq: i + 1,
                method: "GET",
                route: String::new(),
                status: if i % 7 == 0 { 404 } else { 200 },
                delivered: true,
                request_bytes: 0,
                response_bytes: 512,
                latency_ms: 3,
                allow_index: i % 20,
            })
            .collect(),
        ..CallTrace::default()
    };
    assert!(!advice::assess(&trace, &profile).is_empty());
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let found = advice::assess(std::hint::black_box(&trace), &profile);
        v.push(t.elapsed());
        std::hint::black_box(found);
    }
    summary("advice over a 256-call trace, 20 routes", v);
}
