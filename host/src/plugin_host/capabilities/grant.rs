//! The `grant` capability: how a plugin whose sandboxes the host cannot
//! mount a socket into (a hosted service's) hands a granted run its way to
//! the broker, through the daemon's guard.
//!
//! Every plugin may import it; it answers only in a call that carries a
//! grant, on a daemon with a guard. The run's admission (its token) is
//! held in the call's state and dropped with it, so the token dies when the
//! call ends whatever the plugin does. Asking is not dispatch: nothing of
//! the request runs because a token exists.

use std::sync::Arc;

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, WasmStr};

use super::CallView;
use super::log::LogView;
use crate::grants::guard::{Channel, Guard, Ticket};
use crate::plugin_host::bindings::grant_if;
use crate::plugin_host::lazy::Budget;

/// Longest directory name read from a plugin.
const DIR_BYTES: usize = 256;

/// One call's view of the guard, and its admission once asked for.
#[derive(Default)]
pub struct GrantState {
    guard: Option<Arc<Guard>>,
    issued: Option<(Ticket, grant_if::Channel)>,
}

impl GrantState {
    pub fn new(guard: Option<Arc<Guard>>) -> GrantState {
        GrantState {
            guard,
            issued: None,
        }
    }
}

pub trait GrantView: CallView + LogView {
    fn grant(&mut self) -> &mut GrantState;
}

pub fn add_to_linker<T: GrantView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut grant = linker.instance("plimsoll:provider/grant@0.1.0")?;
    grant.func_wrap_async(
        "open-channel",
        |mut store: StoreContextMut<'_, T>, (dir,): (WasmStr,)| {
            let answer = channel(&mut store, &dir);
            Box::new(async move { Ok((answer,)) })
        },
    )?;
    grant.func_wrap_async("guard", |mut store: StoreContextMut<'_, T>, (): ()| {
        let dial = store
            .data_mut()
            .grant()
            .guard
            .as_ref()
            .map(|g| (g.dial().host.clone(), g.dial().port));
        Box::new(async move { Ok((dial,)) })
    })?;
    Ok(())
}

fn channel<T: GrantView>(
    store: &mut StoreContextMut<'_, T>,
    dir: &WasmStr,
) -> Result<Option<grant_if::Channel>, String> {
    let dir = Budget::new(DIR_BYTES, 0)
        .string(store, dir)
        .map_err(|_| format!("the directory is over {DIR_BYTES} bytes"))?;
    let session = store.data_mut().call().grant.clone();
    let state = store.data_mut().grant();
    let (Some(session), Some(guard)) = (session, state.guard.clone()) else {
        return Ok(None);
    };
    if let Some((_, issued)) = &state.issued {
        return Ok(Some(issued.clone()));
    }
    let (ticket, channel) = guard.channel(&session, &dir).map_err(|e| e.to_string())?;
    let token = ticket.token.expose().to_string();
    let wit = to_wit(channel);
    state.issued = Some((ticket, wit.clone()));
    // A plugin that logs the environment it was handed must not put the
    // token in the daemon's log.
    store.data_mut().log().redact(token);
    Ok(Some(wit))
}

fn to_wit(c: Channel) -> grant_if::Channel {
    grant_if::Channel {
        host: c.host,
        port: c.port,
        files: c
            .files
            .into_iter()
            .map(|(name, contents)| grant_if::GrantFile { name, contents })
            .collect(),
        env: c.env,
    }
}
