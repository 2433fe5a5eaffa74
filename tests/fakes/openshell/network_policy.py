"""A sandbox policy's network part, as fake-openshell enforces it.

OpenShell: "If no `network_policies` entry matches the destination host,
port, and calling binary, the proxy denies the connection." The fake
gives a sandbox whose policy names endpoints a jail (../e2b/jail.py): its
own network, from which only the jail's explicit proxy (egress_proxy.py)
can be reached; the proxy asks this module, per CONNECT, whether the host
and port it names match an endpoint. The binaries are not checked: the
fake sees a connection arrive on the host, with no process behind it it
could name (README.md).

Three outcomes, from the stored policy:

- `open` (docker's bridge network): no policy at all (the supervisor
  would take its image's, which the fake never runs; README.md);
- `none` (only `lo`): no endpoint with a host and a port, so nothing can
  match;
- `jail`: the endpoints.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import messages as m
from protowire import decode

TLS_SKIP = m.NetworkTlsMode["SKIP"]


class Endpoint(NamedTuple):
    host: str                  # lowercased, no trailing dot; may be a glob
    ports: "tuple[int, ...]"
    tls: int                   # NetworkTlsMode


def endpoints(policy: dict) -> "list[Endpoint]":
    """Each endpoint of each `network_policies` entry that names both a
    host and a port. `port` is "Single port (backwards compat). Use `ports`
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
                found.append(Endpoint(host, ports, endpoint.get("tls", 0)))
    return found


def network_for(policy: "dict | None") -> "tuple[str, list[Endpoint]]":
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


# What the gate answers for a CONNECT target.
ALLOW, DENY, NOT_SKIP = "allow", "deny", "not-skip"


class EndpointGate:
    """Whether a (name, port) a CONNECT names may be tunnelled; asked per
    connection, so it always reflects the sandbox's endpoints."""

    def __init__(self, found: "list[Endpoint]") -> None:
        self.endpoints = list(found)

    def decide(self, name: str, port: int) -> str:
        """ALLOW when an endpoint matches and every matching endpoint says
        `tls: SKIP` (a raw tunnel, the only relay the fake has); NOT_SKIP
        when one matches without it: OpenShell would then terminate TLS
        with its own CA, which the fake does not do (README.md), and
        OpenShell reads the mode from the first matching endpoint only, so
        two that disagree are refused too. DENY otherwise."""
        matching = [e for e in self.endpoints
                    if port in e.ports and host_matches(name.lower(), e.host)]
        if not matching:
            return DENY
        return ALLOW if all(e.tls == TLS_SKIP for e in matching) else NOT_SKIP
