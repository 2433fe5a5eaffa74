//! The wall: the caller's floor and software rule, compared with the
//! provider's current evidence as the last step before dispatch. Below the
//! floor, or outside the rule, nothing runs.

use crate::providers::Evidence;
use crate::refusal::{Code, Reason, Refusal};
use crate::tier::Tier;
use crate::wire::SoftwareRule;

/// The floor check. `None` is no floor. Below the floor nothing runs.
pub fn check_floor(floor: Option<Tier>, current: Tier) -> Result<(), Refusal> {
    match floor {
        Some(f) if !current.meets(f) => Err(Refusal::new(
            Code::FailedPrecondition,
            Reason::Isolation,
            format!("the provider's isolation is {current}, below the requested minimum {f}"),
        )),
        _ => Ok(()),
    }
}

/// The floor, then the software rule: a provider with no stated software
/// identity meets no rule.
pub fn check(
    floor: Option<Tier>,
    rule: Option<&SoftwareRule>,
    evidence: &Evidence,
) -> Result<(), Refusal> {
    check_floor(floor, evidence.tier)?;
    if let Some(rule) = rule
        && (evidence.software_identity.is_empty()
            || !rule.identities.contains(&evidence.software_identity))
    {
        return Err(Refusal::environment(
            "the provider's software is not in the request's software rule",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_below_evidence_refuses_with_isolation() {
        let r = check_floor(Some(Tier::Vm), Tier::Process).expect_err("refused");
        assert_eq!(r.reason, Reason::Isolation);
        assert_eq!(r.code, Code::FailedPrecondition);
        assert!(check_floor(Some(Tier::Process), Tier::Process).is_ok());
        assert!(check_floor(None, Tier::None).is_ok());
        assert!(check_floor(Some(Tier::Process), Tier::None).is_err());
    }

    #[test]
    fn the_software_rule_needs_the_evidence_identity_in_it() {
        let ev = |identity: &str| Evidence {
            sandbox: "wasm".into(),
            tier: Tier::Process,
            environment: "e".into(),
            software_identity: identity.into(),
            policy: String::new(),
        };
        let rule = SoftwareRule {
            mode: "approved".into(),
            identities: vec!["a:1".into(), "b:2".into()],
        };
        assert!(check(None, Some(&rule), &ev("b:2")).is_ok());
        assert!(
            check(None, None, &ev("")).is_ok(),
            "no rule, no identity needed"
        );
        for outside in ["c:3", ""] {
            let r = check(None, Some(&rule), &ev(outside)).expect_err("refused");
            assert_eq!(r.reason, Reason::Environment, "{outside:?}");
        }
        // The floor is checked first, and its refusal is isolation.
        let r = check(Some(Tier::Vm), Some(&rule), &ev("c:3")).expect_err("refused");
        assert_eq!(r.reason, Reason::Isolation);
    }
}
