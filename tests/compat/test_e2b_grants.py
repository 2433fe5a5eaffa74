"""Grants on the E2B provider plugin: code in an E2B sandbox calls the
operator's API through the daemon's guard, with a token made for its run,
and never holds the operator's credential.

Real parts: plimsolld with its guard on loopback (TLS, a certificate for
`guard.plimsoll.test` from a test CA), the published client, a loopback API
that wants the credential, and fake-e2b, whose sandboxes are containers
jailed to what their create's `allowOut` names: the jail's firewall peeks
the TLS name and dials the fake's stand-in for public DNS (`--resolve`),
which points `guard.plimsoll.test:443` at the guard.

What is proven: a granted snippet and a granted python project reach the
API with the credential added by the broker; the credential is nowhere in
the sandbox (files, environment, processes); the run's token is dead after
the run; a run without a grant reaches nothing, the guard included; a
session's granted call works and the next call without a grant cannot
reach the guard; the token never reaches the daemon's log.
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from plimsoll_client import Client

from test_published_client import ROOT, Daemon

sys.path.insert(0, str(ROOT / "tests" / "fakes" / "e2b"))
import certs as fake_certs  # noqa: E402
from fake_e2b import FakeE2B  # noqa: E402

API_KEY = "e2b-canary-key-41aa07"
GUARD_NAME = "guard.plimsoll.test"
# The operator's credential for its API: must never be inside a sandbox.
CREDENTIAL = "grant-canary-5f3e91"
# A pattern that matches the credential without being it, so the search
# itself (its command line) is not a hit.
CREDENTIAL_PATTERN = "grant-canary-5f3e9[1]"
# A path segment that must reach the API and no log line.
PATH_CANARY = "path-canary-0c4d"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_guard_certificate(d: Path) -> None:
    """guard.pem and guard.key in `d`: the guard's certificate for its
    public name, signed by the test CA there (certs.make's)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(d / "guard.key"), "-out", str(d / "guard.csr"), "-subj", "/CN=guard")
    (d / "guard-ext").write_text(f"subjectAltName=DNS:{GUARD_NAME}\nbasicConstraints=CA:FALSE\n"
                                 "extendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", str(d / "guard.csr"), "-CA", str(d / "ca.pem"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "guard.pem"),
            "-days", "2", "-extfile", str(d / "guard-ext"))


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """The fake's certificate, and the guard's for its public name, from one
    test CA."""
    d = tmp_path_factory.mktemp("e2b-grants-tls")
    fake_certs.make(d)
    make_guard_certificate(d)
    return d


class Api:
    """The operator's API on loopback: answers only with the credential;
    /items/slow answers after 8 s, /items/big with 4 MiB (for the attack
    tests, test_e2b_guard_attacks.py)."""

    def __init__(self) -> None:
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                seen.append((self.path, self.headers.get("authorization")))
                ok = self.headers.get("authorization") == f"Bearer {CREDENTIAL}"
                if self.path.endswith("/slow"):
                    time.sleep(8)
                body = json.dumps({"id": self.path.rsplit("/", 1)[-1]} if ok else {}).encode()
                if ok and self.path.endswith("/big"):
                    body = b"x" * (4 << 20)
                self.send_response(200 if ok else 401)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def api():
    a = Api()
    yield a
    a.server.shutdown()


@pytest.fixture(scope="module")
def guard_port() -> int:
    return _free_port()


@pytest.fixture(scope="module")
def fake(certs, guard_port):
    f = FakeE2B(API_KEY, tls=(str(certs / "leaf.pem"), str(certs / "leaf.key")),
                resolve=[f"{GUARD_NAME}:443=127.0.0.1:{guard_port}"]).start()
    yield f
    f.stop()


def grant_env(certs: Path, api: Api, guard_port: int, grants: Path,
              preamble: bool = True) -> dict:
    """The grants part of a daemon's environment, whatever its provider: one
    profile for the API, and the guard on loopback under its public name."""
    profile = {
        "base_url": api.origin,
        "allow": ["GET /items/*"],
        "allowed_callers": ["*"],
        "allow_in_sessions": True,
        "token": {"type": "static", "env": "INVENTORY_TOKEN"},
    }
    if preamble:
        profile["preamble"] = "host.item = (id) => host.get('/items/' + encodeURIComponent(id));"
    grants.write_text(json.dumps({"profiles": {"inventory": profile}}))
    return {
        "PLIMSOLL_GRANTS_FILE": str(grants),
        "INVENTORY_TOKEN": CREDENTIAL,
        "PLIMSOLL_GUARD_ADDR": f"127.0.0.1:{guard_port}",
        "PLIMSOLL_GUARD_URL": f"https://{GUARD_NAME}",
        "PLIMSOLL_GUARD_TLS_CERT": str(certs / "guard.pem"),
        "PLIMSOLL_GUARD_TLS_KEY": str(certs / "guard.key"),
        "PLIMSOLL_GUARD_CA_FILE": str(certs / "ca.pem"),
        "PLIMSOLL_LOG_FORMAT": "json",
    }


def daemon_env(fake, certs: Path, api: Api, guard_port: int, grants: Path,
               preamble: bool = True) -> dict:
    """The e2b plugin against the fake, with `grant_env`."""
    return {
        "SANDBOX_PROVIDER": "e2b",
        "SANDBOX_PLUGIN_MAX_TIER": "vm",
        "SANDBOX_PLUGIN_HTTP_ORIGINS": f"{fake.url},https://localhost:{fake.port}",
        "SANDBOX_PLUGIN_API_KEY_ORIGINS": fake.url,
        "SANDBOX_PLUGIN_API_KEY_ENV": "E2B_API_KEY",
        "SANDBOX_PLUGIN_API_KEY_HEADER": "x-api-key",
        "E2B_API_KEY": API_KEY,
        "SANDBOX_PLUGIN_HTTP_CA": str(certs / "ca.pem"),
        "SANDBOX_MAX_SESSIONS": "2",
        **grant_env(certs, api, guard_port, grants, preamble),
    }


@pytest.fixture(scope="module")
def daemon(fake, certs, api, guard_port, tmp_path_factory):
    grants = tmp_path_factory.mktemp("e2b-grants") / "grants.json"
    d = Daemon(daemon_env(fake, certs, api, guard_port, grants))
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def no_leaks(fake):
    yield
    assert fake.live_count() == 0, f"sandboxes left: {fake.state()['live']}"


# What a granted snippet reports about its sandbox: where the credential
# shows up (files, every process's environment and command line), and its
# run's token, for the test to replay once the run is over.
INSPECT = f"""
const {{ execSync }} = await import('node:child_process');
const hits = execSync(
  "grep -rIls -e '{CREDENTIAL_PATTERN}' /tmp /home /etc /run /root /var /opt 2>/dev/null;"
  + " for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do"
  + " grep -ls -e '{CREDENTIAL_PATTERN}' $f 2>/dev/null; done; true").toString();
console.log(JSON.stringify({{ hits, token: process.env.PLIMSOLL_GUARD_TOKEN }}));
"""


def guard_call(certs: Path, port: int, token: str) -> "tuple[int, str]":
    """One call on the guard from outside, as a sandbox would make it."""
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    # The certificate names the guard's public name, not the address.
    conn.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), 10),
                                    server_hostname=GUARD_NAME)
    conn.request("GET", "/items/1", headers={"x-plimsoll-guard": token})
    r = conn.getresponse()
    r.read()
    return r.status, r.getheader("plimsoll-broker") or ""


def test_describe_says_runs_and_sessions_carry_grants(daemon):
    info = Client(daemon.url).describe()
    assert (info.provider, info.isolation) == ("e2b", "vm")
    assert info.supports_javascript_grants and info.supports_project_grants


def assert_a_granted_snippet_keeps_the_credential_out(daemon, api, certs: Path, guard_port: int,
                                                      **run) -> None:
    """A granted snippet (with the SDK) reaches the API; the credential is
    nowhere in its sandbox; its token is dead once it is over; no log line
    holds the token, the credential or a raw path. `run`: the provider's
    own run options (its floor)."""
    before = len(api.seen)
    r = Client(daemon.url).run_javascript(
        f"const a = await host.get('/items/42'); const b = await host.item('{PATH_CANARY}');"
        " console.log(a.id, b.id);" + INSPECT,
        grant_profile="inventory", timeout=60, **run)
    assert r.exit_code == 0, r.stderr
    first, report = r.stdout.decode().split("\n")[:2]
    assert first == f"42 {PATH_CANARY}"
    assert api.seen[before:] == [("/items/42", f"Bearer {CREDENTIAL}"),
                                 (f"/items/{PATH_CANARY}", f"Bearer {CREDENTIAL}")]
    inspected = json.loads(report)
    assert inspected["hits"] == "", f"the credential is inside the sandbox: {inspected['hits']}"
    token = inspected["token"]
    assert token and len(token) >= 40
    # The run is over: its token is worth nothing, and nothing reached the API.
    assert guard_call(certs, guard_port, token) == (403, "not-permitted")
    assert len(api.seen) == before + 2
    # The daemon never logged the token, the credential or a raw path: the
    # run's audit line holds the calls as counts.
    for secret in (token, CREDENTIAL, PATH_CANARY):
        assert not any(secret in line for line in daemon.lines), secret
    assert any('"grant_profile":"inventory","host_calls":2,' in line for line in daemon.lines)


def test_a_granted_snippet_reaches_the_api_without_the_credential(daemon, api, certs,
                                                                   guard_port):
    assert_a_granted_snippet_keeps_the_credential_out(daemon, api, certs, guard_port,
                                                      minimum_isolation="vm")


def assert_a_granted_python_project_reaches_the_api(daemon, api) -> None:
    """Python's client, preloaded in a granted project's steps."""
    before = len(api.seen)
    r = Client(daemon.url).run_project(
        {"main.py": "print(host.get('/items/9')['id'])\n"}, ["python3 main.py"],
        grant_profile="inventory", timeout=60)
    assert r.outcome == "completed", r
    assert r.steps[0].stdout == b"9\n"
    assert api.seen[before:] == [("/items/9", f"Bearer {CREDENTIAL}")]


def test_a_granted_python_project_reaches_the_api(daemon, api):
    assert_a_granted_python_project_reaches_the_api(daemon, api)


def test_a_call_outside_the_allow_list_is_refused_by_the_broker(daemon, api):
    before = len(api.seen)
    r = Client(daemon.url).run_javascript(
        "try { await host.del('/items/1') } catch (e) { console.log(e.message) }",
        grant_profile="inventory", timeout=60)
    assert r.stdout.decode().startswith("not permitted by sandbox capability")
    assert len(api.seen) == before


# From inside a sandbox: whether the guard answers at all (any TLS answer
# counts as reached).
PROBE_GUARD = f"""
const tls = require('tls');
const s = tls.connect({{ host: '{GUARD_NAME}', port: 443, servername: '{GUARD_NAME}',
  rejectUnauthorized: false, timeout: 3000 }});
s.on('secureConnect', () => {{ console.log('reached'); s.destroy(); }});
s.on('error', (e) => console.log('unreachable', e.code));
s.on('timeout', () => {{ console.log('unreachable timeout'); s.destroy(); }});
"""


def test_a_run_without_a_grant_reaches_nothing(daemon):
    r = Client(daemon.url).run_javascript(PROBE_GUARD, timeout=30)
    assert r.stdout.decode().startswith("unreachable"), r.stdout


def test_a_session_opens_the_guard_for_its_granted_call_only(daemon, api, fake):
    before = len(api.seen)
    with Client(daemon.url).open_session(minimum_isolation="vm") as s:
        r = s.run_javascript("console.log((await host.get('/items/5')).id)",
                             grant_profile="inventory", timeout=60)
        assert r.stdout == b"5\n", r.stderr
        # The next call carries no grant: no client, and no way out.
        r = s.run_javascript("console.log(typeof host);" + PROBE_GUARD, timeout=30)
        lines = r.stdout.decode().split("\n")
        assert lines[0] == "undefined"
        assert lines[1].startswith("unreachable"), r.stdout
    assert api.seen[before:] == [("/items/5", f"Bearer {CREDENTIAL}")]
