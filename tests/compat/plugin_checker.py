"""`plimsoll plugin check` on a shipped plugin, with the operator's
variables a test gives it (the same ones the daemon reads)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from test_published_client import plimsolld_bin


def check_plugin(name: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    daemon = Path(plimsolld_bin())
    cli = daemon.with_name("plimsoll")
    # PLIMSOLL_PLUGIN_DIR's default: target/plugins beside target/release.
    plugin = daemon.parent.parent / "plugins" / f"{name}.wasm"
    full = {"PATH": os.environ.get("PATH", ""), **env}
    return subprocess.run([str(cli), "plugin", "check", str(plugin)], env=full,
                          capture_output=True, text=True, timeout=timeout)


def assert_passes(done: subprocess.CompletedProcess) -> None:
    report = done.stdout + "\n" + done.stderr[-3000:]
    assert done.returncode == 0, report
    # The ordinary run and the trap after the first capability use both
    # happened: the checks that can fail were made.
    assert "PASS run " in done.stdout, report
    assert "PASS deadline " in done.stdout, report
    assert "PASS not-dispatched " in done.stdout, report
