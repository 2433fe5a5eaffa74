//! The Disabled provider: the default when `SANDBOX_PROVIDER` is unset.
//!
//! It has no way to run anything. It is not a provider that is switched off;
//! it is the absence of one, so no configuration mistake can make it execute
//! code. Every run is refused with reason `unsupported` before any dispatch.

use futures_util::future::{BoxFuture, ready};

use super::{Evidence, Offer, Provider, not_offered};
use crate::job::{Job, Output};
use crate::outcome::RunFailure;
use crate::refusal::{Code, Reason, Refusal};
use crate::tier::Tier;

pub struct Disabled;

impl Provider for Disabled {
    fn evidence(&self) -> Evidence {
        Evidence {
            sandbox: "disabled".to_string(),
            tier: Tier::None,
            environment: String::new(),
            software_identity: String::new(),
            policy: String::new(),
        }
    }

    fn offer(&self) -> Offer {
        Offer::default()
    }

    fn refuses_everything(&self) -> Option<Refusal> {
        Some(Refusal::new(
            Code::FailedPrecondition,
            Reason::Unsupported,
            "no provider is configured (SANDBOX_PROVIDER is unset): this daemon runs nothing",
        ))
    }

    fn run(&self, _job: Job) -> BoxFuture<'_, Result<Output, RunFailure>> {
        Box::pin(ready(Err(not_offered())))
    }
}
