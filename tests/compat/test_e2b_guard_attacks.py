"""Attacks on the guard, the way hosted sandboxes reach a granted run's
broker, through the real daemon and jailed fake-e2b sandboxes: each test
is an attack a review made work on an earlier version, kept so it stays
closed.

- A: an ungranted session call plants a file where the next granted call's
  channel goes, so that call fails: the guard must not stay reachable.
- B: a snippet fires a slow call and exits: the call reached the API, so
  the run's trace and audit line must hold it.
- C: a run's code opens every guard connection it can with its token:
  none stays open after its answer, and another run's calls go through.
- D: a run leaves large answers unread: the daemon's memory stays bounded.
- E: four runs trickle bodies on every slot they have: another run's GET
  still goes through.

The daemon runs with 1024 open files, so the guard holds 128 connections.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time

import pytest

from test_e2b_grants import (  # noqa: E402,F401  (fixtures)
    api, certs, guard_port, fake, no_leaks, GUARD_NAME, PROBE_GUARD, daemon_env,
)
from test_published_client import Daemon, plimsolld_bin  # noqa: E402
from plimsoll_client import Client  # noqa: E402


@pytest.fixture(scope="module")
def daemon(fake, certs, api, guard_port, tmp_path_factory):
    # RLIMIT_NOFILE 1024: ceiling 512, so the guard holds min(1024, 512/4) = 128
    # connections (128 per peer): the same arithmetic as 1024/768 at full size.
    d = tmp_path_factory.mktemp("atk")
    wrapper = d / "plimsolld"
    wrapper.write_text("#!/bin/sh\nexec prlimit --nofile=1024:1024 -- "
                       f"{plimsolld_bin()} \"$@\"\n")
    wrapper.chmod(0o755)
    old = os.environ.get("PLIMSOLLD_BIN")
    os.environ["PLIMSOLLD_BIN"] = str(wrapper)
    try:
        dm = Daemon(daemon_env(fake, certs, api, guard_port, d / "grants.json", preamble=False))
    finally:
        if old is None:
            os.environ.pop("PLIMSOLLD_BIN")
        else:
            os.environ["PLIMSOLLD_BIN"] = old
    yield dm
    dm.stop()


def _audit_calls(daemon):
    return [(a.get("fields", a).get("grant_profile"), a.get("fields", a).get("host_calls"))
            for a in daemon.audit()]


def _token_of(api, before):
    """The token a run's code sent to the API as a path segment (what a
    hostile snippet would exfiltrate)."""
    for _ in range(600):
        paths = [p for p, _ in api.seen[before:] if len(p) > 40]
        if paths:
            return paths[0].rsplit("/", 1)[-1]
        time.sleep(0.1)
    raise AssertionError("no token reached the API")


def _rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return -1


def _tls(certs, port):
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    conn.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), 10),
                                server_hostname=GUARD_NAME)
    return conn


def _get(conn, token):
    conn.request("GET", "/items/pin", headers={"x-plimsoll-guard": token})
    r = conn.getresponse()
    r.read()
    return r.status


def test_a_failed_granted_call_does_not_leave_the_guard_open(daemon):
    with Client(daemon.url).open_session(minimum_isolation="vm") as s:
        r = s.run_javascript("require('fs').writeFileSync('/tmp/.plimsoll-grant', 'x');"
                             "console.log('planted')", timeout=30)
        assert r.stdout == b"planted\n", r
        with pytest.raises(Exception):
            s.run_javascript("console.log('granted ran')", grant_profile="inventory",
                             timeout=30)
        r = s.run_javascript(PROBE_GUARD, timeout=30)
        assert r.stdout.decode().startswith("unreachable"), r.stdout


def test_a_call_left_in_flight_at_the_runs_end_is_in_its_trace(daemon, api):
    before = len(api.seen)
    r = Client(daemon.url).run_javascript(
        "host.get('/items/slow').catch(() => {});"
        "await new Promise(r => setTimeout(r, 1500)); console.log('bye'); process.exit(0);",
        grant_profile="inventory", minimum_isolation="vm", timeout=60)
    assert r.stdout == b"bye\n"
    # The answer came after the call did: the API had it.
    assert [p for p, _ in api.seen[before:]] == ["/items/slow"]
    last = [a for a in daemon.audit() if "inventory" in json.dumps(a)][-1]
    assert '"host_calls":1' in json.dumps(last).replace(" ", ""), last


def test_a_runs_token_holds_no_guard_connection_past_its_answer(daemon, api, certs,
                                                                guard_port):
    before = len(api.seen)
    done = {}

    def attacker_run():
        done["r"] = Client(daemon.url).run_javascript(
            "await host.get('/items/' + process.env.PLIMSOLL_GUARD_TOKEN);"
            "await new Promise(r => setTimeout(r, 8000));",
            grant_profile="inventory", minimum_isolation="vm", timeout=60)

    t = threading.Thread(target=attacker_run)
    t.start()
    token = _token_of(api, before)
    opened = []
    for _ in range(128):
        c = _tls(certs, guard_port)
        assert _get(c, token) == 200
        opened.append(c)
    # Each answer closed its connection: none is left to pin a slot.
    reused = 0
    for c in opened:
        try:
            _get(c, token)
            reused += 1
        except (OSError, http.client.HTTPException):
            pass
        c.close()
    assert reused == 0
    # A stranger, and another run's granted call, are served.
    assert _get(_tls(certs, guard_port), "x") == 403
    r = Client(daemon.url).run_javascript(
        "console.log('ok', (await host.get('/items/7')).id)",
        grant_profile="inventory", minimum_isolation="vm", timeout=60)
    assert r.stdout == b"ok 7\n", r
    t.join()


def test_unread_answers_are_bounded_per_run(daemon, api, certs, guard_port):
    before = len(api.seen)

    def attacker_run():
        Client(daemon.url).run_javascript(
            "await host.get('/items/' + process.env.PLIMSOLL_GUARD_TOKEN);"
            "await new Promise(r => setTimeout(r, 12000));",
            grant_profile="inventory", minimum_isolation="vm", timeout=60)

    t = threading.Thread(target=attacker_run)
    t.start()
    token = _token_of(api, before)
    pid = daemon.proc.pid
    rss0 = _rss_mib(pid)
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    held = []
    for _ in range(60):
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(("127.0.0.1", guard_port))
        s = ctx.wrap_socket(raw, server_hostname=GUARD_NAME)
        s.sendall(f"GET /items/big HTTP/1.1\r\nhost: g\r\nx-plimsoll-guard: {token}"
                  "\r\n\r\n".encode())
        held.append(s)
    time.sleep(4)
    grown = _rss_mib(pid) - rss0
    for s in held:
        s.close()
    t.join()
    # At most the run's 16 answers of 4 MiB are held, not 60.
    assert grown < 100, f"the daemon grew {grown} MiB"


def test_runs_trickling_bodies_do_not_starve_another_runs_calls(daemon, api, certs,
                                                                guard_port):
    before = len(api.seen)
    threads = []
    for _ in range(4):
        t = threading.Thread(target=lambda: Client(daemon.url).run_javascript(
            "await host.get('/items/' + process.env.PLIMSOLL_GUARD_TOKEN);"
            "await new Promise(r => setTimeout(r, 15000));",
            grant_profile="inventory", minimum_isolation="vm", timeout=60))
        t.start()
        threads.append(t)
    tokens = set()
    for _ in range(900):
        tokens = {p.rsplit("/", 1)[-1] for p, _ in api.seen[before:] if len(p) > 40}
        if len(tokens) == 4:
            break
        time.sleep(0.1)
    assert len(tokens) == 4, tokens
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    held = []
    for tok in tokens:
        for _ in range(16):
            raw = socket.create_connection(("127.0.0.1", guard_port))
            s = ctx.wrap_socket(raw, server_hostname=GUARD_NAME)
            s.sendall(f"POST /items/x HTTP/1.1\r\nhost: g\r\ncontent-length: 1000\r\n"
                      f"x-plimsoll-guard: {tok}\r\n\r\n{{".encode())
            held.append(s)
    time.sleep(0.5)
    r = Client(daemon.url).run_javascript(
        "try { console.log('ok', (await host.get('/items/7')).id) }"
        " catch (e) { console.log('victim:', e.message) }",
        grant_profile="inventory", minimum_isolation="vm", timeout=60)
    for s in held:
        s.close()
    for t in threads:
        t.join()
    assert r.stdout == b"ok 7\n", r.stdout
