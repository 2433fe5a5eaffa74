"""fake-e2b's jail, shown from inside the sandbox: a sandbox created with
everything denied but a domain reaches that domain's server (on loopback
here, through the fake's `--resolve` table) by name over TLS, end to end,
and reaches nothing else: not another port on its gateway, not a host
service, not docker's bridge, not the internet, not a name it was not
given, not another sandbox's jail. The jail goes with the sandbox, a
network update changes what passes for the next connection, and a crashed
fake's jails are swept by the next fake to start.

Run: .venv-e2b/bin/python -m pytest -q tests/fakes/e2b (part of `make
test`; needs root for iptables, docker, the plimsoll/sandbox:bookworm
image and the `e2b` package; nothing here skips).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from container import LABEL, docker_available  # noqa: E402
from fake_e2b import FakeE2B  # noqa: E402
from jail import OWNER_LABEL, owner_tag  # noqa: E402
from outside import PROBE, Greeter, TlsServer, host_address, reached, silent  # noqa: E402
from test_fake_e2b import API_KEY, api, sdk_opts  # noqa: E402

GUARD = "guard.plimsoll.test"
OTHER = "other.test"  # resolvable by the fake, never allowed unless a test says so
ALL = "0.0.0.0/0"
# The body plimsoll's E2B adapter sends for a granted run (POST /sandboxes).
GRANTED = {"templateID": "base", "timeout": 120, "secure": True, "allow_internet_access": False,
           "network": {"denyOut": [ALL], "allowOut": [GUARD], "allowPublicTraffic": False}}


# ---- the servers outside, and probing from inside ------------------------------------------

@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    """The daemon's guard, as far as a sandbox can tell: TLS on loopback
    with a certificate for guard.plimsoll.test (and other.test)."""
    server = TlsServer(tmp_path_factory.mktemp("guard"), [GUARD, OTHER])
    yield server
    server.close()


@pytest.fixture(scope="module")
def host_service():
    server = Greeter()
    yield server
    server.close()


@pytest.fixture(scope="module")
def fake(guard):
    assert docker_available(), "docker is not available"
    server = FakeE2B(API_KEY, resolve=[f"{GUARD}:443=127.0.0.1:{guard.port}",
                                       f"{OTHER}:443=127.0.0.1:{guard.port}"]).start()
    yield server
    server.stop()
    assert own_networks(server) == [] and own_rules(server) == []


@pytest.fixture(autouse=True)
def no_sandbox_left(fake):
    yield
    for sandbox in fake.registry.all():
        fake.registry.remove(sandbox.id)


@pytest.fixture(scope="module")
def sdk():
    import e2b

    return e2b


def own_networks(fake: FakeE2B) -> "list[str]":
    return subprocess.run(["docker", "network", "ls", "-q", "--filter",
                           f"label={LABEL}={fake.instance_id}"],
                          capture_output=True, text=True).stdout.split()


def own_rules(fake: FakeE2B, text: "str | None" = None) -> "list[str]":
    rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True,
                           text=True).stdout.splitlines()
    return [r for r in rules if (text or f"plimsoll-{fake.instance_id}") in r]


def inside(fake: FakeE2B, sandbox_id: str, script: str, *args: str,
           stdin: "str | None" = None) -> str:
    """Runs a shell script in the sandbox as its user, with docker exec:
    the adapter's create asks for `allowPublicTraffic: false`, which the
    fake enforces on envd with a traffic token the SDK does not send."""
    container = fake.registry.get(sandbox_id).container
    done = subprocess.run(["docker", "exec", "-i", "-u", "user", "-w", "/home/user", container,
                           "sh", "-c", script, "probe", *args],
                          input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def prepare(fake: FakeE2B, sandbox_id: str, guard) -> None:
    inside(fake, sandbox_id, "cat > /tmp/guard.pem", stdin=guard.pem)


def probe(fake: FakeE2B, sandbox_id: str, *targets: dict) -> "list[str]":
    return json.loads(inside(fake, sandbox_id, 'python3 - "$1"', json.dumps(list(targets)),
                             stdin=PROBE))


def by_name(name: str = GUARD, verify: bool = True) -> dict:
    return {"host": name, "port": 443, "sni": name, **({"ca": "/tmp/guard.pem"} if verify else {})}


def jail_of(fake: FakeE2B, sandbox_id: str) -> dict:
    return fake.state()["jails"][sandbox_id]


# ---- the tests ---------------------------------------------------------------------------------

def test_a_granted_sandbox_reaches_its_guard_and_nothing_else(fake, sdk, guard, host_service):
    from e2b import ALL_TRAFFIC, Sandbox

    status, _, created = api(fake, "POST", "/sandboxes", GRANTED)
    assert status == 201, created
    a = created["sandboxID"]
    b = Sandbox.create(timeout=120, allow_internet_access=False,
                       network={"deny_out": [ALL_TRAFFIC], "allow_out": [GUARD]},
                       **sdk_opts(fake))
    prepare(fake, a, guard)
    prepare(fake, b.sandbox_id, guard)
    gateway, b_gateway = jail_of(fake, a)["gateway"], jail_of(fake, b.sandbox_id)["gateway"]
    port = host_service.port
    # The name resolves to the sandbox's own gateway, without DNS.
    assert b.commands.run(f"getent hosts {GUARD}").stdout.split()[0] == b_gateway
    assert inside(fake, a, f"getent hosts {GUARD}").split()[0] == gateway
    results = probe(fake, a,
                    by_name(),                                        # the guard, TLS verified
                    {"host": gateway, "port": 443, "sni": GUARD},     # by address, same SNI
                    {"host": GUARD, "port": 80},                      # allowed, but no :80 entry
                    {"host": gateway, "port": 443, "sni": OTHER},     # resolvable, not allowed
                    {"host": gateway, "port": 443},                   # no TLS: no name at all
                    {"host": gateway, "port": port},                  # another port on the gateway
                    {"host": host_address(), "port": port},           # the host's own address
                    {"host": "172.17.0.1", "port": port},             # docker0's gateway
                    {"host": "1.1.1.1", "port": 443, "sni": GUARD},   # the internet
                    {"host": b_gateway, "port": 443, "sni": GUARD})   # b's jail
    assert reached(results[0]) and results[0].endswith("guard-ok"), results
    assert reached(results[1]), results
    assert not any(reached(r) for r in results[2:]), results
    # Accepted and then closed where the forwarder refused; silence where
    # the host's rules drop.
    assert all(r.startswith("closed:") for r in results[2:5]), results
    assert all(silent(r) for r in results[5:]), results
    assert host_service.seen == []
    from_b = probe(fake, b.sandbox_id, by_name(), {"host": gateway, "port": 443, "sni": GUARD})
    assert reached(from_b[0]) and from_b[1] == "timeout", from_b
    # TLS was the sandbox's own, end to end: the guard saw its SNI.
    assert GUARD in guard.seen and OTHER not in guard.seen
    # Read back as asked.
    info = Sandbox.get_info(a, **sdk_opts(fake))
    assert info.allow_internet_access is False
    assert info.network["allow_out"] == [GUARD] and info.network["deny_out"] == [ALL]


def test_the_jail_goes_with_the_sandbox(fake, sdk):
    from e2b import ALL_TRAFFIC, Sandbox

    def gone(jail: dict) -> bool:
        network = subprocess.run(["docker", "network", "inspect", jail["network"]],
                                 capture_output=True)
        rules = own_rules(fake, jail["bridge"])
        # Listening sockets on the gateway, as the host lists them (a
        # connection attempt would prove nothing once the address is gone:
        # it would be routed out of the host).
        listening = subprocess.run(["ss", "-Hltn", f"src {jail['gateway']}"],
                                   capture_output=True, text=True).stdout.strip()
        return network.returncode != 0 and rules == [] and listening == ""

    sbx = Sandbox.create(timeout=120, network={"deny_out": [ALL_TRAFFIC], "allow_out": [GUARD]},
                         **sdk_opts(fake))
    jail = jail_of(fake, sbx.sandbox_id)
    assert len(own_rules(fake, jail["bridge"])) == 3  # the DROP and ports 443 and 80
    sbx.kill()
    assert gone(jail)
    # By its timeout too.
    sbx = Sandbox.create(timeout=1, network={"deny_out": [ALL_TRAFFIC], "allow_out": [GUARD]},
                         **sdk_opts(fake))
    jail = jail_of(fake, sbx.sandbox_id)
    deadline = time.monotonic() + 20  # the reaper forgets it first, then takes it down
    while not gone(jail) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake.registry.get(sbx.sandbox_id) is None and gone(jail)
    assert own_networks(fake) == []


def test_a_network_update_changes_what_passes_next(fake, sdk, guard):
    from e2b import ALL_TRAFFIC, Sandbox
    from e2b.exceptions import SandboxException

    status, _, created = api(fake, "POST", "/sandboxes", GRANTED)
    assert status == 201, created
    sid = created["sandboxID"]
    prepare(fake, sid, guard)
    assert reached(probe(fake, sid, by_name())[0])
    # Refused, and nothing changes: a domain without ALL_TRAFFIC denied
    # (E2B's own 400, with or without allow_internet_access false), and an
    # update that would open everything (omitted fields are cleared).
    with pytest.raises(SandboxException, match="0.0.0.0/0"):
        Sandbox.update_network(sid, {"allow_out": [GUARD]}, **sdk_opts(fake))
    path = f"/sandboxes/{sid}/network"
    for body, complaint in (({"allow_internet_access": False, "allowOut": [GUARD]}, "0.0.0.0/0"),
                            ({}, "not implemented"), ({"denyOut": ["10.0.0.0/8"]}, "per-dest"),
                            ({"denyOut": [ALL], "allowOut": ["8.8.8.8"]}, "per-dest"),
                            ({"denyOut": [ALL], "dnsServers": []}, "unknown field"),
                            ({"denyOut": [ALL], "egressProxy": {"address": "x:1"}}, "not impl")):
        status, _, answer = api(fake, "PUT", path, body)
        assert status == 400 and complaint in answer["message"], (body, answer)
    assert reached(probe(fake, sid, by_name())[0])
    # Another name instead: the guard is refused from the next connection
    # on, and the new name resolves and passes.
    Sandbox.update_network(sid, {"deny_out": [ALL_TRAFFIC], "allow_out": [OTHER]},
                           **sdk_opts(fake))
    after = probe(fake, sid, by_name(), by_name(OTHER))
    assert after[0].startswith("closed:") and reached(after[1]), after
    # Read back: the new egress rules, the ingress setting as it was, and
    # allow_internet_access cleared (the update omitted it).
    info = Sandbox.get_info(sid, **sdk_opts(fake))
    assert info.network["allow_out"] == [OTHER] and info.network["deny_out"] == [ALL]
    assert info.network["allow_public_traffic"] is False and info.allow_internet_access is None
    # Nothing allowed: nothing passes (the jail stays and refuses).
    assert api(fake, "PUT", path, {"denyOut": [ALL]})[0] == 204
    assert not any(reached(r) for r in probe(fake, sid, by_name(), by_name(OTHER)))
    assert "allow_out" not in Sandbox.get_info(sid, **sdk_opts(fake)).network
    # Unknown (404), paused (409).
    assert api(fake, "PUT", "/sandboxes/nosuchsandbox/network", {"denyOut": [ALL]})[0] == 404
    fake.pause(sid)
    assert api(fake, "PUT", path, {"denyOut": [ALL]})[0] == 409


def test_an_update_jails_a_sandbox_that_had_no_network(fake, sdk, guard):
    from e2b import ALL_TRAFFIC, Sandbox

    sbx = Sandbox.create(timeout=120, allow_internet_access=False, **sdk_opts(fake))
    prepare(fake, sbx.sandbox_id, guard)
    assert sbx.commands.run("ls /sys/class/net").stdout.split() == ["lo"]
    sbx.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": [GUARD]})
    assert sbx.commands.run("ls /sys/class/net").stdout.split() == ["eth0", "lo"]
    gateway = jail_of(fake, sbx.sandbox_id)["gateway"]
    results = probe(fake, sbx.sandbox_id, by_name(),
                    {"host": "1.1.1.1", "port": 443, "sni": GUARD},
                    {"host": gateway, "port": 443, "sni": OTHER})
    assert reached(results[0]) and not any(reached(r) for r in results[1:]), results
    # A sandbox with the whole way out is not narrowed by the fake, nor one
    # with none opened: refused, not pretended.
    path = f"/sandboxes/{sbx.sandbox_id}/network"
    assert api(fake, "PUT", path, {"allow_internet_access": True})[0] == 400
    opened = Sandbox.create(timeout=60, **sdk_opts(fake))
    status, _, answer = api(fake, "PUT", f"/sandboxes/{opened.sandbox_id}/network",
                            {"denyOut": [ALL]})
    assert status == 400 and "not implemented" in answer["message"]
    assert api(fake, "PUT", f"/sandboxes/{opened.sandbox_id}/network", {})[0] == 204
    jail = jail_of(fake, sbx.sandbox_id)
    sbx.kill()
    assert subprocess.run(["docker", "network", "inspect", jail["network"]],
                          capture_output=True).returncode != 0
    assert own_rules(fake, jail["bridge"]) == []


def test_a_new_fake_sweeps_what_a_dead_one_left(fake, guard):
    """A jail whose owner process is gone (its network and its rule) is
    removed by the next fake to start; one whose owner lives is left."""
    dead, alive = "fake-e2b-deadinstance01", "fake-e2b-liveinstance01"
    made = []
    try:
        for instance, owner, subnet in ((dead, f"{socket.gethostname()}/999999999/1",
                                         "10.214.255.0/28"),
                                        (alive, owner_tag(), "10.214.255.16/28")):
            made.append(subprocess.run(
                ["docker", "network", "create", "--internal", "--subnet", subnet,
                 "--label", f"{LABEL}={instance}", "--label", f"{OWNER_LABEL}={owner}",
                 f"plimsoll-{instance}"], capture_output=True, text=True, check=True
            ).stdout.strip())
            subprocess.run(["iptables", "-I", "INPUT", "-i", f"br-{made[-1][:12]}", "-m",
                            "comment", "--comment", f"plimsoll-{instance}", "-j", "DROP"],
                           check=True)
        other = FakeE2B(API_KEY).start()
        other.stop()
        assert other.swept == {"rules": 1, "networks": 1}
        left = subprocess.run(["docker", "network", "ls", "-q", "--no-trunc"],
                              capture_output=True, text=True).stdout.split()
        assert made[0] not in left and made[1] in left
        assert own_rules(fake, f"plimsoll-{dead}") == []
        assert len(own_rules(fake, f"plimsoll-{alive}")) == 1
    finally:
        for rule in own_rules(fake, "plimsoll-fake-e2b-"):
            if dead in rule or alive in rule:
                subprocess.run(["iptables", "-D", *rule.split()[1:]])
        for network in made:
            subprocess.run(["docker", "network", "rm", network], capture_output=True)


def test_command_line_resolve_flag(tmp_path):
    bad = subprocess.run([sys.executable, str(HERE / "fake_e2b.py"), "--api-key", "k",
                          "--resolve", "guard.plimsoll.test=127.0.0.1:1"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--resolve" in bad.stderr

