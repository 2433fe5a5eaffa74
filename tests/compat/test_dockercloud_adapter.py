"""The Docker Cloud provider plugin (plugins/dockercloud) through the real
plimsolld and the published client (plimsoll-client 0.23.0, unmodified),
against fake-dockercloud (tests/fakes/dockercloud), which serves Docker
Hub's token exchange, the Sandboxes REST API and each sandbox's endpoint
over TLS, runs every command in a real container, and checks every request
and answer against the shapes Docker publishes.

What is proven here: snippets and projects run end to end at the vm tier the
operator allowed; the host, not the plugin, trades the operator's token, and
neither it nor the access token reaches a sandbox's endpoint or the log;
every fault ends the way it should (never marked not-dispatched once a
request went out); the startup smoke test refuses to start on each broken
promise, naming it; and no sandbox is left behind.
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
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "dockercloud"))
import certs as fake_certs  # noqa: E402
from fake_dockercloud import FakeDockerCloud  # noqa: E402

USER = "plimsoll-ci"
PAT = "dckr_pat_canary_4f1e9b"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dockercloud-tls")
    fake_certs.make(d)
    return d


@pytest.fixture(scope="module")
def fake(certs):
    f = FakeDockerCloud(USER, PAT, tls=(str(certs / "leaf.pem"), str(certs / "leaf.key"))).start()
    yield f
    f.stop()


def daemon_env(fake: FakeDockerCloud, certs: Path) -> dict:
    return {
        "SANDBOX_PROVIDER": "dockercloud",
        "SANDBOX_PLUGIN_MAX_TIER": "vm",
        # The API first, then the sandboxes' endpoints; the traded token
        # goes to the API only.
        "SANDBOX_PLUGIN_HTTP_ORIGINS": f"{fake.api_origin},{fake.endpoint_origin}",
        "SANDBOX_PLUGIN_API_KEY_ORIGINS": fake.api_origin,
        "SANDBOX_PLUGIN_API_KEY_ENV": "DOCKER_SBX_TOKEN",
        "DOCKER_SBX_TOKEN": PAT,
        "SANDBOX_PLUGIN_KEY_EXCHANGE_URL": fake.exchange_url,
        "SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER": USER,
        "SANDBOX_PLUGIN_HTTP_CA": str(certs / "ca.pem"),
        # The exchange trusts only the CA named for it (here the same test CA).
        "SANDBOX_PLUGIN_KEY_EXCHANGE_CA": str(certs / "ca.pem"),
        "SANDBOX_PLUGIN_METERED": "1",
        "SANDBOX_MAX_SESSIONS": "2",
        "PLIMSOLL_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="module")
def daemon(fake, certs):
    d = Daemon(daemon_env(fake, certs))
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def no_leaks(fake):
    """After every test: no sandbox left, no token where it must not go, and
    no request or answer that broke Docker's published shapes."""
    fake.clear_faults()
    yield
    fake.clear_faults()
    state = fake.state()
    assert state["live"] == [], f"sandboxes left: {state['live']}"
    assert state["management_token_on_endpoint"] == 0, "the access token reached an endpoint"
    assert state["violations"] == [], state["violations"]


def run(daemon, code="console.log(1)", timeout=30):
    return Client(daemon.url).run_javascript(code, timeout=timeout)


def assert_unmarked_error(daemon, timeout=20) -> PlimsollError:
    """Fails with an error the client may not retry blindly: requests went
    out, so the host never marks it not-dispatched."""
    with pytest.raises(PlimsollError) as e:
        run(daemon, timeout=timeout)
    assert e.value.not_dispatched is None, e.value
    return e.value


# ---- runs -------------------------------------------------------------------------------


def test_describe_states_vm_and_both_payloads(daemon):
    info = Client(daemon.url).describe()
    assert (info.provider, info.isolation) == ("dockercloud", "vm")
    assert info.supports_project and info.supports_sessions


def test_a_snippet_runs_in_a_fresh_sandbox_deleted_after(daemon, fake):
    before = fake.state()
    r = run(daemon, "console.log('hello from the vm', 6 * 7)")
    assert r.stdout == b"hello from the vm 42\n"
    assert r.exit_code == 0 and r.isolation == "vm" and r.provider == "dockercloud"
    after = fake.state()
    assert after["created"] == before["created"] + 1
    assert after["deleted"] == before["deleted"] + 1
    # The policy was read back for this run, and one credential served it.
    assert after["policy_reads"] == before["policy_reads"] + 1
    assert after["mints"] == before["mints"] + 1


def test_the_host_trades_the_token_once_and_reuses_it(daemon, fake):
    run(daemon)
    before = fake.state()["exchanges"]
    run(daemon)
    run(daemon)
    assert fake.state()["exchanges"] == before


def test_a_project_writes_files_runs_steps_in_its_directory_and_returns_artifacts(daemon):
    r = Client(daemon.url).run_project(
        {"src/main.js": "require('fs').writeFileSync('out/answer.txt', String(6*7))"},
        ["mkdir -p out && pwd", "node src/main.js", "cat out/answer.txt"],
        ["out/answer.txt", "out/missing.txt"], timeout=60)
    assert [s.exit_code for s in r.steps] == [0, 0, 0]
    assert r.steps[0].stdout == b"/tmp/plimsoll-project\n"
    assert r.steps[2].stdout == b"42"
    assert {a.path: a.content for a in r.artifacts} == {"out/answer.txt": b"42"}
    assert not r.artifacts_truncated


def test_output_is_kept_to_the_limit_with_flags(daemon):
    # Each stream is cut inside the VM, at the limit plus the one byte that
    # proves the cut (the writer then gets EPIPE, as any program would).
    r = run(daemon, "process.stderr.write('e'.repeat(100)); process.stdout.write('x'.repeat(200000))")
    assert r.stdout == b"x" * 65536 and r.stdout_truncated
    assert r.stderr.startswith(b"e" * 100) and not r.stderr_truncated
    r = run(daemon, "process.stderr.write('e'.repeat(65536))")
    assert r.stderr == b"e" * 65536 and not r.stderr_truncated
    r = run(daemon, "process.stderr.write('e'.repeat(65537))")
    assert r.stderr == b"e" * 65536 and r.stderr_truncated


def test_the_time_limit_is_enforced_inside_the_vm(daemon):
    began = time.monotonic()
    r = run(daemon, "setTimeout(() => {}, 60000)", timeout=5)
    assert r.timed_out and r.exit_code == 124
    assert time.monotonic() - began < 15


def test_a_sandbox_has_no_way_out(daemon):
    r = run(daemon, """
const s = require('net').connect(443, '1.1.1.1');
s.on('connect', () => { console.log('open'); process.exit(0); });
s.on('error', e => { console.log('closed', e.code); process.exit(0); });
setTimeout(() => { console.log('closed timeout'); process.exit(0); }, 3000);
""")
    assert r.stdout.startswith(b"closed"), r.stdout


# ---- faults ------------------------------------------------------------------------------


def test_a_slow_start_is_waited_for(daemon, fake):
    fake.set_fault("create_202", polls=3)
    assert run(daemon).stdout == b"1\n"


@pytest.mark.parametrize("knob", ["read_429", "mint_429"])
def test_a_429_with_retry_after_is_waited_out(daemon, fake, knob):
    fake.set_fault(knob, retry_after=1)
    assert run(daemon).stdout == b"1\n"


def test_a_full_quota_fails_with_nothing_created(daemon, fake):
    before = fake.state()["created"]
    fake.set_fault("create_429", count=None)
    assert_unmarked_error(daemon)
    assert fake.state()["created"] == before


@pytest.mark.parametrize("knob", ["create_failed", "wrong_display_name", "bigger_size",
                                  "endpoint_no_exec", "policy_allow_all",
                                  "policy_extra_rule", "upload_short"])
def test_a_sandbox_that_breaks_a_check_runs_nothing_and_is_deleted(daemon, fake, knob):
    before = fake.state()
    fake.set_fault(knob)
    assert_unmarked_error(daemon)
    after = fake.state()
    assert after["created"] == before["created"] + 1
    assert after["deleted"] == before["deleted"] + 1
    # Nothing of the guest's ran: no wrapped exec was sent.
    assert after["execs"] == before["execs"]


def test_output_the_service_could_not_carry_whole_is_a_flood(daemon, fake):
    fake.set_fault("exec_incomplete")
    r = run(daemon)
    assert r.exit_code == 153 and r.stdout_truncated and r.stderr_truncated


@pytest.mark.parametrize("knob", ["download_cut", "download_stream_error"])
def test_a_broken_download_brings_back_nothing_and_says_so(daemon, fake, knob):
    fake.set_fault(knob)
    r = Client(daemon.url).run_project({"a.txt": "A"}, ["true"], ["a.txt"], timeout=60)
    assert not r.artifacts and r.artifacts_truncated


def test_a_stale_etag_on_delete_is_read_again(daemon, fake):
    fake.set_fault("delete_stale")
    assert run(daemon).stdout == b"1\n"


def test_a_refused_token_exchange_stops_the_start_naming_it(fake, certs):
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
           **daemon_env(fake, certs), "DOCKER_SBX_TOKEN": "dckr_pat_wrong"}
    before = fake.state()["created"]
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "the token exchange refused the operator's key (HTTP 401)" in done.stderr, \
        done.stderr[-2000:]
    assert "dckr_pat_wrong" not in done.stderr
    assert fake.state()["created"] == before


# ---- the smoke test ---------------------------------------------------------------------------


@pytest.mark.parametrize("knob,check", [
    ("egress_open", "connections out are refused: FAILED"),
    ("container_signs", "no container runtime marker (a VM, not a container): FAILED"),
    ("upload_short", "the upload wrote"),
    ("policy_extra_rule", "allow rule(s) are in force"),
    ("exec_ignores_workdir", "the step ran in the project directory: FAILED"),
])
def test_the_smoke_test_refuses_a_broken_promise(fake, certs, knob, check):
    fake.set_fault(knob)
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
           **daemon_env(fake, certs)}
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode != 0, "the daemon started on a sandbox that broke a promise"
    assert check in done.stderr, done.stderr[-2000:]
    assert "plimsolld listening" not in done.stderr


# ---- nothing secret in the log ----------------------------------------------------------------


def test_no_token_reaches_the_log(daemon, fake):
    run(daemon)
    tokens = list(fake.tokens)
    assert tokens
    log = "\n".join(daemon.lines)
    for secret in [PAT, *tokens]:
        assert secret not in log


# ---- the operator's cap, the sweeper, the token's expiry ----------------------------------------


def start_daemon(fake, certs, **extra) -> Daemon:
    return Daemon({**daemon_env(fake, certs), **extra})


def test_the_tier_is_vm_only_under_an_operator_cap_of_vm(fake, certs):
    d = start_daemon(fake, certs, SANDBOX_PLUGIN_MAX_TIER="container")
    try:
        assert Client(d.url).describe().isolation == "container"
        assert run(d).isolation == "container"
    finally:
        d.stop()


def test_the_sweeper_deletes_expired_sandboxes_of_ours_and_nothing_else(fake, certs):
    expired = fake.plant({"created-by": "plimsoll", "plimsoll-deadline": "1"})
    current = fake.plant({"created-by": "plimsoll",
                          "plimsoll-deadline": str(int(time.time()) + 3600)})
    foreign = fake.plant({"created-by": "someone-else", "plimsoll-deadline": "1"})
    d = start_daemon(fake, certs)  # the smoke test sweeps first
    try:
        live = fake.live()
        assert expired not in live and current in live and foreign in live
    finally:
        d.stop()
        for uid in (current, foreign):
            fake._remove(fake.sandboxes[uid])


def test_a_token_near_its_expiry_is_traded_again(fake, certs):
    # Tokens that live 61 s are replaced 60 s early: each run more than a
    # second after the last trade trades again (the module's daemon, with
    # 900 s tokens, trades once and reuses it).
    fake.set_fault("token_ttl", count=None, seconds=61)
    d = start_daemon(fake, certs)
    try:
        before = fake.state()["exchanges"]
        for _ in range(2):
            time.sleep(1.5)
            assert run(d).stdout == b"1\n"
        assert fake.state()["exchanges"] >= before + 2
    finally:
        d.stop()


def test_the_exchange_does_not_trust_the_plugins_extra_ca(fake, certs):
    # The fake's CA is trusted for the plugin's origins only: the trade
    # must fail verification, and the daemon must not start.
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1", **daemon_env(fake, certs)}
    del env["SANDBOX_PLUGIN_KEY_EXCHANGE_CA"]
    before = fake.state()["exchanges"]
    done = subprocess.run([plimsolld_bin()], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "the token exchange could not be reached" in done.stderr, done.stderr[-2000:]
    assert fake.state()["exchanges"] == before


def test_the_operator_picks_image_and_size_and_the_evidence_names_them(daemon, fake, certs,
                                                                        tmp_path):
    """Image, CPUs and memory come from the configuration file, reach the
    create as Docker documents them, are what each sandbox is checked
    against, and change the environment every answer states."""
    import json
    pinned = Client(daemon.url).run_javascript("1", timeout=60).environment
    config = tmp_path / "dockercloud.json"
    image = "docker.io/library/node:22-alpine"
    config.write_text(json.dumps({"image": image, "cpus": "2", "memory-mib": "4096"}))
    d = Daemon({**daemon_env(fake, certs), "SANDBOX_PLUGIN_CONFIG_FILE": str(config)})
    try:
        asked = len(fake.state()["asked"])
        r = Client(d.url).run_javascript("console.log('on', 6 * 7)", timeout=60)
        assert r.stdout == b"on 42\n"
        assert fake.state()["asked"][asked:] == [(image, 2, 4096)]
        assert r.environment != pinned
        assert r.environment.startswith(f"dockercloud:image={image}+config:sha256:"), r.environment
        # A sandbox bigger than the configured size is still refused.
        fake.set_fault("bigger_size")
        assert_unmarked_error(d, timeout=60)
    finally:
        d.stop()


def test_plimsoll_plugin_check_passes_against_the_fake(fake, certs):
    """The checker drives the adapter as the daemon would; the sandbox its
    trap scenario leaves is reaped by the timeout the adapter asked for
    (the run's 5 s and a 30 s margin)."""
    assert_passes(check_plugin("dockercloud", daemon_env(fake, certs)))
    deadline = time.monotonic() + 60
    while fake.live():
        assert time.monotonic() < deadline, f"sandboxes left: {fake.live()}"
        time.sleep(0.2)


def test_the_workload_corpus(daemon):
    """What agents ordinarily run works here as on every tier, and what the
    sandbox forbids fails as documented (docs/workloads.md)."""
    workloads.prove("dockercloud", daemon.url, minimum_isolation="vm")


# ---- sessions ----------------------------------------------------------------------------

def test_a_session_keeps_one_sandbox_and_its_files_and_deletes_it_at_close(daemon, fake):
    c = Client(daemon.url)
    before = fake.state()["created"]
    with c.open_session(minimum_isolation="vm", lifetime=120) as s:
        (uid,) = fake.live()
        # The service's own timeout is the session's life plus the margin
        # runs get, with the delete action: it outlives no session.
        assert fake.sandboxes[uid].timeout == "150s"
        p = s.run_project({"notes.txt": "kept\n"}, ["cat notes.txt"], timeout=60)
        assert p.steps[0].stdout == b"kept\n"
        # A snippet runs in the same project directory, in the same sandbox.
        r = s.run_javascript("console.log(require('fs').readFileSync('notes.txt', 'utf8'))",
                             timeout=30)
        assert (r.stdout, r.exit_code, r.isolation) == (b"kept\n\n", 0, "vm")
        p = s.run_project({}, ["echo more >> notes.txt", "cat notes.txt"], timeout=60)
        assert p.steps[1].stdout == b"kept\nmore\n"
        with pytest.raises(PlimsollError) as e:
            s.run_cell("1", language="javascript")
        assert e.value.not_dispatched is not None
        assert fake.live() == [uid]
    assert fake.state()["created"] == before + 1
    assert s.close().end == "closed"


def test_a_call_that_leaves_a_slow_exiting_process_keeps_its_session(daemon, fake):
    with Client(daemon.url).open_session() as s:
        assert_a_slow_exit_does_not_end_the_session(s)


def test_no_process_a_session_call_starts_outlives_it(daemon, fake):
    with Client(daemon.url).open_session() as s:
        assert_no_process_outlives_a_call(s)
        # The sandbox's own processes were spared: its main process runs on.
        (uid,) = fake.live()
        main = subprocess.run(["docker", "top", fake.sandboxes[uid].container],
                              capture_output=True, text=True, timeout=60).stdout
        assert "tail -f /dev/null" in main, main


def test_a_session_ends_when_the_service_reports_its_sandbox_failed(daemon, fake):
    s = Client(daemon.url).open_session()
    assert s.run_javascript("console.log(1)", timeout=30).stdout == b"1\n"
    (uid,) = fake.live()
    fake.sandboxes[uid].fail("internal", "the VM stopped")
    before = fake.state()
    with pytest.raises(PlimsollError):
        s.run_javascript("console.log(2)", timeout=30)
    # Seen before a credential was minted or anything sent to run.
    after = fake.state()
    assert (after["mints"], after["execs"]) == (before["mints"], before["execs"])
    assert s.close().end == "main_process_ended"


def bigger(sandbox) -> None:
    sandbox.flags.add("bigger")  # the service now reports more memory


def moved(sandbox) -> None:
    sandbox.endpoint += "-elsewhere"  # another endpoint, on an allowed origin


@pytest.mark.parametrize("change", [bigger, moved])
def test_a_session_ends_when_its_sandbox_is_no_longer_what_was_checked(daemon, fake, change):
    s = Client(daemon.url).open_session()
    assert s.run_javascript("console.log(1)", timeout=30).stdout == b"1\n"
    (uid,) = fake.live()
    change(fake.sandboxes[uid])
    before = fake.state()
    with pytest.raises(PlimsollError):
        s.run_javascript("console.log(2)", timeout=30)
    # Stopped at the re-read: no credential minted, nothing sent to run.
    after = fake.state()
    assert (after["mints"], after["execs"]) == (before["mints"], before["execs"])
    assert s.close().end == "sandbox_changed"
