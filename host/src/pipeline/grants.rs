//! The pipeline's side of grants: which profiles a caller may name where,
//! the admission check of the one a request names, and the broker session
//! minted for it immediately before dispatch.

use std::sync::Arc;

use super::Daemon;
use crate::grants::{Profile, broker};
use crate::refusal::Refusal;

impl Daemon {
    /// The profiles `caller` may name in a JavaScript run here: none when
    /// the provider cannot carry a grant.
    pub fn javascript_profiles_for(&self, caller: &str) -> Vec<Arc<Profile>> {
        if !self.provider.offer().javascript_grants {
            return Vec::new();
        }
        self.grants.all_for_caller(caller)
    }

    /// The profile a request names, if this caller may use it and this
    /// provider can carry it; an unknown profile, a forbidden one and one
    /// the provider cannot carry get the same answer.
    pub(super) fn grant_for(
        &self,
        name: &str,
        project: bool,
        caller: &str,
    ) -> Result<Option<Arc<Profile>>, Refusal> {
        if name.is_empty() {
            return Ok(None);
        }
        let offer = self.provider.offer();
        let carries = if project {
            offer.project_grants
        } else {
            offer.javascript_grants
        };
        match self.grants.for_caller(name, caller) {
            Some(p) if carries => Ok(Some(p)),
            _ => Err(Refusal::permission(
                "grant profile is unknown or not permitted for this caller",
            )),
        }
    }

    /// A grant's broker session for one run or session call: its
    /// credential minted now, after every check and immediately before
    /// dispatch. No profile, no session.
    pub(crate) fn mint_grant(
        &self,
        profile: Option<Arc<Profile>>,
        caller: &str,
        timeout: std::time::Duration,
    ) -> Result<Option<Arc<broker::Session>>, Refusal> {
        let Some(p) = profile else { return Ok(None) };
        let Some(client) = &self.broker_client else {
            return Err(Refusal::environment(
                "the broker is not available on this daemon",
            ));
        };
        broker::Session::open(p, caller, timeout, client.clone())
            .map(|s| Some(Arc::new(s)))
            .map_err(|e| {
                tracing::error!(error = %e, "a grant's credential could not be minted; the run is refused");
                Refusal::environment("the grant's credential could not be minted")
            })
    }
}
