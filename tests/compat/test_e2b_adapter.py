"""The E2B provider plugin (plugins/e2b) through the real plimsolld and the
published client (plimsoll-client 0.23.0, unmodified), against fake-e2b
(tests/fakes/e2b), which serves E2B's API and envd over TLS and runs every
command in a real container.

What is proven here: runs and sessions work end to end at the vm tier the
operator allowed; every fault E2B shows ends the way it should (never marked
not-dispatched once a request went out); the startup smoke test refuses to
start on each broken promise (egress open, files lost, a container instead of
a VM); the API key and envd tokens stay out of the log; and no sandbox is
left behind, counted by the fake after every test.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from plimsoll_client import Client
from plimsoll_client.errors import PlimsollError

import workloads
from plugin_checker import assert_passes, check_plugin
from session_leftovers import assert_a_slow_exit_does_not_end_the_session, assert_no_process_outlives_a_call
from test_published_client import ROOT, Daemon, plimsolld_bin

sys.path.insert(0, str(ROOT / "tests" / "fakes" / "e2b"))
import certs as fake_certs  # noqa: E402
from fake_e2b import FakeE2B  # noqa: E402

API_KEY = "e2b-canary-key-7d1c0a"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A test CA, and a certificate for 127.0.0.1 it signed for the fake."""
    d = tmp_path_factory.mktemp("e2b-tls")
    fake_certs.make(d)
    return d


@pytest.fixture(scope="module")
def fake(certs):
    f = FakeE2B(API_KEY, tls=(str(certs / "leaf.pem"), str(certs / "leaf.key"))).start()
    yield f
    f.stop()


def edge(fake: FakeE2B) -> str:
    """The sandbox edge's origin: the same fake under another name, as
    E2B's API and edge are two hosts."""
    return f"https://localhost:{fake.port}"


def daemon_env(fake: FakeE2B, certs: Path) -> dict:
    return {
        "SANDBOX_PROVIDER": "e2b",
        "SANDBOX_PLUGIN_MAX_TIER": "vm",
        "SANDBOX_PLUGIN_HTTP_ORIGINS": f"{fake.url},{edge(fake)}",
        # The key goes to the API only: the edge forwards into the sandbox.
        "SANDBOX_PLUGIN_API_KEY_ORIGINS": fake.url,
        "SANDBOX_PLUGIN_API_KEY_ENV": "E2B_API_KEY",
        "SANDBOX_PLUGIN_API_KEY_HEADER": "x-api-key",
        "E2B_API_KEY": API_KEY,
        "SANDBOX_PLUGIN_HTTP_CA": str(certs / "ca.pem"),
        "SANDBOX_PLUGIN_METERED": "1",
        "SANDBOX_MAX_SESSIONS": "2",
        "PLIMSOLL_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="module")
def daemon(fake, certs):
    d = Daemon(daemon_env(fake, certs))
    yield d
    d.stop()


def wait_no_sandboxes(fake: FakeE2B, within: float) -> None:
    deadline = time.monotonic() + within
    while fake.live_count():
        assert time.monotonic() < deadline, f"sandboxes left: {fake.state()['live']}"
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def no_leaks(fake):
    """After every test, no sandbox is left: deleted by the plugin, or (the
    tests that say so) reaped by the service's own timeout, waited for. And
    the plugin never called the deprecated listing (`GET /sandboxes`)."""
    fake.clear_faults()
    yield
    fake.clear_faults()
    assert fake.live_count() == 0, f"sandboxes left: {fake.state()['live']}"
    assert fake.state()["envd_api_keys_seen"] == 0, "the API key went to a sandbox's envd"
    assert fake.state()["listings"]["deprecated"] == 0, "the deprecated listing was called"


# ---- runs ------------------------------------------------------------------------------


def test_describe_states_vm_projects_and_sessions(daemon):
    info = Client(daemon.url).describe()
    assert (info.provider, info.isolation) == ("e2b", "vm")
    assert info.supports_project and info.supports_sessions


def test_a_snippet_runs_in_a_fresh_sandbox_deleted_after(daemon, fake):
    before = fake.state()["creates"]
    r = Client(daemon.url).run_javascript(
        "console.log('hello', 6 * 7); console.error('to stderr'); process.exitCode = 3",
        minimum_isolation="vm", timeout=30)
    assert (r.stdout, r.stderr, r.exit_code) == (b"hello 42\n", b"to stderr\n", 3)
    assert (r.provider, r.isolation) == ("e2b", "vm")
    assert r.record.isolation == "vm" and r.record.provider == "e2b"
    state = fake.state()
    assert state["creates"] == before + 1 and state["live_count"] == 0


def test_a_run_keeps_one_connection_per_origin_and_shares_none(daemon, fake):
    # Create and delete go to the API, upload and start to the edge: the
    # host carries them on one TLS connection per origin, opened by the run
    # and closed with it.
    c = Client(daemon.url)
    before = fake.state()["connections"]
    c.run_javascript("console.log(1)", timeout=30)
    assert fake.state()["connections"] == before + 2
    c.run_javascript("console.log(2)", timeout=30)
    assert fake.state()["connections"] == before + 4


def test_a_project_writes_files_runs_steps_and_returns_artifacts(daemon):
    r = Client(daemon.url).run_project(
        {"src/in.txt": "payload\n"},
        ["cp src/in.txt out.txt && pwd", "exit 7", "echo never"],
        ["out.txt", "missing.txt"], timeout=60)
    assert r.outcome == "completed"
    assert [s.command for s in r.steps] == ["cp src/in.txt out.txt && pwd", "exit 7"]
    assert r.steps[0].stdout == b"/home/user/project\n"
    assert [s.exit_code for s in r.steps] == [0, 7]
    assert [(a.path, a.content) for a in r.artifacts] == [("out.txt", b"payload\n")], \
        (r.artifacts_truncated, r.record.ended_unix_ms - r.record.started_unix_ms)


def test_output_is_kept_to_the_limit_with_flags(daemon):
    r = Client(daemon.url).run_javascript(
        "process.stdout.write('o'.repeat(70000)); process.stderr.write('e'.repeat(65536))",
        timeout=30)
    assert len(r.stdout) == 65536 and r.stdout_truncated
    assert len(r.stderr) == 65536 and not r.stderr_truncated


def test_the_deadline_kills_the_run_and_the_sandbox(daemon, fake):
    r = Client(daemon.url).run_javascript("console.log('started'); while (true) {}", timeout=3)
    assert r.timed_out and r.exit_code == 124
    assert r.stdout == b"started\n"
    p = Client(daemon.url).run_project({}, ["echo a", "sleep 30", "echo never"], timeout=4)
    assert p.outcome == "timed_out"
    assert [s.exit_code for s in p.steps] == [0, 124] and p.steps[1].timed_out


def test_a_sandbox_has_no_way_out(daemon):
    code = """
    const s = require('net').connect({host: '1.1.1.1', port: 443});
    s.setTimeout(3000, () => { console.log('timeout'); s.destroy(); });
    s.on('connect', () => { console.log('connected'); s.destroy(); });
    s.on('error', (e) => console.log('error', e.code));
    """
    r = Client(daemon.url).run_javascript(code, timeout=30)
    assert b"connected" not in r.stdout and r.stdout.strip(), r.stdout


# ---- faults E2B shows --------------------------------------------------------------------


def assert_unmarked_error(daemon) -> PlimsollError:
    """The run fails with an error the client may not retry blindly: the
    plugin sent requests, so the host never marks it not-dispatched."""
    with pytest.raises(PlimsollError) as e:
        Client(daemon.url).run_javascript("console.log(1)", timeout=8)
    assert e.value.not_dispatched is None, e.value
    return e.value


def test_busy_with_retry_after_is_retried_once(daemon, fake):
    before = fake.state()["creates"]
    fake.set_fault("create_429", retry_after=1)
    r = Client(daemon.url).run_javascript("console.log(1)", timeout=30)
    assert r.stdout == b"1\n"
    assert fake.state()["creates"] == before + 1


@pytest.mark.parametrize("knob", ["create_429", "create_503"])
def test_busy_that_stays_busy_fails_with_nothing_created(daemon, fake, knob):
    before = fake.state()["creates"]
    fake.set_fault(knob, count=None, retry_after=1)
    assert_unmarked_error(daemon)
    assert fake.state()["creates"] == before


@pytest.mark.parametrize("knob", ["create_no_sandbox_id", "create_no_access_token",
                                  "create_old_envd"])
def test_a_bad_create_answer_fails_and_the_sandbox_is_deleted(daemon, fake, knob):
    before = fake.state()
    fake.set_fault(knob)
    # Pages of one: a lookup by nonce reads to the end of the listing.
    fake.set_fault("list_page_size", count=None, size=1)
    assert_unmarked_error(daemon)
    after = fake.state()
    # The sandbox existed; the plugin found it (by its nonce label when the
    # answer had no ID, through GET /v2/sandboxes) and deleted it.
    assert after["creates"] == before["creates"] + 1
    assert after["deletes"] == before["deletes"] + 1
    looked_up = after["listings"]["v2"] - before["listings"]["v2"]
    assert looked_up == (1 if knob == "create_no_sandbox_id" else 0)


@pytest.mark.parametrize("knob", ["envd_not_found", "start_cut"])
def test_envd_failures_fail_unmarked(daemon, fake, knob):
    fake.set_fault(knob)
    assert_unmarked_error(daemon)


def test_a_flood_is_cut_at_32_mib_and_reported(daemon, fake):
    fake.set_fault("stdout_flood")
    r = Client(daemon.url).run_javascript("console.log(1)", timeout=30)
    assert r.exit_code == 153 and not r.timed_out
    assert r.stdout_truncated and r.stderr_truncated and len(r.stdout) == 65536


def test_a_404_on_delete_is_done(daemon, fake):
    fake.set_fault("delete_404", remove=True)
    assert Client(daemon.url).run_javascript("console.log(1)", timeout=30).stdout == b"1\n"


def test_a_sandbox_the_service_kept_after_404_is_reaped_by_its_ttl(daemon, fake):
    fake.set_fault("delete_404", remove=False)
    assert Client(daemon.url).run_javascript("console.log(1)", timeout=5).stdout == b"1\n"
    assert fake.live_count() == 1
    # Created with a timeout of the run's budget plus 10 s: E2B reaps it.
    wait_no_sandboxes(fake, 5 + 10 + 5)


def test_a_slow_create_inside_the_budget_still_runs(daemon, fake):
    fake.set_fault("create_delay", seconds=1.5)
    r = Client(daemon.url).run_javascript("console.log(1)", timeout=30)
    assert r.stdout == b"1\n"


def test_a_create_slower_than_the_budget_fails_and_its_ttl_reaps_it(daemon, fake):
    before = fake.state()["creates"]
    fake.set_fault("create_delay", seconds=4)
    with pytest.raises(PlimsollError) as e:
        Client(daemon.url).run_javascript("console.log(1)", timeout=2)
    assert e.value.not_dispatched is None
    # The fake makes it after the delay, when the plugin has given up, so
    # nothing of ours knows its ID: its timeout (the run's 2 s + 10) reaps it.
    deadline = time.monotonic() + 10
    while fake.state()["creates"] == before:
        assert time.monotonic() < deadline, "the delayed create never happened"
        time.sleep(0.1)
    wait_no_sandboxes(fake, 2 + 10 + 5)


def test_paid_seconds_count_and_past_the_allowance_nothing_is_created(fake, certs):
    d = Daemon({**daemon_env(fake, certs), "SANDBOX_PAID_SECONDS_PER_DAY": "1"})
    try:
        c = Client(d.url)
        assert c.run_javascript("console.log(1)", timeout=10).stdout == b"1\n"
        before = fake.state()["creates"]
        with pytest.raises(PlimsollError) as e:
            c.run_javascript("console.log(2)", timeout=10)
        # Refused before the plugin was called: marked, and nothing created.
        assert e.value.not_dispatched == "capacity", e.value
        assert fake.state()["creates"] == before
    finally:
        d.stop()


# ---- sweeping at start -------------------------------------------------------------------

OURS = {"created-by": "plimsoll"}


def seed(fake: FakeE2B, certs: Path, metadata: dict) -> str:
    """A sandbox made through E2B's API with these labels, as another
    instance (or someone else) left it; its own timeout is far off."""
    body = json.dumps({"templateID": "base", "timeout": 600, "metadata": metadata}).encode()
    request = urllib.request.Request(fake.url + "/v2/sandboxes", data=body, method="POST",
                                     headers={"X-API-Key": API_KEY,
                                              "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    with urllib.request.urlopen(request, context=context, timeout=60) as answer:
        return json.loads(answer.read())["sandboxID"]


def test_the_start_sweeps_expired_sandboxes_of_ours_across_pages(fake, certs):
    now = int(time.time())
    past = {**OURS, "plimsoll-deadline": str(now - 60)}
    expired = [seed(fake, certs, {**past, "plimsoll-nonce": f"n{i}"}) for i in range(4)]
    expired.append(seed(fake, certs, OURS))  # no deadline: counted as past it
    fake.pause(expired[0])  # paused: the deprecated listing (running only) would miss it
    in_use = seed(fake, certs, {**OURS, "plimsoll-deadline": str(now + 600)})
    others = [seed(fake, certs, {"created-by": "someone-else",
                                 "plimsoll-deadline": str(now - 60)}),
              seed(fake, certs, {"owner": "t"})]
    # Six of ours in pages of two: three pages, all read before a delete.
    fake.set_fault("list_page_size", count=None, size=2)
    before = fake.state()
    d = Daemon(daemon_env(fake, certs))
    try:
        after = fake.state()
        assert set(after["live"]) == {in_use, *others}
        assert after["listings"]["v2"] - before["listings"]["v2"] == 3
        # The five, and the smoke test's own sandbox (made after the sweep).
        assert after["deletes"] - before["deletes"] == 5 + 1
        assert any("swept 5 expired sandbox(es) of ours" in line for line in d.lines)
    finally:
        d.stop()
        for sandbox_id in [*expired, in_use, *others]:
            fake.registry.remove(sandbox_id)


def test_a_listing_that_never_ends_stops_the_start_and_deletes_nothing(fake, certs):
    expired = seed(fake, certs, {**OURS, "plimsoll-deadline": "1"})
    fake.set_fault("list_endless", count=None)
    before = fake.state()
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
           **daemon_env(fake, certs)}
    try:
        done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode != 0, "the daemon started on a listing it could not finish"
        assert "went on past 50 pages of 100 sandboxes" in done.stderr, done.stderr[-2000:]
        after = fake.state()
        assert after["listings"]["v2"] - before["listings"]["v2"] == 50
        assert after["live"] == [expired] and after["deletes"] == before["deletes"]
    finally:
        fake.registry.remove(expired)


# ---- sessions ----------------------------------------------------------------------------


def test_a_session_keeps_one_sandbox_and_deletes_it_at_close(daemon, fake):
    c = Client(daemon.url)
    before = fake.state()["creates"]
    with c.open_session(minimum_isolation="vm") as s:
        assert fake.live_count() == 1
        p = s.run_project({"notes.txt": "kept\n"}, ["cat notes.txt"], timeout=60)
        assert p.steps[0].stdout == b"kept\n"
        r = s.run_javascript(
            "console.log(require('fs').readFileSync('/home/user/project/notes.txt', 'utf8'))",
            timeout=30)
        assert r.stdout == b"kept\n\n"
    assert fake.state()["creates"] == before + 1
    wait_no_sandboxes(fake, 5)


def test_a_call_that_leaves_a_slow_exiting_process_keeps_its_session(daemon, fake):
    with Client(daemon.url).open_session() as s:
        assert_a_slow_exit_does_not_end_the_session(s)


def test_no_process_a_session_call_starts_outlives_it(daemon, fake):
    with Client(daemon.url).open_session() as s:
        assert_no_process_outlives_a_call(s)
    wait_no_sandboxes(fake, 5)


# ---- the smoke test refuses to start on each broken promise ------------------------------


@pytest.mark.parametrize("knob,check", [
    ("create_network_ignored", "connections out are refused: FAILED"),
    ("create_container_signs", "no container runtime marker (a VM, not a container): FAILED"),
    ("upload_dropped", "the project file arrived intact: FAILED"),
])
def test_the_smoke_test_refuses_a_broken_promise(fake, certs, knob, check):
    fake.set_fault(knob)
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
           **daemon_env(fake, certs)}
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0, "the daemon started on a sandbox that broke a promise"
    assert check in done.stderr, done.stderr[-2000:]
    assert "plimsolld listening" not in done.stderr


# ---- the operator's configuration ------------------------------------------------------------------


def test_the_operator_picks_the_template_and_the_evidence_names_it(daemon, fake, certs, tmp_path):
    """The template comes from the configuration file, reaches E2B's create
    as `templateID`, and changes the environment every answer states, so a
    client pinned to the old one sees the change."""
    pinned = Client(daemon.url).run_javascript("1", timeout=30).environment
    assert pinned.startswith("e2b:template=base+config:sha256:"), pinned
    # A second template in the account, with the same image.
    fake.control.templates["node-22"] = fake.control.templates["base"]
    config = tmp_path / "e2b.json"
    config.write_text(json.dumps({"template": "node-22"}))
    d = Daemon({**daemon_env(fake, certs), "SANDBOX_PLUGIN_CONFIG_FILE": str(config)})
    try:
        before = fake.state()["templates_used"].get("node-22", 0)
        r = Client(d.url).run_javascript("console.log('on', 6 * 7)", timeout=30)
        assert r.stdout == b"on 42\n"
        assert fake.state()["templates_used"]["node-22"] == before + 1
        assert r.environment != pinned
        assert r.environment.startswith("e2b:template=node-22+config:sha256:"), r.environment
    finally:
        d.stop()
    wait_no_sandboxes(fake, 10)


def test_plimsoll_plugin_check_passes_against_the_fake(fake, certs):
    """The checker drives the adapter as the daemon would; the sandbox its
    trap scenario leaves is reaped by the TTL the adapter asked for."""
    assert_passes(check_plugin("e2b", daemon_env(fake, certs)))
    wait_no_sandboxes(fake, 30)


def test_a_bad_template_stops_the_start_with_every_problem(fake, certs, tmp_path):
    config = tmp_path / "e2b.json"
    config.write_text(json.dumps({"template": "two words", "region": "eu"}))
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
           **daemon_env(fake, certs), "SANDBOX_PLUGIN_CONFIG_FILE": str(config)}
    creates = fake.state()["creates"]
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "has 2 problem(s)" in done.stderr, done.stderr[-2000:]
    assert 'refused the value of \\"template\\"' in done.stderr, done.stderr[-2000:]
    assert 'unknown key \\"region\\" (this plugin reads: template)' in done.stderr
    assert fake.state()["creates"] == creates, "nothing is made for a refused configuration"


# ---- nothing secret in the log, or in a sandbox -----------------------------------------------------------


def test_the_key_and_envd_tokens_stay_out_of_the_log(daemon, fake):
    with Client(daemon.url).open_session() as s:
        assert s.run_javascript("console.log(1)", timeout=30).stdout == b"1\n"
        (sandbox_id,) = fake.state()["live"]
        token = fake.registry.get(sandbox_id).access_token
        assert token
    wait_no_sandboxes(fake, 5)
    log = "\n".join(daemon.lines)
    for secret in (API_KEY, sandbox_id, token):
        assert secret not in log


def test_the_key_reaches_envd_unless_the_operator_names_its_origins(fake, certs):
    # The check above can fail: with the key sent to every origin (the
    # default), the edge, and so the sandbox, would receive it.
    env = daemon_env(fake, certs)
    del env["SANDBOX_PLUGIN_API_KEY_ORIGINS"]
    d = Daemon(env)
    try:
        Client(d.url).run_javascript("console.log(1)", timeout=30)
        assert fake.state()["envd_api_keys_seen"] > 0
    finally:
        d.stop()
        fake.envd.api_keys_seen = 0


def test_the_workload_corpus(daemon):
    """What agents ordinarily run works here as on every tier, and what the
    sandbox forbids fails as documented (docs/workloads.md)."""
    workloads.prove("e2b", daemon.url, minimum_isolation="vm")
