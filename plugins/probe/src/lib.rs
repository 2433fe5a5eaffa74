//! What the cloud adapters' startup smoke tests share: a probe step prints
//! `key=value` lines from inside the sandbox, and each promise is a named
//! check that passed or FAILED. The report is the operator's: every check
//! is listed, and the daemon refuses to start on any failure, naming it.
//! `leftovers` holds what their sessions share: the sweep of processes a
//! call left behind.

pub mod leftovers;

/// A probe step's output, read as `key=value` lines.
pub struct Probe {
    text: String,
}

impl Probe {
    pub fn new(stdout: &[u8]) -> Probe {
        Probe {
            text: String::from_utf8_lossy(stdout).into_owned(),
        }
    }

    /// Every value printed for `key`, in order.
    pub fn values(&self, key: &str) -> Vec<&str> {
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    }

    /// Whether `key` was printed exactly once, as `want`.
    pub fn is(&self, key: &str, want: &str) -> bool {
        self.values(key) == [want]
    }
}

/// The smoke test's checks, in the order they were made.
#[derive(Default)]
pub struct Checks {
    lines: Vec<String>,
    failed: bool,
}

impl Checks {
    /// A line that is not a check (what was swept, say).
    pub fn note(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    pub fn check(&mut self, ok: bool, what: &str) {
        self.failed |= !ok;
        self.lines
            .push(format!("{what}: {}", if ok { "ok" } else { "FAILED" }));
    }

    /// The two promises every adapter's probe step shows the same way:
    /// both egress attempts (`egress=`) found closed, and `node=` printed a
    /// version.
    pub fn egress_and_node(&mut self, probe: &Probe) {
        let egress = probe.values("egress");
        self.check(
            egress.len() == 2 && egress.iter().all(|e| *e == "closed"),
            "connections out are refused",
        );
        self.check(
            probe
                .values("node")
                .first()
                .is_some_and(|v| v.starts_with('v')),
            "node is present",
        );
    }

    /// The two signs of a virtual machine rather than a container, which
    /// the VM adapters' probe steps show the same way: a virtual CPU
    /// (`hypervisor=yes`) and no container runtime's marker
    /// (`container=no`).
    pub fn vm(&mut self, probe: &Probe) {
        self.check(probe.is("hypervisor", "yes"), "the CPU is virtual (a VM)");
        self.check(
            probe.is("container", "no"),
            "no container runtime marker (a VM, not a container)",
        );
    }

    pub fn passed(&self) -> bool {
        !self.failed
    }

    pub fn report(&self) -> String {
        self.lines.join("\n")
    }
}
