"""fake-openshell's jail, driven by OpenShell's own stubs and shown from
inside the sandbox, as OpenShell's users meet it: the one way out is the
explicit proxy every process is pointed at (`HTTPS_PROXY`, set over
whatever the exec asked for), which tunnels a CONNECT only to a host and
port some `tls: SKIP` endpoint of the policy names, dialled where the
fake's `resolve` table says, bytes untouched (TLS end to end with the
server's own certificate). A name or port the policy lacks is refused
with a 403; a direct connection goes nowhere (no name resolves in the
sandbox, and only the proxy's port is open on the host); the jail goes
with the sandbox. Also here: the hash the fake states for a policy with
network entries.

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
import messages  # noqa: E402
from container import LABEL  # noqa: E402
from egress_proxy import PROXY_PORT  # noqa: E402
from fake_openshell import FakeOpenShell  # noqa: E402
from outside import Greeter, HttpServer, TlsServer, host_address, reached, silent  # noqa: E402
from policy_hash import policy_hash  # noqa: E402
from test_fake_openshell import WS, channel, delete, pki, policy, wait_phase  # noqa: E402,F401

GUARD, OTHER, NOSKIP = "guard.plimsoll.test", "other.test", "noskip.test"
PROBE = (HERE / "tunnel_probe.py").read_bytes()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    found = {"tls": TlsServer(tmp_path_factory.mktemp("guard"), [GUARD, OTHER, NOSKIP]),
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
                               f"{NOSKIP}:443=127.0.0.1:{tls}",
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
    """The guard by name at 443 and a plain HTTP service at 8080 (given as
    `ports`), both `tls: SKIP`; and an endpoint without it. Each with the
    binary OpenShell would check."""
    p = policy()
    for key, host, ports, tls in (("guard", GUARD, [443], sb.NETWORK_TLS_MODE_SKIP),
                                  ("other", OTHER, [8080], sb.NETWORK_TLS_MODE_SKIP),
                                  ("noskip", NOSKIP, [443], sb.NETWORK_TLS_MODE_UNSPECIFIED)):
        rule = p.network_policies[key]
        rule.name = key
        if key == "other":
            rule.endpoints.add(host=host, ports=ports, tls=tls)
        else:
            rule.endpoints.add(host=host, port=ports[0], tls=tls)
        rule.binaries.add(path="/usr/bin/python3")
    return p


def run(stub, name: str, command: "list[str]", stdin: bytes = b"", *,
        environment: "dict[str, str] | None" = None, login: bool = False) -> "tuple[int, str]":
    events = list(stub.ExecSandbox(pb.ExecSandboxRequest(
        workspace_scope=WS, sandbox=name, command=command, stdin=stdin,
        environment=environment or {}, no_login_shell=not login), timeout=60))
    out = b"".join(e.stdout.data for e in events if e.HasField("stdout")).decode()
    return events[-1].exit.exit_code, out


def probe(stub, name: str, *targets: dict) -> "list[str]":
    code, out = run(stub, name, ["python3", "-", json.dumps(list(targets))], PROBE)
    assert code == 0, out
    return json.loads(out)


def create(stub, name: str, asked: sb.SandboxPolicy) -> None:
    spec = pb.SandboxSpec(template=pb.SandboxTemplate(image="node:22"),
                          command=["sleep", "infinity"], policy=asked)
    stub.CreateSandbox(pb.CreateSandboxRequest(workspace_scope=WS, name=name, spec=spec),
                       timeout=30)
    wait_phase(stub, name, pb.SANDBOX_PHASE_READY)


@pytest.fixture(scope="module")
def jailed(fake, pki, servers):  # noqa: F811
    """A sandbox jailed to granted(), with the guard's certificate in
    /tmp/guard.pem: (stub, its jail as the fake describes it)."""
    with channel(fake, pki) as ch:
        stub = pbg.OpenShellStub(ch)
        create(stub, "jailed", granted())
        assert run(stub, "jailed", ["sh", "-c", "cat > /tmp/guard.pem"],
                   servers["tls"].pem.encode())[0] == 0
        jail = fake.state()["jails"]["jailed"]
        yield stub, jail
        delete(stub, "jailed")
        # The jail goes with the sandbox: network, rules, proxy.
        assert subprocess.run(["docker", "network", "inspect", jail["network"]],
                              capture_output=True).returncode != 0
        assert rules_with(jail["bridge"]) == []
    assert fake.live() == []


def test_the_proxy_tunnels_to_the_policys_endpoints_only(jailed, fake, servers):
    stub, jail = jailed
    gateway, port = jail["gateway"], servers["host"].port
    # On the host, the sandbox may reach the proxy's port and nothing else.
    assert jail["ports"] == [PROXY_PORT]
    accepts = [r for r in rules_with(jail["bridge"]) if "ACCEPT" in r]
    assert len(accepts) == 1 and f"--dport {PROXY_PORT}" in accepts[0], accepts
    results = probe(stub, "jailed",
                    # through the proxy, as a Python client goes
                    {"via": "tunnel", "host": GUARD, "port": 443, "ca": "/tmp/guard.pem"},
                    {"via": "tunnel", "host": OTHER, "port": 8080},      # plain HTTP inside
                    # tls: SKIP looks at nothing past the CONNECT line
                    {"via": "raw", "host": GUARD, "port": 443, "sni": OTHER,
                     "ca": "/tmp/guard.pem"},
                    # refused by the proxy
                    {"via": "tunnel", "host": OTHER, "port": 443, "ca": "/tmp/guard.pem"},
                    {"via": "tunnel", "host": GUARD, "port": 8080},      # another's port
                    {"via": "tunnel", "host": GUARD, "port": 80},
                    {"via": "tunnel", "host": gateway, "port": 443},     # an address
                    {"via": "tunnel", "host": NOSKIP, "port": 443, "ca": "/tmp/guard.pem"},
                    {"via": "forward", "url": f"http://{OTHER}:8080/"},
                    # going around the proxy
                    {"via": "resolve", "host": GUARD},
                    {"via": "resolve", "host": "example.com"},
                    {"via": "direct", "host": GUARD, "port": 443},
                    {"via": "direct", "host": gateway, "port": 443},
                    {"via": "direct", "host": gateway, "port": port},     # host services
                    {"via": "direct", "host": host_address(), "port": port},
                    {"via": "direct", "host": "172.17.0.1", "port": port},
                    {"via": "direct", "host": "1.1.1.1", "port": 443})   # the internet
    assert results[0] == "answer:guard-ok", results
    assert results[1] == "answer:http-ok", results
    assert results[2].endswith("guard-ok"), results
    assert results[3:8] == ["refused:403 Forbidden"] * 5, results
    assert results[8].startswith("status:501:"), results
    assert results[9:12] == ["unresolved"] * 3, results
    assert all(silent(r) for r in results[12:]), results
    assert not any(reached(r) for r in results[3:])
    assert servers["host"].seen == []
    # The TLS server saw the guard's name, and the other name only where
    # the raw client chose it inside the guard's tunnel; never NOSKIP.
    assert GUARD in servers["tls"].seen and NOSKIP not in servers["tls"].seen
    assert servers["tls"].seen.count(OTHER) == 1
    assert [h.split(":")[0] for h in servers["http"].seen] == [OTHER]
    proxy = fake.sandboxes["jailed"].jail.forwarder
    assert (f"CONNECT {NOSKIP}:443", "not skip") in proxy.log
    # No name is planted in the sandbox's hosts file, and it has no resolver.
    hosts = run(stub, "jailed", ["cat", "/etc/hosts"])[1]
    assert GUARD not in hosts and OTHER not in hosts
    assert "nameserver" not in run(stub, "jailed", ["cat", "/etc/resolv.conf"])[1]


def test_every_exec_is_pointed_at_the_proxy(jailed):
    stub, jail = jailed
    url = f"http://{jail['gateway']}:{PROXY_PORT}"
    asked = {"HTTPS_PROXY": "http://elsewhere.test:1", "HTTP_PROXY": "", "https_proxy": "x",
             "NO_PROXY": "*", "NODE_USE_ENV_PROXY": "0", "KEPT": "kept"}
    for login in (False, True):
        code, out = run(stub, "jailed", ["env"], environment=asked, login=login)
        assert code == 0, out
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
                     "grpc_proxy"):
            assert env[name] == url, (login, name, env)
        assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1,localhost,::1"
        assert env["NODE_USE_ENV_PROXY"] == "1"
        assert env["KEPT"] == "kept"


def test_the_policy_reads_back_with_its_hash(jailed):
    stub, _ = jailed
    config = stub.GetSandboxConfig(sb.GetSandboxConfigRequest(workspace_scope=WS,
                                                              name="jailed"), timeout=10)
    assert config.policy == granted()
    want = policy_hash(messages.decode(messages.SandboxPolicy,
                                       granted().SerializeToString(deterministic=True)))
    assert want and config.policy_hash == want


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
        assert "HTTPS_PROXY" not in run(stub, "vague", ["env"])[1]
        delete(stub, "vague")
    assert "vague" not in fake.live()
