//! Test harness: starts the real `plimsolld` binary on a loopback port with a
//! given environment, and talks to it as a client would.
//!
//! The binary is the one `make build` produced (`PLIMSOLLD_BIN`, or found next
//! to the test executable). Each daemon gets port 0 and reports the address it
//! bound in its "plimsolld listening" log line; its log is kept so tests can
//! assert on the audit lines (and on what must never appear in them).

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

pub mod canaries;
pub mod certs;
pub mod containers;
pub mod engine_relay;
pub mod fleet;
pub mod hostile_plugin;
pub mod redis_server;

pub use certs::{certificate, client_certificate, test_ca};
pub use containers::*;
pub use engine_relay::{EngineRelay, RelayFaults};

pub const REQUEST_ID: &str = "0123456789abcdef0123456789abcdef";

pub fn plimsolld_path() -> PathBuf {
    if let Some(p) = std::env::var_os("PLIMSOLLD_BIN") {
        return PathBuf::from(p);
    }
    // Tests live in target/release/deps/, the benchmark in target/release/.
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("plimsolld"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("plimsolld"))
}

/// The build's target directory, found from this executable's path
/// (tests run from target/release/deps/, the benchmark from target/release/).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .find(|d| d.join("release").is_dir() && d.join("wasm32-wasip2").is_dir())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Where `make guest` installs the shipped plugins.
pub fn plugin_dir() -> PathBuf {
    target_dir().join("plugins")
}

/// Where `make guest` installs the test-fixture plugins.
pub fn test_plugin_dir() -> PathBuf {
    target_dir().join("test-plugins")
}

/// Serves `app` on a free loopback port for the rest of the test; returns
/// `http://127.0.0.1:<port>`.
pub async fn serve_loopback(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// The guest component the daemon embeds, for checking reported identities.
pub fn guest_wasm_path() -> PathBuf {
    if let Some(p) = std::env::var_os("PLIMSOLL_GUEST_JS_WASM") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let target = exe.ancestors().nth(3).expect("target dir");
    target.join("wasm32-wasip2/guest/plimsoll_guest_js.wasm")
}

pub struct Daemon {
    child: Child,
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
    /// The child's start time (`/proc/PID/stat` field 22), read while it
    /// could not have been reaped: with the PID, what tells this daemon
    /// from a later process given the same PID.
    started: Option<String>,
    /// Removed after the daemon has stopped (fields drop after `drop`).
    _state: StateDir,
}

impl Daemon {
    /// Starts plimsolld with exactly `env` (plus PATH) and waits until it
    /// listens. Panics with the daemon's log if it exits first.
    pub fn start(env: &[(&str, &str)]) -> Daemon {
        Daemon::try_start(env).unwrap_or_else(|log| panic!("{log}"))
    }

    /// As `start`, but a daemon that exits before it listens is an `Err`
    /// with its log, for a caller that can try again (a replica given a
    /// port another process took first: see `fleet::start_forwarding`).
    /// Panics if it neither listens nor exits within 60 s.
    pub fn try_start(env: &[(&str, &str)]) -> Result<Daemon, String> {
        let mut cmd = Command::new(plimsolld_path());
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.env("PLIMSOLL_ADDR", "127.0.0.1:0");
        let state = test_env(&mut cmd, env);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .expect("spawning plimsolld (run `make build` first)");
        // Read before anything could reap the child, so it is this child's.
        let started = start_time(child.id());
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    // Kept before it is announced: a test that reads the log
                    // once the daemon listens must find the listening line.
                    log.lock().expect("log lock").push(line.clone());
                    if line.contains("plimsolld listening") {
                        let _ = tx.send(line);
                    }
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
                let v: Value = serde_json::from_str(&line).expect("listening line is JSON");
                let addr = v["addr"].as_str().expect("addr field").to_string();
                return Ok(Daemon {
                    child,
                    addr,
                    log,
                    started,
                    _state: state,
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                // Its last lines are in once the pipe has closed (bounded:
                // a descendant could hold the pipe open).
                let until = Instant::now() + Duration::from_secs(2);
                while !reader.is_finished() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return Err(format!(
                    "plimsolld exited with {status} before listening:\n{}",
                    log.lock().expect("log").join("\n")
                ));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "plimsolld did not start listening in 60 s:\n{}",
                    log.lock().expect("log").join("\n")
                );
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().expect("log lock").clone()
    }

    /// Audit lines ("code run") logged so far.
    pub fn audit_runs(&self) -> usize {
        self.log_lines()
            .iter()
            .filter(|l| l.contains("plimsoll::audit"))
            .count()
    }

    pub fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    /// Sends one ordinary run and waits until its audit line has been read,
    /// then returns how many audit lines there are. Lines arrive in order on
    /// one stream, so every line logged before the sentinel is in by then:
    /// "nothing ran" checks compare against this, not against a log that may
    /// still be in flight.
    pub async fn audit_after_sentinel(&self) -> usize {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let tag = format!(
            "sentinel-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut req = js_run("0");
        req["traceId"] = serde_json::json!(tag);
        let a = call(self, "Run", &req).await;
        assert_eq!(a.status, 200, "sentinel run failed: {:?}", a.body);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log_lines().iter().any(|l| l.contains(&tag)) {
            assert!(
                Instant::now() < deadline,
                "the sentinel's audit line never arrived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.audit_runs()
    }

    /// Asks the daemon to stop (SIGTERM), as an operator does, without
    /// waiting for it; whether the signal was delivered.
    pub fn terminate(&self) -> bool {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Kills the daemon outright (SIGKILL), as a crash would: it gives
    /// nothing back on the way out.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the daemon as dropping it does (SIGTERM, SIGKILL after 20 s)
    /// and calls `check` with its PID once it has exited but before it is
    /// reaped. Until then its PID and start time still name a live
    /// process, so no other daemon's sweeper can judge its containers
    /// orphaned and remove them: a check of what it left behind sees what
    /// this daemon left, not what the others' sweeps have not yet taken.
    pub fn stop_then<T>(mut self, check: impl FnOnce(u32) -> T) -> T {
        let pid = self.child.id();
        // Signals go to the PID only while it is still this child (alive,
        // or exited and unreaped); one reaped earlier (`kill`,
        // `is_running`) may have been handed to another process since.
        let ours = self.started.is_some() && start_time(pid) == self.started;
        if ours && !exited_unreaped(pid) {
            let _ = self.terminate();
            let deadline = Instant::now() + Duration::from_secs(20);
            while !exited_unreaped(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !exited_unreaped(pid) {
                // SIGKILL through the handle, which knows whether the
                // child has been reaped.
                let _ = self.child.kill();
                let deadline = Instant::now() + Duration::from_secs(20);
                while !exited_unreaped(pid) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        } else if !ours && matches!(self.child.try_wait(), Ok(None)) {
            // Running, but its start time could not be read: stopped as
            // dropping it does (reaped on the way), and checked after.
            let _ = self.terminate();
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
        }
        let out = check(pid);
        let _ = self.child.wait();
        out
    }

    /// Stops the daemon (`stop_then`) and counts the containers it made
    /// that are left: none, when it cleaned up after itself.
    pub fn stop_counting_leftovers(self) -> usize {
        self.stop_then(containers_of)
    }
}

/// Field 22 of `/proc/PID/stat`, the process's start time in clock ticks
/// after boot (read after the last `)`: the name may hold anything).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19).map(str::to_string)
}

/// Whether child `pid` has exited and waits to be reaped (a zombie), or
/// is gone altogether.
fn exited_unreaped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

impl Drop for Daemon {
    /// SIGTERM first, as an operator stops it, so the daemon removes what it
    /// holds (warm containers); SIGKILL if it has not exited in 20 s.
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // A daemon that exited since the check above has nothing to stop.
        let _ = self.terminate();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The embedded state store's directory a test daemon was given, removed
/// when the test is done with it.
pub struct StateDir(Option<PathBuf>);

impl Drop for StateDir {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// A test's environment over the defaults every test daemon gets: metrics
/// on a free port (tests run many daemons at once), open development mode
/// unless the test configures authentication or hardened mode itself, and
/// an embedded state store of its own (the default directory would carry
/// one test's paid seconds into the next) unless the test names one.
fn test_env(cmd: &mut Command, env: &[(&str, &str)]) -> StateDir {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    cmd.env("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0");
    let names_store = env
        .iter()
        .any(|(k, _)| matches!(*k, "PLIMSOLL_STATE_URL" | "PLIMSOLL_STATE_DIR"));
    let state = if names_store {
        StateDir(None)
    } else {
        let p = std::env::temp_dir().join(format!(
            "plimsoll-test-state-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        cmd.env("PLIMSOLL_STATE_DIR", &p);
        StateDir(Some(p))
    };
    let configures_auth = env.iter().any(|(k, _)| {
        matches!(
            *k,
            "PLIMSOLL_TOKEN" | "PLIMSOLL_CLIENTS_FILE" | "PLIMSOLL_INSECURE" | "PLIMSOLL_HARDENED"
        )
    });
    if !configures_auth {
        cmd.env("PLIMSOLL_INSECURE", "1");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    state
}

/// Runs plimsolld with `args` and `env`, waiting for it to exit; returns the
/// exit code and everything it wrote.
pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(plimsolld_path());
    cmd.env_clear().args(args);
    // The same defaults as `Daemon::start`, so a test of one start-up check
    // is not answered by another.
    let _state = test_env(&mut cmd, env);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("running plimsolld");
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = read(Box::new(child.stdout.take().expect("stdout")));
    let err = read(Box::new(child.stderr.take().expect("stderr")));
    // A daemon that should have refused to start and did not would
    // otherwise hold the test forever.
    let deadline = Instant::now() + Duration::from_secs(120);
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut text = out.join().unwrap_or_default();
    text.push_str(&err.join().unwrap_or_default());
    if code.is_none() {
        text.push_str("\n(plimsolld did not exit within 120 s and was killed)");
    }
    (code, text)
}

/// One answer, as a test looks at it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    pub fn mark(&self) -> Option<&str> {
        self.headers
            .get("plimsoll-not-dispatched")
            .and_then(|v| v.to_str().ok())
    }

    pub fn request_id(&self) -> Option<&str> {
        self.headers
            .get("plimsoll-request-id")
            .and_then(|v| v.to_str().ok())
    }

    /// The reason number in the NotDispatched Connect detail, if any.
    pub fn detail_reason(&self) -> Option<u8> {
        let details = self.body.get("details")?.as_array()?;
        let d = details
            .iter()
            .find(|d| d["type"] == "plimsoll.v1.NotDispatched")?;
        let raw = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(d["value"].as_str()?)
            .ok()?;
        match raw.as_slice() {
            [0x08, n] => Some(*n),
            _ => None,
        }
    }

    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }

    pub fn js_bytes(&self, field: &str) -> Vec<u8> {
        let s = self.body["javascript"][field].as_str().unwrap_or("");
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .expect("base64 output")
    }

    pub fn stdout(&self) -> String {
        String::from_utf8(self.js_bytes("stdout")).expect("utf-8 stdout")
    }

    pub fn stderr(&self) -> String {
        String::from_utf8(self.js_bytes("stderr")).expect("utf-8 stderr")
    }

    pub fn exit_code(&self) -> i64 {
        self.body["javascript"]["exitCode"].as_i64().unwrap_or(0)
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client")
}

/// POSTs a raw body to a procedure with the Connect JSON headers.
pub async fn call_raw(d: &Daemon, procedure: &str, body: impl Into<reqwest::Body>) -> Answer {
    let resp = client()
        .post(d.url(&format!("/plimsoll.v1.SandboxService/{procedure}")))
        .header("content-type", "application/json")
        .header("plimsoll-request-id", REQUEST_ID)
        .body(body)
        .send()
        .await
        .expect("request sent");
    answer(resp).await
}

pub async fn answer(resp: reqwest::Response) -> Answer {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

pub async fn call(d: &Daemon, procedure: &str, body: &Value) -> Answer {
    call_raw(d, procedure, serde_json::to_vec(body).expect("json")).await
}

/// A JavaScript Run request with the current protocol.
pub fn js_run(code: &str) -> Value {
    serde_json::json!({"protocol": 4, "javascript": {"code": code}})
}

pub fn wasm_daemon() -> Daemon {
    Daemon::start(&[("SANDBOX_PROVIDER", "wasm")])
}

/// A temporary directory, removed when dropped.
pub struct Scratch(pub PathBuf);
impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let p = std::env::temp_dir().join(format!("plimsoll-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The metrics listener's `/metrics` URL, from its listening line.
pub fn metrics_url(d: &Daemon) -> String {
    let line = d
        .log_lines()
        .into_iter()
        .find(|l| l.contains("metrics listening"))
        .expect("a metrics listening line");
    let v: Value = serde_json::from_str(&line).expect("json");
    format!("http://{}/metrics", v["addr"].as_str().expect("addr"))
}

/// A TCP listener on loopback that counts the connections made to it and
/// closes each at once: a stand-in proxy or decoy that must never be
/// reached. Returns `http://127.0.0.1:<port>` and the count.
pub async fn recording_listener() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    (format!("http://{addr}"), hits)
}

/// Every proxy variable HTTP clients read, pointing at `proxy`.
pub fn proxy_env(proxy: &str) -> Vec<(&'static str, String)> {
    [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .into_iter()
    .map(|k| (k, proxy.to_string()))
    .collect()
}

/// The daemon's own in-flight gauge (`plimsoll_inflight`) now.
pub async fn inflight(d: &Daemon) -> usize {
    canaries::metric(d, "plimsoll_inflight").await as usize
}

/// The daemon's whole `/metrics` page now.
pub async fn metrics_text(d: &Daemon) -> String {
    client()
        .get(metrics_url(d))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// Waits (at most 10 s) until the daemon's own in-flight gauge reads `n`:
/// the sentinel for "these runs have started", instead of a guessed sleep.
pub async fn wait_inflight(d: &Daemon, n: usize) {
    let want = format!("plimsoll_inflight {n}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_text(d).await;
        if text.lines().any(|l| l == want) {
            return;
        }
        assert!(Instant::now() < deadline, "{n} runs were never in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
