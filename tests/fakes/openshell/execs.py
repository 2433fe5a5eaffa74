"""How fake-openshell runs one exec: the shell line the gateway builds from
the request, and the relay of the process's output, stdin and end to the
gRPC stream.

The line follows the server (`crates/openshell-server/src/grpc/sandbox.rs`,
lines 1870-1941 at the README's commit): each `environment` entry as
`KEY=value`, then each argv word, quoted for the shell, after a `cd` into
the working directory when one is given. The supervisor then starts it
with an environment of its own making (`ssh.rs::apply_child_env`): it
clears the environment, sets the request's entries, and only then its
proxy variables, so those override whatever the request said. `forced`
is that last layer.
"""

from __future__ import annotations

import queue
import shlex
import subprocess
import threading
import time
from typing import Callable, Iterator

import grpc

import messages as m


def shell_args(start: dict, forced: "dict[str, str]") -> "list[str]":
    """bash's arguments for an ExecSandboxRequest: `-lc` (a login shell)
    unless `no_login_shell`, then the line."""
    env = {**start.get("environment", {}), **forced}
    words = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    words += [shlex.quote(arg) for arg in start.get("command") or []]
    line = " ".join(words)
    if start.get("workdir"):
        line = f"cd {shlex.quote(start['workdir'])} && {line}"
    return ["-c" if start.get("no_login_shell") else "-lc", line]


class Run:
    """A started process relayed to a call: stdout and stderr are read as
    they come, stdin frames are written as they arrive (the request's end
    closes it), and `cancel` (the call's callback) kills the process
    unless it ended or was left running on purpose."""

    def __init__(self, proc: subprocess.Popen, stdin, kill: "Callable[[], None]") -> None:
        self.proc, self.kill = proc, kill
        self.left_running = False
        self._events: "queue.Queue" = queue.Queue()
        for target, args in ((self._pump, (proc.stdout, "stdout")),
                             (self._pump, (proc.stderr, "stderr")), (self._feed, (stdin,))):
            threading.Thread(target=target, args=args, daemon=True).start()

    def _pump(self, stream, kind: str) -> None:
        while chunk := stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096):
            self._events.put((kind, chunk))
        self._events.put((kind, None))

    def _feed(self, stdin) -> None:
        try:
            for chunk in stdin:
                self.proc.stdin.write(chunk)
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError, grpc.RpcError):
            pass

    def cancel(self) -> None:
        if self.proc.poll() is None and not self.left_running:
            self.kill()

    def events(self, ends: "float | None") -> "Iterator[bytes]":
        """The call's answers: output as read, then the exit. At `ends` (the
        gateway's own timeout, a wall-clock time) the call ends with exit
        124 and the process is left running, as the gateway leaves it."""
        open_streams = 2
        while open_streams:
            try:
                kind, chunk = self._events.get(timeout=0.1)
            except queue.Empty:
                if ends and time.time() >= ends:
                    self.left_running = True
                    yield m.encode(m.ExecSandboxEvent, {"exit": {"exit_code": 124}})
                    return
                continue
            if chunk is None:
                open_streams -= 1
                continue
            yield m.encode(m.ExecSandboxEvent, {kind: {"data": chunk}})
        code = self.proc.wait()
        yield m.encode(m.ExecSandboxEvent, {"exit": {"exit_code": code}})
