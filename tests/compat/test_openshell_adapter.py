"""The OpenShell provider plugin (plugins/openshell) through the real
plimsolld and the published client (plimsoll-client 0.23.0, unmodified),
against fake-openshell (tests/fakes/openshell): gRPC over HTTP/2 and mutual
TLS, the client certificate held by the host, every command run in a real
container.

What is proven here: snippets and projects run end to end at the container
tier; each knob a gateway can turn ends the way it should (a failed check
runs nothing and deletes the sandbox; never marked not-dispatched once a
request went out); the deadline cancels the exec and the process with it;
the startup smoke test refuses to start on each broken promise, naming it
(every refused start is checked for its reason, not just for failing);
sessions keep one sandbox with its files, leave no process of a call
running, and end when the sandbox dies or its policy changes; and no
sandbox is left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plimsoll_client import Client
from plimsoll_client.errors import PlimsollError

import workloads
from plugin_checker import assert_passes, check_plugin
from session_leftovers import assert_a_slow_exit_does_not_end_the_session, assert_no_process_outlives_a_call
from test_published_client import ROOT, Daemon, plimsolld_bin

sys.path.insert(0, str(ROOT / "tests" / "fakes" / "e2b"))
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "openshell"))
import certs as fake_certs  # noqa: E402
from fake_openshell import FakeOpenShell  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("openshell-pki")
    fake_certs.make(d)
    fake_certs.make_client(d)
    return d


@pytest.fixture(scope="module")
def fake(pki):
    f = FakeOpenShell(tls=(str(pki / "leaf.pem"), str(pki / "leaf.key")),
                      client_ca=str(pki / "ca.pem")).start()
    yield f
    f.stop()


def daemon_env(fake: FakeOpenShell, pki: Path) -> dict:
    return {
        "SANDBOX_PROVIDER": "openshell",
        "SANDBOX_PLUGIN_MAX_TIER": "container",
        "SANDBOX_PLUGIN_HTTP_ORIGINS": fake.origin,
        "SANDBOX_PLUGIN_HTTP_CA": str(pki / "ca.pem"),
        "SANDBOX_PLUGIN_HTTP_CLIENT_CERT": str(pki / "client.pem"),
        "SANDBOX_PLUGIN_HTTP_CLIENT_KEY": str(pki / "client.key"),
        "SANDBOX_MAX_SESSIONS": "2",
        "PLIMSOLL_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="module")
def daemon(fake, pki):
    d = Daemon(daemon_env(fake, pki))
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def no_leaks(fake):
    fake.clear_faults()
    yield
    fake.clear_faults()
    deadline = time.monotonic() + 10
    while fake.live() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake.live() == [], f"sandboxes left: {fake.live()}"


def run(daemon, code="console.log(1)", timeout=30):
    return Client(daemon.url).run_javascript(code, timeout=timeout)


def assert_unmarked_error(daemon) -> PlimsollError:
    with pytest.raises(PlimsollError) as e:
        run(daemon)
    assert e.value.not_dispatched is None, e.value
    return e.value


def test_describe_states_the_container_tier(daemon):
    info = Client(daemon.url).describe()
    assert (info.provider, info.isolation) == ("openshell", "container")
    assert info.supports_project and info.supports_sessions


def test_a_snippet_runs_from_stdin_in_a_fresh_sandbox(daemon, fake):
    before = fake.state()
    r = Client(daemon.url).run_javascript(
        "console.log('hi', 6 * 7); console.error('e'); process.exitCode = 3",
        minimum_isolation="container", timeout=30)
    assert (r.stdout, r.stderr, r.exit_code) == (b"hi 42\n", b"e\n", 3)
    assert (r.provider, r.isolation) == ("openshell", "container")
    after = fake.state()
    assert after["created"] == before["created"] + 1
    assert after["config_reads"] == before["config_reads"] + 1


def test_a_vm_floor_is_refused_before_anything_is_made(daemon, fake):
    before = fake.state()["created"]
    with pytest.raises(PlimsollError) as e:
        Client(daemon.url).run_javascript("console.log(1)", minimum_isolation="vm", timeout=30)
    assert e.value.not_dispatched is not None
    assert fake.state()["created"] == before


def test_a_project_writes_files_runs_steps_and_returns_artifacts(daemon):
    r = Client(daemon.url).run_project(
        {"src/in.txt": "payload\n"},
        ["cp src/in.txt out.txt && pwd", "exit 7", "echo never"],
        ["out.txt", "missing.txt"], timeout=60)
    assert [s.exit_code for s in r.steps] == [0, 7]
    assert r.steps[0].stdout == b"/tmp/work\n"
    assert [(a.path, a.content) for a in r.artifacts] == [("out.txt", b"payload\n")]


def test_output_is_kept_to_the_limit_with_flags(daemon):
    r = run(daemon, "process.stdout.write('o'.repeat(70000)); process.stderr.write('e'.repeat(65536))")
    assert len(r.stdout) == 65536 and r.stdout_truncated
    assert len(r.stderr) == 65536 and not r.stderr_truncated


def test_the_deadline_cancels_the_exec_and_ends_the_process(daemon, fake):
    before = fake.state()["cancelled"]
    r = run(daemon, "console.log('started'); setInterval(() => {}, 1000)", timeout=3)
    assert r.timed_out and r.exit_code == 124 and r.stdout == b"started\n"
    assert fake.state()["cancelled"] == before + 1


def test_a_sandbox_has_no_way_out(daemon):
    r = run(daemon, """
const s = require('net').connect(443, '1.1.1.1');
s.on('connect', () => { console.log('open'); process.exit(0); });
s.on('error', e => { console.log('closed'); process.exit(0); });
setTimeout(() => { console.log('closed'); process.exit(0); }, 3000);
""")
    assert r.stdout == b"closed\n"


@pytest.mark.parametrize("knob", ["driver_not_docker", "two_drivers"])
def test_a_gateway_without_exactly_one_docker_driver_makes_nothing(daemon, fake, knob):
    before = fake.state()["created"]
    fake.set_fault(knob)
    assert_unmarked_error(daemon)
    assert fake.state()["created"] == before


@pytest.mark.parametrize("knob", ["policy_global", "proposals_on", "readback_changed",
                                  "config_not_admitted", "main_process_swapped",
                                  "main_process_killed"])
def test_a_sandbox_that_fails_a_read_back_runs_nothing_and_is_deleted(daemon, fake, knob):
    before = fake.state()
    fake.set_fault(knob)
    assert_unmarked_error(daemon)
    after = fake.state()
    assert after["created"] == before["created"] + 1
    assert after["deleted"] == before["deleted"] + 1
    assert after["execs"] == before["execs"]


def test_a_sandbox_that_is_not_ready_fails_unmarked(daemon, fake):
    fake.set_fault("not_ready")
    assert_unmarked_error(daemon)


def test_the_gateways_own_timeout_reports_its_exit_and_the_sandbox_still_goes(daemon, fake):
    fake.set_fault("exec_timeout", seconds=1)
    r = run(daemon, "setTimeout(() => console.log('late'), 5000)", timeout=20)
    assert r.exit_code == 124 and not r.timed_out


def test_a_flood_is_cut_before_the_calls_budget_and_the_sandbox_still_goes(daemon, fake):
    fake.set_fault("stdout_flood", mib=56)
    r = run(daemon, timeout=30)
    assert r.exit_code == 153 and r.stdout_truncated and r.stderr_truncated
    assert len(r.stdout) == 65536


def test_a_slow_start_and_a_delayed_delete_are_waited_for(daemon, fake):
    fake.set_fault("provisioning_reads", reads=5)
    fake.set_fault("delete_accepted", vanish_after=1.0)
    assert run(daemon).stdout == b"1\n"


def assert_start_refused(done: subprocess.CompletedProcess, reason: str) -> None:
    """The daemon did not start, and said why: a refusal for any other
    reason fails the test."""
    assert done.returncode != 0, f"the daemon started; it should have refused: {reason}"
    assert reason in done.stderr, done.stderr[-2000:]
    assert "plimsolld listening" not in done.stderr


@pytest.mark.parametrize("knob,check", [
    ("egress_open", "connections out are refused: FAILED"),
    ("driver_not_docker", "compute driver is not docker"),
    ("policy_global", "a global policy governs"),
    ("run_as_root", "nothing outside /tmp is writable: FAILED"),
    ("main_process_swapped", "the sandbox's main process is not the one asked for"),
    ("main_process_killed", "the sandbox's main process ended with exit 137"),
])
def test_the_smoke_test_refuses_a_broken_promise(fake, pki, knob, check):
    fake.set_fault(knob)
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1", **daemon_env(fake, pki)}
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=120)
    assert_start_refused(done, check)


def test_without_the_client_certificate_nothing_starts(fake, pki):
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1", **daemon_env(fake, pki)}
    del env["SANDBOX_PLUGIN_HTTP_CLIENT_CERT"], env["SANDBOX_PLUGIN_HTTP_CLIENT_KEY"]
    before = fake.state()["created"]
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=120)
    # The first call, the driver check, is where the handshake fails.
    assert_start_refused(done, "the gateway info failed")
    assert fake.state()["created"] == before


def test_a_bearer_token_instead_of_a_client_certificate(pki):
    # A gateway behind OIDC: the host adds the token; the plugin never sees it.
    token = "oidc-canary-token-51f0"
    f = FakeOpenShell(tls=(str(pki / "leaf.pem"), str(pki / "leaf.key")), bearer=token).start()
    env = {**daemon_env(f, pki), "SANDBOX_PLUGIN_API_KEY_ENV": "OPENSHELL_TOKEN",
           "OPENSHELL_TOKEN": token}
    del env["SANDBOX_PLUGIN_HTTP_CLIENT_CERT"], env["SANDBOX_PLUGIN_HTTP_CLIENT_KEY"]
    d = Daemon(env)
    try:
        assert run(d).stdout == b"1\n"
        assert f.state()["refused"] == 0
        assert token not in "\n".join(d.lines)
    finally:
        d.stop()
        f.stop()
    assert f.live() == []


def test_the_sweeper_deletes_expired_sandboxes_of_ours_and_nothing_else(fake, pki):
    expired = fake.plant({"plimsoll.run": "1", "plimsoll.deadline": "1"})
    current = fake.plant({"plimsoll.run": "1", "plimsoll.deadline": str(int(time.time()) + 3600)})
    foreign = fake.plant({"someone.else": "1"})
    d = Daemon(daemon_env(fake, pki))  # the smoke test sweeps first
    try:
        live = fake.live()
        assert expired not in live and current in live and foreign in live
    finally:
        d.stop()
        for name in (current, foreign):
            fake._remove(fake.sandboxes[name])


def test_plimsoll_plugin_check_passes_against_the_fake(fake, pki):
    """The checker drives the adapter as the daemon would; the sandbox its
    trap scenario leaves carries its deadline label (the run's 5 s and the
    adapter's 60 s margin: a gateway has no timeout of its own), and the
    next start's sweep deletes it once that has passed."""
    assert_passes(check_plugin("openshell", daemon_env(fake, pki)))
    deadline = time.monotonic() + 90
    while fake.live():
        assert time.monotonic() < deadline, f"sandboxes left: {fake.live()}"
        time.sleep(5)
        d = Daemon(daemon_env(fake, pki))  # its preflight sweeps expired sandboxes
        d.stop()


def test_the_operator_picks_image_limits_and_workspace(daemon, fake, pki, tmp_path):
    """Image, limits and workspace come from the configuration file, reach
    the gateway in every call that names them, and change the environment
    every answer states; a workspace the gateway lacks stops the start."""
    import json
    pinned = Client(daemon.url).run_javascript("1", timeout=60).environment
    fake.workspaces.add("agents")
    config = tmp_path / "openshell.json"
    image = "docker.io/library/node:22-alpine"
    config.write_text(json.dumps({"image": image, "memory": "512Mi", "cpu": "500m",
                                  "workspace": "agents"}))
    d = Daemon({**daemon_env(fake, pki), "SANDBOX_PLUGIN_CONFIG_FILE": str(config)})
    try:
        asked = len(fake.state()["asked"])
        r = Client(d.url).run_javascript("console.log('on', 6 * 7)", timeout=60)
        assert r.stdout == b"on 42\n"
        [(workspace, template)] = fake.state()["asked"][asked:]
        assert workspace == "agents"
        assert template["image"] == image
        limits = repr(template.get("resources"))  # kept as the wire had it
        assert "512Mi" in limits and "500m" in limits, limits
        assert r.environment != pinned
        assert r.environment.startswith(f"openshell:image={image}+config:sha256:"), r.environment
    finally:
        d.stop()
        fake.workspaces.discard("agents")
    config.write_text(json.dumps({"workspace": "elsewhere"}))
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
           **daemon_env(fake, pki), "SANDBOX_PLUGIN_CONFIG_FILE": str(config)}
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "plimsolld listening" not in done.stderr


def test_the_workload_corpus(daemon):
    """What agents ordinarily run works here as on every tier, and what the
    sandbox forbids fails as documented (docs/workloads.md)."""
    workloads.prove("openshell", daemon.url, minimum_isolation="container")


# ---- sessions ----------------------------------------------------------------------------

def test_a_session_keeps_one_sandbox_and_its_files_and_deletes_it_at_close(daemon, fake):
    c = Client(daemon.url)
    before = fake.state()["created"]
    with c.open_session(minimum_isolation="container") as s:
        assert len(fake.live()) == 1
        p = s.run_project({"notes.txt": "kept\n"}, ["cat notes.txt"], timeout=60)
        assert p.steps[0].stdout == b"kept\n"
        # A snippet runs in the same work directory, in the same sandbox.
        r = s.run_javascript("console.log(require('fs').readFileSync('notes.txt', 'utf8'))",
                             timeout=30)
        assert (r.stdout, r.exit_code, r.isolation) == (b"kept\n\n", 0, "container")
        p = s.run_project({}, ["echo more >> notes.txt", "cat notes.txt"], timeout=60)
        assert p.steps[1].stdout == b"kept\nmore\n"
        with pytest.raises(PlimsollError) as e:
            s.run_cell("1", language="javascript")
        assert e.value.not_dispatched is not None
        assert len(fake.live()) == 1
    assert fake.state()["created"] == before + 1
    summary = s.close()
    assert summary.end == "closed"


def test_a_call_that_leaves_a_slow_exiting_process_keeps_its_session(daemon, fake):
    with Client(daemon.url).open_session() as s:
        assert_a_slow_exit_does_not_end_the_session(s)


def test_no_process_a_session_call_starts_outlives_it(daemon, fake):
    with Client(daemon.url).open_session() as s:
        assert_no_process_outlives_a_call(s)


def test_a_session_ends_when_its_sandboxs_main_process_dies(daemon, fake):
    s = Client(daemon.url).open_session()
    assert s.run_javascript("console.log(1)", timeout=30).stdout == b"1\n"
    (name,) = fake.live()
    subprocess.run(["docker", "kill", fake.sandboxes[name].container], check=True,
                   capture_output=True, timeout=60)
    deadline = time.monotonic() + 20
    while fake.sandboxes[name].exit_code is None and time.monotonic() < deadline:
        time.sleep(0.1)
    execs = fake.state()["execs"]
    with pytest.raises(PlimsollError):
        s.run_javascript("console.log(2)", timeout=30)
    # Seen before anything was sent to run.
    assert fake.state()["execs"] == execs
    assert s.close().end == "main_process_ended"


def test_a_session_ends_when_its_sandboxs_policy_changes(daemon, fake):
    s = Client(daemon.url).open_session()
    assert s.run_javascript("console.log(1)", timeout=30).stdout == b"1\n"
    before = fake.state()
    fake.set_fault("policy_global")
    with pytest.raises(PlimsollError):
        s.run_javascript("console.log(2)", timeout=30)
    # The policy was read again, and nothing was sent to run after it.
    after = fake.state()
    assert after["config_reads"] == before["config_reads"] + 1
    assert after["execs"] == before["execs"]
    assert s.close().end == "sandbox_changed"
