//! The not-dispatched mark, as the plugin host gives or withholds it: the
//! one place that rule lives.
//!
//! The mark on an answer is the host's statement that nothing ran. A plugin
//! cannot earn it by claiming it: the host repeats a plugin's refusal, or
//! turns a plugin's failure into a marked refusal, only when it saw the
//! plugin use nothing during the call that could have started execution.
//! Capabilities say when they are about to do such a thing (send a request,
//! ask a backend to start a container) *before* doing it, so a call
//! abandoned at its deadline mid-act still counts; and they put the mark
//! back only when the act proved that nothing started.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::outcome::RunFailure;
use crate::refusal::Refusal;

/// How an overruled claim of "nothing ran" reads (`plimsoll plugin check`
/// looks for it).
pub const OVERRULED: &str = "reported a refusal after using a capability that can start execution";

/// What the host saw of one plugin call.
#[derive(Debug, Default)]
pub struct DispatchMark {
    may_have_started: bool,
    /// Set by acts that run outside the host function that began them (a
    /// wasi:http request is sent by a task of its own): they can only set
    /// it, never put it back, because nothing proves such an act sent nothing.
    elsewhere: Arc<AtomicBool>,
}

/// A handle that marks the call from outside the store's data.
#[derive(Debug, Clone)]
pub struct Elsewhere(Arc<AtomicBool>);

impl Elsewhere {
    /// Called before anything that could start execution; never undone.
    pub fn before_execution(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The mark as it was before an act, to put back if the act started nothing.
#[must_use = "put it back with `nothing_started` when the act proves nothing ran"]
pub struct Before(bool);

impl DispatchMark {
    /// Called before anything that could start execution.
    pub fn before_execution(&mut self) -> Before {
        let was = self.may_have_started;
        self.may_have_started = true;
        Before(was)
    }

    /// The act proved nothing started: the mark is what it was before.
    pub fn nothing_started(&mut self, before: Before) {
        self.may_have_started = before.0;
    }

    /// Whether the plugin used anything that could have started execution.
    pub fn may_have_started(&self) -> bool {
        self.may_have_started || self.elsewhere.load(Ordering::SeqCst)
    }

    /// A handle for acts that outlive the host function that began them.
    pub fn elsewhere(&self) -> Elsewhere {
        Elsewhere(self.elsewhere.clone())
    }

    /// A call that ended without a result (a trap, a deadline, memory):
    /// marked `environment` if nothing could have started, unmarked if
    /// something could.
    pub fn failed(&self, plugin: &str, what: &str) -> RunFailure {
        if self.may_have_started() {
            RunFailure::MayHaveRun(format!(
                "plugin {plugin} failed after it started work: {what}"
            ))
        } else {
            RunFailure::NotDispatched(Refusal::environment(format!(
                "plugin {plugin} failed before dispatching anything: {what}"
            )))
        }
    }

    /// A plugin that says nothing ran: repeated only if the host saw
    /// nothing that could have started execution.
    pub fn refused(&self, plugin: &str, refusal: Refusal) -> RunFailure {
        if self.may_have_started() {
            RunFailure::MayHaveRun(format!("plugin {plugin} {OVERRULED}"))
        } else {
            RunFailure::NotDispatched(refusal)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_survives_only_acts_that_started_nothing() {
        let mut m = DispatchMark::default();
        let refusal = || Refusal::capacity("full");
        assert!(matches!(
            m.refused("p", refusal()),
            RunFailure::NotDispatched(_)
        ));
        let before = m.before_execution();
        m.nothing_started(before);
        assert!(!m.may_have_started());
        assert!(matches!(
            m.failed("p", "trap"),
            RunFailure::NotDispatched(_)
        ));
        let _kept = m.before_execution();
        assert!(m.may_have_started());
        assert!(matches!(
            m.refused("p", refusal()),
            RunFailure::MayHaveRun(_)
        ));
        assert!(matches!(m.failed("p", "trap"), RunFailure::MayHaveRun(_)));
        // An act that started nothing after one that may have does not
        // clear the earlier one.
        let before = m.before_execution();
        m.nothing_started(before);
        assert!(m.may_have_started());
    }

    #[test]
    fn a_mark_set_elsewhere_is_never_put_back() {
        let mut m = DispatchMark::default();
        let handle = m.elsewhere();
        let before = m.before_execution();
        m.nothing_started(before);
        assert!(!m.may_have_started());
        handle.before_execution();
        assert!(m.may_have_started());
        let before = m.before_execution();
        m.nothing_started(before);
        assert!(
            m.may_have_started(),
            "an act proven empty does not clear it"
        );
        assert!(matches!(
            m.refused("p", Refusal::capacity("full")),
            RunFailure::MayHaveRun(_)
        ));
    }
}
