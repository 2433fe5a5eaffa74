//! A Unix-socket relay to the real docker engine, standing in for an
//! engine that goes away and comes back, is slow, or says something else.

use std::path::PathBuf;
use std::time::Duration;

/// What an `EngineRelay` does to the traffic it carries.
#[derive(Clone, Default)]
pub struct RelayFaults {
    /// Requests (chunks from the daemon) containing this are held this long
    /// before they are passed on: an engine slow to act on them.
    pub delay: Option<(&'static str, Duration)>,
    /// Answers from the engine have this replaced by that (same length, so
    /// framing holds): an engine that reports something else.
    pub rewrite: Option<(&'static str, &'static str)>,
    /// Requests from the daemon have this replaced by that (same length):
    /// a daemon that asks the engine for something else.
    pub rewrite_request: Option<(&'static str, &'static str)>,
}

impl RelayFaults {
    /// The daemon's sweep for leftovers asks for containers labelled
    /// `PLANTED_LABEL` instead of the run label (the label filter in its
    /// list's query, as bollard encodes it): it sees the containers a test
    /// planted with that label, and no other daemon on the engine sees
    /// them, so what goes of them this daemon swept, and what stays it
    /// kept.
    pub fn sweep_only_planted() -> RelayFaults {
        RelayFaults {
            rewrite_request: Some(("io.plimsoll.run%3D1", "io.plimsoll.tst%3D1")),
            ..RelayFaults::default()
        }
    }
}

/// A Unix-socket relay to the real engine, standing in for an engine that
/// goes away and comes back (`cut`), is slow, or says something else.
pub struct EngineRelay {
    path: PathBuf,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl EngineRelay {
    pub fn start(path: &std::path::Path, faults: RelayFaults) -> EngineRelay {
        for (from, to) in [faults.rewrite, faults.rewrite_request]
            .into_iter()
            .flatten()
        {
            assert_eq!(from.len(), to.len(), "a rewrite keeps the length");
        }
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).expect("bind relay");
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    break;
                };
                let faults = faults.clone();
                conns.spawn(async move {
                    let Ok(engine) = tokio::net::UnixStream::connect("/var/run/docker.sock").await
                    else {
                        return;
                    };
                    let (mut from_daemon, mut to_daemon) = inbound.into_split();
                    let (mut from_engine, mut to_engine) = engine.into_split();
                    let up = async {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = match from_daemon.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if let Some((pattern, hold)) = faults.delay
                                && contains(&buf[..n], pattern.as_bytes())
                            {
                                tokio::time::sleep(hold).await;
                            }
                            if let Some((from, to)) = faults.rewrite_request {
                                replace_all(&mut buf[..n], from.as_bytes(), to.as_bytes());
                            }
                            if to_engine.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = to_engine.shutdown().await;
                    };
                    let down = async {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = match from_engine.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let mut chunk = buf[..n].to_vec();
                            if let Some((from, to)) = faults.rewrite {
                                replace_all(&mut chunk, from.as_bytes(), to.as_bytes());
                            }
                            if to_daemon.write_all(&chunk).await.is_err() {
                                break;
                            }
                        }
                        let _ = to_daemon.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        EngineRelay {
            path: path.to_path_buf(),
            task: Some(task),
        }
    }

    /// Drops every connection and the socket: the engine is gone.
    pub fn cut(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for EngineRelay {
    fn drop(&mut self) {
        self.cut();
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn replace_all(buf: &mut [u8], from: &[u8], to: &[u8]) {
    let mut i = 0;
    while i + from.len() <= buf.len() {
        if &buf[i..i + from.len()] == from {
            buf[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
}
