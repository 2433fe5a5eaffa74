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

/// A loopback port nothing listens on now, for a replica whose address
/// must be in its environment before it starts (its peers dial the URL it
/// publishes). Free when chosen, not promised to stay free: a replica
/// started on it is checked to have bound it (`start_forwarding`), and
/// given another when some other process took it first.
fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Points a replica's environment at `127.0.0.1:port`: where it listens
/// and the URL it gives its peers (replacing any earlier choice).
fn set_address(env: &mut Vec<(String, String)>, port: u16) {
    env.retain(|(k, _)| k != "PLIMSOLL_ADDR" && k != "PLIMSOLL_REPLICA_URL");
    let addr = format!("127.0.0.1:{port}");
    env.push(("PLIMSOLL_REPLICA_URL".into(), format!("http://{addr}")));
    env.push(("PLIMSOLL_ADDR".into(), addr));
}

/// Starts a replica of `env` (from `forwarding_env`) on a port of its own,
/// written into `env` so a test can start it again at the same address.
/// A port is only known free when it is chosen, so the replica must bind
/// it itself: one that finds it taken (by any other process, in the
/// moment between) exits before it listens, and is started again on
/// another; one that listens reports the address it bound, which must be
/// the one its peers were told.
pub fn start_forwarding(env: &mut Vec<(String, String)>) -> Daemon {
    let mut tries = 0;
    loop {
        let port = unused_port();
        set_address(env, port);
        match Daemon::try_start(&borrowed(env)) {
            Ok(d) => {
                assert_eq!(
                    d.addr,
                    format!("127.0.0.1:{port}"),
                    "the replica listens where its peers were told"
                );
                return d;
            }
            Err(log) if log.contains("PLIMSOLL_ADDR") && log.contains("in use") && tries < 5 => {
                tries += 1;
            }
            Err(log) => panic!("{log}"),
        }
    }
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
    let (mut envs, secret_text) = forwarding_env(n, dir, env);
    let ds = envs.iter_mut().map(start_forwarding).collect();
    (ds, secret_text)
}

/// `n` wasm replicas forwarding session calls to each other over the store
/// at `store_url`, with room for four sessions each, `extra` added to
/// their environment, and the callers `names` (in a clients file in
/// `dir`). Returns the replicas, the secret's text and the callers' tokens,
/// in the order named.
pub fn wasm_forwarding(
    n: usize,
    store_url: String,
    dir: &Scratch,
    names: &[&str],
    extra: &[(&str, String)],
) -> (Vec<Daemon>, String, Vec<String>) {
    let file = dir.path("clients.json");
    let callers: Vec<(&str, Option<u64>)> = names.iter().map(|n| (*n, None)).collect();
    let tokens = clients(&file, &callers);
    let mut env = vec![
        ("SANDBOX_PROVIDER", "wasm".to_string()),
        ("PLIMSOLL_CLIENTS_FILE", file.display().to_string()),
        ("PLIMSOLL_STATE_URL", store_url),
        ("SANDBOX_MAX_SESSIONS", "4".into()),
    ];
    env.extend(extra.iter().cloned());
    let (ds, secret) = forwarding(n, dir, &env);
    (ds, secret, tokens)
}

/// The environments of `n` replicas that forward session calls to each
/// other, without starting them or choosing their addresses:
/// `start_forwarding` gives each its address as it starts it, and leaves
/// it in the environment, so a test that restarts a replica starts it
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
    let envs = (0..n)
        .map(|_| {
            let mut all: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            all.push((
                "PLIMSOLL_REPLICA_SECRET_FILE".into(),
                secret.display().to_string(),
            ));
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
