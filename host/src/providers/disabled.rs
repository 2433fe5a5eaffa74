//! The Disabled provider: the default when `SANDBOX_PROVIDER` is unset.
//!
//! It has no way to run anything. It is not a provider that is switched off;
//! it is the absence of one, so no configuration mistake can make it execute
//! code. Every run is refused with reason `unsupported` before any dispatch.

use super::Evidence;
use crate::tier::Tier;

pub fn evidence() -> Evidence {
    Evidence {
        sandbox: "disabled".to_string(),
        tier: Tier::None,
        environment: String::new(),
        software_identity: String::new(),
        policy: String::new(),
    }
}
