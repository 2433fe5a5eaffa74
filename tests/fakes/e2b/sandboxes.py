"""Sandboxes and the processes running in them: the fake's state.

A `Registry` owns every live sandbox, enforces each one's timeout (a reaper
thread kills it when its end time passes, as E2B does), and keeps the counts
the leak accounting reads. A jailed sandbox's jail (jail.py) is made before
its container and closed after it, so no container runs on a network with
nothing guarding it, and no jail outlives its sandbox. A `Process` is one
command started through envd: its output is read from `docker exec` in
chunks and handed to every stream subscribed to it (Start's, and any
Connect's).
"""

from __future__ import annotations

import os
import queue
import secrets
import string
import threading
import time

from container import Docker
from egress import DOMAIN_PORTS, DomainGate, hosts_for

_ID_ALPHABET = string.ascii_lowercase + string.digits
READ_CHUNK = 32 * 1024  # how much output one DataEvent carries at most

# What a stream receives when the sandbox under it is removed mid-command.
SANDBOX_GONE = {"sandbox_gone": True}
SIGNAL_STATUS = {9: "signal: killed", 15: "signal: terminated"}


def new_id(length: int = 20) -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


class Process:
    def __init__(self, sandbox: "Sandbox", pid: int, config: dict, tag: "str | None",
                 user: str, popen, stdin: bool) -> None:
        self.sandbox, self.pid, self.config, self.tag, self.user = sandbox, pid, config, tag, user
        self.popen, self.stdin_open = popen, stdin
        self._lock = threading.Lock()  # subscribers and the end
        self._stdin_lock = threading.Lock()  # a blocked stdin write must not stall output
        self._subscribers: "list[queue.Queue]" = []
        self.signal_sent: "int | None" = None
        self.ended = threading.Event()

    # ---- fan-out of events to streams ------------------------------------------

    def subscribe(self) -> "queue.Queue | None":
        """A queue of ProcessEvent dicts from now on; None if already ended."""
        with self._lock:
            if self.ended.is_set():
                return None
            q: queue.Queue = queue.Queue()
            self._subscribers.append(q)
            return q

    def unsubscribe(self, q: queue.Queue) -> None:
        with self._lock:
            if q in self._subscribers:
                self._subscribers.remove(q)

    def publish(self, event: dict, *, final: bool = False) -> None:
        with self._lock:
            for q in self._subscribers:
                q.put(event)
            if final:
                self._subscribers.clear()
                self.ended.set()

    # ---- running ---------------------------------------------------------------

    def run(self) -> None:
        """Pump stdout and stderr into events, then the end; in threads."""
        readers = [threading.Thread(target=self._pump, args=(pipe, name), daemon=True)
                   for pipe, name in ((self.popen.stdout, "stdout"),
                                      (self.popen.stderr, "stderr"))]
        for reader in readers:
            reader.start()
        threading.Thread(target=self._wait, args=(readers,), daemon=True).start()

    def _pump(self, pipe, name: str) -> None:
        """Chunks as they come, up to READ_CHUNK each: never joined, never cut."""
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except OSError:
                break
            if not chunk:
                break
            self.publish({"data": {name: chunk}})

    def _wait(self, readers: "list[threading.Thread]") -> None:
        for reader in readers:
            reader.join()
        code = self.popen.wait()
        with self._stdin_lock:
            self.stdin_open = False
        for pipe in (self.popen.stdout, self.popen.stderr, self.popen.stdin):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        self.sandbox.forget(self)
        if self.sandbox.removed:
            self.publish(SANDBOX_GONE, final=True)
            return
        # docker exec answers 128+N for a command killed by signal N; only
        # trust that reading when the fake sent that signal itself.
        if self.signal_sent and code == 128 + self.signal_sent:
            end = {"exit_code": -1, "exited": False,
                   "status": SIGNAL_STATUS.get(self.signal_sent, f"signal: {self.signal_sent}")}
        else:
            end = {"exit_code": code, "exited": True, "status": f"exit status {code}"}
        if end["status"] != "exit status 0":
            end["error"] = end["status"]  # what waiting on a failed process reports
        self.publish({"end": end}, final=True)

    def write_stdin(self, data: bytes) -> bool:
        with self._stdin_lock:
            if not self.stdin_open:
                return False
            try:
                self.popen.stdin.write(data)
                return True
            except (BrokenPipeError, ValueError, OSError):
                return False

    def close_stdin(self) -> bool:
        with self._stdin_lock:
            if not self.stdin_open:
                return False
            self.stdin_open = False
            try:
                self.popen.stdin.close()
            except OSError:
                pass
            return True

    def info(self) -> dict:
        info = {"config": self.config, "pid": self.pid}
        if self.tag is not None:
            info["tag"] = self.tag
        return info


class Sandbox:
    def __init__(self, sandbox_id: str, container: str, spec: dict) -> None:
        self.id, self.container = sandbox_id, container
        self.template_id = spec["template_id"]
        self.metadata: "dict[str, str]" = spec.get("metadata") or {}
        self.env_vars: "dict[str, str]" = spec.get("env_vars") or {}
        self.access_token: "str | None" = spec.get("access_token")
        self.traffic_token: "str | None" = spec.get("traffic_token")
        # What the create said about internet access (None: nothing), and
        # which network the sandbox has: "open", "none" or "jail" (egress.py).
        self.allow_internet_access: "bool | None" = spec.get("allow_internet_access")
        self.egress: str = spec.get("egress") or "none"
        self.network: "dict | None" = spec.get("network")
        # A jailed sandbox's jail and the domains it lets out (None: no jail).
        self.jail = None
        self.gate: "DomainGate | None" = None
        # Held while the sandbox's network changes or its jail goes.
        self.network_lock = threading.Lock()
        self.envd_version: str = spec["envd_version"]
        self.started_at = time.time()
        self.end_at = self.started_at + spec["timeout"]
        # "running", or "paused" once a test paused it (Registry.pause): a
        # paused sandbox is listed as such, its timeout does not run, and
        # envd is unreachable until a connect resumes it.
        self.state = "running"
        self.removed = False
        self._lock = threading.Lock()
        self._processes: "dict[int, Process]" = {}

    def add(self, process: Process) -> None:
        with self._lock:
            self._processes[process.pid] = process

    def forget(self, process: Process) -> None:
        with self._lock:
            self._processes.pop(process.pid, None)

    def processes(self) -> "list[Process]":
        with self._lock:
            return list(self._processes.values())

    def find(self, pid: "int | None" = None, tag: "str | None" = None) -> "Process | None":
        with self._lock:
            if pid is not None:
                return self._processes.get(pid)
            return next((p for p in self._processes.values() if p.tag == tag), None)


class Registry:
    """Live sandboxes, their timeouts, and the create/delete counts."""

    def __init__(self, docker: Docker, jails=None) -> None:
        self.docker = docker
        self.jails = jails  # jail.Jails, or None: a jail cannot be made
        self._lock = threading.Lock()
        self._sandboxes: "dict[str, Sandbox]" = {}
        self.counts = {"creates": 0, "deletes": 0, "expired": 0}
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="fake-e2b-reaper", daemon=True)
        self._reaper.start()

    def create(self, image: str, spec: dict) -> Sandbox:
        sandbox_id = new_id()
        kind = spec.get("egress") or "none"
        network, hosts, jail, gate = {"open": "bridge"}.get(kind, "none"), [], None, None
        if kind == "jail":
            gate = DomainGate(spec.get("domains") or [])
            jail = self._jail(sandbox_id, gate)
            network, hosts = jail.network, hosts_for(gate.domains, jail.gateway)
        try:
            container = self.docker.create(image, sandbox_id, network=network, hosts=hosts,
                                           container_signs=bool(spec.get("container_signs")),
                                           env=spec.get("env_vars") or {})
        except Exception:
            if jail is not None:
                jail.close()
            raise
        sandbox = Sandbox(sandbox_id, container, spec)
        sandbox.jail, sandbox.gate = jail, gate
        with self._lock:
            if self._stop.is_set():  # stopping: do not hand out a sandbox nobody will reap
                self.docker.remove(container)
                if jail is not None:
                    jail.close()
                raise RuntimeError("the fake is stopping")
            self._sandboxes[sandbox_id] = sandbox
            self.counts["creates"] += 1
        return sandbox

    def _jail(self, sandbox_id: str, gate: DomainGate):
        if self.jails is None:
            raise RuntimeError("this fake makes no jails")
        return self.jails.open(sandbox_id, DOMAIN_PORTS, gate.allows)

    def set_egress(self, sandbox: Sandbox, kind: str, domains: "list[str]") -> bool:
        """Changes a running sandbox with no network or a jail to `none` or
        `jail` with these domains; False when the sandbox is gone. A jail,
        once made, stays for the sandbox's life: `none` is a jail that lets
        no name out (what E2B's firewall does with every name when nothing
        is allowed: accepts, then closes). Names newly allowed are written
        into the sandbox's /etc/hosts; names no longer allowed keep their
        line and are refused by the forwarder."""
        with sandbox.network_lock:
            if sandbox.removed:
                return False
            if sandbox.jail is not None:
                sandbox.gate.set(domains)
                sandbox.egress = "jail"
            elif kind == "jail":
                gate = DomainGate(domains)
                jail = self._jail(sandbox.id, gate)
                try:
                    self.docker.join_network(sandbox.container, jail.network)
                except Exception:
                    # Off the network again (if it got on), so the network can go;
                    # the sandbox keeps no network at all.
                    self.docker.leave_network(sandbox.container, jail.network)
                    jail.close()
                    raise
                sandbox.jail, sandbox.gate, sandbox.egress = jail, gate, "jail"
            if sandbox.jail is not None:
                self.docker.add_hosts(sandbox.container, hosts_for(domains, sandbox.jail.gateway))
            return True

    def get(self, sandbox_id: str) -> "Sandbox | None":
        with self._lock:
            return self._sandboxes.get(sandbox_id)

    def all(self) -> "list[Sandbox]":
        with self._lock:
            return sorted(self._sandboxes.values(), key=lambda s: s.started_at)

    def pause(self, sandbox_id: str) -> bool:
        """Marks a live sandbox paused (the API's pause route is not served:
        this is for tests of listings). Its container is left as it is."""
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None:
                return False
            sandbox.state = "paused"
            return True

    def remove(self, sandbox_id: str, *, expired: bool = False) -> bool:
        """Kill a sandbox: forget it first (so envd answers "not found" at
        once), then remove its container, which ends its commands."""
        with self._lock:
            sandbox = self._sandboxes.pop(sandbox_id, None)
            if sandbox is None:
                return False
            sandbox.removed = True
            self.counts["expired" if expired else "deletes"] += 1
        self.docker.remove(sandbox.container)
        with sandbox.network_lock:
            if sandbox.jail is not None:
                sandbox.jail.close()  # its rules, its forwarder, its network
        return True

    def _reap(self) -> None:
        while not self._stop.wait(0.1):
            now = time.time()
            for sandbox in [s for s in self.all()
                            if s.end_at <= now and s.state == "running"]:
                self.remove(sandbox.id, expired=True)

    def stop(self) -> None:
        self._stop.set()
        self._reaper.join(timeout=5)
        for sandbox in self.all():
            self.remove(sandbox.id)
        self.docker.remove_all()  # anything a crash or race left behind, by label
        if self.jails is not None:
            self.jails.remove_own()
