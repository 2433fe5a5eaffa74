"""One fake-openshell sandbox as the fake keeps it: its stored spec, its
container, how its main process ended, and the phase a read of it sees."""

from __future__ import annotations

import subprocess

import messages as m


class Sandbox:
    def __init__(self, sid: str, name: str, labels: "dict[str, str]", spec: dict,
                 container: str) -> None:
        self.id, self.name, self.labels, self.container = sid, name, labels, container
        self.spec = spec  # as stored: what GetSandbox answers and what runs
        self.pending_reads = 1
        self.vanish_at: "float | None" = None
        # The main process's exit status once it ended (128 + n for signal n).
        self.exit_code: "int | None" = None
        self.processes: "list[subprocess.Popen]" = []
        self.flags: "set[str]" = set()
        self.jail = None  # its jail (../e2b/jail.py), when its policy names endpoints
        # What every process in it gets last (egress_proxy.environment): set
        # with a jail, empty otherwise.
        self.proxy_env: "dict[str, str]" = {}

    def phase(self, *, read: bool = False) -> int:
        """The phase now; `read` counts this as one of the reads a slow
        start needs before READY."""
        if self.vanish_at:
            return m.PHASE["DELETING"]
        if self.exit_code is not None:
            return m.PHASE["COMPLETED"] if self.exit_code == 0 else m.PHASE["ERROR"]
        if self.pending_reads > 0:
            if read:
                self.pending_reads -= 1
            return m.PHASE["PROVISIONING"]
        return m.PHASE["READY"]

    def to_message(self, phase: int, spec: "dict | None" = None) -> dict:
        status: dict = {"phase": phase}
        if self.exit_code is not None:
            status["exit_code"] = self.exit_code
        return {"metadata": {"id": self.id, "name": self.name,
                             "labels": self.labels, "workspace": "default"},
                "spec": spec if spec is not None else self.spec,
                "status": status}
