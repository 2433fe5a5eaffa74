//! A plugin's answers, turned into the host's terms: its output held to the
//! run's limits, its refusal kept to the API's reasons with its text
//! bounded, its claimed tier capped.

use super::MESSAGE_BYTES;
use super::bindings::types;
use crate::outcome::{ProcessOutput, ProjectOutcome};
use crate::refusal::{Code, Reason, Refusal};
use crate::text::sanitize;
use crate::tier::Tier;

/// A plugin's output, held to the run's per-stream limit.
pub(super) fn cap_output(mut out: types::ProcessOutput, limit: usize) -> ProcessOutput {
    let cut = |v: &mut Vec<u8>| {
        let over = v.len() > limit;
        v.truncate(limit);
        over
    };
    let cut_out = cut(&mut out.stdout);
    let cut_err = cut(&mut out.stderr);
    ProcessOutput {
        stdout: out.stdout,
        stderr: out.stderr,
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        stdout_truncated: out.stdout_truncated || cut_out,
        stderr_truncated: out.stderr_truncated || cut_err,
    }
}

pub(super) fn outcome_of(o: types::ProjectOutcome) -> ProjectOutcome {
    match o {
        types::ProjectOutcome::Completed => ProjectOutcome::Completed,
        types::ProjectOutcome::SetupFailed => ProjectOutcome::SetupFailed,
        types::ProjectOutcome::TimedOut => ProjectOutcome::TimedOut,
        types::ProjectOutcome::ProtocolError => ProjectOutcome::ProtocolError,
    }
}

/// The tier a plugin provider reports: its claim, capped by what the
/// operator allows and, for a plugin that drives a container backend, by the
/// tier the backend's own evidence stands behind (container under runc,
/// kernel under a verified runsc).
pub fn effective_tier(claimed: Tier, operator_max: Tier, backend_tier: Option<Tier>) -> Tier {
    claimed
        .min(operator_max)
        .min(backend_tier.unwrap_or(Tier::Vm))
}

pub(super) fn tier_of(t: types::Tier) -> Tier {
    match t {
        types::Tier::Process => Tier::Process,
        types::Tier::Container => Tier::Container,
        types::Tier::Kernel => Tier::Kernel,
        types::Tier::Vm => Tier::Vm,
    }
}

pub(super) fn refusal_of(r: types::Refusal) -> Refusal {
    let (code, reason, msg) = match r {
        types::Refusal::Request(m) => (Code::InvalidArgument, Reason::Request, m),
        types::Refusal::Permission(m) => (Code::PermissionDenied, Reason::Permission, m),
        types::Refusal::Unsupported(m) => (Code::Unimplemented, Reason::Unsupported, m),
        types::Refusal::Isolation(m) => (Code::FailedPrecondition, Reason::Isolation, m),
        types::Refusal::Environment(m) => (Code::FailedPrecondition, Reason::Environment, m),
        types::Refusal::Capacity(m) => (Code::ResourceExhausted, Reason::Capacity, m),
    };
    Refusal::new(code, reason, sanitize(&msg, MESSAGE_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_capped_never_raised() {
        assert_eq!(effective_tier(Tier::Vm, Tier::Vm, None), Tier::Vm);
        assert_eq!(effective_tier(Tier::Vm, Tier::Process, None), Tier::Process);
        assert_eq!(effective_tier(Tier::Process, Tier::Vm, None), Tier::Process);
        // The engine's evidence caps the claim: runc is container...
        assert_eq!(
            effective_tier(Tier::Vm, Tier::Vm, Some(Tier::Container)),
            Tier::Container
        );
        // ...and a verified runsc is kernel, never vm.
        assert_eq!(
            effective_tier(Tier::Vm, Tier::Vm, Some(Tier::Kernel)),
            Tier::Kernel
        );
        assert_eq!(
            effective_tier(Tier::Kernel, Tier::Container, Some(Tier::Kernel)),
            Tier::Container
        );
    }
}
