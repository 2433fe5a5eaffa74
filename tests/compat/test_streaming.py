"""`RunStream`, the server-streaming form of `Run` (docs/api.md), observed
chunk by chunk against the real plimsolld on wasm and on docker (runc): each
message is timestamped as it arrives, so the tests prove output reaches the
client while the run is still running, not only that it arrives at all.
The final message is `Run`'s answer; the streamed bytes are exactly the
output it reports, and caps and flags are Run's.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import struct
import time

import pytest

from plimsoll_client import Client

from test_published_client import Daemon
from test_sessions import GracefulDaemon

IMAGE = os.environ.get("SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:bookworm")
PATH = "/plimsoll.v1.SandboxService/RunStream"


@pytest.fixture(scope="module")
def wasm():
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "PLIMSOLL_LOG_FORMAT": "json"})
    yield d
    d.stop()


@pytest.fixture(scope="module")
def docker():
    # Stopped with SIGTERM, so the daemon removes its warm containers.
    d = GracefulDaemon({"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_RUNTIME": "runc",
                "SANDBOX_DOCKER_IMAGE": IMAGE})
    yield d
    d.stop()


def envelope(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"\x00" + struct.pack(">I", len(body)) + body


def stream(url: str, request: dict, content_type: str = "application/connect+json",
           body: bytes | None = None):
    """POSTs a RunStream call; returns (status, headers, [(t, flags, message)])
    with each message's arrival time (this machine's clock, in seconds, as a
    run's own Date.now() reads it in ms)."""
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    c.request("POST", PATH, body if body is not None else envelope(request),
              {"content-type": content_type})
    r = c.getresponse()
    headers = {k.lower(): v for k, v in r.getheaders()}
    if r.status != 200 or not headers["content-type"].startswith("application/connect+json"):
        return r.status, headers, json.loads(r.read() or b"null")
    messages = []
    while True:
        head = r.read(5)
        if len(head) < 5:
            break
        flags, n = head[0], struct.unpack(">I", head[1:])[0]
        messages.append((time.time(), flags, json.loads(r.read(n))))
    c.close()
    return r.status, headers, messages


def run_request(code: str, **extra) -> dict:
    return {"protocol": 4, "javascript": {"code": code}, **extra}


def outputs(messages, key: str) -> bytes:
    return b"".join(base64.b64decode(m["output"][key])
                    for _, _, m in messages if "output" in m and key in m["output"])


def canary(what: str) -> str:
    """A trace ID no other request carries: the canary a refused stream
    wears, found in an audit line if its run ever started."""
    return f"stream-{what}-{time.monotonic_ns()}"


def never_ran(d: Daemon, *traces: str) -> None:
    """Proves "nothing ran" rather than assuming it: a sentinel run's audit line
    is waited for (lines arrive in order, so every earlier line is in by
    then), and no line carries any of `traces`. Every run that may have
    started gets an audit line."""
    d.audit_after_sentinel()
    for trace in traces:
        hits = [line for line in list(d.lines) if f'"{trace}"' in line]
        assert not hits, f"a refused stream ran: {hits}"


def open_stream(url: str, request: dict):
    """Starts a RunStream call and returns (connection, response) once its
    headers are in; its messages are then read one at a time."""
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    c.request("POST", PATH, envelope(request), {"content-type": "application/connect+json"})
    return c, c.getresponse()


def next_message(r) -> tuple[int, dict] | None:
    """The stream's next message as (flags, message), or None once it has
    ended."""
    head = r.read(5)
    if not head:
        return None
    assert len(head) == 5, f"a message cut short: {head!r}"
    n = struct.unpack(">I", head[1:])[0]
    body = r.read(n)
    assert len(body) == n, f"a message cut short: {body!r}"
    return head[0], json.loads(body)


def assert_refused_first(url: str, request: dict, reason: str, code: str) -> None:
    """A refused stream: marked in its header, and its first message is the
    end of the stream carrying the refusal (no output, no result before
    it), with nothing after it."""
    c, r = open_stream(url, request)
    try:
        assert r.status == 200, r.status
        assert r.getheader("plimsoll-not-dispatched") == reason
        first = next_message(r)
        assert first is not None, "the refused stream ended without a message"
        flags, message = first
        assert "output" not in message and "result" not in message, \
            f"the refusal came after {message}"
        assert flags == 2, (flags, message)
        assert message["metadata"]["plimsoll-not-dispatched"] == [reason], message
        assert message["error"]["code"] == code, message
        assert message["error"]["details"][0]["type"] == "plimsoll.v1.NotDispatched"
        rest = next_message(r)
        assert rest is None, f"a message followed the refusal: {rest}"
    finally:
        c.close()


def test_output_arrives_while_the_run_runs_then_runs_answer(wasm):
    # The run stamps its stderr line with its own clock, 1.5 s after `first`.
    code = ("console.log('first'); let t = Date.now(); while (Date.now() - t < 1500) {} "
            "console.error('warn ' + Date.now()); console.log('second')")
    status, headers, messages = stream(wasm.url, run_request(code))
    assert status == 200 and "plimsoll-not-dispatched" not in headers
    first = next(t for t, _, m in messages if b"first" in outputs([(0, 0, m)], "stdout"))
    _, _, result = next(x for x in messages if "result" in x[2])
    # In the order things happened, not a time bound: `first` was here
    # before the run stamped its later line, so it came while the run ran.
    stamped = int(outputs(messages, "stderr").split()[1]) / 1000
    assert first < stamped, "the first line arrived only with the answer"
    # The last message ends the stream, and ends it cleanly.
    assert messages[-1][1] == 2 and messages[-1][2] == {}
    answer = result["result"]
    assert (answer["sandbox"], answer["isolation"]) == ("wasm", "process")
    assert answer["record"]["recordSha256"]
    # The streamed bytes are the output the answer reports, in order.
    assert outputs(messages, "stdout") == base64.b64decode(answer["javascript"]["stdout"])
    assert outputs(messages, "stderr") == base64.b64decode(answer["javascript"]["stderr"])
    assert outputs(messages, "stdout") == b"first\nsecond\n"


def test_the_streamed_answer_is_runs_answer(wasm):
    """The same request through Run and RunStream: the same result digest,
    because the record covers the whole output either way."""
    code = "console.log('same'); console.error('both')"
    ran = Client(wasm.url).run_javascript(code)
    _, _, messages = stream(wasm.url, run_request(code))
    answer = next(m for _, _, m in messages if "result" in m)["result"]
    assert answer["record"]["resultSha256"] == ran.record.result_sha256
    assert answer["record"]["requestSha256"] == ran.record.request_sha256


def test_caps_and_flags_are_runs(wasm):
    # 100 000 bytes against the 64 KiB limit: no more is streamed than kept.
    code = "let s = 'x'.repeat(1000); for (let i = 0; i < 100; i++) console.log(s.slice(1))"
    _, _, messages = stream(wasm.url, run_request(code))
    answer = next(m for _, _, m in messages if "result" in m)["result"]["javascript"]
    assert answer["stdoutTruncated"] is True
    assert len(outputs(messages, "stdout")) == 65536
    assert outputs(messages, "stdout") == base64.b64decode(answer["stdout"])


def test_a_timeout_streams_the_daemons_notice(wasm):
    _, _, messages = stream(wasm.url, run_request("console.log('up'); while (true) {}",
                                                  timeoutMs=300))
    answer = next(m for _, _, m in messages if "result" in m)["result"]["javascript"]
    assert answer["timedOut"] is True
    assert b"deadline" in outputs(messages, "stderr")


def test_a_refusal_is_marked_and_nothing_is_streamed(wasm):
    trace = canary("floor")
    status, headers, messages = stream(wasm.url, run_request("console.log('ran')",
                                                             minimumIsolation="vm",
                                                             traceId=trace))
    assert status == 200
    assert headers["plimsoll-not-dispatched"] == "isolation"
    assert len(messages) == 1
    _, flags, end = messages[0]
    assert flags == 2
    assert end["metadata"]["plimsoll-not-dispatched"] == ["isolation"]
    assert end["error"]["code"] == "failed_precondition"
    assert end["error"]["details"][0]["type"] == "plimsoll.v1.NotDispatched"
    never_ran(wasm, trace)


def test_malformed_streams_are_refused_before_anything_runs(wasm):
    # Each carries a well-formed request with a canary trace: were any of
    # them run, its audit line would carry it.
    traces = [canary(k) for k in ("content-type", "two-messages", "compressed")]

    def request(trace: str) -> dict:
        return run_request("console.log('ran')", traceId=trace)
    status, headers, body = stream(wasm.url, {}, content_type="application/json",
                                   body=envelope(request(traces[0])))
    assert status == 415 and headers["plimsoll-not-dispatched"] == "request"
    two = envelope(request(traces[1])) * 2
    status, headers, body = stream(wasm.url, {}, body=two)
    assert status == 400 and headers["plimsoll-not-dispatched"] == "request"
    compressed = b"\x01" + envelope(request(traces[2]))[1:]
    status, headers, body = stream(wasm.url, {}, body=compressed)
    assert status == 400 and headers["plimsoll-not-dispatched"] == "request"
    never_ran(wasm, *traces)


def test_a_refused_stream_sends_its_refusal_first_and_nothing_else(wasm):
    """Every refusal comes before any output: read message by message, a
    stream refused for its floor, for bad input (caught by validation, after
    framing and parsing) or for capacity opens with its refusal, marked, and
    ends there. Each refused request would print at once had it run; none
    ran."""
    floor, bad, full = canary("floor-first"), canary("input-first"), canary("capacity-first")
    assert_refused_first(wasm.url, run_request("console.log('ran')", minimumIsolation="vm",
                                               traceId=floor),
                         "isolation", "failed_precondition")
    assert_refused_first(wasm.url, run_request("console.log('ran')", minimumIsolation="none",
                                               traceId=bad),
                         "request", "invalid_argument")
    never_ran(wasm, floor, bad)

    # Capacity: the daemon's one place is held by a run seen running (its
    # first output has arrived) while the refused stream is asked for.
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "SANDBOX_MAX_CONCURRENT": "1",
                "PLIMSOLL_LOG_FORMAT": "json"})
    try:
        busy = "console.log('up'); let t = Date.now(); while (Date.now() - t < 2000) {}"
        c, r = open_stream(d.url, run_request(busy, timeoutMs=10000))
        try:
            assert r.status == 200
            first = next_message(r)
            assert first is not None and b"up" in outputs([(0, 0, first[1])], "stdout"), first
            assert_refused_first(d.url, run_request("console.log('ran')", traceId=full),
                                 "capacity", "resource_exhausted")
            rest = []
            while (m := next_message(r)) is not None:
                rest.append(m)
            assert any("result" in m for _, m in rest), rest
        finally:
            c.close()
        never_ran(d, full)
    finally:
        d.stop()


def test_docker_output_arrives_while_the_container_runs(docker):
    # 2.5 s after `early`, the container stamps its stderr with its clock.
    code = ("console.log('early'); "
            "setTimeout(() => { console.error(Date.now()); console.log('late') }, 2500)")
    status, _, messages = stream(docker.url, run_request(code, timeoutMs=20000))
    assert status == 200
    early = next(t for t, _, m in messages if b"early" in outputs([(0, 0, m)], "stdout"))
    _, _, result = next(x for x in messages if "result" in x[2])
    # Order, not a time bound: `early` was here before the container
    # stamped its later line, so it came while the container ran.
    stamped = int(outputs(messages, "stderr")) / 1000
    assert early < stamped, "the container's first line arrived only with the answer"
    answer = result["result"]
    assert answer["isolation"] == "container"
    assert outputs(messages, "stdout") == b"early\nlate\n"
    assert outputs(messages, "stdout") == base64.b64decode(answer["javascript"]["stdout"])


def test_a_watcher_that_leaves_does_not_stop_or_unrecord_the_run(wasm):
    before = len(wasm.audit())
    host, port = wasm.url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    code = "console.log('up'); let t = Date.now(); while (Date.now() - t < 1000) {}"
    c.request("POST", PATH, envelope(run_request(code)),
              {"content-type": "application/connect+json"})
    r = c.getresponse()
    assert r.status == 200
    head = r.read(5)
    assert head[0] == 0
    c.close()  # gone mid-run
    deadline = time.monotonic() + 15
    while len(wasm.audit()) <= before:
        assert time.monotonic() < deadline, "the abandoned run was never audited"
        time.sleep(0.05)
    line = wasm.audit()[before]
    # Run to its end, not cut when the watcher left.
    assert line["op"] == "javascript" and line["duration_ms"] >= 900, line
