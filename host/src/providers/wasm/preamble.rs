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
use crate::grants::{Grants, broker};
use crate::outcome::RunFailure;
use crate::refusal::Refusal;

/// Longest compiling one preamble may take.
const COMPILE_BUDGET: Duration = Duration::from_secs(5);

/// A preamble's bytecode, or the compiler's reason it has none.
type Outcome = Result<Arc<[u8]>, String>;

/// Each profile's compiled preamble, or why it did not compile, by profile
/// name (profiles are frozen at start, so a name is one preamble).
#[derive(Default)]
pub(super) struct Compiled(Mutex<HashMap<String, Arc<Outcome>>>);

/// Why a preamble has no bytecode.
enum Failed {
    /// The compiler refused it: the same text always will.
    Refused(String),
    /// No instance to compile in, or it trapped: another try may work.
    Unavailable(String),
}

impl WasmProvider {
    /// Compiles every profile's preamble, at start: one that does not
    /// compile stops the daemon, as any other mistake in the grants file
    /// does, and no run ever waits on a compile (or on an instance for it).
    pub async fn prepare_preambles(&self, grants: &Grants) -> Result<(), String> {
        for profile in grants.all() {
            let Some(text) = &profile.preamble else {
                continue;
            };
            match self.compile(text).await {
                Ok(bytes) => self.remember(&profile.name, Ok(bytes)),
                Err(Failed::Refused(why) | Failed::Unavailable(why)) => {
                    return Err(format!(
                        "grant profile {:?}: its preamble does not compile: {why}",
                        profile.name
                    ));
                }
            }
        }
        Ok(())
    }

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
            Some(text) => match self.compiled_preamble(&profile.name, text).await {
                Ok(bytes) => Some(bytes.to_vec()),
                Err(Failed::Refused(why)) => {
                    return Err(RunFailure::NotDispatched(Refusal::environment(format!(
                        "the grant profile's preamble does not compile: {why}"
                    ))));
                }
                Err(Failed::Unavailable(why)) => {
                    tracing::warn!(error = %why, "compiling a grant preamble failed");
                    return Err(RunFailure::NotDispatched(Refusal::capacity(
                        "no wasm instance could be made to prepare the grant's preamble",
                    )));
                }
            },
        };
        Ok(GrantClient {
            global: profile.global.clone(),
            preamble,
        })
    }

    /// The bytecode compiled at start. A provider that was not prepared
    /// (made in process, as the benchmark does) compiles on first use;
    /// only the compiler's own verdict is kept, never a missing instance.
    async fn compiled_preamble(&self, profile: &str, text: &str) -> Result<Arc<[u8]>, Failed> {
        let known = match self.preambles.0.lock() {
            Ok(m) => m.get(profile).cloned(),
            Err(_) => None,
        };
        match known.as_deref() {
            Some(Ok(bytes)) => return Ok(bytes.clone()),
            Some(Err(why)) => return Err(Failed::Refused(why.clone())),
            None => {}
        }
        match self.compile(text).await {
            Ok(bytes) => {
                let bytes: Arc<[u8]> = Arc::from(bytes);
                self.remember(profile, Ok(bytes.to_vec()));
                Ok(bytes)
            }
            Err(Failed::Refused(why)) => {
                self.remember(profile, Err(why.clone()));
                Err(Failed::Refused(why))
            }
            Err(e) => Err(e),
        }
    }

    fn remember(&self, profile: &str, outcome: Result<Vec<u8>, String>) {
        let outcome = Arc::new(outcome.map(Arc::from));
        if let Ok(mut m) = self.preambles.0.lock() {
            m.insert(profile.to_string(), outcome);
        }
    }

    async fn compile(&self, text: &str) -> Result<Vec<u8>, Failed> {
        let mut state = RunState::new(self.memory_limit, self.output_limit);
        state.ends = Instant::now() + COMPILE_BUDGET;
        let mut store = store::new(&self.engine, state);
        let guest = self
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| Failed::Unavailable(format!("no instance to compile it in: {e}")))?;
        let compiled = guest.call_compile_preamble(&mut store, text).await;
        let _ = store::release(store).await;
        match compiled {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(why)) => Err(Failed::Refused(why)),
            Err(e) => Err(Failed::Unavailable(format!("the compiler stopped: {e}"))),
        }
    }
}
