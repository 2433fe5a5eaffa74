"""fake-e2b proven against E2B's official Python SDK (e2b 2.63.0, unmodified),
and its fault knobs shown on the wire.

Run: .venv-e2b/bin/python -m pytest -q tests/fakes/e2b (part of `make test`;
needs docker, the plimsoll/sandbox:bookworm image and the `e2b` package,
which `make setup` installs; nothing here skips).
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from container import LABEL, docker_available  # noqa: E402
from fake_e2b import DEFAULT_IMAGE, FakeE2B  # noqa: E402

API_KEY = "e2b_fake_test_key"
MIB = 1024 * 1024

def _image_present() -> bool:
    return subprocess.run(["docker", "image", "inspect", DEFAULT_IMAGE],
                          capture_output=True).returncode == 0


# ---- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fake():
    # Never skipped: without docker or the image this suite fails, so a
    # machine that cannot run it is never counted as passing it.
    assert docker_available(), "docker is not available"
    assert _image_present(), f"{DEFAULT_IMAGE} is not built (make image)"
    server = FakeE2B(API_KEY).start()
    yield server
    server.stop()
    # stop() removes by label too; nothing of this instance may survive it.
    left = subprocess.run(["docker", "ps", "-aq", "--filter",
                           f"label={LABEL}={server.instance_id}"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], f"containers left behind: {left}"


@pytest.fixture(autouse=True)
def clean_slate(request):
    """Each test starts with no faults armed and leaves no sandbox alive,
    whether it passed or not."""
    if "fake" not in request.fixturenames:
        yield
        return
    server = request.getfixturevalue("fake")
    server.clear_faults()
    yield
    server.clear_faults()
    for sandbox in server.registry.all():
        server.registry.remove(sandbox.id)


@pytest.fixture(scope="module")
def sdk():
    import e2b  # the official SDK; make setup installs it in .venv-e2b

    return e2b


def sdk_opts(fake: FakeE2B, **extra) -> dict:
    # Plain http: the SDK's default HTTP version ("2") falls back to HTTP/1.1
    # without TLS (ALPN picks h2 only on TLS), which is what the fake serves.
    return {"api_key": API_KEY, "api_url": fake.url, "sandbox_url": fake.url, **extra}


def container_exists(container: str) -> bool:
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", f"id={container}"],
                         capture_output=True, text=True).stdout
    return container in out


def wait_for(condition, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return condition()


# ---- raw HTTP helpers -----------------------------------------------------------------------

def api(fake: FakeE2B, method: str, path: str, body=None, *, key: "str | None" = API_KEY,
        headers: "dict | None" = None):
    """(status, headers, parsed JSON or None) for a control-plane request."""
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    request = urllib.request.Request(fake.url + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("X-API-Key", key)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, head, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        status, head, raw = e.code, e.headers, e.read()
    return status, head, (json.loads(raw) if raw.strip() else None)


def create(fake: FakeE2B, **body) -> dict:
    status, _, answer = api(fake, "POST", "/v2/sandboxes", {"templateID": "base", **body})
    assert status == 201, answer
    return answer


def envd_headers(sandbox: dict) -> dict:
    headers = {"E2b-Sandbox-Id": sandbox["sandboxID"]}
    if sandbox.get("envdAccessToken"):
        headers["X-Access-Token"] = sandbox["envdAccessToken"]
    return headers


def envd(fake: FakeE2B, method: str, path: str, headers: dict, body: bytes = b"",
         content_type: "str | None" = None):
    """(status, headers, body bytes) for an envd request, via the edge."""
    conn = http.client.HTTPConnection(fake.host, fake.port, timeout=60)
    try:
        all_headers = dict(headers)
        if content_type:
            all_headers["Content-Type"] = content_type
        conn.request(method, path, body=body or None, headers=all_headers)
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def read_envelopes(data: bytes) -> "list[tuple[int, bytes]]":
    frames, pos = [], 0
    while pos + 5 <= len(data):
        flags, length = struct.unpack(">BI", data[pos:pos + 5])
        frames.append((flags, data[pos + 5:pos + 5 + length]))
        pos += 5 + length
    return frames


def start_stream(fake: FakeE2B, sandbox: dict, cmd: "list[str]", *, codec: str = "json",
                 extra_headers: "dict | None" = None):
    """Raw process.Process/Start: (frames, completed). `completed` is False
    when the connection closed before the chunked body ended."""
    request = {"process": {"cmd": cmd[0], "args": cmd[1:]}}
    if codec == "json":
        payload = json.dumps(request).encode()
    else:  # encoded with the SDK's own generated protobuf module, independently of the fake
        from e2b.envd.process import process_pb
        payload = process_pb.StartRequest(
            process=process_pb.ProcessConfig(cmd=cmd[0], args=cmd[1:])).to_binary()
    conn = http.client.HTTPConnection(fake.host, fake.port, timeout=60)
    try:
        conn.request("POST", "/process.Process/Start", body=envelope(payload),
                     headers={**envd_headers(sandbox), **(extra_headers or {}),
                              "Content-Type": f"application/connect+{codec}"})
        response = conn.getresponse()
        assert response.status == 200
        try:
            body, completed = response.read(), True
        except http.client.IncompleteRead as e:
            body, completed = e.partial, False
        return read_envelopes(body), completed
    finally:
        conn.close()


def json_events(frames) -> "list[dict]":
    return [json.loads(payload)["event"] for flags, payload in frames if not flags & 0x02]


def sdk_events(frames) -> "list[tuple[str, object]]":
    """Binary StartResponse frames decoded by the SDK's generated module,
    independently of the fake's codec: (oneof field, value) per event."""
    from e2b.envd.process import process_pb
    events = [process_pb.StartResponse.from_binary(p).event.event for f, p in frames
              if not f & 0x02]
    return [(event.field, event.value) for event in events]


def stdout_of(events) -> bytes:
    return b"".join(base64.b64decode(e["data"]["stdout"]) for e in events
                    if "data" in e and "stdout" in e["data"])


# ---- 1. the official SDK, end to end --------------------------------------------------------

def test_sdk_round_trip(fake, sdk):
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import CommandExitException

    sbx = Sandbox.create(timeout=120, metadata={"suite": "fake-e2b"}, **sdk_opts(fake))
    container = fake.state()["containers"][sbx.sandbox_id]
    assert container_exists(container)

    # Files: write, then read the same bytes back.
    content = "first line\nsecond line, ünïcode\n"
    sbx.files.write("/home/user/work/notes.txt", content)  # multipart upload
    assert sbx.files.read("/home/user/work/notes.txt") == content
    blob = bytes(range(256)) * 64
    sbx.files.write("work/blob.bin", io.BytesIO(blob))  # octet-stream upload, relative path
    assert bytes(sbx.files.read("/home/user/work/blob.bin", format="bytes")) == blob
    assert [e.name for e in sbx.files.list("/home/user/work")] == ["blob.bin", "notes.txt"]

    # A command: stdout and stderr apart, exit 0; cwd is the user's home.
    result = sbx.commands.run("echo to-out; echo to-err >&2; pwd; id -un")
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, "to-out\n/home/user\nuser\n", "to-err\n")

    # A failing command: the SDK raises, with the exit code and both streams.
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; echo broken >&2; exit 3")
    assert (failed.value.exit_code, failed.value.stdout, failed.value.stderr) == (
        3, "partial\n", "broken\n")

    # Stdin: a background command fed through SendInput, ended by CloseStdin.
    handle = sbx.commands.run("tr a-z A-Z", background=True, stdin=True)
    handle.send_stdin("hello stdin\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "HELLO STDIN\n"

    # A signal: SIGKILL through the SDK ends the command (and its children).
    sleeper = sbx.commands.run("sleep 30 & sleep 30", background=True)
    assert sleeper.pid in [p.pid for p in sbx.commands.list()]
    assert sleeper.kill() is True
    with pytest.raises(CommandExitException) as killed:
        sleeper.wait()
    assert killed.value.exit_code == -1

    # Listing by metadata finds it; the info is what create said.
    listed = Sandbox.list(query=sdk.SandboxQuery(metadata={"suite": "fake-e2b"}),
                          **sdk_opts(fake)).next_items()
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
    assert sbx.get_info().metadata == {"suite": "fake-e2b"}
    assert sbx.is_running() is True

    assert sbx.kill() is True
    assert fake.live_count() == 0
    assert not container_exists(container)
    assert sbx.is_running() is False  # the edge now answers "sandbox was not found"
    assert Sandbox.kill(sbx.sandbox_id, **sdk_opts(fake)) is False  # 404 on a second kill


def test_sdk_command_timeout_ends_the_stream(fake, sdk):
    from e2b import Sandbox
    from e2b.exceptions import TimeoutException

    sbx = Sandbox.create(timeout=60, **sdk_opts(fake))
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 20", timeout=1)  # Connect-Timeout-Ms: 1000
    assert time.monotonic() - started < 5


def list_all(paginator) -> "tuple[list, int]":
    """Every page of an SDK paginator, followed as its docstring says:
    (the sandboxes, how many pages)."""
    items, pages = [], 0
    while paginator.has_next:
        items += paginator.next_items()
        pages += 1
        assert pages <= 20, "the listing never ended"
    return items, pages


def test_sdk_lists_every_page_by_metadata_and_state(fake, sdk):
    from e2b import Sandbox, SandboxQuery, SandboxState

    # A value the SDK has to encode: a space, '&', '=', '%', '+', non-ASCII.
    odd = "a b&c=d%e+\u00fc"
    labels = {"suite": "listing", "odd": odd}
    ours = [create(fake, timeout=120, metadata=labels)["sandboxID"] for _ in range(4)]
    create(fake, timeout=120, metadata={"suite": "listing"})  # one label short
    create(fake, timeout=120, metadata={"suite": "other", "odd": odd})
    fake.pause(ours[1])
    newest_first = ours[::-1]
    before = fake.state()["listings"]

    # Pages of one (the knob): the SDK follows X-Next-Token to the end.
    fake.set_fault("list_page_size", count=None, size=1)
    query = SandboxQuery(metadata=labels)
    listed, pages = list_all(Sandbox.list(query=query, **sdk_opts(fake)))
    # No state asked for: running and paused, newest first.
    assert [s.sandbox_id for s in listed] == newest_first and pages == 4
    assert [s.state for s in listed] == [
        SandboxState.PAUSED if i == ours[1] else SandboxState.RUNNING for i in newest_first]
    assert all(s.metadata == labels for s in listed)

    # The state filter, each way; the order, reversed.
    running = SandboxQuery(metadata=labels, state=[SandboxState.RUNNING])
    listed, pages = list_all(Sandbox.list(query=running, **sdk_opts(fake)))
    assert [s.sandbox_id for s in listed] == [i for i in newest_first if i != ours[1]]
    assert pages == 3
    paused = SandboxQuery(metadata=labels, state=[SandboxState.PAUSED])
    listed, pages = list_all(Sandbox.list(query=paused, **sdk_opts(fake)))
    assert [s.sandbox_id for s in listed] == [ours[1]] and pages == 1
    listed, pages = list_all(Sandbox.list(query=query, order="asc", **sdk_opts(fake)))
    assert [s.sandbox_id for s in listed] == ours and pages == 4

    # Without the knob a page holds the SDK's `limit`.
    fake.clear_faults("list_page_size")
    listed, pages = list_all(Sandbox.list(query=query, limit=3, **sdk_opts(fake)))
    assert [s.sandbox_id for s in listed] == newest_first and pages == 2

    # One request per page, all of them to the current listing.
    after = fake.state()["listings"]
    assert after["v2"] - before["v2"] == 4 + 3 + 1 + 4 + 2
    assert after["deprecated"] == before["deprecated"]


def test_listing_on_the_wire(fake):
    first = create(fake, timeout=2, metadata={"k": "v"})
    fake.pause(first["sandboxID"])
    second = create(fake, timeout=60, metadata={"k": "v"})
    ids = [second["sandboxID"], first["sandboxID"]]  # newest first

    # The defaults: both states, newest first, every match on one page.
    status, head, body = api(fake, "GET", "/v2/sandboxes?metadata=k%3Dv")
    assert status == 200 and [s["sandboxID"] for s in body] == ids
    assert [s["state"] for s in body] == ["running", "paused"]
    assert head["X-Total-Running"] == "1" and head["X-Next-Token"] is None
    # Running ones not asked for: no X-Total-Running.
    status, head, body = api(fake, "GET", "/v2/sandboxes?state=paused")
    assert [s["sandboxID"] for s in body] == ids[1:] and head["X-Total-Running"] is None

    # `limit` makes the pages; X-Next-Token chains them, absent on the last.
    status, head, body = api(fake, "GET", "/v2/sandboxes?limit=1")
    assert [s["sandboxID"] for s in body] == ids[:1] and head["X-Next-Token"]
    status, head, body = api(fake, "GET",
                             f"/v2/sandboxes?limit=1&nextToken={quote(head['X-Next-Token'])}")
    assert [s["sandboxID"] for s in body] == ids[1:] and head["X-Next-Token"] is None

    # Outside what the spec allows: 400.
    for query in ("limit=0", "limit=101", "limit=x", "state=", "state=running,stopped",
                  "order=newest", "nextToken=garbage", "startedAfter=yesterday",
                  "metadata=k", "metadata=k%3Dv%3Dw", "metadata=k%3D%25zz"):
        status, _, body = api(fake, "GET", f"/v2/sandboxes?{query}")
        assert (status, body["code"]) == (400, 400), query

    # The deprecated listing still answers, running sandboxes only, and
    # every call to it is counted.
    before = fake.state()["listings"]["deprecated"]
    status, _, body = api(fake, "GET", "/sandboxes?metadata=k%3Dv")
    assert status == 200 and [s["sandboxID"] for s in body] == ids[:1]
    assert fake.state()["listings"]["deprecated"] == before + 1

    # Paused: its timeout does not run and envd is out of reach, until a
    # connect resumes it.
    time.sleep(2.5)
    assert first["sandboxID"] in fake.state()["live"]
    assert envd(fake, "GET", "/health", envd_headers(first))[0] == 502
    path = f"/sandboxes/{first['sandboxID']}/connect"
    assert api(fake, "POST", path, {"timeout": 30})[0] == 200
    assert envd(fake, "GET", "/health", envd_headers(first))[0] == 204
    assert api(fake, "GET", "/v2/sandboxes?state=paused")[2] == []


# ---- 2. authentication and request validation -----------------------------------------------

def test_wrong_api_key(fake, sdk):
    from e2b import Sandbox
    from e2b.exceptions import AuthenticationException

    with pytest.raises(AuthenticationException):
        Sandbox.create(**sdk_opts(fake, api_key="e2b_wrong"))
    for key in ("e2b_wrong", None):
        status, _, body = api(fake, "GET", "/v2/sandboxes", key=key)
        assert status == 401 and body["code"] == 401 and body["message"]
    assert fake.live_count() == 0


@pytest.mark.parametrize("path", ["/sandboxes", "/v2/sandboxes"])
@pytest.mark.parametrize("body, complaint", [
    ({"templateID": "base", "colour": "blue"}, "unknown field"),
    ({"templateID": "base", "timeout": "10"}, "integer"),
    ({"templateID": 7}, "string"),
    ({"timeout": 10}, "templateID is required"),
    ({"templateID": "base", "metadata": {"k": 1}}, "string"),
    ({"templateID": "base", "network": {"denyOut": ["not-a-cidr"]}}, "CIDR"),
    ({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}}, "per-destination"),
    ({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1"]}},
     "per-destination"),
    ({"templateID": "base", "allow_internet_access": False,
      "network": {"allowOut": ["8.8.8.0/24"]}}, "per-destination"),
])
def test_create_refuses_invalid_bodies(fake, path, body, complaint):
    status, _, answer = api(fake, "POST", path, body)
    assert status == 400, answer
    assert answer["code"] == 400 and complaint in answer["message"]
    assert fake.live_count() == 0


def test_create_v1_secure_flag_decides_the_token(fake):
    status, _, open_box = api(fake, "POST", "/sandboxes", {"templateID": "base", "timeout": 60})
    assert status == 201 and "envdAccessToken" not in open_box
    status, _, secure_box = api(fake, "POST", "/sandboxes",
                                {"templateID": "base", "timeout": 60, "secure": True})
    assert status == 201 and secure_box["envdAccessToken"]
    listing = (b"{}", "application/json")
    assert envd(fake, "POST", "/process.Process/List", envd_headers(open_box), *listing)[0] == 200
    no_token = {"E2b-Sandbox-Id": secure_box["sandboxID"]}
    assert envd(fake, "POST", "/process.Process/List", no_token, *listing)[0] == 401
    assert envd(fake, "POST", "/process.Process/List", envd_headers(secure_box),
                *listing)[0] == 200


# ---- 3. egress is denied for real -----------------------------------------------------------

def test_egress_denied(fake, sdk):
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import CommandExitException

    # Something listening on the host, which a sandbox must not reach.
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    try:
        sbx = Sandbox.create(timeout=60, allow_internet_access=False, **sdk_opts(fake))
        assert sbx.commands.run("ls /sys/class/net").stdout.split() == ["lo"]
        probe = ("import socket,sys\n"
                 "for host in sys.argv[1:]:\n"
                 "    try:\n"
                 f"        socket.create_connection((host, {port}), timeout=3)\n"
                 "        print('open', host)\n"
                 "    except OSError as e: print('refused', host, e.errno)\n")
        sbx.files.write("/home/user/probe.py", probe)
        result = sbx.commands.run("python3 probe.py 172.17.0.1 1.1.1.1 10.0.0.1")
        assert "open" not in result.stdout and result.stdout.count("refused") == 3
        with pytest.raises(CommandExitException):
            sbx.commands.run("getent hosts example.com")  # no resolver reachable
        assert accepted == []
        assert Sandbox.get_info(sbx.sandbox_id, **sdk_opts(fake)).allow_internet_access is False
    finally:
        listener.close()


def network_of(fake: FakeE2B, sandbox_id: str) -> "tuple[str, list[str], bool]":
    """The sandbox's container as docker and the sandbox itself see it:
    docker's network mode, the interfaces inside, and whether the routing
    table inside holds a default route."""
    container = fake.registry.get(sandbox_id).container
    mode = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.NetworkMode}}", container],
                          capture_output=True, text=True, check=True).stdout.strip()
    inside = subprocess.run(["docker", "exec", container, "sh", "-c",
                             "ls /sys/class/net; echo --; cat /proc/net/route"],
                            capture_output=True, text=True, check=True).stdout
    interfaces, _, routes = inside.partition("--")
    default = any(line.split()[1:2] == ["00000000"] for line in routes.splitlines()[1:])
    return mode, interfaces.split(), default


@pytest.mark.parametrize("options, network", [
    ({}, "bridge"),  # E2B's default: internet access on
    ({"allow_internet_access": True}, "bridge"),
    ({"allow_internet_access": False}, "none"),
    ({"network": {"deny_out": ["0.0.0.0/0"]}}, "none"),  # ALL_TRAFFIC
    ({"allow_internet_access": True, "network": {"deny_out": ["0.0.0.0/0"]}}, "none"),
    ({"network": {"allow_out": ["1.1.1.1"]}}, "bridge"),  # nothing denied, nothing narrowed
])
def test_the_network_is_what_the_create_asked_for(fake, sdk, options, network):
    """A sandbox has a network unless its create locks all egress, as E2B
    documents; the lock is applied by the fake, never assumed."""
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=60, **options, **sdk_opts(fake))
    mode, interfaces, default_route = network_of(fake, sbx.sandbox_id)
    seen = sbx.commands.run("ls /sys/class/net").stdout.split()
    if network == "bridge":
        assert (mode, default_route) == ("bridge", True) and "eth0" in seen
    else:
        assert (mode, default_route, seen) == ("none", False, ["lo"])
    assert interfaces == seen
    # Read back as asked: null when the create said nothing about it.
    assert Sandbox.get_info(sbx.sandbox_id, **sdk_opts(fake)).allow_internet_access is \
        options.get("allow_internet_access")


def test_the_plugins_lock_on_the_v1_create_gives_no_network(fake):
    """The body plimsoll's E2B plugin sends (POST /sandboxes)."""
    body = {"templateID": "base", "timeout": 60, "secure": True, "allow_internet_access": False,
            "network": {"denyOut": ["0.0.0.0/0"], "allowPublicTraffic": False}}
    status, _, sandbox = api(fake, "POST", "/sandboxes", body)
    assert status == 201, sandbox
    assert network_of(fake, sandbox["sandboxID"]) == ("none", ["lo"], False)
    # Without its lock, the same create gets the way out.
    status, _, sandbox = api(fake, "POST", "/sandboxes",
                             {**body, "allow_internet_access": True, "network": {}})
    assert status == 201, sandbox
    assert network_of(fake, sandbox["sandboxID"])[0] == "bridge"


def test_egress_rules_the_fake_cannot_enforce_are_refused(fake, sdk):
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    # An address allowed beside a denial, or a partial denial (a domain
    # beside ALL_TRAFFIC denied is a jail: test_fake_e2b_jail.py).
    for network in ({"deny_out": ["0.0.0.0/0"], "allow_out": ["8.8.8.8"]},
                    {"deny_out": ["10.0.0.0/8"]}):
        with pytest.raises(SandboxException, match="400.*per-destination"):
            Sandbox.create(timeout=60, network=network, **sdk_opts(fake))
    # A domain is allowed out only beside ALL_TRAFFIC denied, as E2B's API says.
    status, _, answer = api(fake, "POST", "/v2/sandboxes",
                            {"templateID": "base", "network": {"allowOut": ["example.com"]}})
    assert status == 400 and "0.0.0.0/0" in answer["message"]
    assert fake.live_count() == 0


# ---- 4. fault knobs, each shown on the wire -------------------------------------------------

@pytest.mark.parametrize("knob, status", [("create_429", 429), ("create_503", 503)])
def test_fault_create_busy(fake, knob, status):
    fake.set_fault(knob, count=1, retry_after=7)
    code, headers, body = api(fake, "POST", "/v2/sandboxes", {"templateID": "base"})
    assert (code, headers["Retry-After"], body["code"]) == (status, "7", status)
    assert fake.live_count() == 0  # nothing was created
    code, _, body = api(fake, "POST", "/v2/sandboxes", {"templateID": "base", "timeout": 30})
    assert code == 201  # the knob was for one request only


def test_fault_create_network_ignored_opens_a_locked_sandbox(fake):
    fake.set_fault("create_network_ignored")
    body = {"templateID": "base", "timeout": 60, "allow_internet_access": False,
            "network": {"denyOut": ["0.0.0.0/0"]}}
    status, _, sandbox = api(fake, "POST", "/sandboxes", body)
    assert status == 201, sandbox
    # The service still says what was asked; the container has the way out.
    detail = api(fake, "GET", f"/sandboxes/{sandbox['sandboxID']}")[2]
    assert detail["allowInternetAccess"] is False
    assert network_of(fake, sandbox["sandboxID"])[:2] == ("bridge", ["eth0", "lo"])
    # The knob was for one create only.
    status, _, sandbox = api(fake, "POST", "/sandboxes", body)
    assert network_of(fake, sandbox["sandboxID"])[0] == "none"


def test_fault_create_busy_sdk_honours_retry_after(fake, sdk):
    from e2b import Sandbox

    fake.set_fault("create_503", count=1, retry_after=1)
    started = time.monotonic()
    sbx = Sandbox.create(timeout=30, **sdk_opts(fake))
    assert time.monotonic() - started >= 1  # the SDK waited as told, then retried
    assert fake.live_count() == 1 and sbx.is_running()


def test_fault_create_without_sandbox_id_leaks_a_sandbox(fake):
    fake.set_fault("create_no_sandbox_id")
    status, _, body = api(fake, "POST", "/v2/sandboxes",
                          {"templateID": "base", "timeout": 30, "metadata": {"owner": "t"}})
    assert status == 201 and "sandboxID" not in body and body["envdAccessToken"]
    # The sandbox exists all the same: only listing (by metadata) finds it.
    assert fake.live_count() == 1
    status, _, listed = api(fake, "GET", "/v2/sandboxes?metadata=owner%3Dt")
    assert status == 200 and len(listed) == 1
    assert api(fake, "DELETE", f"/sandboxes/{listed[0]['sandboxID']}")[0] == 204


def test_fault_create_without_access_token(fake):
    fake.set_fault("create_no_access_token")
    sandbox = create(fake, timeout=30)
    assert "envdAccessToken" not in sandbox and sandbox["sandboxID"]
    # envd still wants the token the client was never given.
    status, _, _ = envd(fake, "POST", "/process.Process/List", envd_headers(sandbox), b"{}",
                        "application/json")
    assert status == 401


def test_fault_create_delay(fake):
    fake.set_fault("create_delay", seconds=1.0)
    started = time.monotonic()
    create(fake, timeout=30)
    assert time.monotonic() - started >= 1.0


def test_fault_old_envd_version(fake, sdk):
    from e2b import Sandbox
    from e2b.exceptions import TemplateException

    fake.set_fault("create_old_envd")
    with pytest.raises(TemplateException):
        Sandbox.create(**sdk_opts(fake))
    # The SDK kills what it cannot use: a create and a delete, nothing live.
    state = fake.state()
    assert (state["live_count"], state["creates"] - state["deletes"]) == (0, 0)


@pytest.mark.parametrize("remove", [True, False])
def test_fault_delete_404(fake, remove):
    sandbox = create(fake, timeout=30)
    fake.set_fault("delete_404", remove=remove)
    status, _, body = api(fake, "DELETE", f"/sandboxes/{sandbox['sandboxID']}")
    assert (status, body["code"]) == (404, 404)
    assert fake.live_count() == (0 if remove else 1)


def test_fault_envd_sandbox_not_found(fake, sdk):
    from e2b import Sandbox
    from e2b.exceptions import SandboxNotRunningException

    sbx = Sandbox.create(timeout=60, **sdk_opts(fake))
    fake.set_fault("envd_not_found", count=2)
    with pytest.raises(SandboxNotRunningException):
        sbx.commands.run("true")
    assert sbx.is_running() is False  # the second faulted request: /health
    assert sbx.commands.run("echo back").stdout == "back\n"  # the knob is spent
    # The same answer, for real, once the sandbox is gone.
    sbx.kill()
    status, _, body = envd(fake, "GET", "/health", {"E2b-Sandbox-Id": sbx.sandbox_id})
    assert status == 502 and b"was not found" in body


def test_fault_start_cut_before_end_event(fake, sdk):
    sandbox = create(fake, timeout=60)
    fake.set_fault("start_cut")
    frames, completed = start_stream(fake, sandbox, ["/bin/sh", "-c", "echo cut-here"])
    events = json_events(frames)
    assert not completed  # the connection closed mid-body
    assert "start" in events[0] and stdout_of(events) == b"cut-here\n"
    assert not any("end" in e for e in events) and not any(f & 0x02 for f, _ in frames)

    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import CommandExitException
    sbx = Sandbox.connect(sandbox["sandboxID"], **sdk_opts(fake))
    fake.set_fault("start_cut")
    with pytest.raises(Exception) as raised:  # not a result, not an exit code
        sbx.commands.run("echo cut-here")
    assert not isinstance(raised.value, CommandExitException)


def test_fault_stdout_flood(fake, sdk):
    sandbox = create(fake, timeout=60)
    fake.set_fault("stdout_flood")
    frames, completed = start_stream(fake, sandbox, ["/bin/true"], codec="proto")
    assert completed and frames[-1][0] & 0x02 and json.loads(frames[-1][1]) == {}
    events = sdk_events(frames)
    chunks = [value.output.value for field, value in events if field == "data"]
    assert sum(len(chunk) for chunk in chunks) > 32 * MIB
    assert len(chunks) > 100 and max(len(chunk) for chunk in chunks) <= 64 * 1024  # chunked
    assert events[-1][0] == "end" and events[-1][1].exit_code == 0


def test_faults_over_http(fake):
    status, _, armed = api(fake, "POST", "/_fake/faults", {"name": "create_429", "count": 2},
                           key=None)
    assert status == 200 and armed["create_429"]["count"] == 2
    assert [api(fake, "POST", "/v2/sandboxes", {"templateID": "base"})[0]
            for _ in range(2)] == [429, 429]
    assert api(fake, "POST", "/_fake/faults", {"name": "no_such_knob"}, key=None)[0] == 400
    api(fake, "POST", "/_fake/faults", {"name": "create_503", "count": None}, key=None)
    assert api(fake, "POST", "/_fake/faults", {"clear": True}, key=None)[0] == 200
    assert api(fake, "GET", "/_fake/faults", key=None)[2] == {}
    status, _, state = api(fake, "GET", "/_fake/state", key=None)
    assert status == 200 and state["live"] == [] and "creates" in state


# ---- 5. the sandbox timeout is enforced -----------------------------------------------------

def test_timeout_kills_the_sandbox(fake):
    sandbox = create(fake, timeout=2)
    sandbox_id = sandbox["sandboxID"]
    container = fake.state()["containers"][sandbox_id]
    started = time.monotonic()
    assert wait_for(lambda: fake.live_count() == 0, timeout=6)
    assert 1.5 <= time.monotonic() - started <= 4.5
    assert wait_for(lambda: not container_exists(container), timeout=10)
    assert api(fake, "GET", f"/sandboxes/{sandbox_id}")[0] == 404
    assert envd(fake, "GET", "/health", envd_headers(sandbox))[0] == 502
    assert fake.state()["expired"] >= 1


def test_set_timeout_extends_and_shortens(fake):
    sandbox = create(fake, timeout=1)
    path = f"/sandboxes/{sandbox['sandboxID']}/timeout"
    assert api(fake, "POST", path, {"timeout": 60})[0] == 204
    time.sleep(1.5)  # past the first end time: nothing to wait for but the clock
    assert fake.live_count() == 1
    assert api(fake, "POST", path, {"timeout": 0})[0] == 204
    assert wait_for(lambda: fake.live_count() == 0, timeout=3)
    assert api(fake, "POST", "/sandboxes/nope/timeout", {"timeout": 5})[0] == 404


# ---- the wire, directly: codecs, routing, the command line ----------------------------------

def test_envd_routing_by_host_and_both_codecs(fake, sdk):
    from e2b.envd.process import process_pb

    sandbox = create(fake, timeout=60)
    by_host = {"Host": f"49983-{sandbox['sandboxID']}.e2b.example",
               "X-Access-Token": sandbox["envdAccessToken"]}
    assert envd(fake, "GET", "/health", by_host)[0] == 204
    # The same unary call in JSON and in binary protobuf.
    status, head, body = envd(fake, "POST", "/process.Process/List", by_host, b"{}",
                              "application/json")
    assert (status, head["Content-Type"], json.loads(body)) == (200, "application/json", {})
    status, head, body = envd(fake, "POST", "/process.Process/List", by_host, b"",
                              "application/proto")
    assert (status, head["Content-Type"]) == (200, "application/proto")
    assert list(process_pb.ListResponse.from_binary(body).processes) == []
    # Unary errors: a Connect code and the HTTP status that goes with it.
    status, _, body = envd(fake, "POST", "/process.Process/SendSignal", by_host,
                           json.dumps({"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"})
                           .encode(), "application/json")
    assert status == 404 and json.loads(body)["code"] == "not_found"
    # A streamed command in the binary codec, decoded by the SDK's module.
    frames, completed = start_stream(fake, sandbox, ["/bin/sh", "-c", "printf hi; exit 4"],
                                     codec="proto")
    events = sdk_events(frames)
    assert completed and events[0][0] == "start" and events[0][1].pid > 0
    assert ("data", b"hi") in [(f, v.output.value) for f, v in events if f == "data"]
    assert events[-1][0] == "end"
    assert (events[-1][1].exit_code, events[-1][1].exited) == (4, True)
    # Keepalives while a command is quiet, at the interval the client asked for.
    frames, completed = start_stream(fake, sandbox, ["sleep", "1.5"],
                                     extra_headers={"Keepalive-Ping-Interval": "1"})
    assert completed and {"keepalive": {}} in json_events(frames)
    # Connect-Timeout-Ms ends a stream that outlives it.
    frames, completed = start_stream(fake, sandbox, ["sleep", "10"],
                                     extra_headers={"Connect-Timeout-Ms": "500"})
    assert json.loads(frames[-1][1])["error"]["code"] == "deadline_exceeded"
    # An unknown sandbox, by header or by host: the edge's answer.
    for headers in ({"E2b-Sandbox-Id": "nosuchsandbox"}, {"Host": "49983-nosuchsandbox.e2b.x"}):
        status, _, body = envd(fake, "GET", "/health", headers)
        assert status == 502 and json.loads(body)["message"] == "The sandbox was not found"


def test_command_line_ready_file_and_clean_exit(tmp_path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, str(HERE / "fake_e2b.py"), "--port", "0",
                             "--api-key", "k", "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening 127.0.0.1:")
        assert ready.read_text().strip() == line
        port = int(line.rsplit(":", 1)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_fake/state", timeout=10) as r:
            assert json.load(r)["live_count"] == 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
