"""The MCP server, driven by the official MCP Python SDK (`mcp` from PyPI,
pinned in scripts/setup.sh), against the real plimsolld: over streamable HTTP
at /mcp and over the `plimsoll mcp` stdio bridge.

What is checked is what an agent relies on: the tools and what their
descriptions promise, every result's provider, tier, exit code, flags and
record digest, a floor refusal as a tool error that names its reason, a
timeout, output arriving as progress notifications before the result, and
that nothing answers without the caller's token. The daemon's log is checked
with canaries: no code, output or session ID reaches it through MCP.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.error
import urllib.request

import httpx2
import pytest

from plimsoll_client import Client

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from test_published_client import Daemon, _Api, plimsolld_bin
from test_sessions import GracefulDaemon

TOKEN = "mcp-test-token-" + "k" * 32
IMAGE = os.environ.get("SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:bookworm")
RUN_TOOLS = {"run_javascript", "run_project", "session_run", "run_cell", "open_session"}
# Prints, keeps running for a while, prints again.
SLOW = ("console.log('first'); let t = Date.now(); while (Date.now() - t < 1500) {} "
        "console.log('second ' + Date.now())")  # stamped with the run's clock (this machine's)


@pytest.fixture(scope="module")
def wasm():
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "PLIMSOLL_TOKEN": TOKEN,
                "SANDBOX_MAX_SESSIONS": "2", "PLIMSOLL_LOG_FORMAT": "json"})
    yield d
    d.stop()


@pytest.fixture(scope="module")
def docker():
    # Stopped with SIGTERM, so the daemon removes its warm containers.
    d = GracefulDaemon({"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_RUNTIME": "runc",
                "SANDBOX_DOCKER_IMAGE": IMAGE, "PLIMSOLL_TOKEN": TOKEN})
    yield d
    d.stop()


def plimsoll_bin() -> str:
    return os.path.join(os.path.dirname(plimsolld_bin()), "plimsoll")


def http(url: str, token: str | None = TOKEN, seen: list | None = None):
    """The SDK's streamable HTTP transport to `url`/mcp. With `seen`, every
    answer the SDK's HTTP client receives is recorded there as (method,
    path, status, WWW-Authenticate), through the client's own response
    hook: what the SDK does not pass on is still observed."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    hooks = {}
    if seen is not None:
        async def record(response):
            seen.append((response.request.method, response.request.url.path,
                         response.status_code, response.headers.get("www-authenticate")))
        hooks["response"] = [record]
    client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=60),
                                event_hooks=hooks)
    return streamable_http_client(f"{url}/mcp", http_client=client)


def stdio(url: str, token: str | None = TOKEN):
    env = {"PATH": os.environ.get("PATH", "")}
    if token:
        env["PLIMSOLL_TOKEN"] = token
    params = StdioServerParameters(command=plimsoll_bin(), args=["mcp", "--url", url], env=env)
    return stdio_client(params)


async def with_session(transport, body):
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as s:
            await s.initialize()
            return await body(s)


def run(coro):
    return asyncio.run(coro)


TRANSPORTS = ["http", "stdio"]


def transport(kind: str, d: Daemon, token: str | None = TOKEN):
    return http(d.url, token) if kind == "http" else stdio(d.url, token)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_tools_are_listed_with_what_the_tier_means(wasm, kind):
    async def body(s):
        return (await s.list_tools()).tools
    tools = {t.name: t for t in run(with_session(transport(kind, wasm), body))}
    assert set(tools) == {"describe", "run_javascript", "run_project", "open_session",
                          "session_run", "run_cell", "close_session"}
    for name in RUN_TOOLS:
        d = tools[name].description
        assert "minimum_isolation" in d and "process" in d and "vm" in d, name
        assert tools[name].output_schema is not None, name
    assert tools["run_javascript"].input_schema["required"] == ["code"]


def assert_result(sc: dict, provider: str, isolation: str) -> None:
    assert sc["outcome"] == "completed"
    assert (sc["provider"], sc["isolation"]) == (provider, isolation)
    for k in ("exitCode", "timedOut", "stdoutTruncated", "stderrTruncated"):
        assert k in sc, k
    assert re.fullmatch(r"[0-9a-f]{64}", sc["recordSha256"])


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_run_javascript_states_provider_tier_exit_flags_and_record(wasm, kind):
    async def body(s):
        return await s.call_tool("run_javascript", {
            "code": "console.log('hi', 6 * 7); console.error('err'); throw new Error('boom')",
            "minimum_isolation": "process", "timeout_ms": 5000})
    r = run(with_session(transport(kind, wasm), body))
    assert not r.is_error
    sc = r.structured_content
    assert_result(sc, "wasm", "process")
    assert sc["stdout"] == "hi 42\n"
    assert "err" in sc["stderr"] and "boom" in sc["stderr"]
    assert sc["exitCode"] == 1 and sc["timedOut"] is False
    text = r.content[0].text
    assert "isolation process" in text and sc["recordSha256"] in text


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_floor_refusal_is_a_tool_error_naming_its_reason(wasm, kind):
    async def body(s):
        return await s.call_tool("run_javascript", {"code": "console.log('ran')",
                                                    "minimum_isolation": "vm"})
    r = run(with_session(transport(kind, wasm), body))
    assert r.is_error
    assert r.structured_content["outcome"] == "not_dispatched"
    assert r.structured_content["notDispatched"] == "isolation"
    assert "not dispatched: isolation" in r.content[0].text
    assert "ran" not in json.dumps(r.structured_content.get("stdout", ""))


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_timeout_is_reported_with_its_flag(wasm, kind):
    async def body(s):
        return await s.call_tool("run_javascript", {"code": "while (true) {}",
                                                    "timeout_ms": 300})
    r = run(with_session(transport(kind, wasm), body))
    sc = r.structured_content
    assert_result(sc, "wasm", "process")
    assert sc["timedOut"] is True and sc["exitCode"] == 124
    assert "timed out" in r.content[0].text


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_output_arrives_as_progress_before_the_result(wasm, kind):
    seen: list[tuple[float, str]] = []

    async def progress(value, total, message):
        seen.append((time.time(), message or ""))

    async def body(s):
        return await s.call_tool("run_javascript", {"code": SLOW}, progress_callback=progress)
    r = run(with_session(transport(kind, wasm), body))
    out = r.structured_content["stdout"]
    stamped = re.fullmatch(r"first\nsecond (\d+)\n", out)
    assert stamped, out
    first = next(t for t, m in seen if "first" in m)
    # In the order things happened, not a time bound: `first`'s progress
    # notification was here before the run, 1.5 s later, stamped its last
    # line, so it came while the run still ran.
    assert first < int(stamped.group(1)) / 1000, (first, out, seen)
    assert "".join(m for _, m in seen) == out


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_nothing_answers_without_the_callers_token(wasm, kind):
    """Without the token, or with a wrong one, the session fails at its
    first message, initialize, with the one error that means the daemon
    refused it: over HTTP the SDK's stand-in for a non-2xx answer, and the
    401 itself (with its Bearer challenge) seen on the wire; through the
    bridge, the bridge's error naming HTTP 401. Any other failure (a
    timeout, a refused connection, a 200 the SDK could not parse, a tool
    call that got further) fails the test."""
    async def body(s):
        return await s.list_tools()
    for token in (None, "wrong-" + "x" * 40):
        seen: list = []
        t = http(wasm.url, token, seen) if kind == "http" else stdio(wasm.url, token)
        with pytest.raises((MCPError, BaseExceptionGroup)) as e:
            run(with_session(t, body))
        # The SDK's task groups wrap what initialize raised.
        errors = _leaves(e.value)
        assert len(errors) == 1 and isinstance(errors[0], MCPError), repr(e.value)
        error = errors[0]
        if kind == "http":
            # The SDK turns a non-2xx answer that is no JSON-RPC error into
            # this stand-in, which names no status: the status is read off
            # the wire.
            assert (error.code, error.message) == (
                INTERNAL_ERROR, "Server returned an error response"), repr(error)
            assert seen, "the SDK's client received no answer"
            assert seen[0] == ("POST", "/mcp", 401, "Bearer"), seen
            assert all(status == 401 for _, _, status, _ in seen), seen
        else:
            # The bridge answers with the daemon's status, so the agent sees
            # why.
            assert error.code == -32000, repr(error)
            assert "(HTTP 401 Unauthorized)" in error.message, repr(error)


def _leaves(e: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, however deeply nested; an
    exception that is no group is its own one leaf."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for x in e.exceptions for leaf in _leaves(x)]
    return [e]


def raw_post(url: str, body: dict, headers: dict) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(f"{url}/mcp", json.dumps(body).encode(), {
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_unauthenticated_requests_are_refused_before_the_sdk_reads_them(wasm):
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "run_javascript", "arguments": {"code": "console.log(1)"}}}
    status, headers, _ = raw_post(wasm.url, call, {})
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 401 and headers.get("www-authenticate") == "Bearer"
    # Every method, not only POST.
    for method in ("GET", "DELETE"):
        req = urllib.request.Request(f"{wasm.url}/mcp", method=method,
                                     headers={"accept": "text/event-stream"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401, method
    # A browser page must not drive the daemon, token or not: refused by
    # the API's own rule, marked (nothing ran), repeating nothing it sent.
    status, headers, body = raw_post(wasm.url, call, {"authorization": f"Bearer {TOKEN}",
                                                      "origin": "http://page.example"})
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 403
    assert headers.get("plimsoll-not-dispatched") == "permission"
    assert b"page.example" not in body


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_session_tools_keep_state_and_report_each_call(wasm, kind):
    async def body(s):
        opened = await s.call_tool("open_session", {"minimum_isolation": "process"})
        sid = opened.structured_content["sessionId"]
        a = await s.call_tool("session_run", {"session_id": sid, "code": "globalThis.n = 41"})
        b = await s.call_tool("session_run", {"session_id": sid, "code": "console.log(n + 1)"})
        closed = await s.call_tool("close_session", {"session_id": sid})
        gone = await s.call_tool("session_run", {"session_id": sid, "code": "1"})
        return opened, a, b, closed, gone
    opened, a, b, closed, gone = run(with_session(transport(kind, wasm), body))
    assert opened.structured_content["isolation"] == "process"
    assert_result(a.structured_content, "wasm", "process")
    assert b.structured_content["stdout"] == "42\n"
    assert closed.structured_content["calls"] == "2"
    assert gone.is_error and gone.structured_content["outcome"] == "not_dispatched"


def test_describe_runs_nothing_and_states_the_tier(wasm):
    async def body(s):
        return await s.call_tool("describe", {})
    r = run(with_session(http(wasm.url), body))
    assert r.structured_content["sandbox"] == "wasm"
    assert r.structured_content["isolation"] == "process"


def test_unknown_arguments_are_refused_and_nothing_runs(wasm):
    # `trace_id` is a field the API knows (`traceId`) and no tool's schema
    # names. Were it passed through instead of refused, the run would go
    # ahead and its audit line would carry this tag: the sentinel.
    tag = f"mcp-unknown-arg-{time.monotonic_ns()}"

    async def body(s):
        return await s.call_tool("run_javascript", {"code": "console.log(1)", "trace_id": tag})
    def sentinel() -> int:
        """Runs a snippet with a trace ID of its own and waits for its audit
        line: lines arrive in order, so every earlier one is in by then."""
        mark = f"sentinel-{time.monotonic_ns()}"
        Client(wasm.url, TOKEN, insecure_http=True).run_javascript("0", trace_id=mark)
        deadline = time.monotonic() + 10
        while not any(a.get("trace_id") == mark for a in wasm.audit()):
            assert time.monotonic() < deadline, "the sentinel's audit line never arrived"
            time.sleep(0.02)
        return len(wasm.audit())
    before = sentinel()
    r = run(with_session(http(wasm.url), body))
    assert r.is_error and r.structured_content["notDispatched"] == "request", r
    after = sentinel()
    assert not [a for a in wasm.audit()[before:after] if a.get("trace_id") == tag]


def test_the_log_holds_no_code_output_or_session_id(wasm):
    canary = f"mcp-canary-{time.monotonic_ns()}"

    async def body(s):
        # A tool name is echoed in the SDK's own warning about the error: the
        # filter on its log lines is what keeps this one out.
        try:
            await s.call_tool(f"no-such-tool-{canary}", {})
        except Exception:
            pass
        await s.call_tool("run_javascript", {"code": f"console.log('{canary}')"})
        opened = await s.call_tool("open_session", {})
        sid = opened.structured_content["sessionId"]
        await s.call_tool("session_run", {"session_id": sid, "code": f"'{canary}'"})
        await s.call_tool("close_session", {"session_id": sid})
        # Last, a run whose audit line says every line before it is in.
        await s.call_tool("run_javascript", {"code": "console.log('sentinel')"})
        return sid
    before = len(wasm.audit())
    sid = run(with_session(http(wasm.url), body))
    # Audit lines are written before each answer, in order; the log reader
    # may lag, so wait for the sentinel's (the last run's).
    deadline = time.monotonic() + 10
    # (the first run, the session call, the sentinel).
    while len([a for a in wasm.audit()[before:] if a.get("op") == "javascript"]) < 3:
        assert time.monotonic() < deadline, "the MCP runs' audit lines never arrived"
        time.sleep(0.05)
    time.sleep(0.2)
    log = "\n".join(wasm.lines)
    assert canary not in log
    assert sid not in log
    assert TOKEN not in log
    assert any(a.get("op") == "javascript" for a in wasm.audit()), "MCP runs are audited"


def test_run_project_on_docker_returns_each_step(docker):
    async def body(s):
        return await s.call_tool("run_project", {
            "files": [{"path": "main.py", "content": "print('from python')\n"}],
            "steps": ["python3 main.py", "echo done > out.txt"],
            "artifacts": ["out.txt"], "timeout_ms": 60000})
    r = run(with_session(http(docker.url), body))
    sc = r.structured_content
    assert_result(sc, "docker", "container")
    assert [s["stdout"] for s in sc["steps"]] == ["from python\n", ""]
    assert sc["artifacts"] == [{"path": "out.txt", "content": "done\n"}]
    assert sc["projectOutcome"] == "completed"


def test_docker_output_arrives_as_progress_before_the_result(docker):
    seen: list[tuple[float, str]] = []

    async def progress(value, total, message):
        seen.append((time.time(), message or ""))

    async def body(s):
        return await s.call_tool("run_javascript", {
            "code": "console.log('early'); setTimeout(() => console.log('late ' + Date.now()), 2500)",
            "timeout_ms": 20000}, progress_callback=progress)
    r = run(with_session(stdio(docker.url), body))
    assert_result(r.structured_content, "docker", "container")
    stamped = re.search(r"late (\d+)", r.structured_content["stdout"])
    assert stamped, r.structured_content
    early = next(t for t, m in seen if "early" in m)
    # Order, not a time bound: `early` was here before the container, 2.5 s
    # later, stamped its last line with its clock (this machine's).
    assert early < int(stamped.group(1)) / 1000, (early, r.structured_content, seen)


# --- grants: the SDK an agent is told about --------------------------------

PETSTORE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "openapi", "petstore.yaml")
TOKEN_B = "mcp-test-token-b-" + "q" * 32


@pytest.fixture(scope="module")
def granted(tmp_path_factory):
    """A wasm daemon with two callers, and a profile generated from the
    Petstore document by the real `plimsoll grants from-openapi`, granted
    to caller `a` only."""
    import hashlib
    import subprocess
    api = _Api()
    out = tmp_path_factory.mktemp("grants")
    done = subprocess.run(
        [plimsoll_bin(), "grants", "from-openapi", PETSTORE, "--base-url", api.origin,
         "--profile", "petstore", "--global", "petstore", "--caller", "a", "--out", str(out)],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "required query parameter status; skipped" in done.stderr
    clients = out / "clients.json"
    clients.write_text(json.dumps({"clients": [
        {"id": "a", "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest(), "scopes": ["code:run"]},
        {"id": "b", "token_sha256": hashlib.sha256(TOKEN_B.encode()).hexdigest(), "scopes": ["code:run"]},
    ]}))
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "PLIMSOLL_CLIENTS_FILE": str(clients),
                "PLIMSOLL_GRANTS_FILE": str(out / "petstore.profile.json")})
    yield d, api, (out / "petstore.tool.txt").read_text()
    d.stop()
    api.server.shutdown()


def test_each_caller_is_told_the_sdk_of_its_own_grants_only(granted):
    d, api, tool_txt = granted

    async def tools(s):
        return {t.name: t.description for t in (await s.list_tools()).tools}
    mine = run(with_session(http(d.url, TOKEN), tools))
    theirs = run(with_session(http(d.url, TOKEN_B), tools))
    assert "petstore.getPetById(petId) — GET /v2/pet/{petId}: Find pet by ID" in mine["run_javascript"]
    # What MCP shows is what the generator wrote beside the profile.
    assert tool_txt.strip() in mine["run_javascript"]
    assert "petstore" not in theirs["run_javascript"]
    assert all("petstore" not in (t or "") for n, t in mine.items() if n != "run_javascript")

    # And the agent can call what it was told about.
    async def call(s):
        return await s.call_tool("run_javascript", {
            "code": "console.log(JSON.stringify(await petstore.getPetById(7)))",
            "grant_profile": "petstore"})
    result = run(with_session(http(d.url, TOKEN), call))
    assert not result.is_error, result
    assert result.structured_content["stdout"] == '{"id":"7"}\n'
    assert [(m, p) for m, p, _ in api.seen] == [("GET", "/v2/pet/7")]
