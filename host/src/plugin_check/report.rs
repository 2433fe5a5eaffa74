//! What `plimsoll plugin check` found: one verdict per rule, with the
//! reason, as text for a person or JSON for CI.

use serde::Serialize;

/// The rules a plugin is held to, in the order they are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// Every import is an interface a plimsoll plugin may have.
    Imports,
    /// describe answers in time, names itself, states what it runs, claims
    /// no tier above its backend's evidence, and its configuration settles.
    Describe,
    /// The smoke test passes in time and says what it checked.
    Preflight,
    /// An ordinary snippet runs and answers what it printed.
    Run,
    /// A snippet that never ends is answered by the plugin itself, before
    /// the host's backstop stops it.
    Deadline,
    /// The plugin never claims nothing ran after using a capability that
    /// can start execution.
    NotDispatched,
    /// Whatever the plugin made is gone after every path, its own trap too.
    Cleanup,
    /// An ordinary run stays inside the host's budgets.
    Budgets,
    /// No credential-shaped header on a plain-http request.
    PlainHttpCredential,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::Imports => "imports",
            Rule::Describe => "describe",
            Rule::Preflight => "preflight",
            Rule::Run => "run",
            Rule::Deadline => "deadline",
            Rule::NotDispatched => "not-dispatched",
            Rule::Cleanup => "cleanup",
            Rule::Budgets => "budgets",
            Rule::PlainHttpCredential => "plain-http-credential",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    /// Not checked, and why (the plugin does not do it, or the check
    /// needs something the operator did not give).
    Skip,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub rule: Rule,
    pub verdict: Verdict,
    pub reason: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub plugin: String,
    pub sha256: String,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn add(&mut self, rule: Rule, verdict: Verdict, reason: impl Into<String>) {
        self.findings.push(Finding {
            rule,
            verdict,
            reason: reason.into(),
        });
    }

    pub fn pass(&mut self, rule: Rule, reason: impl Into<String>) {
        self.add(rule, Verdict::Pass, reason);
    }

    pub fn fail(&mut self, rule: Rule, reason: impl Into<String>) {
        self.add(rule, Verdict::Fail, reason);
    }

    pub fn skip(&mut self, rule: Rule, reason: impl Into<String>) {
        self.add(rule, Verdict::Skip, reason);
    }

    /// Passes `rule` unless it has already failed: for rules judged over
    /// every scenario.
    pub fn pass_unless_failed(&mut self, rule: Rule, reason: impl Into<String>) {
        if !self.failed(rule) {
            self.pass(rule, reason);
        }
    }

    pub fn failed(&self, rule: Rule) -> bool {
        self.findings
            .iter()
            .any(|f| f.rule == rule && f.verdict == Verdict::Fail)
    }

    pub fn any_failed(&self) -> bool {
        self.findings.iter().any(|f| f.verdict == Verdict::Fail)
    }

    pub fn text(&self) -> String {
        let mut out = format!("plugin {} (sha256 {})\n", self.plugin, self.sha256);
        for f in &self.findings {
            let verdict = match f.verdict {
                Verdict::Pass => "PASS",
                Verdict::Fail => "FAIL",
                Verdict::Skip => "SKIP",
            };
            out.push_str(&format!("{verdict} {:<22} {}\n", f.rule.name(), f.reason));
        }
        let count = |v: Verdict| self.findings.iter().filter(|f| f.verdict == v).count();
        let (failed, skipped) = (count(Verdict::Fail), count(Verdict::Skip));
        out.push_str(&if failed == 0 {
            format!("every rule checked passed ({skipped} not checked)\n")
        } else {
            format!("{failed} rule(s) failed ({skipped} not checked)\n")
        });
        out
    }
}
