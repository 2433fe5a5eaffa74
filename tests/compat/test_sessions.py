"""Sessions through the published client (plimsoll-client 0.23.0, unmodified)
against the real plimsolld: Session, AsyncSession, run_cell and Workspace on the
wasm provider and on docker under runc and runsc.

The client checks every session answer's record and its place in the chain
(session fingerprint, sequence, previous digest), and at close compares the
daemon's count of calls with its own, so a test passing here means the daemon's
chain held, not only that output came back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from plimsoll_client import Client
from plimsoll_client.aio import AsyncClient
from plimsoll_client.errors import PlimsollError, SessionEndedError
from plimsoll_client.workspace import Workspace

from test_published_client import Daemon, wait_exited

IMAGE = os.environ.get("SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:bookworm")


class GracefulDaemon(Daemon):
    """Stopped with SIGTERM, as an operator would, so the daemon ends its
    sessions and removes their containers itself."""

    def stop(self, before_reaping=None):
        """As `Daemon.stop` (`before_reaping` included), with SIGTERM."""
        if self.proc.returncode is None:
            self.proc.terminate()
        if not wait_exited(self.proc, 60):
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("plimsolld did not stop within 60 s of SIGTERM")
        out = before_reaping(self.proc.pid) if before_reaping is not None else None
        self.proc.wait()
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return out


def containers_of(pid: int, *filters: str) -> list[str]:
    """IDs of the containers daemon `pid` made that exist now (its owner
    label), narrowed by more `label=` filters: this daemon's only, whatever
    other daemons on the engine make or sweep meanwhile."""
    args = ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=io.plimsoll.owner={pid}"]
    for f in filters:
        args += ["--filter", f]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()


def session_containers(pid: int) -> list[str]:
    return containers_of(pid, "label=io.plimsoll.session=1")


def container_exists(cid: str) -> bool:
    return subprocess.run(["docker", "inspect", cid], capture_output=True).returncode == 0


def post_marked(url: str, procedure: str, body: dict) -> tuple[int, dict, "str | None"]:
    """`post`, with the answer's not-dispatched mark (None when unmarked)."""
    req = urllib.request.Request(
        f"{url}/plimsoll.v1.SandboxService/{procedure}", json.dumps(body).encode(),
        {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r), r.headers.get("plimsoll-not-dispatched")
    except urllib.error.HTTPError as e:
        return e.code, json.load(e), e.headers.get("plimsoll-not-dispatched")


def post(url: str, procedure: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{url}/plimsoll.v1.SandboxService/{procedure}", json.dumps(body).encode(),
        {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


# Counts processes named sleep by reading /proc, skipping ones that end
# while it reads.
COUNT_SLEEP = """import os
n = 0
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/comm") as f:
                n += f.read().strip() == "sleep"
        except OSError:
            pass
print(n)
"""

WASM_SESSIONS = {"SANDBOX_PROVIDER": "wasm", "SANDBOX_MAX_SESSIONS": "4",
                 "SANDBOX_MAX_SESSIONS_PER_CALLER": "3", "PLIMSOLL_LOG_FORMAT": "json"}


@pytest.fixture(scope="module")
def wasm():
    d = GracefulDaemon(WASM_SESSIONS)
    yield d
    d.stop()


def docker_runtimes() -> list[str]:
    info = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"],
                          capture_output=True, text=True, timeout=30)
    assert info.returncode == 0, "docker is not reachable: make setup starts it"
    found = [r for r in ("runc", "runsc") if f'"{r}"' in info.stdout]
    # Under CI both must be there: setup registers runsc.
    assert "runc" in found and ("runsc" in found or not os.environ.get("CI")), found
    return found


@pytest.fixture(scope="module", params=["runc", "runsc"])
def docker(request):
    if request.param not in docker_runtimes():
        pytest.fail(f"{request.param} is not registered with dockerd (make setup registers it)")
    d = GracefulDaemon({"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_RUNTIME": request.param,
                        "SANDBOX_DOCKER_IMAGE": IMAGE, "SANDBOX_MAX_SESSIONS": "3",
                        "SANDBOX_SESSION_POOL": "1", "PLIMSOLL_LOG_FORMAT": "json"})
    d.runtime = request.param
    yield d
    # Counted before the stopped daemon is reaped: no other daemon's sweep
    # can have taken one of its containers yet (see Daemon.stop).
    left = d.stop(before_reaping=containers_of)
    assert left == [], "the daemon left containers behind"


# ---- wasm: one QuickJS instance kept per session ----


def test_describe_states_sessions(wasm):
    info = Client(wasm.url).describe()
    assert info.supports_sessions
    assert info.session_lifetime_ms == 30 * 60 * 1000
    assert info.session_idle_timeout_ms == 5 * 60 * 1000


def test_cells_keep_state_and_the_chain_checks(wasm):
    c = Client(wasm.url)
    with c.open_session(minimum_isolation="process") as s:
        assert s.isolation == "process" and s.provider == "wasm"
        r = s.run_cell("let x = 40; x", language="javascript")
        assert r.exit_code == 0 and r.stdout_text == "40\n"
        r = s.run_cell("x + 2", language="javascript")
        assert r.stdout_text == "42\n", r
        r = s.run_cell("'text'", language="javascript")
        assert r.stdout_text == "'text'\n"
        # A snippet in the session sees what cells defined too.
        r = s.run_javascript("console.log(x * 2)")
        assert r.stdout_text == "80\n" and r.exit_code == 0
        r = s.run_cell("throw new Error('boom')", language="javascript")
        assert r.exit_code == 1 and "boom" in r.stderr_text
        assert s.calls == 5
        assert s.run_cell("x", language="javascript").stdout_text == "40\n"
    summary = s.close()
    assert summary.calls == 6 and summary.end == "closed"
    assert summary.last_record_sha256 == s.last_record_sha256


def test_python_cells_are_refused_on_wasm_before_anything_runs(wasm):
    with Client(wasm.url).open_session() as s:
        with pytest.raises(PlimsollError) as e:
            s.run_cell("1 + 1", language="python")
        assert e.value.not_dispatched is not None
        # The refusal did not move the chain; the session goes on.
        assert s.run_cell("1 + 1", language="javascript").stdout_text == "2\n"
        assert s.calls == 1


def test_a_cell_out_of_time_ends_the_session(wasm):
    s = Client(wasm.url).open_session()
    r = s.run_cell("for (;;) {}", language="javascript", timeout=0.3)
    assert r.timed_out
    assert s.ended is not None and s.ended.reason == "main_process_ended"
    with pytest.raises(SessionEndedError):
        s.run_cell("1", language="javascript")
    summary = s.close()
    assert summary.calls == 1 and summary.end == "main_process_ended"


def test_idle_timeout_ends_the_session(wasm):
    # Asking for less than the daemon's 1 s floor gets the floor.
    s = Client(wasm.url).open_session(idle_timeout=0.2)
    assert s.idle_timeout_ms == 1000
    assert s.run_cell("1", language="javascript").stdout_text == "1\n"
    time.sleep(2.0)
    with pytest.raises(SessionEndedError) as e:
        s.run_cell("2", language="javascript")
    assert e.value.reason == "expired"
    assert s.close().end == "expired"


def test_a_closed_sessions_id_is_not_found_on_the_daemon(wasm):
    s = Client(wasm.url).open_session()
    sid = s._id  # the capability, held by this test only
    s.run_cell("1", language="javascript")
    s.close()
    status, body = post(wasm.url, "SessionRun", {
        "protocol": 4, "sessionId": sid, "cell": {"language": "javascript", "code": "1"}})
    assert status == 404 and body["code"] == "not_found", body
    assert "plimsoll.v1.SessionEnded" in json.dumps(body)
    # A made-up ID the same way: nothing tells a guesser which IDs existed.
    status2, body2 = post(wasm.url, "SessionRun", {
        "protocol": 4, "sessionId": "x" * 43, "cell": {"language": "javascript", "code": "1"}})
    assert (status2, body2["code"]) == (status, body["code"])


def test_caps_per_caller_then_daemon_wide(wasm):
    c = Client(wasm.url)
    held = [c.open_session() for _ in range(3)]
    try:
        with pytest.raises(PlimsollError) as e:
            c.open_session()
        assert e.value.not_dispatched == "capacity"
    finally:
        for s in held:
            s.close()
    # Closed sessions give their places back at once.
    c.open_session().close()


def test_owner_cap_replaces_the_least_recently_used():
    d = GracefulDaemon({**WASM_SESSIONS, "SANDBOX_MAX_SESSIONS_PER_OWNER": "1"})
    try:
        c = Client(d.url)
        first = c.open_session(owner="alice@example.com")
        first.run_cell("1", language="javascript")
        second = c.open_session(owner="alice@example.com")
        with pytest.raises(SessionEndedError) as e:
            first.run_cell("2", language="javascript")
        assert e.value.reason == "replaced"
        # Another owner is not touched.
        other = c.open_session(owner="bob@example.com")
        assert second.run_cell("3", language="javascript").stdout_text == "3\n"
        assert other.run_cell("4", language="javascript").stdout_text == "4\n"
        assert first.close().end == "replaced"
        second.close()
        other.close()
    finally:
        d.stop()


def _open_and_hold(url: str, hold: float, out, start) -> None:
    # Every process opens at once: spawned processes come up staggered on a
    # two-core machine, and without the barrier they would not race at all.
    start.wait(60)
    try:
        s = Client(url).open_session()
    except PlimsollError as e:
        out.put(("refused", e.not_dispatched))
        return
    out.put(("opened", None))
    time.sleep(hold)
    s.close()


@pytest.mark.parametrize("daemon_cap,caller_cap,expected", [("3", "3", 3), ("4", "2", 2)],
                         ids=["daemon-wide", "per-caller"])
def test_caps_are_exact_under_racing_processes(daemon_cap, caller_cap, expected):
    d = GracefulDaemon({**WASM_SESSIONS, "SANDBOX_MAX_SESSIONS": daemon_cap,
                        "SANDBOX_MAX_SESSIONS_PER_CALLER": caller_cap})
    try:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        start = ctx.Barrier(10)
        procs = [ctx.Process(target=_open_and_hold, args=(d.url, 3.0, out, start)) for _ in range(10)]
        for p in procs:
            p.start()
        answers = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        assert sorted(a for a, _ in answers).count("opened") == expected, answers
        assert all(r == "capacity" for a, r in answers if a == "refused"), answers
    finally:
        d.stop()


def test_racing_calls_on_one_session_are_serialized(wasm):
    # Two clients holding the same ID: calls run one at a time, each record
    # continues the daemon's chain, and the close count is every call.
    s = Client(wasm.url).open_session()
    s.run_cell("var n = 0", language="javascript")
    sid = s._id
    # Eight calls released together, each busy for 300 ms, so they overlap:
    # one runs, one waits its turn, the rest are refused.
    start = threading.Barrier(8)
    def bump():
        start.wait(30)
        return post_marked(wasm.url, "SessionRun", {
            "protocol": 4, "sessionId": sid,
            "cell": {"language": "javascript",
                     "code": "{ const t0 = Date.now(); while (Date.now() - t0 < 300) {} } n += 1; n"}})
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: bump(), range(8)))
    done = [b for st, b, _ in results if st == 200]
    busy = [(b, mark) for st, b, mark in results if st != 200]
    assert busy, "no call found the session busy: the calls never overlapped"
    seen = sorted(int(base64.b64decode(b["run"]["cell"]["stdout"])) for b in done)
    assert seen == list(range(1, len(done) + 1)), seen
    sequences = sorted(int(b["run"]["record"]["sequence"]) for b in done)
    assert sequences == list(range(2, len(done) + 2))
    # A call that found one waiting already is refused as capacity, marked
    # as not dispatched.
    assert all(b.get("code") == "resource_exhausted" and mark == "capacity" for b, mark in busy), busy
    status, closed = post(wasm.url, "CloseSession", {"protocol": 4, "sessionId": sid})
    assert status == 200 and int(closed["calls"]) == 1 + len(done)


def test_async_session(wasm):
    async def go():
        c = AsyncClient(wasm.url)
        async with await c.open_session() as s:
            await s.run_cell("let a = [1, 2]", language="javascript")
            r = await s.run_cell("a.length", language="javascript")
            assert r.stdout_text == "2\n"
        return s
    s = asyncio.run(go())
    assert s.calls == 2


def test_no_session_id_in_audit_or_metrics():
    # A daemon of its own: the session gauges then count this test's one
    # session, not what earlier tests on the module's daemon left open.
    d = GracefulDaemon({**WASM_SESSIONS, "PLIMSOLL_METRICS_ADDR": "127.0.0.1:0"})
    try:
        canary = "canary-trace-7f3a"
        s = Client(d.url).open_session(trace_id=canary)
        sid = s._id
        s.run_cell("1", language="javascript", trace_id=canary)
        s.close()
        n = d.audit_after_sentinel()
        assert n > 0
        log = "\n".join(d.lines)
        metrics = urllib.request.urlopen(d.metrics_url(), timeout=10).read().decode()
        assert sid not in log and sid not in metrics
        assert s.fingerprint in log  # the fingerprint is what records and audit carry
        assert s.fingerprint not in metrics
        assert re.search(r'^plimsoll_sessions_ended_total\{end="closed"\} 1$', metrics, re.M), metrics
        assert re.search(r"^plimsoll_sessions_open 0$", metrics, re.M), metrics
    finally:
        d.stop()


# ---- docker: one container kept per session ----


def test_docker_cells_projects_and_workspace(docker):
    c = Client(docker.url)
    info = c.describe()
    assert info.supports_sessions
    tier = "kernel" if docker.runtime == "runsc" else "container"
    with c.open_session(minimum_isolation=tier, languages=["python"]) as s:
        assert s.isolation == tier
        r = s.run_cell("x = 40\nx + 2", language="python")
        assert r.stdout_text == "42\n" and r.exit_code == 0, r
        assert s.run_cell("x + 1", language="python").stdout_text == "41\n"
        r = s.run_cell("let y = 5; y * 2", language="javascript")
        assert r.stdout_text == "10\n", r
        assert s.run_cell("y + 1", language="javascript").stdout_text == "6\n"
        r = s.run_project({"a.txt": "hello"}, ["cat a.txt"], ["a.txt"])
        assert r.steps[0].stdout_text == "hello" and [(a.path, a.content) for a in r.artifacts] == [("a.txt", b"hello")]
        # Files persist between calls and kinds.
        r = s.run_cell("open('a.txt').read()", language="python")
        assert r.stdout_text == "'hello'\n"
        # No process a call starts outlives it. The count scans /proc itself
        # (no tool of the image in between), and is first seen to count a
        # live sleep inside the call that starts it, so a count of 0 later
        # means the process is gone, not that the probe is blind.
        r = s.run_project({"count_sleep.py": COUNT_SLEEP},
                          ["(sleep 300 &) ; sleep 0.3; python3 count_sleep.py"])
        assert (r.steps[0].exit_code, r.steps[0].stdout_text, r.steps[0].stderr_text) == (0, "1\n", ""), r.steps[0]
        r = s.run_project({}, ["python3 count_sleep.py; rc=$?; rm -f count_sleep.py; exit $rc"])
        assert (r.steps[0].exit_code, r.steps[0].stdout_text, r.steps[0].stderr_text) == (0, "0\n", ""), r.steps[0]

        ws = Workspace(s, timeout=30)
        assert ws.root.startswith("/")
        ws.write("src/app.py", "print('hi')\n")
        assert ws.read("src/app.py") == b"print('hi')\n"
        assert ws.edit("src/app.py", "hi", "there") == 1
        assert ws.glob("**/*.py") == ["src/app.py"]
        assert "there" in ws.grep("there")
        out = ws.exec("cd src && export GREETING=hey && python3 app.py")
        assert out.exit_code == 0 and out.stdout_text == "there\n"
        out = ws.exec("pwd; echo $GREETING")
        assert out.stdout_text.split() == [ws.root + "/src", "hey"]
        saved = ws.persist()
        ws.exec("rm -rf src")
        ws.hydrate(saved)
        assert ws.read("src/app.py") == b"print('there')\n"
    summary = s.close()
    assert summary.calls == s.calls and summary.end == "closed"


def test_docker_session_out_of_time_and_unanswered_chain(docker):
    c = Client(docker.url)
    with c.open_session() as s:
        r = s.run_cell("while True: pass", language="python", timeout=0.5)
        assert r.timed_out
        # The kernel was replaced; the session goes on with a fresh one.
        r = s.run_cell("1 + 1", language="python")
        assert r.stdout_text == "2\n" and r.interpreter_started


def test_a_forged_answer_line_is_not_believed(docker):
    # A snippet writes a well-formed "exit 0" answer line into the agent's
    # own output, then exits 3: the reply then holds two answers, and the
    # call is reported as unanswered (it may have run), never as exit 0.
    forged = json.dumps({"process": {"stdout": "", "stderr": "", "exit_code": 0, "timed_out": False,
                                     "stdout_truncated": False, "stderr_truncated": False}}) + "\n"
    code = (f"require('fs').appendFileSync('/proc/' + process.ppid + '/fd/1', {json.dumps(forged)});"
            "process.exit(3)")
    with Client(docker.url).open_session() as s:
        with pytest.raises(PlimsollError) as e:
            s.run_javascript(code)
        assert e.value.not_dispatched is None
        assert e.value.record is not None  # the unanswered call, chained and checked
        assert s.calls == 1
    assert s.close().calls == 1


SWEPT = "removed run containers left behind"


def swept(d: Daemon, since: int = 0) -> int:
    """How many leftover containers `d` logged sweeping, in its log lines
    from `since` on."""
    n = 0
    for line in d.lines[since:]:
        if SWEPT in line:
            try:
                n += int(json.loads(line).get("removed", 1))
            except ValueError:
                n += 1
    return n


def test_a_killed_daemons_session_containers_are_swept_by_the_next(docker):
    env = {"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_RUNTIME": docker.runtime,
           "SANDBOX_DOCKER_IMAGE": IMAGE, "SANDBOX_MAX_SESSIONS": "2",
           "SANDBOX_DOCKER_POOL": "0"}
    # Any daemon on the engine sweeps what a dead one left, this module's
    # own (`docker`) among them, every minute: the container's going proves
    # something only when the next daemon's log says it removed it. When it
    # does not (another sweep came first), the whole thing is tried again.
    takers = []
    for _ in range(3):
        first = Daemon(env)  # stopped with SIGKILL: it cannot clean up
        s = Client(first.url).open_session()
        s.run_cell("1", language="javascript")
        assert len(session_containers(first.proc.pid)) == 1
        # Counted after the kill, before the reaping: nobody can have swept
        # it yet (see Daemon.stop).
        left = first.stop(before_reaping=session_containers)
        assert len(left) == 1, left
        module_lines = len(docker.lines)
        second = GracefulDaemon(env)
        try:
            deadline = time.monotonic() + 30
            while container_exists(left[0]):
                assert time.monotonic() < deadline, "the next daemon did not sweep the session container"
                time.sleep(0.2)
            # The sweep logs once its removals have ended.
            deadline = time.monotonic() + 10
            while not swept(second) and time.monotonic() < deadline:
                time.sleep(0.05)
            if swept(second):
                return
            takers.append("this module's daemon" if swept(docker, module_lines) else "another daemon")
        finally:
            second.stop()
    pytest.fail(f"the dead daemon's container was swept by others first, every time: {takers}")
