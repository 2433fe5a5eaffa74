//! The hostile test plugin and the servers it attacks, shared by the
//! plugin suites (`plugins.rs`, `plugin_network.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Daemon, test_plugin_dir};

/// A real HTTP server on loopback that counts every request it receives, so
/// a test can prove a refused request never left the host.
pub async fn recording_server() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            "{}"
        }
    });
    (crate::serve_loopback(app).await, hits)
}

/// The hostile plugin with every capability granted, and `extra`.
pub fn hostile_with(origin: &str, extra: &[(&str, &str)]) -> Daemon {
    let dir = test_plugin_dir().display().to_string();
    let image = crate::sandbox_image();
    let mut env = vec![
        ("SANDBOX_PROVIDER", "hostile"),
        ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
        ("SANDBOX_PLUGIN_HTTP_ORIGINS", origin),
        ("SANDBOX_PLUGIN_CONTAINER_ENGINE", "1"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_MEMORY_MB", "64"),
    ];
    if !extra.iter().any(|(k, _)| *k == "SANDBOX_DOCKER_POOL") {
        env.push(("SANDBOX_DOCKER_POOL", "0"));
    }
    env.extend_from_slice(extra);
    Daemon::start(&env)
}

/// None of the URLs, hosts or header values the hostile plugin tried
/// reached the operator's log (call after `audit_after_sentinel`).
pub fn assert_no_attack_in_log(d: &Daemon) {
    let log = d.log_lines().join("\n");
    for canary in [
        "evil.example",
        "169.254.169.254",
        "etc/passwd",
        "stolen",
        "X-Injected",
        "user:pw",
    ] {
        assert!(!log.contains(canary), "{canary} reached the log");
    }
}
