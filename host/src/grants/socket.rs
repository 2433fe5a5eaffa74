//! The broker's transport into containers: a per-run Unix socket.
//!
//! For a granted container run the host makes a fresh directory holding the
//! socket and the guest-side clients (node and python), bind-mounts it
//! read-only at `/run/plimsoll`, and serves HTTP on the socket with the run's
//! broker session. A request's method and raw path are the call; its body is
//! the call's body. Nothing else on the socket is reachable: no other
//! endpoint, no upstream URL, no credential.
//!
//! gVisor connects to a bind-mounted host socket only with runsc's
//! `--host-uds=open` (scripts/setup.sh registers it so); the docker tests
//! run every grant test under runsc too.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dirs::{self, Dir};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use super::Profile;
use super::answer::{self, broker_answer};
use super::broker::{MAX_REQUEST_BODY, Session};

/// Where the directory appears inside a container.
pub const MOUNT_POINT: &str = "/run/plimsoll";
/// Connections one run's socket serves at once.
const MAX_CONNECTIONS: usize = 32;
pub use super::answer::BROKER_HEADER;

use super::clients::{NODE as NODE_CLIENT, PYTHON as PYTHON_CLIENT};

/// One run's (or one session's) socket directory and its server; both go
/// when this is dropped.
pub struct Mount {
    /// The root the directory was made in, and its name there: it is
    /// removed through the root's handle, never by path.
    root: Arc<Dir>,
    name: String,
    /// The path the container engine bind-mounts (the engine takes a path).
    dir: PathBuf,
    server: tokio::task::JoinHandle<()>,
    /// A run mount's environment, made with it; empty for a session's.
    env: Vec<String>,
    /// The broker session requests are served with now. A run's mount
    /// serves its one session for its whole life; a session's mount serves
    /// none between calls and each granted call's own while it runs.
    serving: Serving,
}

/// Which broker session a mount's requests go to, looked up per request.
type Serving = Arc<std::sync::Mutex<Option<Arc<Session>>>>;

/// While held, a session's mount serves one call's broker session; dropped
/// (the call is over), it serves none again.
pub struct Serve {
    serving: Serving,
}

impl Drop for Serve {
    fn drop(&mut self) {
        *self.serving.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Where run directories live, opened once: made by the daemon, owned by
/// it, not a symlink, and closed to others (mode 0711: they may pass
/// through to a run directory whose name they know, never list).
pub struct Root {
    path: PathBuf,
    dir: Arc<Dir>,
}

impl Root {
    /// Makes (or checks) the root at `path` and opens it.
    pub fn open(path: &Path) -> std::io::Result<Root> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // A root someone else made, or a link, could be swapped under us.
        let dir = dirs::open_nofollow(path)?;
        let me = std::fs::metadata("/proc/self")?.uid();
        let here = dirs::self_path(&dir);
        if std::fs::metadata(&here)?.uid() != me {
            return Err(std::io::Error::other(format!(
                "{} is not a directory this daemon owns",
                path.display()
            )));
        }
        std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o711))?;
        Ok(Root {
            path: path.to_path_buf(),
            dir: Arc::new(dir),
        })
    }
}

impl Mount {
    /// Makes the directory under `root`, writes the clients, binds the
    /// socket and starts serving `session` on it.
    /// The directory is the guest group's to read and nobody else's, and
    /// the socket only the guest group's to connect to: another local user
    /// cannot spend the run's grant. Every step goes through the handle of
    /// the directory just made.
    pub fn open(root: &Root, session: Arc<Session>, guest_gid: u32) -> std::io::Result<Mount> {
        let profile = session.profile_arc();
        let mut mount = Mount::make(root, Some(session), guest_gid)?;
        mount.env = mount.env_for(&profile)?;
        Ok(mount)
    }

    /// A session's mount: made when its container is, serving nothing until
    /// a granted call hands it that call's broker session (`serve`).
    /// Between calls, and in a call without a grant, every request is
    /// refused as not permitted.
    pub fn open_idle(root: &Root, guest_gid: u32) -> std::io::Result<Mount> {
        Mount::make(root, None, guest_gid)
    }

    /// Serves `session` on this mount until the returned guard drops.
    pub fn serve(&self, session: Arc<Session>) -> Serve {
        *self.serving.lock().unwrap_or_else(|p| p.into_inner()) = Some(session);
        Serve {
            serving: self.serving.clone(),
        }
    }

    fn make(root: &Root, session: Option<Arc<Session>>, guest_gid: u32) -> std::io::Result<Mount> {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).map_err(|e| std::io::Error::other(e.to_string()))?;
        let name = hex::encode(id);
        root.dir.create_dir(&name)?;
        let opened = (|| {
            let dir = dirs::sub_nofollow(&root.dir, &name)?;
            let here = dirs::self_path(&dir);
            std::os::unix::fs::chown(&here, None, Some(guest_gid))?;
            std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o750))?;
            dir.write("host.cjs", NODE_CLIENT)?;
            dir.write("sitecustomize.py", PYTHON_CLIENT)?;
            // Bound through the directory's own descriptor, so the socket is
            // made in the directory just opened, whatever its path names now.
            let sock = dirs::path_in(&dir, "host.sock");
            let listener = std::os::unix::net::UnixListener::bind(&sock)?;
            // The guest's group, and only it, may connect.
            std::os::unix::fs::lchown(&sock, None, Some(guest_gid))?;
            std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o660))?;
            listener.set_nonblocking(true)?;
            UnixListener::from_std(listener)
        })();
        let listener = match opened {
            Ok(l) => l,
            Err(e) => {
                let _ = root.dir.remove_dir_all(&name);
                return Err(e);
            }
        };
        let serving: Serving = Arc::new(std::sync::Mutex::new(session));
        let server = tokio::spawn(serve(listener, serving.clone()));
        Ok(Mount {
            root: root.dir.clone(),
            dir: root.path.join(&name),
            name,
            server,
            env: Vec::new(),
            serving,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The environment a container of this run gets, so node and python
    /// find the client without the guest doing anything.
    pub fn env(&self) -> Vec<String> {
        self.env.clone()
    }

    /// The environment for a process of a call granted `profile`, writing
    /// the profile's preamble into this mount first if it has one. The file
    /// is named by the profile and written once (never rewritten), so a
    /// process of an earlier call still reading it never sees it change.
    pub fn env_for(&self, profile: &Profile) -> std::io::Result<Vec<String>> {
        let mut env = vec![
            format!("HOST_API_SOCKET={MOUNT_POINT}/host.sock"),
            format!("PLIMSOLL_GRANT_GLOBAL={}", profile.global),
            format!("NODE_OPTIONS=--require={MOUNT_POINT}/host.cjs"),
            format!("PYTHONPATH={MOUNT_POINT}"),
        ];
        if let Some(text) = &profile.preamble {
            // Profile names are letters, digits and `._-`: after the prefix
            // none of them can leave the directory.
            let file = format!("preamble.{}.js", profile.name);
            let dir = dirs::sub_nofollow(&self.root, &self.name)?;
            match dir.open_with(
                &file,
                cap_std::fs::OpenOptions::new().write(true).create_new(true),
            ) {
                Ok(mut f) => std::io::Write::write_all(&mut f, text.as_bytes())?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            env.push(format!("PLIMSOLL_GRANT_PREAMBLE={MOUNT_POINT}/{file}"));
        }
        Ok(env)
    }
}

/// Where run directories live by default.
pub const ROOT: &str = "/run/plimsoll-runs";

impl Drop for Mount {
    fn drop(&mut self) {
        self.server.abort();
        let _ = self.root.remove_dir_all(&self.name);
    }
}

async fn serve(listener: UnixListener, serving: Serving) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // Connection tasks live in this set, so ending the server (the run is
    // over) ends them too, and with them every reference to the session
    // and its credential.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        while conns.try_join_next().is_some() {}
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Over the cap: the connection is closed unanswered.
            continue;
        };
        let serving = serving.clone();
        conns.spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                // Per request, not per connection: a connection kept open
                // from one session call must not carry that call's grant
                // into the next.
                let session = serving.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let serving = serving.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(match session {
                        Some(s) => handle(s, &serving, req).await,
                        None => broker_answer(
                            StatusCode::FORBIDDEN,
                            "not-permitted",
                            "no grant is in force for this call",
                        ),
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(5))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    session: Arc<Session>,
    serving: &Serving,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let (method, target) = answer::call_of(&req);
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return broker_answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                "budget",
                "the request body is over 1 MiB",
            );
        }
    };
    // A request begun in one session call and finished after it must not
    // spend that call's grant once the call is over.
    let current = serving.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if !current.is_some_and(|c| Arc::ptr_eq(&c, &session)) {
        return broker_answer(
            StatusCode::FORBIDDEN,
            "not-permitted",
            "no grant is in force for this call",
        );
    }
    let body = (!body.is_empty()).then(|| body.to_vec());
    answer::call_detached(session, method, target, body).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Arc<Session> {
        let grants = crate::grants::Grants::parse(
            r#"{"profiles":{"p":{"base_url":"http://127.0.0.1:9","allow":["GET /x"],"allowed_callers":["*"]}}}"#,
            &|_| None,
            None,
        )
        .expect("grants");
        let profile = grants.for_caller("p", "someone").expect("profile");
        let client = crate::outbound::client().expect("client");
        Arc::new(
            Session::open(
                profile,
                "someone",
                std::time::Duration::from_secs(5),
                client,
            )
            .expect("session"),
        )
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("plimsoll-sock-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch");
        d
    }

    #[tokio::test]
    async fn a_root_that_is_a_symlink_is_refused() {
        let base = scratch("root");
        std::fs::create_dir(base.join("real")).expect("real");
        std::os::unix::fs::symlink(base.join("real"), base.join("root")).expect("link");
        assert!(Root::open(&base.join("root")).is_err());
        assert!(Root::open(&base.join("real")).is_ok());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[tokio::test]
    async fn a_run_directory_swapped_for_a_symlink_sends_nothing_outside() {
        use std::os::unix::fs::MetadataExt;
        let base = scratch("run");
        let outside = base.join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("keep"), b"x").expect("keep");
        let root = Root::open(&base.join("root")).expect("root");
        let gid = std::fs::metadata("/proc/self").expect("self").gid();
        let mount = Mount::open(&root, session(), gid).expect("mount");
        assert!(mount.dir().join("host.sock").exists());
        assert!(mount.dir().join("host.cjs").exists());
        // The run's directory is moved away and a symlink to elsewhere put in
        // its place: removing the run touches nothing outside the root.
        let moved = base.join("root").join("moved");
        std::fs::rename(mount.dir(), &moved).expect("move");
        std::os::unix::fs::symlink(&outside, mount.dir()).expect("swap");
        drop(mount);
        assert!(
            outside.join("keep").exists(),
            "the removal followed the symlink"
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Sends `head`, then `body` once `between` has run, on one connection
    /// to the mount's socket; the answer's first line and broker kind.
    async fn ask(
        mount: &Mount,
        head: &str,
        body: &str,
        between: impl std::future::Future<Output = ()>,
    ) -> (String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::UnixStream::connect(mount.dir().join("host.sock"))
            .await
            .expect("connect");
        c.write_all(head.as_bytes()).await.expect("head");
        // Let the server take the headers before anything changes.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        between.await;
        // A refusal may come before the body is wanted; the answer tells.
        let _ = c.write_all(body.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            c.read_to_end(&mut answer),
        )
        .await;
        let text = String::from_utf8_lossy(&answer).to_string();
        let status = text.lines().next().unwrap_or("").to_string();
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{BROKER_HEADER}: ")))
            .unwrap_or("")
            .to_string();
        (status, kind)
    }

    const GET: &str =
        "GET /x HTTP/1.1\r\nhost: h\r\nconnection: close\r\ncontent-length: 2\r\n\r\n";

    #[tokio::test]
    async fn a_session_mount_serves_only_while_a_call_holds_it() {
        use std::os::unix::fs::MetadataExt;
        let base = scratch("idle");
        let root = Root::open(&base.join("root")).expect("root");
        let gid = std::fs::metadata("/proc/self").expect("self").gid();
        let mount = Mount::open_idle(&root, gid).expect("mount");
        // Between calls: refused by the host, nothing sent.
        let (status, kind) = ask(&mount, GET, "{}", async {}).await;
        assert!(status.contains("403"), "{status}");
        assert_eq!(kind, "not-permitted");
        // While a call serves its grant, the request goes to the broker (its
        // upstream, port 9, refuses: the broker's own failure, not a 403).
        let guard = mount.serve(session());
        let (status, kind) = ask(&mount, GET, "{}", async {}).await;
        assert!(!status.contains("403"), "{status}");
        assert_eq!(kind, "upstream-failed");
        // The call ends while a request is half sent: the rest of it does
        // not spend the grant of a call that is over.
        let (status, kind) = ask(&mount, GET, "{}", async move { drop(guard) }).await;
        assert!(status.contains("403"), "{status}");
        assert_eq!(kind, "not-permitted");
        // The next call's grant is that call's own, not the last one's.
        let first = session();
        let next = session();
        let g1 = mount.serve(first.clone());
        drop(g1);
        let _g2 = mount.serve(next.clone());
        let current = mount.serving.lock().unwrap().clone().expect("serving");
        assert!(Arc::ptr_eq(&current, &next));
        drop(mount);
        let _ = std::fs::remove_dir_all(&base);
    }
}
