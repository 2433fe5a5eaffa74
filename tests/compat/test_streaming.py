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
    with each message's arrival time."""
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
        messages.append((time.monotonic(), flags, json.loads(r.read(n))))
    c.close()
    return r.status, headers, messages


def run_request(code: str, **extra) -> dict:
    return {"protocol": 4, "javascript": {"code": code}, **extra}


def outputs(messages, key: str) -> bytes:
    return b"".join(base64.b64decode(m["output"][key])
                    for _, _, m in messages if "output" in m and key in m["output"])


def test_output_arrives_while_the_run_runs_then_runs_answer(wasm):
    code = ("console.log('first'); let t = Date.now(); while (Date.now() - t < 1500) {} "
            "console.error('warn'); console.log('second')")
    status, headers, messages = stream(wasm.url, run_request(code))
    assert status == 200 and "plimsoll-not-dispatched" not in headers
    first = next(t for t, _, m in messages if b"first" in outputs([(0, 0, m)], "stdout"))
    result_at, _, result = next(x for x in messages if "result" in x[2])
    assert result_at - first > 1.0, "the first line arrived only with the answer"
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
    status, headers, messages = stream(wasm.url, run_request("console.log('ran')",
                                                             minimumIsolation="vm"))
    assert status == 200
    assert headers["plimsoll-not-dispatched"] == "isolation"
    assert len(messages) == 1
    _, flags, end = messages[0]
    assert flags == 2
    assert end["metadata"]["plimsoll-not-dispatched"] == ["isolation"]
    assert end["error"]["code"] == "failed_precondition"
    assert end["error"]["details"][0]["type"] == "plimsoll.v1.NotDispatched"


def test_malformed_streams_are_refused_before_anything_runs(wasm):
    status, headers, body = stream(wasm.url, {}, content_type="application/json",
                                   body=envelope(run_request("1")))
    assert status == 415 and headers["plimsoll-not-dispatched"] == "request"
    two = envelope(run_request("1")) * 2
    status, headers, body = stream(wasm.url, {}, body=two)
    assert status == 400 and headers["plimsoll-not-dispatched"] == "request"
    compressed = b"\x01" + envelope(run_request("1"))[1:]
    status, headers, body = stream(wasm.url, {}, body=compressed)
    assert status == 400 and headers["plimsoll-not-dispatched"] == "request"


def test_docker_output_arrives_while_the_container_runs(docker):
    code = "console.log('early'); setTimeout(() => console.log('late'), 2500)"
    status, _, messages = stream(docker.url, run_request(code, timeoutMs=20000))
    assert status == 200
    early = next(t for t, _, m in messages if b"early" in outputs([(0, 0, m)], "stdout"))
    result_at, _, result = next(x for x in messages if "result" in x[2])
    assert result_at - early > 1.5, "the container's first line arrived only with the answer"
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
