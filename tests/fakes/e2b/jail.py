"""A sandbox's jail: egress to named endpoints only, enforced by the host,
for a fake whose sandboxes are docker containers.

A jail is three things, made in this order and undone in the reverse:

1. its own docker network, `--internal` (no route out through docker's
   NAT), on a /28 from a pool the fake owns (10.213.0.0/16 unless told
   otherwise: outside docker's default pools, 172.17-31/16 and
   192.168/16, and never more than a few addresses per sandbox, so jails
   do not eat the pools every other docker user on the host draws from).
   Its gateway, the first address, is an address of the host.
2. a forwarder (forwarder.py) in the fake's process on that gateway, at
   the ports the vendor's firewall would inspect (or, for a vendor whose
   sandboxes must go through an explicit proxy, that proxy, at its port).
3. host INPUT rules on the network's bridge: everything arriving from it
   is dropped except TCP to the gateway at those ports. These are needed:
   an internal network keeps routed traffic in, but every packet addressed
   to one of the host's own addresses (any bridge's gateway, the host's
   own IP) goes to INPUT, which accepts by default, so without them every
   host service on 0.0.0.0, and every other jail's forwarder, is in reach
   (measured on this project's CI host: /work/notes/guard-egress-experiment.md).
   IPv6 from the bridge is dropped too; nothing there is offered.

Everything is marked so that a fake that died without cleaning up can be
cleaned up after: networks carry the fake's label (its instance ID) and
an owner label (host name, PID and the PID's start time), rules carry the
comment `plimsoll-<instance ID>`. A fake's start sweeps what belongs to a
fake instance whose owner process is certainly gone, and nothing else.
This needs root: iptables, and ports 80 and 443 on the gateway.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import threading
import time
from typing import Callable

from container import LABEL
from forwarder import Forwarder, ResolveTable

DEFAULT_POOL = "10.213.0.0/16"
SUBNET_PREFIX = 28
OWNER_LABEL = f"{LABEL}.owner"
SANDBOX_LABEL = f"{LABEL}.sandbox"
COMMENT_PREFIX = "plimsoll-"
# Only rules whose comment is exactly this are ever swept: a fake's.
_FAKE_COMMENT = re.compile(r"^plimsoll-(fake-(?:e2b|openshell)-[a-z0-9]+)$")
_NETWORK_RM_TRIES = 50  # a container's endpoint can outlive `docker rm -f` briefly


class JailError(RuntimeError):
    """A jail that could not be made (docker, iptables, or the pool)."""


def owner_tag(pid: "int | None" = None) -> str:
    """Who owns a jail: host name, PID, and that PID's start time (so a
    reused PID is not mistaken for the owner)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{pid}/{_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    """False only when the owner is certainly gone: same host, and its PID
    is not running or is another process. An owner on another host (a
    fake in another container sharing this docker) cannot be judged here,
    so it counts as alive."""
    host, pid, start = (tag.split("/") + ["", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    return _start_time(int(pid)) == start


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    # The command name may hold spaces and parentheses: fields are counted
    # from after its closing parenthesis (state is field 3, starttime 22).
    # A zombie is dead already: killed, waiting for its parent to read it.
    fields = stat.rsplit(")", 1)[1].split()
    return "" if fields[0] in ("Z", "X") else fields[19]


class Jail:
    """One sandbox's network, forwarder and rules; `close` undoes them."""

    def __init__(self, jails: "Jails", network: str, network_id: str,
                 subnet: ipaddress.IPv4Network) -> None:
        self.jails, self.network, self.network_id, self.subnet = jails, network, network_id, subnet
        self.gateway = str(subnet.network_address + 1)
        self.bridge = "br-" + network_id[:12]  # docker's name for the bridge it made
        self.forwarder: "Forwarder | None" = None
        self.rules: "list[tuple[str, list[str]]]" = []  # (binary, spec), as added
        self._closed = False

    def describe(self) -> dict:
        forwarder = self.forwarder
        return {"network": self.network, "bridge": self.bridge, "subnet": str(self.subnet),
                "gateway": self.gateway, "ports": sorted(forwarder.ports) if forwarder else [],
                "counts": dict(forwarder.counts) if forwarder else {}}

    def _add_rules(self, ports: "list[int]") -> None:
        # Inserted at the top of INPUT: the DROP first, then each ACCEPT
        # above it, so the ACCEPTs are matched first.
        self._add(self.jails.iptables, self._spec("-j", "DROP"))
        for port in ports:
            self._add(self.jails.iptables, self._spec("-p", "tcp", "-d", self.gateway,
                                                      "--dport", str(port), "-j", "ACCEPT"))
        if self.jails.ip6tables:
            self._add(self.jails.ip6tables, self._spec("-j", "DROP"))

    def _spec(self, *rule: str) -> "list[str]":
        return ["INPUT", "-i", self.bridge, "-m", "comment", "--comment", self.jails.comment,
                *rule]

    def _add(self, binary: str, spec: "list[str]") -> None:
        done = _run([binary, "-w", "-I", spec[0], "1", *spec[1:]])
        if done.returncode != 0:
            raise JailError(f"{binary}: {done.stderr.strip()}")
        self.rules.append((binary, spec))

    def close(self) -> None:
        """Rules first (so nothing reaches the host through a half-removed
        jail), then the forwarder, then the network. The sandbox's
        container must be gone (or disconnected) for the network to go."""
        if self._closed:
            return
        self._closed = True
        for binary, spec in reversed(self.rules):
            _run([binary, "-w", "-D", *spec])
        self.rules = []
        if self.forwarder is not None:
            self.forwarder.close()
        _remove_network(self.jails.docker, self.network_id)


class Jails:
    """Makes jails for one fake instance, and sweeps a dead instance's."""

    def __init__(self, instance_id: str, resolve: ResolveTable, *, pool: str = DEFAULT_POOL,
                 docker: str = "docker", iptables: str = "iptables",
                 ip6tables: str = "ip6tables") -> None:
        self.instance_id, self.resolve, self.docker = instance_id, resolve, docker
        self.pool = ipaddress.ip_network(pool)
        if self.pool.version != 4 or self.pool.prefixlen > SUBNET_PREFIX:
            raise ValueError(f"the jail pool {pool} must be IPv4 and hold a /{SUBNET_PREFIX}")
        self._slots = 2 ** (SUBNET_PREFIX - self.pool.prefixlen)
        # A random first slot, so fakes side by side rarely try the same one.
        self._next = random.randrange(self._slots)
        self._lock = threading.Lock()
        self.iptables = iptables
        self.ip6tables = ip6tables if shutil.which(ip6tables) else None
        self.comment = COMMENT_PREFIX + instance_id
        self.owner = owner_tag()

    def open(self, sandbox_id: str, ports: "dict[int, str]",
             allows: "Callable[[str, int], bool]") -> Jail:
        """A jail for a sandbox about to be created: its network exists, its
        forwarder listens, its rules are in. `ports` is {port: how the
        forwarder reads the name}; `allows(name, port)` is asked per
        connection."""
        return self.open_serving(
            sandbox_id, lambda gateway: Forwarder(gateway, ports, allows, self.resolve).start())

    def open_serving(self, sandbox_id: str, serve: "Callable[[str], Forwarder]") -> Jail:
        """A jail whose gateway is served by what `serve(gateway address)`
        starts: a Forwarder, or anything shaped like one (`ports`, `counts`,
        `close`), such as an explicit proxy. The rules let the sandbox reach
        exactly the ports it listens on, and nothing else."""
        jail = self._network(sandbox_id)
        try:
            jail.forwarder = serve(jail.gateway)
            jail._add_rules(sorted(jail.forwarder.ports))
        except (OSError, JailError) as e:
            jail.close()
            raise JailError(f"cannot make the sandbox's jail: {e}") from None
        return jail

    def _network(self, sandbox_id: str) -> Jail:
        # A random suffix: a sandbox name may be used again (fake-openshell)
        # while an earlier network of that name is still being removed.
        name = f"{COMMENT_PREFIX}{self.instance_id}-{sandbox_id}-{secrets.token_hex(3)}"
        for _ in range(min(self._slots, 256)):
            with self._lock:
                slot, self._next = self._next, (self._next + 1) % self._slots
            subnet = ipaddress.ip_network(
                (int(self.pool.network_address) + slot * 2 ** (32 - SUBNET_PREFIX), SUBNET_PREFIX))
            done = _run([self.docker, "network", "create", "--internal",
                         "--subnet", str(subnet), "--gateway", str(subnet.network_address + 1),
                         "--label", f"{LABEL}={self.instance_id}",
                         "--label", f"{OWNER_LABEL}={self.owner}",
                         "--label", f"{SANDBOX_LABEL}={sandbox_id}", name])
            if done.returncode == 0:
                return Jail(self, name, done.stdout.strip(), subnet)
            if "overlap" not in done.stderr:  # a slot taken (by another fake) is tried past
                raise JailError(f"docker network create: {done.stderr.strip()}")
        raise JailError(f"no free /{SUBNET_PREFIX} left in the jail pool {self.pool}")

    # ---- what a crash left ---------------------------------------------------------------

    def sweep(self) -> "dict[str, int]":
        """Removes the rules and networks of fake instances whose owner is
        certainly gone (and any container of that instance still on such a
        network, without which the network cannot go). Rules are listed
        before networks: a live fake adds a jail's rules only after its
        network and removes them before it, so a rule whose instance has
        no network owned by a live process is a dead fake's."""
        rules = self._fake_rules()
        networks = self._fake_networks()
        live = {self.instance_id} | {labels.get(LABEL) for _, labels in networks
                                     if owner_alive(labels.get(OWNER_LABEL, ""))}
        swept = {"rules": 0, "networks": 0}
        for binary, spec, instance in rules:
            if instance not in live and _run([binary, "-w", "-D", *spec]).returncode == 0:
                swept["rules"] += 1
        for network_id, labels in networks:
            if owner_alive(labels.get(OWNER_LABEL, "")):
                continue
            self._remove_containers(network_id, labels.get(LABEL, ""))
            if _remove_network(self.docker, network_id):
                swept["networks"] += 1
        return swept

    def remove_own(self) -> None:
        """This instance's rules and networks, whatever is left of them (a
        jail whose close failed): called when the fake stops."""
        for binary, spec, instance in self._fake_rules():
            if instance == self.instance_id:
                _run([binary, "-w", "-D", *spec])
        for network_id, labels in self._fake_networks():
            if labels.get(LABEL) == self.instance_id:
                self._remove_containers(network_id, self.instance_id)
                _remove_network(self.docker, network_id)

    def _fake_rules(self) -> "list[tuple[str, list[str], str]]":
        found = []
        for binary in filter(None, (self.iptables, self.ip6tables)):
            done = _run([binary, "-w", "-S", "INPUT"])
            for line in done.stdout.splitlines() if done.returncode == 0 else []:
                words = shlex.split(line)
                if words[:1] != ["-A"] or "--comment" not in words:
                    continue
                match = _FAKE_COMMENT.match(words[words.index("--comment") + 1])
                if match:
                    found.append((binary, words[1:], match.group(1)))
        return found

    def _fake_networks(self) -> "list[tuple[str, dict]]":
        done = _run([self.docker, "network", "ls", "-q", "--no-trunc",
                     "--filter", f"label={OWNER_LABEL}"])
        ids = done.stdout.split()
        if done.returncode != 0 or not ids:
            return []
        done = _run([self.docker, "network", "inspect", "--format",
                     "{{.Id}} {{json .Labels}}", *ids])
        networks = []
        for line in done.stdout.splitlines():
            network_id, _, labels = line.partition(" ")
            try:
                networks.append((network_id, json.loads(labels) or {}))
            except ValueError:
                continue
        return networks

    def _remove_containers(self, network_id: str, instance: str) -> None:
        if not instance:
            return
        done = _run([self.docker, "ps", "-aq", "--filter", f"network={network_id}",
                     "--filter", f"label={LABEL}={instance}"])
        if done.stdout.split():
            _run([self.docker, "rm", "-f", *done.stdout.split()])


def _remove_network(docker: str, network_id: str) -> bool:
    for _ in range(_NETWORK_RM_TRIES):
        done = _run([docker, "network", "rm", network_id])
        if done.returncode == 0:
            return True
        if "No such network" in done.stderr or "not found" in done.stderr:
            return False
        time.sleep(0.1)  # "has active endpoints": the container is still going
    return False


def _run(argv: "list[str]") -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 127, "", str(e))
