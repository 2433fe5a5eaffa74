//! The container-engine capability's session functions: a session's one
//! container, bound by the host to that session.
//!
//! The plugin never names a container. The host gives each call of a
//! session that session's `SessionSlot`, and the functions act on the
//! slot's container only: a plugin serving one session cannot reach
//! another's container, whatever it sends. `start-session` works only in
//! the call that opens the session, once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::StoreContextMut;
use wasmtime::component::{LinkerInstance, WasmList};

use super::backend::{EngineFailure, SessionContainer};
use super::{
    ContainerEngineView, MAX_CONTAINER_OUTPUT, MAX_CONTAINER_STDIN, REPORT_MARGIN, approve,
    copy_spec, prewarm_with, refuse,
};
use crate::grants::socket;
use crate::plugin_host::bindings::engine_if;
use crate::plugin_host::lazy;

/// Longest terminator an exchange may wait for.
const MAX_UNTIL: usize = 256;

/// What the host keeps for one session of a container-engine plugin.
pub struct SessionSlot {
    lifetime: Duration,
    /// Open only during the call that opens the session.
    may_start: AtomicBool,
    container: Mutex<Option<Arc<dyn SessionContainer>>>,
    /// The session's broker directory, when its container mounts one: it
    /// serves a granted call's broker session from that call's first
    /// exchange (the moment the call is marked dispatched) until the call is
    /// answered, and nothing otherwise.
    pub grant: Option<Arc<socket::Mount>>,
    serving: Mutex<Option<socket::Serve>>,
}

impl SessionSlot {
    pub fn new(lifetime: Duration, grant: Option<socket::Mount>) -> Arc<Self> {
        Arc::new(SessionSlot {
            lifetime,
            may_start: AtomicBool::new(true),
            container: Mutex::new(None),
            grant: grant.map(Arc::new),
            serving: Mutex::new(None),
        })
    }

    /// The call is over: its grant is served no more.
    pub fn call_ended(&self) {
        self.serving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// Makes the broker directory a session's container will mount.
    pub fn grant_mount(guest_gid: u32) -> std::io::Result<socket::Mount> {
        let root = socket::Root::open(std::path::Path::new(socket::ROOT))?;
        socket::Mount::open_idle(&root, guest_gid)
    }

    fn container(&self) -> Option<Arc<dyn SessionContainer>> {
        self.container
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The open is over: no container can be started for it any more.
    pub fn opened(&self) {
        self.may_start.store(false, Ordering::Release);
    }

    /// Whether the session's container (if it has one) can still answer.
    pub fn alive(&self) -> bool {
        self.container().is_none_or(|c| c.alive())
    }

    pub fn has_container(&self) -> bool {
        self.container().is_some()
    }

    /// Removes the container, if one was started.
    pub async fn end(&self) {
        let taken = self
            .container
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(c) = taken {
            c.end().await;
        }
    }
}

pub(super) fn add_to_linker<T: ContainerEngineView>(
    engine: &mut LinkerInstance<'_, T>,
) -> wasmtime::Result<()> {
    engine.func_wrap_async(
        "start-session",
        |mut store: StoreContextMut<'_, T>, (spec,): (lazy::ContainerSpec,)| {
            Box::new(async move { Ok((start(&mut store, spec).await,)) })
        },
    )?;
    engine.func_wrap_async(
        "exchange",
        |mut store: StoreContextMut<'_, T>,
         (request, until, timeout_ms, limit): (WasmList<u8>, WasmList<u8>, u32, u32)| {
            Box::new(
                async move { Ok((exchange(&mut store, request, until, timeout_ms, limit).await,)) },
            )
        },
    )?;
    engine.func_wrap_async("grant-env", |mut store: StoreContextMut<'_, T>, (): ()| {
        let (call, state) = store.data_mut().container_engine();
        let env = match (state.and_then(|s| s.session.as_ref()), &call.grant) {
            (Some(slot), Some(g)) => match &slot.grant {
                Some(mount) => mount.env_for(g.profile()).unwrap_or_else(|e| {
                    // The client without its preamble would be a different
                    // SDK from the one the operator configured: none at all
                    // makes the call fail plainly instead.
                    tracing::error!(error = %e, "writing a session's grant preamble failed");
                    Vec::new()
                }),
                None => Vec::new(),
            },
            _ => Vec::new(),
        };
        Box::new(async move { Ok((env,)) })
    })?;
    engine.func_wrap_async(
        "prewarm-sessions",
        |mut store: StoreContextMut<'_, T>, (spec,): (lazy::ContainerSpec,)| {
            let answer = prewarm_with(&mut store, &spec, |e, approved| {
                Ok(e.backend.prewarm_sessions(approved))
            });
            Box::new(async move { Ok((answer,)) })
        },
    )?;
    Ok(())
}

fn not_started(why: &str) -> engine_if::EngineError {
    engine_if::EngineError::NotStarted(why.to_string())
}

async fn start<T: ContainerEngineView>(
    store: &mut StoreContextMut<'_, T>,
    spec: lazy::ContainerSpec,
) -> Result<(), engine_if::EngineError> {
    let copied = copy_spec(store, &spec);
    let (call, state) = store.data_mut().container_engine();
    let spec = copied.map_err(|rule| refuse(call, rule))?;
    let (engine, approved) = approve(call, state.as_deref(), &spec)?;
    let Some(slot) = state.and_then(|s| s.session.clone()) else {
        return Err(refuse(
            call,
            "start-session is only for a call that opens a session",
        ));
    };
    if !slot.may_start.swap(false, Ordering::AcqRel) {
        return Err(refuse(
            call,
            "a session's container is started once, when it opens",
        ));
    }
    let deadline = call
        .ends
        .checked_sub(REPORT_MARGIN)
        .unwrap_or_else(Instant::now);
    let before = call.mark.before_execution();
    match engine
        .backend
        .start_session(
            approved,
            slot.lifetime,
            deadline,
            slot.grant.as_ref().map(|m| m.dir().to_path_buf()),
        )
        .await
    {
        Ok(container) => {
            *slot.container.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::from(container));
            Ok(())
        }
        Err(EngineFailure::BeforeStart(why)) => {
            call.mark.nothing_started(before);
            tracing::warn!(target: "plimsoll::engine", why = %why, "a session container did not start");
            Err(not_started(
                "the session's container could not be started (the daemon's log has the details)",
            ))
        }
        Err(EngineFailure::OutOfTime(why)) => {
            call.mark.nothing_started(before);
            tracing::warn!(target: "plimsoll::engine", why = %why, "a session container could not start in time");
            Err(engine_if::EngineError::OutOfTime(
                "the session's container could not be started in time; the engine is busy".into(),
            ))
        }
        Err(EngineFailure::AfterStart(why)) => {
            tracing::warn!(target: "plimsoll::engine", why = %why, "a session container failed as it started");
            Err(engine_if::EngineError::Engine(
                "the session's container failed as it started (the daemon's log has the details)"
                    .into(),
            ))
        }
    }
}

async fn exchange<T: ContainerEngineView>(
    store: &mut StoreContextMut<'_, T>,
    request: WasmList<u8>,
    until: WasmList<u8>,
    timeout_ms: u32,
    limit: u32,
) -> Result<Vec<u8>, engine_if::EngineError> {
    let too_large = |_| {
        engine_if::EngineError::Forbidden("the exchange's request is over the host's limits".into())
    };
    let request = lazy::Budget::new(MAX_CONTAINER_STDIN, 0)
        .bytes(store, &request)
        .map_err(too_large)?;
    let until = lazy::Budget::new(MAX_UNTIL, 0)
        .bytes(store, &until)
        .map_err(too_large)?;
    let (call, state) = store.data_mut().container_engine();
    let slot = state.and_then(|s| s.session.clone());
    let Some(container) = slot.as_ref().and_then(|slot| slot.container()) else {
        return Err(refuse(call, "this call has no session container"));
    };
    if until.is_empty() {
        return Err(refuse(call, "an exchange needs a terminator to read until"));
    }
    let ends = call
        .ends
        .checked_sub(REPORT_MARGIN)
        .unwrap_or_else(Instant::now);
    let deadline = (Instant::now() + Duration::from_millis(u64::from(timeout_ms))).min(ends);
    let limit = (limit as usize).min(MAX_CONTAINER_OUTPUT);
    let before = call.mark.before_execution();
    // From here the call counts as dispatched, so only from here may its
    // grant be used: anything in the container (a kernel an earlier cell
    // left running) could call the socket once it serves.
    if let (Some(slot), Some(grant)) = (&slot, &call.grant)
        && let Some(mount) = &slot.grant
    {
        let mut serving = slot.serving.lock().unwrap_or_else(|p| p.into_inner());
        // The old guard goes first: its drop clears the mount.
        drop(serving.take());
        *serving = Some(mount.serve(grant.clone()));
    }
    match container.exchange(request, until, deadline, limit).await {
        Ok(reply) => Ok(reply),
        Err(EngineFailure::BeforeStart(why)) | Err(EngineFailure::OutOfTime(why)) => {
            call.mark.nothing_started(before);
            tracing::info!(target: "plimsoll::engine", why = %why, "a session exchange found its container gone");
            Err(not_started("the session's container has ended"))
        }
        Err(EngineFailure::AfterStart(why)) => {
            tracing::warn!(target: "plimsoll::engine", why = %why, "a session exchange failed; its container was ended");
            Err(engine_if::EngineError::Engine(
                "the session's container did not answer in time or in bounds, and was ended".into(),
            ))
        }
    }
}
