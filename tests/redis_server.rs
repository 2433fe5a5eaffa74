//! A real `redis-server` (Debian's) on a free loopback port, for the shared
//! state tests: started in a scratch directory with its append-only file
//! synced on every write, so a stop and start on the same directory keeps
//! what it held, as a production Redis with persistence does. It can also
//! take TLS connections with a password, as a managed Redis does.
//!
//! redis-server cannot report a port it chose, and the daemons under test
//! take only `redis://` or `rediss://` URLs with a host (no Unix socket), so
//! its port is chosen free and handed to it, and then checked: the server
//! that answers there must be this one (the process ID it reports is the
//! child's), or a server that lost the port to another test's would pass
//! its start-up check by answering that one's PING. A start that lost its
//! port is tried again on another; while the server is killed, its ports
//! stay bound (not listening) so no other test is given them.

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
    /// While the server is killed: its ports, bound and not listening, so
    /// no other process is given them before it starts again (a connection
    /// to them is refused, as to a port nothing holds).
    held: Vec<tokio::net::TcpSocket>,
}

/// A TLS port beside the plain one (kept for `command`), and a password
/// every client must give.
struct Tls {
    port: u16,
    cert: PathBuf,
    key: PathBuf,
    password: String,
}

/// `n` different loopback ports, free when chosen (all bound at once while
/// they are chosen, so no two are the same); nothing keeps them free after.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// Binds `127.0.0.1:port` without listening: the port is taken for every
/// other bind (another test's choice of a free port included), and a
/// connection to it is refused. Best effort: None if it cannot be bound.
fn hold(port: u16) -> Option<tokio::net::TcpSocket> {
    let s = tokio::net::TcpSocket::new_v4().ok()?;
    // Connections the killed server had may linger in TIME_WAIT on it.
    s.set_reuseaddr(true).ok()?;
    s.bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .ok()?;
    Some(s)
}

/// How a start went.
enum Started {
    /// The child answers on its port.
    Answering,
    /// The child exited, or something else answers on its port: the port
    /// was taken before the child could bind it.
    PortTaken(String),
}

/// How many fresh ports a first start tries before it gives up.
const START_TRIES: usize = 5;

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
                port: 0,
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
            port: 0,
            dir,
            fsync,
            tls,
            held: Vec::new(),
        };
        // Nothing depends on the port yet: one lost to another process is
        // replaced by another.
        let mut lost = Vec::new();
        for _ in 0..START_TRIES {
            let ports = free_ports(if r.tls.is_some() { 2 } else { 1 });
            r.port = ports[0];
            if let Some(t) = &mut r.tls {
                t.port = ports[1];
            }
            match r.launch() {
                Started::Answering => return r,
                Started::PortTaken(why) => lost.push(why),
            }
        }
        panic!("redis-server lost its port {START_TRIES} times: {lost:?}");
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
    /// append-only file, nothing else is saved on the way out. Its ports
    /// stay held for `restart`.
    pub fn kill(&mut self) {
        self.stop();
        if self.held.is_empty() {
            let mut ports = vec![self.port];
            ports.extend(self.tls.as_ref().map(|t| t.port));
            self.held = ports.into_iter().filter_map(hold).collect();
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory, and checks
    /// that the server answering there is the new one.
    pub fn restart(&mut self) {
        self.kill();
        match self.launch() {
            Started::Answering => {}
            // The daemons under test were given this port: there is no
            // other to try.
            Started::PortTaken(why) => panic!(
                "redis-server could not have its port {} again: {why}",
                self.port
            ),
        }
    }

    /// Starts the child on `self.port` (and the TLS port) and waits until it
    /// answers there itself.
    fn launch(&mut self) -> Started {
        self.stop();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "yes", "--appendfsync", self.fsync])
            .args(["--save", ""])
            .arg("--logfile")
            .arg(self.dir.join("redis.log"));
        if let Some(t) = &self.tls {
            cmd.args(["--tls-port", &t.port.to_string()])
                .arg("--tls-cert-file")
                .arg(&t.cert)
                .arg("--tls-key-file")
                .arg(&t.key)
                .args(["--tls-auth-clients", "no"])
                .args(["--requirepass", &t.password]);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // The held ports are let go at the last moment: the server binds
        // them a few milliseconds later.
        self.held.clear();
        let child = cmd
            .spawn()
            .expect("redis-server (Debian's redis-server package; make setup installs it)");
        let pid = child.id().to_string();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                let last = log.lines().rev().take(3).collect::<Vec<_>>();
                return Started::PortTaken(format!(
                    "it exited ({status}) before answering: {last:?}"
                ));
            }
            if let Some(info) = self.command(&["INFO", "server"]) {
                let answering = info
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("process_id:"))
                    .map(str::to_string);
                if answering.as_deref() != Some(pid.as_str()) {
                    // Another server holds the port (ours cannot bind it
                    // and will exit, or is killed here).
                    self.stop();
                    return Started::PortTaken(format!(
                        "another redis-server answers on it (process {answering:?}, not {pid})"
                    ));
                }
                // Ours; ready once it has loaded what it held (INFO is
                // answered while it loads, PING is not).
                if self.command(&["PING"]).as_deref() == Some("PONG") {
                    return Started::Answering;
                }
            }
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
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
