"""The remote-js plugin (plugins/remote-js: the remote-plimsoll adapter in
JavaScript, built with componentize-js) through the real plimsolld and the
published client (plimsoll-client 0.23.0, unmodified): a snippet, the
upstream's floor, a refusal passed on with its mark, and a session, all
forwarded to a real upstream daemon. That the plugin keeps to the host's
rules is `plimsoll plugin check`'s to say, checked here too."""

from __future__ import annotations

import pytest

from plimsoll_client import Client
from plimsoll_client.errors import PlimsollError

from plugin_checker import assert_passes, check_plugin
from test_published_client import Daemon


@pytest.fixture(scope="module")
def upstream():
    d = Daemon({"SANDBOX_PROVIDER": "wasm", "SANDBOX_MAX_SESSIONS": "2"})
    yield d
    d.stop()


def js_env(upstream: Daemon) -> dict:
    return {"SANDBOX_PROVIDER": "remote-js", "SANDBOX_PLUGIN_HTTP_ORIGINS": upstream.url,
            "SANDBOX_MAX_SESSIONS": "2"}


@pytest.fixture(scope="module")
def daemon(upstream):
    d = Daemon(js_env(upstream))
    yield d
    d.stop()


def test_describe_names_the_plugin_and_the_upstreams_environment(daemon):
    info = Client(daemon.url).describe()
    assert info.provider == "remote-js"
    # The operator allowed nothing above process (SANDBOX_PLUGIN_MAX_TIER).
    assert info.isolation == "process"


def test_a_snippet_runs_upstream_and_comes_back(daemon):
    r = Client(daemon.url).run_javascript(
        "console.log('from', 6 * 7); console.error('err')", timeout=20)
    assert (r.stdout, r.stderr, r.exit_code) == (b"from 42\n", b"err\n", 0)
    failed = Client(daemon.url).run_javascript("throw new Error('boom')", timeout=20)
    assert failed.exit_code != 0 and b"boom" in failed.stderr
    assert r.environment.startswith("remote:quickjs-wasm:sha256:"), r.environment


def test_a_floor_above_the_tier_is_refused_marked(daemon):
    with pytest.raises(PlimsollError) as e:
        Client(daemon.url).run_javascript("console.log(1)", minimum_isolation="container")
    assert e.value.not_dispatched is not None, e.value


def test_a_session_keeps_state_upstream(daemon):
    c = Client(daemon.url)
    with c.open_session(languages=["javascript"]) as s:
        s.run_cell("globalThis.n = 41", language="javascript")
        out = s.run_cell("console.log(n + 1)", language="javascript")
        assert out.stdout == b"42\n"


def test_plimsoll_plugin_check_passes(upstream):
    assert_passes(check_plugin("remote-js", js_env(upstream)))
