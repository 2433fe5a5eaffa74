//! A real `redis-server` (Debian's) on a free loopback port, for the shared
//! state tests: started in a scratch directory with its append-only file
//! synced on every write, so a stop and start on the same directory keeps
//! what it held, as a production Redis with persistence does.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// `appendfsync`: `always` (every write on disk before its answer) or
    /// `everysec` (the common production choice).
    fsync: &'static str,
}

impl RedisServer {
    /// Starts a server in a fresh directory, every write synced before it
    /// is answered, and waits until it answers.
    pub fn start(tag: &str) -> RedisServer {
        RedisServer::start_with(tag, "always")
    }

    /// The same with `appendfsync` set to `fsync`.
    pub fn start_with(tag: &str, fsync: &'static str) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "plimsoll-redis-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut r = RedisServer {
            child: None,
            port,
            dir,
            fsync,
        };
        r.restart();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
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
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "yes", "--appendfsync", self.fsync])
            .args(["--save", ""])
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
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--raw"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
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
