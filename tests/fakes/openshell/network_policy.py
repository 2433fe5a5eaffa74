"""A sandbox policy's network part, as fake-openshell enforces it.

OpenShell: "If no `network_policies` entry matches the destination host,
port, and calling binary, the proxy denies the connection." The fake
gives a sandbox whose policy names endpoints a jail (../e2b/jail.py): its
own network, whose forwarder listens on the gateway at exactly the ports
the endpoints name, reads the name a connection is for (TLS SNI, or the
HTTP Host header: whichever the first bytes show) and passes it only when
some endpoint has that host and that port. The binaries are not checked:
the fake sees a connection arrive on the host, with no process behind it
it could name (README.md).

Three outcomes, from the stored policy:

- `open` (docker's bridge network): no policy at all (the supervisor
  would take its image's, which the fake never runs; README.md);
- `none` (only `lo`): no endpoint with a host and a port, so nothing can
  match;
- `jail`: the endpoints.
"""

from __future__ import annotations

import ipaddress
import re

import messages as m
from protowire import decode

# Any port may carry TLS or plain HTTP: the forwarder looks at the first byte.
READER = "sniff"


def endpoints(policy: dict) -> "list[tuple[str, tuple[int, ...]]]":
    """(host, ports) for each endpoint of each `network_policies` entry
    that names both. `port` is "Single port (backwards compat). Use `ports`
    for multiple ports. Mutually exclusive with `ports` — if both are set,
    `ports` takes precedence." (`proto/sandbox.proto`)"""
    found = []
    for raw in policy.get("network_policies") or []:
        rule = decode(m.NetworkPolicyEntry, raw).get("value") or {}
        for endpoint in rule.get("endpoints") or []:
            given = endpoint.get("ports") or [endpoint.get("port", 0)]
            ports = tuple(sorted({p for p in given if 0 < p < 65536}))
            host = (endpoint.get("host") or "").strip().rstrip(".").lower()
            if host and ports:
                found.append((host, ports))
    return found


def network_for(policy: "dict | None") -> "tuple[str, list[tuple[str, tuple[int, ...]]]]":
    """(`open` | `none` | `jail`, the endpoints)."""
    if policy is None:
        return "open", []
    found = endpoints(policy)
    return ("jail" if found else "none"), found


def host_matches(name: str, pattern: str) -> bool:
    """OpenShell's host matching (`proto/sandbox.proto`: "Exact match is
    case-insensitive. Glob patterns use "." as delimiter: "*.example.com"
    matches a single subdomain label, "**.example.com" matches across
    labels."; the policy schema allows a `*` "inside the first DNS label
    only", as in `*-aiplatform.googleapis.com`)."""
    name, pattern = name.lower(), pattern.lower()
    if "*" not in pattern:
        return name == pattern
    first, _, rest = pattern.partition(".")
    labels = name.split(".")
    if first == "**":
        return len(labels) > rest.count(".") + 1 and name.endswith("." + rest)
    head, _, tail = name.partition(".")
    label = "[^.]*".join(re.escape(part) for part in first.split("*"))
    return tail == rest and re.fullmatch(label, head) is not None


class EndpointGate:
    """Whether a (name, port) matches an endpoint; asked per connection."""

    def __init__(self, found: "list[tuple[str, tuple[int, ...]]]") -> None:
        self.endpoints = list(found)

    def ports(self) -> "dict[int, str]":
        return {port: READER for _, ports in self.endpoints for port in ports}

    def allows(self, name: str, port: int) -> bool:
        return any(port in ports and host_matches(name.lower(), host)
                   for host, ports in self.endpoints)

    def hosts(self, address: str) -> "list[tuple[str, str]]":
        """/etc/hosts lines pointing each named host at the jail's gateway
        (a glob or an IP literal names no line)."""
        names = {host for host, _ in self.endpoints
                 if "*" not in host and not _is_address(host)}
        return [(name, address) for name in sorted(names)]


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
