//! A real `redis-server` (Debian's) on a free loopback port, for the shared
//! state tests: started in a scratch directory with its append-only file
//! synced on every write, so a stop and start on the same directory keeps
//! what it held, as a production Redis with persistence does. It can also
//! take TLS connections with a password, as a managed Redis does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// `appendfsync`: `always` (every write on disk before its answer) or
    /// `everysec` (the common production choice).
    fsync: &'static str,
    tls: Option<Tls>,
}

/// A TLS port beside the plain one (kept for `command`), and a password
/// every client must give.
struct Tls {
    port: u16,
    cert: PathBuf,
    key: PathBuf,
    password: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl RedisServer {
    /// Starts a server in a fresh directory, every write synced before it
    /// is answered, and waits until it answers.
    pub fn start(tag: &str) -> RedisServer {
        RedisServer::start_with(tag, "always")
    }

    /// The same, also taking TLS connections (with `cert` and `key`) on a
    /// port of their own, and requiring `password` on every connection.
    pub fn start_tls(tag: &str, cert: &Path, key: &Path, password: &str) -> RedisServer {
        RedisServer::start_full(
            tag,
            "always",
            Some(Tls {
                port: free_port(),
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                password: password.to_string(),
            }),
        )
    }

    /// The same with `appendfsync` set to `fsync`.
    pub fn start_with(tag: &str, fsync: &'static str) -> RedisServer {
        RedisServer::start_full(tag, fsync, None)
    }

    fn start_full(tag: &str, fsync: &'static str, tls: Option<Tls>) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "plimsoll-redis-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut r = RedisServer {
            child: None,
            port: free_port(),
            dir,
            fsync,
            tls,
        };
        r.restart();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The TLS port's URL, by name (the certificate's), with `password`.
    pub fn tls_url(&self, password: &str) -> String {
        let port = self.tls.as_ref().expect("a TLS server").port;
        format!("rediss://:{password}@localhost:{port}/0")
    }

    /// Kills the server outright (SIGKILL): what it acknowledged is in its
    /// append-only file, nothing else is saved on the way out.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "yes", "--appendfsync", self.fsync])
            .args(["--save", ""]);
        if let Some(t) = &self.tls {
            cmd.args(["--tls-port", &t.port.to_string()])
                .arg("--tls-cert-file")
                .arg(&t.cert)
                .arg("--tls-key-file")
                .arg(&t.key)
                .args(["--tls-auth-clients", "no"])
                .args(["--requirepass", &t.password]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package; make setup installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.command(&["PING"]).as_deref() != Some("PONG") {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer in 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One command through `redis-cli` (Debian's, beside the server); the
    /// answer as text, or None if the server did not answer.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--raw"]);
        if let Some(t) = &self.tls {
            cmd.args(["--no-auth-warning", "-a", &t.password]);
        }
        let out = cmd.args(args).stdin(Stdio::null()).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
