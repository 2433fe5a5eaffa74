"""The published client's agent integrations over real plimsolld sessions,
driven through their tool entry points without a model: the Anthropic
self-hosted worker's six tools (`plimsoll_client.anthropic_worker`) and the
OpenAI Agents SDK sandbox provider (`plimsoll_client.openai_sandbox`), with
the SDK versions the client's extras name installed by scripts/setup.sh.

Every call below goes through `Workspace`, so the client checks each answer's
record and the session chain, as in test_sessions.py.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from plimsoll_client import Client

from test_sessions import IMAGE, GracefulDaemon, containers_of, session_containers


@pytest.fixture(scope="module")
def docker():
    d = GracefulDaemon({"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_RUNTIME": "runc",
                        "SANDBOX_DOCKER_IMAGE": IMAGE, "SANDBOX_MAX_SESSIONS": "2",
                        "SANDBOX_SESSION_POOL": "1"})
    yield d
    # Counted before the stopped daemon is reaped: no other daemon's sweep
    # can have taken one of its containers yet (see Daemon.stop).
    assert d.stop(before_reaping=containers_of) == [], "the daemon left containers behind"


def test_anthropic_worker_tools(docker):
    from anthropic.lib.tools import ToolError
    from plimsoll_client.anthropic_worker import PlimsollTools

    tools = PlimsollTools(Client(docker.url), minimum_isolation="container", stage_skills=False)
    ctx = SimpleNamespace(session_id="managed-agents-session-1", workdir=None)
    by_name = {t.name: t for t in tools.tools(ctx)}
    assert sorted(by_name) == ["bash", "edit", "glob", "grep", "read", "write"]

    async def go():
        bash = by_name["bash"]
        out = await bash.call({"command": "mkdir -p notes && cd notes && echo one > a.txt && export K=v"})
        assert tools.open_sessions == ["managed-agents-session-1"]
        out = await bash.call({"command": "pwd; echo $K; cat a.txt"})
        lines = str(out).split()
        assert lines[-2:] == ["v", "one"] and lines[0].endswith("/notes"), out
        with pytest.raises(ToolError):
            await bash.call({"command": "exit 3"})
        await by_name["write"].call({"file_path": "src/m.py", "content": "x = 1\n"})
        assert "x = 1" in str(await by_name["read"].call({"file_path": "src/m.py"}))
        await by_name["edit"].call({"file_path": "src/m.py", "old_string": "x = 1", "new_string": "x = 2"})
        assert "x = 2" in str(await by_name["read"].call({"file_path": "src/m.py"}))
        assert "src/m.py" in str(await by_name["glob"].call({"pattern": "**/*.py"}))
        assert "x = 2" in str(await by_name["grep"].call({"pattern": "x = "}))
        # The runner's cleanup exits the bash tool, which closes the session
        # (the SDK's own cleanup routine, as its runner calls it).
        from anthropic.lib.tools._beta_functions import aclose_runnable_tool
        await aclose_runnable_tool(bash)

    asyncio.run(go())
    assert tools.open_sessions == []
    # Only the warm pool's unused container is left (SANDBOX_SESSION_POOL=1).
    assert len(session_containers(docker.proc.pid)) <= 1


def test_openai_agents_sandbox_client(docker):
    from plimsoll_client.openai_sandbox import PlimsollSandboxClient, PlimsollSandboxClientOptions

    client = PlimsollSandboxClient(Client(docker.url))

    async def go():
        session = await client.create(options=PlimsollSandboxClientOptions(minimum_isolation="container"))
        await session.start()
        result = await session.exec("echo hello from the sandbox; python3 -c 'print(6*7)'")
        assert result.exit_code == 0
        assert result.stdout.split(b"\n")[:2] == [b"hello from the sandbox", b"42"], result
        root = Path(session._inner.workspace.root)
        await session.write(root / "data.txt", io.BytesIO(b"kept"))
        assert (await session.read(root / "data.txt")).read() == b"kept"
        saved = await session.persist_workspace()
        await client.delete(session)
        return saved.read()

    archive = asyncio.run(go())
    assert archive, "persist_workspace returned nothing"
    assert len(session_containers(docker.proc.pid)) <= 1
