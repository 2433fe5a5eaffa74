"""fake-openshell's jail, driven by OpenShell's own stubs and shown from
inside the sandbox: a policy whose `network_policies` name a host and a
port lets exactly that host out at exactly that port (TLS by SNI, plain
HTTP by Host, end to end, to where the fake's `resolve` table says), and
nothing else: not the same host at another port, not another host at that
port, not a port no endpoint names, not a host service, not docker's
bridge, not the internet. The jail goes with the sandbox.

Run: .venv-openshell/bin/python -m pytest -q tests/fakes/openshell (needs
root for iptables, docker and the plimsoll/sandbox:bookworm image).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from openshell._proto import openshell_pb2 as pb
from openshell._proto import openshell_pb2_grpc as pbg
from openshell._proto import sandbox_pb2 as sb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2b"))
sys.path.insert(0, str(HERE))
from container import LABEL  # noqa: E402
from fake_openshell import FakeOpenShell  # noqa: E402
from outside import (  # noqa: E402
    PROBE, Greeter, HttpServer, TlsServer, host_address, reached, silent)
from test_fake_openshell import WS, channel, delete, pki, policy, wait_phase  # noqa: E402,F401

GUARD, OTHER = "guard.plimsoll.test", "other.test"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    found = {"tls": TlsServer(tmp_path_factory.mktemp("guard"), [GUARD, OTHER]),
             "http": HttpServer(), "host": Greeter()}
    yield found
    for server in found.values():
        server.close()


@pytest.fixture(scope="module")
def fake(pki, servers):  # noqa: F811
    tls, http = servers["tls"].port, servers["http"].port
    # Every name the tests try is resolvable: what refuses is the policy.
    f = FakeOpenShell(tls=(str(pki / "leaf.pem"), str(pki / "leaf.key")),
                      client_ca=str(pki / "ca.pem"),
                      resolve=[f"{GUARD}:443=127.0.0.1:{tls}", f"{OTHER}:443=127.0.0.1:{tls}",
                               f"{GUARD}:8080=127.0.0.1:{http}",
                               f"{OTHER}:8080=127.0.0.1:{http}"]).start()
    yield f
    f.stop()
    left = subprocess.run(["docker", "network", "ls", "-q", "--filter",
                           f"label={LABEL}={f.instance_id}"], capture_output=True, text=True)
    assert left.stdout.split() == [] and rules_with(f"plimsoll-{f.instance_id}") == []


def rules_with(text: str) -> "list[str]":
    rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True)
    return [r for r in rules.stdout.splitlines() if text in r]


def granted() -> sb.SandboxPolicy:
    """The guard by name at 443, and a plain HTTP service at 8080 (given
    as `ports`); each with the binary OpenShell would check."""
    p = policy()
    guard = p.network_policies["guard"]
    guard.name = "guard"
    guard.endpoints.add(host=GUARD, port=443)
    guard.binaries.add(path="/usr/bin/python3")
    other = p.network_policies["other"]
    other.name = "other"
    other.endpoints.add(host=OTHER, ports=[8080])
    other.binaries.add(path="/usr/bin/python3")
    return p


def run(stub, name: str, command: "list[str]", stdin: bytes = b"") -> "tuple[int, str]":
    events = list(stub.ExecSandbox(pb.ExecSandboxRequest(
        workspace_scope=WS, sandbox=name, command=command, stdin=stdin, no_login_shell=True),
        timeout=60))
    out = b"".join(e.stdout.data for e in events if e.HasField("stdout")).decode()
    return events[-1].exit.exit_code, out


def probe(stub, name: str, *targets: dict) -> "list[str]":
    code, out = run(stub, name, ["python3", "-", json.dumps(list(targets))], PROBE.encode())
    assert code == 0, out
    return json.loads(out)


def create(stub, name: str, asked: sb.SandboxPolicy) -> None:
    spec = pb.SandboxSpec(template=pb.SandboxTemplate(image="node:22"),
                          command=["sleep", "infinity"], policy=asked)
    stub.CreateSandbox(pb.CreateSandboxRequest(workspace_scope=WS, name=name, spec=spec),
                       timeout=30)
    wait_phase(stub, name, pb.SANDBOX_PHASE_READY)


def test_a_policys_endpoints_are_all_that_gets_out(fake, pki, servers):  # noqa: F811
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        create(stub, "jailed", granted())
        jail = fake.state()["jails"]["jailed"]
        gateway, port = jail["gateway"], servers["host"].port
        assert jail["ports"] == [443, 8080]
        assert run(stub, "jailed", ["sh", "-c", "cat > /tmp/guard.pem"],
                   servers["tls"].pem.encode())[0] == 0
        results = probe(stub, "jailed",
                        {"host": GUARD, "port": 443, "sni": GUARD, "ca": "/tmp/guard.pem"},
                        {"host": OTHER, "port": 8080},                  # plain HTTP, by Host
                        {"host": GUARD, "port": 8080},                  # the guard at 8080: no
                        {"host": OTHER, "port": 443, "sni": OTHER},     # other at 443: no
                        {"host": gateway, "port": 443},                 # no name at all
                        {"host": GUARD, "port": 80},                    # a port no endpoint names
                        {"host": gateway, "port": port},                # a host service ...
                        {"host": host_address(), "port": port},
                        {"host": "172.17.0.1", "port": port},
                        {"host": "1.1.1.1", "port": 443, "sni": GUARD})  # the internet
        assert results[0].endswith("guard-ok") and results[1].endswith("http-ok"), results
        assert all(r.startswith("closed:") for r in results[2:5]), results
        assert all(silent(r) for r in results[5:]), results
        assert not any(reached(r) for r in results[2:])
        assert servers["host"].seen == [] and GUARD in servers["tls"].seen
        assert OTHER in servers["http"].seen and OTHER not in servers["tls"].seen
        # The policy reads back as sent, its network entries included.
        config = stub.GetSandboxConfig(sb.GetSandboxConfigRequest(workspace_scope=WS,
                                                                  name="jailed"), timeout=10)
        assert config.policy == granted()
        delete(stub, "jailed")
        assert subprocess.run(["docker", "network", "inspect", jail["network"]],
                              capture_output=True).returncode != 0
        assert rules_with(jail["bridge"]) == []
    assert fake.live() == []


def test_an_entry_without_host_and_port_lets_nothing_out(fake, pki):  # noqa: F811
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        p = policy()
        rule = p.network_policies["vague"]
        rule.name = "vague"
        rule.endpoints.add(host=GUARD)  # no port: nothing can match it
        create(stub, "vague", p)
        assert "vague" not in fake.state()["jails"]
        assert run(stub, "vague", ["ls", "/sys/class/net"])[1].split() == ["lo"]
        delete(stub, "vague")
    assert fake.live() == []
