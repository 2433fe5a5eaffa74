//! Helpers for tests of several replicas (shared state, sessions across
//! replicas): a clients file, calls to one replica by URL, and a fleet of
//! replicas that forward session calls to each other.

use std::path::Path;

use serde_json::{Value, json};

use crate::{Answer, Daemon, Scratch};

/// A clients file with these callers (ID, paid seconds per day); returns
/// each caller's token, in order.
pub fn clients(file: &Path, callers: &[(&str, Option<u64>)]) -> Vec<String> {
    let mut entries = Vec::new();
    let mut tokens = Vec::new();
    for (id, paid) in callers {
        let token = plimsoll::callers::new_token().expect("token");
        let mut e = json!({
            "id": id,
            "token_sha256": plimsoll::callers::fingerprint(&token),
            "scopes": ["code:run"],
        });
        if let Some(p) = paid {
            e["paid_seconds_per_day"] = json!(p);
        }
        entries.push(e);
        tokens.push(token);
    }
    std::fs::write(file, json!({ "clients": entries }).to_string()).expect("clients file");
    tokens
}

pub async fn run(d: &Daemon, token: &str, code: &str) -> Answer {
    run_at(d.url("/plimsoll.v1.SandboxService/Run"), token, code).await
}

pub async fn run_at(url: String, token: &str, code: &str) -> Answer {
    let r = crate::client()
        .post(url)
        .header("authorization", format!("Bearer {token}"))
        .json(&json!({"protocol": 4, "javascript": {"code": code}, "timeoutMs": 20000}))
        .send()
        .await
        .expect("sent");
    crate::answer(r).await
}

/// POSTs `body` to `procedure` on `d` as the holder of `token`.
pub async fn post(d: &Daemon, token: &str, procedure: &str, body: Value) -> Answer {
    let url = d.url(&format!("/plimsoll.v1.SandboxService/{procedure}"));
    post_at(url, token, body).await
}

pub async fn post_at(url: String, token: &str, body: Value) -> Answer {
    let r = crate::client()
        .post(url)
        .header("authorization", format!("Bearer {token}"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    crate::answer(r).await
}

/// `n` different free loopback ports, for replicas whose addresses their
/// peers must know before they start: all held at once while they are
/// chosen, so no two are the same.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// What a cell printed, from a SessionRun answer.
pub fn cell_stdout(a: &Answer) -> String {
    use base64::Engine;
    let out = a
        .body
        .pointer("/run/cell/stdout")
        .and_then(Value::as_str)
        .unwrap_or("");
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(out)
            .expect("base64"),
    )
    .expect("utf-8")
}

/// `n` replicas on loopback that forward session calls to each other:
/// each knows its own URL and the shared secret (written in `dir`).
/// Returns the replicas and the secret's text.
pub fn forwarding(n: usize, dir: &Scratch, env: &[(&str, String)]) -> (Vec<Daemon>, String) {
    let (envs, secret_text) = forwarding_env(n, dir, env);
    let ds = envs.iter().map(|e| Daemon::start(&borrowed(e))).collect();
    (ds, secret_text)
}

/// The environments of `n` replicas that forward session calls to each
/// other, without starting them: a test that restarts a replica starts it
/// again from the same environment (its address, its URL, the secret).
/// Returns the environments and the secret's text.
pub fn forwarding_env(
    n: usize,
    dir: &Scratch,
    env: &[(&str, String)],
) -> (Vec<Vec<(String, String)>>, String) {
    let secret = dir.path("replica-secret");
    let secret_text = plimsoll::callers::new_token().expect("secret");
    std::fs::write(&secret, &secret_text).expect("secret");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let envs = free_ports(n)
        .into_iter()
        .map(|port| {
            let addr = format!("127.0.0.1:{port}");
            let mut all: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            all.push((
                "PLIMSOLL_REPLICA_SECRET_FILE".into(),
                secret.display().to_string(),
            ));
            all.push(("PLIMSOLL_ADDR".into(), addr.clone()));
            all.push(("PLIMSOLL_REPLICA_URL".into(), format!("http://{addr}")));
            all
        })
        .collect();
    (envs, secret_text)
}

/// `n` replicas with the same environment (each on a port of its own).
pub fn replicas(n: usize, env: &[(&str, &str)]) -> Vec<Daemon> {
    (0..n).map(|_| Daemon::start(env)).collect()
}

/// `env` as the pairs `Daemon::start` takes.
pub fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}
