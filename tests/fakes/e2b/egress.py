"""E2B's egress rules as fake-e2b reads them (README.md, "Egress"): what a
create or a network update asks for, turned into one of the three things
a container can honestly be given, or refused.

- `open`: docker's bridge network, the whole way out (nothing denied).
- `none`: no network at all (everything denied, nothing allowed).
- `jail`: everything denied but some domains (jail.py): a forwarder on
  the jail's gateway reads the name on port 443 (TLS SNI) and port 80 (the
  HTTP Host header), as E2B's firewall does, and passes only a name that
  matches an allowed domain, asked afresh for each connection.

Anything else (an IP or CIDR allowed beside a denial, a denial that is not
all traffic) is a per-destination rule the fake does not enforce: refused
with 400 saying so, never widened or narrowed in silence.
"""

from __future__ import annotations

import ipaddress
import re
import threading

ALL_TRAFFIC = "0.0.0.0/0"  # what E2B's SDKs name ALL_TRAFFIC
# The ports whose traffic E2B's firewall filters by name, and how it reads
# the name on each ("Domain-based filtering only works for HTTP traffic on
# port 80 (via Host header inspection) and TLS traffic on port 443 (via SNI
# inspection)").
DOMAIN_PORTS = {443: "sni", 80: "host"}
_DOMAIN = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,}")
# The egress fields of a network config; the others (allowPublicTraffic,
# maskRequestHost) are about traffic into the sandbox, which a network
# update leaves as it was.
EGRESS_FIELDS = ("allowOut", "denyOut", "egressProxy", "rules", "dnsServers")


class Refused(Exception):
    """A network config refused with 400: E2B's own refusal, or one the
    fake cannot honour (the message says which)."""


def is_address(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
        return True
    except ValueError:
        return False


def is_domain(entry: str) -> bool:
    return _DOMAIN.fullmatch(entry.lower()) is not None


def check_entries(network: dict, where: str) -> None:
    """allowOut entries are IPs, CIDRs or domains; denyOut entries IPs or
    CIDRs ("Domain names are not supported for deny rules.")."""
    for entry in network.get("allowOut") or []:
        if not (is_address(entry) or is_domain(entry)):
            raise Refused(f"{where}.allowOut: {entry!r} is not a CIDR or IP or domain")
    for entry in network.get("denyOut") or []:
        if not is_address(entry):
            raise Refused(f"{where}.denyOut: {entry!r} is not a CIDR or IP")
    for name in ("egressProxy", "rules"):
        if network.get(name):
            raise Refused(f"{where}.{name}: not implemented by fake-e2b")


def decide(allow_internet_access: "bool | None", network: dict) -> "tuple[str, list[str]]":
    """(`open` | `none` | `jail`, the allowed domains) for checked entries.

    E2B's default is the way out. `allow_internet_access: false` is
    `denyOut: ["0.0.0.0/0"]` (the spec says so), allowed entries win over
    denied ones, and what neither list matches is allowed. A domain in
    allowOut needs `0.0.0.0/0` in the body's own denyOut, which E2B checks
    before it applies `allow_internet_access` (so the flag alone does not
    do)."""
    allow_out = [e.lower() for e in network.get("allowOut") or []]
    deny_out = list(network.get("denyOut") or [])
    domains = [e for e in allow_out if not is_address(e)]
    addresses = [e for e in allow_out if is_address(e)]
    if domains and ALL_TRAFFIC not in deny_out:
        # E2B's API refuses it: a domain can only be allowed out of a
        # sandbox whose traffic is otherwise all denied.
        raise Refused("network.allowOut: domains need network.denyOut to hold "
                      f"{ALL_TRAFFIC} (ALL_TRAFFIC)")
    if allow_internet_access is False:
        deny_out = deny_out + [ALL_TRAFFIC]
    if not deny_out:
        return "open", []  # nothing denied: allowOut alone narrows nothing
    if ALL_TRAFFIC in deny_out and not addresses:
        # Everything denied; other denials are inside it.
        return ("jail" if domains else "none"), _unique(domains)
    raise Refused("network: per-destination egress rules (an IP or CIDR in allowOut beside a "
                  f"denial, or a denyOut other than {ALL_TRAFFIC}) are not implemented by "
                  "fake-e2b; it gives a sandbox the whole network (nothing denied), none "
                  f"(everything denied), or everything denied but domains in allowOut "
                  f"(denyOut {ALL_TRAFFIC}, allowOut domains only)")


def match_domain(name: str, pattern: str) -> bool:
    """E2B's matching: the exact name (any case), or under a `*.x.com`
    pattern any name ending in `.x.com`, at any depth (not `x.com` itself)."""
    name, pattern = name.lower(), pattern.lower()
    return name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:]))


def after_update(current: "dict | None", body: dict) -> "dict | None":
    """The network a sandbox reads back after `PUT /sandboxes/{id}/network`:
    "Replaces the current egress rules with the provided configuration.
    Omitting field clears it." Ingress settings stay as they were."""
    kept = {k: v for k, v in (current or {}).items() if k not in EGRESS_FIELDS}
    given = {k: v for k, v in body.items() if k in EGRESS_FIELDS}
    return {**kept, **given} or None


class DomainGate:
    """A jailed sandbox's allowed domains, read by its forwarder for each
    new connection and replaced by a network update."""

    def __init__(self, domains: "list[str]") -> None:
        self._lock = threading.Lock()
        self._domains = list(domains)

    @property
    def domains(self) -> "list[str]":
        with self._lock:
            return list(self._domains)

    def set(self, domains: "list[str]") -> None:
        with self._lock:
            self._domains = list(domains)

    def allows(self, name: str, port: int) -> bool:
        return port in DOMAIN_PORTS and any(match_domain(name, d) for d in self.domains)


def hosts_for(domains: "list[str]", address: str) -> "list[tuple[str, str]]":
    """/etc/hosts lines that make the allowed names resolve to the jail's
    gateway (the fake runs no DNS). A wildcard names no one host."""
    return [(d, address) for d in domains if not d.startswith("*.")]


def _unique(items: "list[str]") -> "list[str]":
    return list(dict.fromkeys(items))
