//! Advice after a granted run, through the real daemon: thirteen reads of a
//! per-item route answered with one suggested batch call, in the answer only
//! for a profile that gives advice to its callers, in the audit line as
//! counts (and route templates when detail is kept), in /metrics as counts;
//! nothing for failed reads; and the item IDs the snippet used (canaries)
//! nowhere in any of it.

use std::sync::{Arc, Mutex};

use plimsoll_tests::{Daemon, call, js_run};
use serde_json::{Value, json};

/// The API: `GET /items/ID` answers the item; `GET /gone/ID` 404.
async fn api() -> (String, Arc<Mutex<u32>>) {
    let hits = Arc::new(Mutex::new(0));
    let seen = hits.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let seen = seen.clone();
        async move {
            use axum::response::IntoResponse;
            *seen.lock().unwrap() += 1;
            match uri.path().strip_prefix("/items/") {
                Some(id) => axum::Json(json!({"id": id})).into_response(),
                None => (axum::http::StatusCode::NOT_FOUND, "gone").into_response(),
            }
        }
    });
    (plimsoll_tests::serve_loopback(app).await, hits)
}

struct Setup {
    d: Daemon,
    file: std::path::PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

async fn setup(advice: &str, retention: &str) -> (Setup, Arc<Mutex<u32>>) {
    let (origin, hits) = api().await;
    let grants = json!({"profiles": {"shop": {
        "base_url": origin,
        "allow": ["GET /items/*", "GET /items", "GET /gone/*"],
        "allowed_callers": ["anonymous"],
        "global": "shop",
        "batch_of": {"GET /items": ["GET /items/*"]},
        "advice": advice,
        "advice_retention": retention,
    }}});
    let file = std::env::temp_dir().join(format!(
        "plimsoll-advice-{advice}-{}.json",
        std::process::id()
    ));
    std::fs::write(&file, grants.to_string()).expect("grants file");
    let path = file.display().to_string();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_GRANTS_FILE", &path),
    ]);
    (Setup { d, file }, hits)
}

fn canary(i: u32) -> String {
    format!("canaryitem{i}x{}", std::process::id())
}

/// The N+1 an agent writes: one call per item, thirteen items.
fn fan_out(route: &str) -> Value {
    let ids: Vec<String> = (0..13).map(canary).collect();
    let code = format!(
        "for (const id of {}) {{ try {{ await shop.get('/{route}/' + id) }} catch (e) {{}} }}",
        serde_json::to_string(&ids).unwrap()
    );
    let mut r = js_run(&code);
    r["javascript"]["grantProfile"] = json!("shop");
    r
}

fn assert_no_canary(text: &str, where_: &str) {
    for i in 0..13 {
        assert!(
            !text.contains(&canary(i)),
            "{where_} holds an item id: {text}"
        );
    }
}

async fn audit_lines(d: &Daemon) -> Vec<String> {
    d.audit_after_sentinel().await;
    d.log_lines()
        .into_iter()
        .filter(|l| l.contains("\"grant_profile\":\"shop\""))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirteen_item_reads_become_one_suggested_batch_call() {
    let (s, hits) = setup("caller", "detailed").await;
    let a = call(&s.d, "Run", &fan_out("items")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(*hits.lock().unwrap(), 13);
    let advice = &a.body["javascript"]["advice"];
    assert_eq!(
        advice,
        &json!([{
            "pattern": "fan_out", "severity": "medium", "remedy": "batch",
            "method": "GET", "route": "/items/*", "calls": 13, "extraCalls": 12,
            "addedLatencyMs": advice[0]["addedLatencyMs"], "bytesMoved": advice[0]["bytesMoved"],
            "suggestedRoute": "GET /items", "suggestedCalls": 1, "agentFixable": true,
        }]),
        "{advice}"
    );
    assert_no_canary(&a.body.to_string(), "the answer");

    let audit = audit_lines(&s.d).await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].contains("\"advice_findings\":1"), "{}", audit[0]);
    assert!(
        audit[0].contains("\"advice_extra_calls\":12"),
        "{}",
        audit[0]
    );
    assert!(
        audit[0].contains("suggestedRoute"),
        "detail is kept: {}",
        audit[0]
    );
    for line in s.d.log_lines() {
        assert_no_canary(&line, "the log");
    }
    let metrics = plimsoll_tests::metrics_text(&s.d).await;
    assert!(
        metrics.contains(
            "plimsoll_advice_findings_total{agent_fixable=\"true\",pattern=\"fan_out\",profile=\"shop\",remedy=\"batch\",severity=\"medium\"} 1"
        ),
        "{metrics}"
    );
    assert_no_canary(&metrics, "/metrics");

    // Thirteen reads that failed are no finding: nothing was fetched twice.
    let a = call(&s.d, "Run", &fan_out("gone")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert!(a.body["javascript"].get("advice").is_none(), "{:?}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_advice_stays_out_of_the_answer() {
    let (s, _) = setup("operator", "aggregate").await;
    let a = call(&s.d, "Run", &fan_out("items")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert!(a.body["javascript"].get("advice").is_none(), "{:?}", a.body);
    let audit = audit_lines(&s.d).await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].contains("\"advice_findings\":1"), "{}", audit[0]);
    assert!(
        !audit[0].contains("suggestedRoute"),
        "aggregate keeps counts only"
    );
}
