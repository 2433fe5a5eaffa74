"""The published client, unmodified, against two replicas behind a
round-robin balancer that sends each request to the next replica: the
replicas share a real redis-server (PLIMSOLL_STATE_URL) and a secret
(PLIMSOLL_REPLICA_SECRET_FILE), so a session opened through one is used
through both (docs/scaling.md). And three replicas under load from several
client processes at once, each with its own connection: one caller's
concurrency cap, rate bucket and the day's paid seconds hold exactly across
the three.

The balancer here is a few lines of Python that forward each HTTP request
whole to the next replica in turn: per request, not per connection, as an
HTTP load balancer does, so the client's one keep-alive connection still
reaches both."""

from __future__ import annotations

import http.server
import itertools
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from plimsoll_client import Client
from plimsoll_client.workspace import Workspace

from test_published_client import Daemon, DaemonExited
from test_sessions import GracefulDaemon

TOKEN = "r" * 40


def unused_port() -> int:
    """A loopback port nothing holds now; nothing keeps it free after, so
    whoever is given it must be seen to have bound it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """Debian's redis-server on a free loopback port, in a scratch dir.

    redis-server cannot report a port it chose, and the daemons take only
    redis:// URLs with a host, so a free port is chosen and handed to it;
    the server answering there must then be this one (the process ID it
    reports is the child's), or a server that lost the port to another
    test's would pass its start by answering that one's PING. A lost port
    is replaced by another."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="plimsoll-redis-")
        lost = []
        for _ in range(5):
            self.port = unused_port()
            why = self._start()
            if why is None:
                self.url = f"redis://127.0.0.1:{self.port}/0"
                return
            lost.append(why)
        raise AssertionError(f"redis-server lost its port five times: {lost}")

    def cli(self, *args: str) -> "str | None":
        done = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "--raw", *args],
                              capture_output=True, text=True)
        out = done.stdout.strip()
        return out if done.returncode == 0 and not out.startswith("Could not connect") else None

    def _start(self) -> "str | None":
        """Starts the server on self.port; None once it answers there
        itself, else why not."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                return f"it exited ({self.proc.returncode}) before answering"
            info = self.cli("INFO", "server")
            if info is not None:
                pid = re.search(r"^process_id:(\d+)", info, re.M)
                if not pid or int(pid.group(1)) != self.proc.pid:
                    self.proc.kill()
                    self.proc.wait()
                    return f"another server answers there ({pid and pid.group(1)})"
                if self.cli("PING") == "PONG":
                    return None
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Balancer:
    """Each request to the next backend, in turn; the answer relayed."""

    def __init__(self, backends: list[str]) -> None:
        turn = itertools.cycle(backends)
        lock = threading.Lock()
        self.seen: dict[str, list[str]] = {b: [] for b in backends}
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                with lock:
                    backend = next(turn)
                    seen[backend].append(self.path.rsplit("/", 1)[-1])
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                keep = {k: v for k, v in self.headers.items()
                        if k.lower() in ("content-type", "authorization", "connect-protocol-version")
                        or k.lower().startswith("plimsoll-")}
                req = urllib.request.Request(backend + self.path, body, keep, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        status, headers, out = r.status, r.headers, r.read()
                except urllib.error.HTTPError as e:
                    status, headers, out = e.code, e.headers, e.read()
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() == "content-type" or k.lower().startswith("plimsoll-"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def replicas(extra: dict[str, str], n: int = 2):
    redis = RedisServer()
    secret_dir = tempfile.mkdtemp(prefix="plimsoll-secret-")
    secret = os.path.join(secret_dir, "replica-secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("s" * 48)
    daemons = []
    for _ in range(n):
        # Each replica publishes its own URL, so its port is chosen before
        # it starts; it then binds the port itself, and one that finds it
        # taken (by anything, in the moment between) exits before it
        # listens and is started again on another.
        for attempt in range(5):
            port = unused_port()
            try:
                d = GracefulDaemon({**extra, "PLIMSOLL_TOKEN": TOKEN, "PLIMSOLL_INSECURE": "",
                                    # (empty is unset: the token is required)
                                    "PLIMSOLL_ADDR": f"127.0.0.1:{port}",
                                    "PLIMSOLL_REPLICA_URL": f"http://127.0.0.1:{port}",
                                    "PLIMSOLL_REPLICA_SECRET_FILE": secret,
                                    "PLIMSOLL_STATE_URL": redis.url, "PLIMSOLL_LOG_FORMAT": "json"})
            except DaemonExited as e:
                if attempt < 4 and "PLIMSOLL_ADDR" in e.log and "in use" in e.log:
                    continue
                raise
            break
        assert d.url == f"http://127.0.0.1:{port}", (d.url, port)
        daemons.append(d)
    lb = Balancer([d.url for d in daemons])
    return redis, secret_dir, daemons, lb


def stop(redis, secret_dir, daemons, lb) -> None:
    lb.stop()
    for d in daemons:
        d.stop()
    redis.stop()
    shutil.rmtree(secret_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def wasm_fleet():
    fleet = replicas({"SANDBOX_PROVIDER": "wasm", "SANDBOX_MAX_SESSIONS": "4"})
    yield fleet
    stop(*fleet)


def test_a_session_through_a_round_robin_balancer_keeps_one_interpreter(wasm_fleet):
    _, _, daemons, lb = wasm_fleet
    c = Client(lb.url, TOKEN)
    with c.open_session(minimum_isolation="process") as s:
        assert s.run_cell("let x = 40; x", language="javascript").stdout_text == "40\n"
        for i in range(6):
            r = s.run_cell(f"x + {i}", language="javascript")
            assert r.stdout_text == f"{40 + i}\n" and r.exit_code == 0, r
        assert s.calls == 7
    summary = s.close()
    assert summary.calls == 7 and summary.end == "closed"
    # Both replicas took session calls, and one of them ran them all.
    runs = [lb.seen[d.url].count("SessionRun") for d in daemons]
    assert all(n >= 3 for n in runs), runs
    logged = [sum(bool(re.search(r'"session_call":\s*\d', l)) for l in d.lines) for d in daemons]
    assert sorted(logged)[0] == 0 and sorted(logged)[1] >= 7, logged


def test_mcp_session_tools_reach_the_replica_holding_the_session(wasm_fleet):
    """MCP is stateless, so each tool call may reach any replica: a session
    opened over MCP on one is used and closed over MCP through the other,
    its calls running where the session is."""
    from test_mcp import http, run, with_session

    _, _, daemons, _ = wasm_fleet

    def session_calls():
        return [sum(bool(re.search(r'"session_call":\s*\d', l)) for l in d.lines)
                for d in daemons]

    before = session_calls()

    def tool(d, name: str, args: dict):
        async def body(s):
            return await s.call_tool(name, args)
        return run(with_session(http(d.url, TOKEN), body))

    opened = tool(daemons[0], "open_session", {"minimum_isolation": "process"})
    sid = opened.structured_content["sessionId"]
    a = tool(daemons[1], "session_run", {"session_id": sid, "code": "globalThis.n = 41"})
    assert not a.is_error and a.structured_content["provider"] == "wasm", a
    b = tool(daemons[1], "session_run", {"session_id": sid, "code": "console.log(n + 1)"})
    assert b.structured_content["stdout"] == "42\n", b
    c = tool(daemons[1], "run_cell", {"session_id": sid, "language": "javascript", "code": "n + 2"})
    assert c.structured_content["stdout"] == "43\n", c
    closed = tool(daemons[1], "close_session", {"session_id": sid})
    assert not closed.is_error and closed.structured_content["calls"] == "3", closed
    for d in daemons:
        gone = tool(d, "session_run", {"session_id": sid, "code": "1"})
        assert gone.is_error and gone.structured_content["outcome"] == "not_dispatched", gone
    # The calls ran on the replica holding the session, and only there
    # (log lines arrive on their own stream: waited for).
    deadline = time.monotonic() + 5
    while True:
        logged = [n - b for n, b in zip(session_calls(), before)]
        if logged[0] >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert logged[1] == 0 and logged[0] >= 3, logged


def test_an_mcp_session_call_whose_holder_is_gone_is_told_the_session_ended():
    from test_mcp import http, run, with_session

    fleet = replicas({"SANDBOX_PROVIDER": "wasm", "SANDBOX_MAX_SESSIONS": "2"})
    try:
        _, _, daemons, _ = fleet

        def tool(d, name: str, args: dict):
            async def body(s):
                return await s.call_tool(name, args)
            return run(with_session(http(d.url, TOKEN), body))

        sid = tool(daemons[0], "open_session", {}).structured_content["sessionId"]
        daemons[0].proc.kill()
        daemons[0].proc.wait()
        r = tool(daemons[1], "session_run", {"session_id": sid, "code": "1"})
        sc = r.structured_content
        assert r.is_error and sc["outcome"] == "not_dispatched", r
        assert sc["notDispatched"] == "environment", sc
        assert sc["sessionEnded"] == "SESSION_END_SHUTDOWN", sc
    finally:
        stop(*fleet)


@pytest.fixture(scope="module")
def docker_fleet():
    fleet = replicas({"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_RUNTIME": "runc",
                      "SANDBOX_MAX_SESSIONS": "2", "SANDBOX_DOCKER_POOL": "0",
                      "SANDBOX_SESSION_POOL": "0"})
    yield fleet
    stop(*fleet)


def test_the_workspace_works_through_a_round_robin_balancer(docker_fleet):
    _, _, daemons, lb = docker_fleet
    c = Client(lb.url, TOKEN)
    with c.open_session(minimum_isolation="container", languages=["python"]) as s:
        ws = Workspace(s, timeout=30)
        ws.write("src/app.py", "print('hi')\n")
        assert ws.read("src/app.py") == b"print('hi')\n"
        assert ws.edit("src/app.py", "hi", "there") == 1
        assert ws.glob("**/*.py") == ["src/app.py"]
        out = ws.exec("cd src && python3 app.py")
        assert out.exit_code == 0 and out.stdout_text == "there\n"
        r = s.run_cell("x = 40\nx + 2", language="python")
        assert r.stdout_text == "42\n", r
        assert s.run_cell("x + 1", language="python").stdout_text == "41\n"
    assert s.close().end == "closed"
    runs = [lb.seen[d.url].count("SessionRun") for d in daemons]
    assert all(n >= 2 for n in runs), runs


# A run that holds its caller's concurrency place for a while.
BUSY = "const t = Date.now(); while (Date.now() - t < 4000) {} 1"


def _client_process(url: str, code: str, until_rate: bool, start, results,
                    timeout: float = 20) -> None:
    """One client process: waits for the others, then runs `code` through
    `url` with the published client. With `until_rate`, a run refused for
    the concurrency cap is tried again until one runs or the rate bucket
    refuses it. Reports what happened to each attempt."""
    from plimsoll_client import Client
    from plimsoll_client.errors import PlimsollError

    c = Client(url, TOKEN)
    seen = []
    start.wait(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            c.run_javascript(code, timeout=timeout, minimum_isolation="process")
            seen.append("ran")
        except PlimsollError as e:
            if e.not_dispatched != "capacity":
                seen.append(f"other:{e.not_dispatched}:{e}")
            elif "rate" in str(e):
                seen.append("rate")
            elif "at once" in str(e):
                seen.append("at-once")
            elif "paid seconds" in str(e):
                seen.append("paid")
            else:
                seen.append(f"capacity:{e}")
        if not until_rate or seen[-1] != "at-once":
            break
        time.sleep(0.05)
    results.put(seen)


def _at_once(urls: list[str], code: str, until_rate: bool,
             timeout: float = 20) -> list[list[str]]:
    """One process per URL, released together."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(urls))
    results = ctx.Queue()
    procs = [ctx.Process(target=_client_process,
                         args=(u, code, until_rate, start, results, timeout))
             for u in urls]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, p.exitcode
    return out


def test_one_callers_caps_hold_exactly_across_three_replicas_under_load_from_several_processes():
    fleet = replicas({"SANDBOX_PROVIDER": "wasm", "SANDBOX_PER_KEY_CONCURRENT": "2",
                      "SANDBOX_RATE_PER_MIN": "1", "SANDBOX_RATE_BURST": "5"}, n=3)
    try:
        _, _, daemons, _ = fleet
        urls = [daemons[i % 3].url for i in range(9)]
        # Nine processes at once, three per replica, each run holding its
        # place for four seconds: two run in the whole fleet; the rest are
        # refused for the concurrency cap, marked, nothing run.
        first = [s[0] for s in _at_once(urls, BUSY, until_rate=False)]
        assert sorted(first) == ["at-once"] * 7 + ["ran"] * 2, first
        # The two spent two of the bucket's five tokens. Nine processes
        # again, each retrying the cap until it runs or the rate refuses:
        # exactly three more run in the whole fleet, and every process ends
        # on a run or the rate.
        second = _at_once(urls, "1", until_rate=True)
        ran = sum(s.count("ran") for s in second)
        assert ran == 3, second
        assert all(s[-1] in ("ran", "rate") for s in second), second
        assert not [a for s in second for a in s if a not in ("ran", "rate", "at-once")], second
    finally:
        stop(*fleet)


def test_the_days_paid_seconds_hold_exactly_across_three_replicas_under_load_from_several_processes():
    # A metered provider: the remote-plimsoll plugin in front of a wasm
    # daemon. Each run books its budget (1 s) before it runs and keeps at
    # least one whole second, so of nine sent at once by nine processes
    # through three replicas, exactly three fit a daily allowance of three.
    upstream = Daemon({"SANDBOX_PROVIDER": "wasm"})
    fleet = replicas({"SANDBOX_PROVIDER": "remote-plimsoll",
                      "SANDBOX_PLUGIN_HTTP_ORIGINS": upstream.url,
                      "SANDBOX_PLUGIN_METERED": "1",
                      "SANDBOX_PAID_SECONDS_PER_DAY": "3"}, n=3)
    try:
        redis, _, daemons, _ = fleet
        urls = [daemons[i % 3].url for i in range(9)]
        outcomes = [s[0] for s in _at_once(urls, "1", until_rate=False, timeout=1)]
        assert sorted(outcomes) == ["paid"] * 6 + ["ran"] * 3, outcomes
        used = subprocess.run(["redis-cli", "-p", str(redis.port), "HGET", "plimsoll:paid:*",
                               "used"], capture_output=True, text=True).stdout.strip()
        assert used == "3", used
    finally:
        stop(*fleet)
        upstream.stop()
