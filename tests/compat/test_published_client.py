"""The published Python client (plimsoll-client 0.23.0, from PyPI, unmodified)
against the real plimsolld binary.

The client is the compatibility contract: it checks the protocol number, binds
every answer to its request ID, recomputes both digests of every run record,
and compares the stated tier with the caller's floor. A test passing here means
the daemon satisfied all of those checks, not just that JSON came back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import plimsoll_client
from plimsoll_client import Client
from plimsoll_client.aio import AsyncClient
from plimsoll_client.errors import (
    DisabledError,
    InsufficientIsolationError,
    InvalidRequestError,
    SoftwareMismatchError,
    UnsupportedError,
)
from plimsoll_client.types import SoftwareRule

ROOT = Path(__file__).resolve().parents[2]


def plimsolld_bin() -> str:
    path = os.environ.get("PLIMSOLLD_BIN") or str(ROOT / "target" / "release" / "plimsolld")
    assert Path(path).is_file(), f"plimsolld not built at {path} (run make build)"
    return path


class DaemonExited(RuntimeError):
    """plimsolld ended before it listened; `log` is what it wrote."""

    def __init__(self, log: str) -> None:
        super().__init__("plimsolld did not start:\n" + log)
        self.log = log


def exited_unreaped(pid: int) -> bool:
    """Whether child `pid` has exited and waits to be reaped (a zombie), or
    is gone altogether."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 1:].split()[0] in ("Z", "X")


def wait_exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Waits up to `timeout` s for `proc` to exit, without reaping it (see
    `Daemon.stop`); whether it did."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None and not exited_unreaped(proc.pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Daemon:
    """The real binary on loopback, with its log kept. It binds port 0
    itself and the test reads the address it got from its listening line,
    so no port is chosen here and handed over (another process could take
    it in between); a test that names PLIMSOLL_ADDR gets that address."""

    def __init__(self, env: dict[str, str]) -> None:
        # Each daemon counts paid seconds in a store of its own: the
        # default directory would carry one test's day into the next.
        self.state_dir = None
        if "PLIMSOLL_STATE_URL" not in env and "PLIMSOLL_STATE_DIR" not in env:
            self.state_dir = tempfile.mkdtemp(prefix="plimsoll-state-")
        full = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
                "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
                **({"PLIMSOLL_STATE_DIR": self.state_dir} if self.state_dir else {}), **env}
        self.proc = subprocess.Popen([plimsolld_bin()], env=full, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.listening = threading.Event()
        self.ended = threading.Event()  # its log closed: it exited
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 60
        while not self.listening.wait(0.05):
            if self.ended.is_set() or time.monotonic() > deadline:
                Daemon.stop(self)
                raise DaemonExited("\n".join(self.lines))
        self.addr = self.reported_addr("plimsolld listening")
        self.url = f"http://{self.addr}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "plimsolld listening" in line:
                self.listening.set()
        self.ended.set()

    def reported_addr(self, message: str) -> str:
        """The address in the first log line saying `message` ("plimsolld
        listening", "metrics listening"): the one the daemon bound."""
        for line in list(self.lines):
            if message not in line:
                continue
            try:
                return json.loads(line)["addr"]
            except (ValueError, KeyError):
                m = re.search(r"\baddr=(\S+)", line)  # PLIMSOLL_LOG_FORMAT=text
                if m:
                    return m.group(1)
        raise AssertionError(f"no {message!r} line with an address:\n" + "\n".join(self.lines))

    def metrics_url(self) -> str:
        """/metrics, on the listener the daemon reported (PLIMSOLL_METRICS_ADDR
        set to port 0 by the test)."""
        return f"http://{self.reported_addr('metrics listening')}/metrics"

    def audit(self) -> list[dict]:
        out = []
        for line in list(self.lines):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if v.get("target") == "plimsoll::audit":
                out.append(v)
        return out

    def audit_after_sentinel(self) -> int:
        """Runs one snippet with a unique trace ID and waits for its audit line;
        lines arrive in order, so every earlier line is in by then."""
        tag = f"sentinel-{time.monotonic_ns()}"
        Client(self.url).run_javascript("0", trace_id=tag)
        deadline = time.monotonic() + 10
        while not any(a.get("trace_id") == tag for a in self.audit()):
            assert time.monotonic() < deadline, "the sentinel's audit line never arrived"
            time.sleep(0.02)
        return len(self.audit())

    def stop(self, before_reaping=None):
        """Kills the daemon (SIGKILL: it cleans nothing up). With
        `before_reaping`, calls it with the daemon's PID once the process has
        exited but before it is reaped, and returns what it returned: until
        it is reaped its PID and start time still name a live process, so no
        other daemon's sweeper can judge its containers orphaned, and a
        count of them is what this daemon left."""
        if self.proc.returncode is None:
            self.proc.kill()
        out = None
        if before_reaping is not None:
            wait_exited(self.proc, 20)
            out = before_reaping(self.proc.pid)
        self.proc.wait()
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return out


@pytest.fixture(scope="module")
def wasm():
    d = Daemon({"SANDBOX_PROVIDER": "wasm"})
    yield d
    d.stop()


@pytest.fixture(scope="module")
def disabled():
    d = Daemon({})
    yield d
    d.stop()


def test_client_version_is_the_published_one():
    assert plimsoll_client.__version__ == "0.23.0"


def test_describe(wasm):
    info = Client(wasm.url).describe()
    assert info.provider == "wasm"
    assert info.isolation == "process"
    assert info.protocol == 4
    assert info.javascript_environment.identity.startswith("quickjs-wasm:sha256:")
    assert info.javascript_environment.max_timeout_ms == 30000
    assert info.javascript_environment.languages == ("javascript",)
    assert not info.supports_project and not info.supports_sessions
    assert info.resources.memory_mb == 256


def test_run_javascript_passes_every_client_check(wasm):
    c = Client(wasm.url)
    r = c.run_javascript("console.log('hello', 6 * 7); console.error('to stderr')",
                         minimum_isolation="process", trace_id="compat-1", timeout=5)
    assert r.stdout == b"hello 42\n"
    assert r.stderr == b"to stderr\n"
    assert r.exit_code == 0 and not r.timed_out
    assert (r.provider, r.isolation) == ("wasm", "process")
    # The client recomputed both digests and the record's own digest.
    assert r.record is not None and r.record.version == 4
    assert r.record.provider == "wasm" and r.record.isolation == "process"
    assert r.record.environment == r.environment
    assert r.record.ended_unix_ms >= r.record.started_unix_ms > 0
    # The log is read on its own thread: wait for the line, boundedly.
    deadline = time.monotonic() + 10
    while not any(a.get("trace_id") == "compat-1" for a in wasm.audit()):
        assert time.monotonic() < deadline, "the run's audit line never arrived"
        time.sleep(0.02)


def test_vm_floor_is_refused_and_nothing_runs(wasm):
    before = wasm.audit_after_sentinel()
    with pytest.raises(InsufficientIsolationError) as e:
        Client(wasm.url).run_javascript("console.log('must not run')", minimum_isolation="vm")
    assert e.value.not_dispatched == "isolation"
    assert e.value.code == "failed_precondition"
    assert wasm.audit_after_sentinel() == before + 1, "a run below its floor reached the provider"


def test_software_rule(wasm):
    c = Client(wasm.url)
    identity = c.describe().javascript_environment.software_identity
    r = c.run_javascript("console.log(1)", software=SoftwareRule.exact(identity))
    assert r.record.software_rule_id == f"exact:{identity}"
    r = c.run_javascript("console.log(1)", software=SoftwareRule.approved(identity, "other:id"))
    assert r.record.software_rule_id.startswith("approved:sha256:")
    with pytest.raises(SoftwareMismatchError) as e:
        c.run_javascript("1", software=SoftwareRule.exact("oci-manifest:linux/amd64@sha256:00"))
    assert e.value.not_dispatched == "environment"


def test_failures_are_results_not_errors(wasm):
    c = Client(wasm.url)
    r = c.run_javascript("throw new Error('nope')")
    assert r.exit_code == 1 and b"Error: nope" in r.stderr
    r = c.run_javascript("while (true) {}", timeout=0.3)
    assert r.timed_out and r.exit_code == 124
    assert r.record.version == 4


def test_truncation_flags_survive_the_record_check(wasm):
    r = Client(wasm.url).run_javascript("console.log('z'.repeat(70000))")
    assert r.stdout_truncated and len(r.stdout) == 65536


def test_project_payload_is_unsupported_on_wasm(wasm):
    with pytest.raises(UnsupportedError) as e:
        Client(wasm.url).run_project({"a.txt": "x"}, ["cat a.txt"])
    assert e.value.not_dispatched == "unsupported"


def test_disabled_refuses(disabled):
    c = Client(disabled.url)
    info = c.describe()
    assert (info.provider, info.isolation) == ("disabled", "none")
    with pytest.raises(DisabledError) as e:
        c.run_javascript("console.log('no')")
    assert e.value.not_dispatched == "unsupported"
    assert disabled.audit() == []


def test_server_side_validation_matches_the_client(wasm):
    # The client refuses these itself; the daemon must too, for clients that do not.
    import urllib.request
    for body in ({"protocol": 4, "javascript": {"code": "x" * (256 * 1024 + 1)}},
                 {"protocol": 4, "javascript": {"code": "a\u0000b"}}):
        req = urllib.request.Request(wasm.url + "/plimsoll.v1.SandboxService/Run",
                                     data=json.dumps(body).encode(), headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.headers["plimsoll-not-dispatched"] == "request"
    with pytest.raises(InvalidRequestError):
        Client(wasm.url).run_javascript("")


def test_async_client(wasm):
    import asyncio

    async def main():
        c = AsyncClient(wasm.url)
        results = await asyncio.gather(*(c.run_javascript(f"console.log({i})") for i in range(6)))
        return [r.stdout for r in results]

    assert asyncio.run(main()) == [f"{i}\n".encode() for i in range(6)]


class _Api:
    """A loopback HTTP API that records what reached it."""

    def __init__(self) -> None:
        import http.server

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                seen.append((self.command, self.path, self.headers.get("authorization")))
                body = json.dumps({"id": self.path.rsplit("/", 1)[-1]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_granted_runs_pass_every_client_check(tmp_path):
    api = _Api()
    grants = tmp_path / "grants.json"
    grants.write_text(json.dumps({"profiles": {"inventory": {
        "base_url": api.origin,
        "allow": ["GET /items/*"],
        "allowed_callers": ["anonymous"],
        "token": {"type": "static", "env": "COMPAT_TOKEN"},
    }}}))
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "PLIMSOLL_GRANTS_FILE": str(grants),
                "COMPAT_TOKEN": "compat-canary-token"})
    try:
        r = Client(d.url).run_javascript(
            "const r = await host.get('/items/42'); console.log(r.id)",
            grant_profile="inventory", minimum_isolation="process")
        assert r.stdout == b"42\n"
        assert api.seen == [("GET", "/items/42", "Bearer compat-canary-token")]
        with pytest.raises(plimsoll_client.errors.PlimsollError) as refused:
            Client(d.url).run_javascript("1", grant_profile="nope")
        assert refused.value.not_dispatched == "permission"
        assert len(api.seen) == 1
    finally:
        d.stop()
        api.server.shutdown()


def test_callers_with_tokens():
    token = "compat-token-" + "x" * 32
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "PLIMSOLL_INSECURE": "0", "PLIMSOLL_TOKEN": token})
    try:
        r = Client(d.url, token).run_javascript("console.log('authenticated')")
        assert r.stdout == b"authenticated\n"
        with pytest.raises(plimsoll_client.errors.PlimsollError) as refused:
            Client(d.url, "wrong-token-" + "y" * 32).run_javascript("console.log('ran')")
        # Nothing ran, and the client was told so: the 401 carries the
        # not-dispatched mark, as every refusal before the body does.
        assert "401" in str(refused.value) or "unauthenticated" in str(refused.value).lower()
        assert refused.value.not_dispatched == "permission"
        assert not any(token in line for line in d.lines)
    finally:
        d.stop()


def test_a_daemon_signing_its_records_keeps_the_client_working(tmp_path):
    """The receipt beside the record and the key ID in Describe are this
    daemon's own fields: the published client must read past them and still
    check every record."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key_file = tmp_path / "daemon.key"
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "SANDBOX_MAX_SESSIONS": "1",
                "PLIMSOLL_RECORD_SIGNING_KEY": str(key_file)})
    try:
        client = Client(d.url)
        assert client.describe().provider == "wasm"
        # The client recomputes the record's digests, as for any daemon.
        result = client.run_javascript("console.log(6 * 7)", minimum_isolation="process")
        assert result.stdout == b"42\n"
        assert result.record is not None and result.record.version == 4
        # A session's calls and its close carry receipts too; the client
        # checks its chain and the close's count past them.
        with client.open_session() as s:
            assert s.run_javascript("console.log(1)", timeout=30).stdout == b"1\n"
        assert s.close().calls == 1
    finally:
        d.stop()
