//! Isolation tiers and the floor a caller may demand.
//!
//! A tier is this daemon's observation of the boundary a run executes behind,
//! never a remote attestation. The ordering is the whole point: a caller's
//! `minimum_isolation` is compared against the provider's *current* evidence
//! immediately before dispatch (see `pipeline::floor`).

use std::fmt;

/// Weakest first, so the derived ordering is the security ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Nothing runs at all (the Disabled provider).
    None,
    /// In the daemon's own process (the wasm provider): not an OS boundary.
    Process,
    /// A container sharing the host kernel (runc).
    Container,
    /// A stand-in kernel between the guest and the host's (gVisor runsc).
    Kernel,
    /// A virtual machine (hosted microVMs).
    Vm,
}

impl Tier {
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::None => "none",
            Tier::Process => "process",
            Tier::Container => "container",
            Tier::Kernel => "kernel",
            Tier::Vm => "vm",
        }
    }

    /// Parses a floor as a request states it. "" is no floor; `none` is not a
    /// floor anyone can ask for, and anything else is a malformed request.
    pub fn parse_floor(s: &str) -> Result<Option<Tier>, InvalidTier> {
        match s {
            "" => Ok(None),
            "process" => Ok(Some(Tier::Process)),
            "container" => Ok(Some(Tier::Container)),
            "kernel" => Ok(Some(Tier::Kernel)),
            "vm" => Ok(Some(Tier::Vm)),
            _ => Err(InvalidTier),
        }
    }

    /// Whether this tier satisfies `floor`. `None` (nothing runs) satisfies no
    /// floor, not even `process`.
    pub fn meets(self, floor: Tier) -> bool {
        self != Tier::None && self >= floor
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("minimum isolation must be process, container, kernel or vm")]
pub struct InvalidTier;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_is_security_ordering() {
        assert!(Tier::Process < Tier::Container);
        assert!(Tier::Container < Tier::Kernel);
        assert!(Tier::Kernel < Tier::Vm);
        assert!(Tier::Vm.meets(Tier::Process));
        assert!(!Tier::Process.meets(Tier::Container));
        assert!(!Tier::None.meets(Tier::Process));
    }

    #[test]
    fn floors_parse_strictly() {
        assert_eq!(Tier::parse_floor(""), Ok(None));
        assert_eq!(Tier::parse_floor("kernel"), Ok(Some(Tier::Kernel)));
        for bad in ["none", "VM", " vm", "vm ", "unknown", "Process"] {
            assert_eq!(Tier::parse_floor(bad), Err(InvalidTier), "{bad:?}");
        }
    }
}
