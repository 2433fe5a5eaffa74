"""Grants on the OpenShell provider plugin: code in an OpenShell sandbox
calls the operator's API through the daemon's guard, reached as OpenShell
lets a sandbox out: a CONNECT tunnel through the gateway's egress proxy,
allowed by one policy entry (the guard's name and port, TLS `SKIP`), with
the client's own TLS inside it.

Real parts: plimsolld with its guard on loopback (TLS, a certificate for
`guard.plimsoll.test`), the published client, a loopback API that wants
the credential, and fake-openshell, whose sandboxes reach out only through
its CONNECT proxy, which tunnels what the policy allows (its stand-in for
public DNS, `resolve=`, points the guard's name at the guard).

What is proven: a granted snippet (with the profile's SDK) and a granted
python project reach the API; the credential is nowhere in the sandbox;
the run's token is dead after the run; a run without a grant has no way
out; the policy read back (by value and by OpenShell's hash) is the one
sent, guard entry included; a session's granted call works and its next,
ungranted call has no client.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from plimsoll_client import Client

from test_published_client import ROOT, Daemon
from test_e2b_grants import (  # noqa: F401  (fixtures)
    CREDENTIAL, PROBE_GUARD, api, assert_a_granted_python_project_reaches_the_api,
    assert_a_granted_snippet_keeps_the_credential_out, grant_env, guard_port,
    make_guard_certificate,
)

sys.path.insert(0, str(ROOT / "tests" / "fakes" / "e2b"))
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "openshell"))
import certs as fake_certs  # noqa: E402
from fake_openshell import FakeOpenShell  # noqa: E402

GUARD_NAME = "guard.plimsoll.test"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("openshell-grants-pki")
    fake_certs.make(d)
    fake_certs.make_client(d)
    make_guard_certificate(d)
    return d


@pytest.fixture(scope="module")
def fake(certs, guard_port):
    f = FakeOpenShell(tls=(str(certs / "leaf.pem"), str(certs / "leaf.key")),
                      client_ca=str(certs / "ca.pem"),
                      resolve=[f"{GUARD_NAME}:443=127.0.0.1:{guard_port}"]).start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def daemon(fake, certs, api, guard_port, tmp_path_factory):
    grants = tmp_path_factory.mktemp("openshell-grants") / "grants.json"
    d = Daemon({
        "SANDBOX_PROVIDER": "openshell",
        "SANDBOX_PLUGIN_MAX_TIER": "container",
        "SANDBOX_PLUGIN_HTTP_ORIGINS": fake.origin,
        "SANDBOX_PLUGIN_HTTP_CA": str(certs / "ca.pem"),
        "SANDBOX_PLUGIN_HTTP_CLIENT_CERT": str(certs / "client.pem"),
        "SANDBOX_PLUGIN_HTTP_CLIENT_KEY": str(certs / "client.key"),
        "SANDBOX_MAX_SESSIONS": "2",
        **grant_env(certs, api, guard_port, grants),
    })
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def no_leaks(fake):
    yield
    deadline = time.monotonic() + 10
    while fake.live() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake.live() == [], f"sandboxes left: {fake.live()}"


def test_describe_says_runs_and_sessions_carry_grants(daemon):
    info = Client(daemon.url).describe()
    assert (info.provider, info.isolation) == ("openshell", "container")
    assert info.supports_javascript_grants and info.supports_project_grants


def test_a_granted_snippet_reaches_the_api_through_the_proxy(daemon, api, certs, guard_port):
    assert_a_granted_snippet_keeps_the_credential_out(daemon, api, certs, guard_port)


def test_a_granted_python_project_reaches_the_api(daemon, api):
    assert_a_granted_python_project_reaches_the_api(daemon, api)


def test_a_run_without_a_grant_has_no_way_out(daemon, fake):
    r = Client(daemon.url).run_javascript(
        "console.log(typeof host, process.env.HTTPS_PROXY || 'no proxy');" + PROBE_GUARD,
        timeout=30)
    lines = r.stdout.decode().split("\n")
    assert lines[0] == "undefined no proxy", r.stdout
    assert lines[1].startswith("unreachable"), r.stdout


def test_a_session_carries_a_granted_call_and_not_the_next(daemon, api):
    before = len(api.seen)
    with Client(daemon.url).open_session() as s:
        r = s.run_javascript("console.log((await host.get('/items/5')).id)",
                             grant_profile="inventory", timeout=60)
        assert r.stdout == b"5\n", r.stderr
        r = s.run_javascript("console.log(typeof host)", timeout=30)
        assert r.stdout == b"undefined\n"
    assert api.seen[before:] == [("/items/5", f"Bearer {CREDENTIAL}")]
