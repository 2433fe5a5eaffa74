//! Grant preambles, compiled once per profile into the guest engine's
//! bytecode and handed to every granted run of that profile.
//!
//! A preamble (a generated SDK, say) is a few KiB of source that every
//! granted run would otherwise parse again, because each run starts from
//! the same snapshot. Parsing was most of its cost; loading bytecode is a
//! copy and a walk (docs/benchmarks.md). The bytes are made by the guest in
//! an instance of its own that runs nothing else, kept here, out of every
//! run's reach, and copied into each run before its snippet starts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::WasmProvider;
use super::generated::plimsoll::js::grant::GrantClient;
use super::store::{self, RunState};
use crate::grants::broker;
use crate::outcome::RunFailure;
use crate::refusal::Refusal;

/// Longest compiling one preamble may take.
const COMPILE_BUDGET: Duration = Duration::from_secs(5);

/// A preamble's bytecode, or why it did not compile.
type Outcome = Result<Vec<u8>, String>;

/// Each profile's compiled preamble, or why it did not compile, by profile
/// name (profiles are frozen at start, so a name is one preamble).
#[derive(Default)]
pub(super) struct Compiled(Mutex<HashMap<String, Arc<Outcome>>>);

impl WasmProvider {
    /// What the guest needs to set up a granted run's client: its global
    /// and the profile's compiled preamble. Never the credential, which
    /// stays in the broker. A preamble that does not compile refuses the
    /// run before anything of it ran.
    pub(super) async fn grant_client(
        &self,
        session: &broker::Session,
    ) -> Result<GrantClient, RunFailure> {
        let profile = session.profile();
        let preamble = match &profile.preamble {
            None => None,
            Some(text) => match &*self.compiled_preamble(&profile.name, text).await {
                Ok(bytes) => Some(bytes.clone()),
                Err(why) => {
                    return Err(RunFailure::NotDispatched(Refusal::environment(format!(
                        "the grant profile's preamble does not compile: {why}"
                    ))));
                }
            },
        };
        Ok(GrantClient {
            global: profile.global.clone(),
            preamble,
        })
    }

    async fn compiled_preamble(&self, profile: &str, text: &str) -> Arc<Outcome> {
        let known = match self.preambles.0.lock() {
            Ok(m) => m.get(profile).cloned(),
            Err(_) => None,
        };
        if let Some(done) = known {
            return done;
        }
        // Two first runs of a profile may both compile it: the same bytes,
        // and cheaper than making one wait on the other.
        let done = Arc::new(self.compile(text).await);
        if let Ok(mut m) = self.preambles.0.lock() {
            m.insert(profile.to_string(), done.clone());
        }
        done
    }

    async fn compile(&self, text: &str) -> Result<Vec<u8>, String> {
        let mut state = RunState::new(self.memory_limit, self.output_limit);
        state.ends = Instant::now() + COMPILE_BUDGET;
        let mut store = store::new(&self.engine, state);
        let guest = self
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| format!("no instance to compile it in: {e}"))?;
        let compiled = guest.call_compile_preamble(&mut store, text).await;
        let _ = store::release(store).await;
        compiled.map_err(|e| format!("the compiler stopped: {e}"))?
    }
}
