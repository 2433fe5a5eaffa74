"""OpenShell's identity of a sandbox policy: the `policy_hash` that
GetSandboxConfig answers, computed the way the gateway computes it.

The gateway's function is `deterministic_policy_hash` (in 0.1.x
`openshell_core::policy_identity`, `crates/openshell-core/src/
policy_identity.rs`; /work/notes/openshell-guard-research.md §1 has the
sources). Protobuf maps have no order on the wire and the gateway keeps
them in hash maps, so the hash never covers a map's encoding: each map is
cleared from the message it sits in, and its entries are written after
it, sorted by key. Every length and count is a little-endian u64; every
byte string is written as its length, then the bytes (`part`):

    part(policy with network_policies and network_middlewares cleared)
    part("network_policies")  count   then per entry, by key:
        part(key)  part(rule bytes)
    part("network_middlewares")  count   then per entry, by key: ...

and a rule's bytes are `part(rule with its nested maps cleared)`, then for
each endpoint its index and its `graphql_persisted_queries` map (written
even when empty), then for each of its L7 rules the index and, when the
rule has an `allow`, its `query` and `params` maps; then for each deny
rule the index, its `query` and its `params`. A map is written as
part(label), count, then per entry by key: part(key), part(value).

Rust sorts `&str` keys by their UTF-8 bytes; Python sorts `str` by code
point, which is the same order.

Middlewares carry a `google.protobuf.Struct` whose canonical form the
fake does not reproduce: a policy with any is not hashed here (the
answer is then empty; plimsoll sends none).
"""

from __future__ import annotations

import hashlib
import struct

import messages as m
from protowire import decode, encode


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def _part(data: bytes) -> bytes:
    return _u64(len(data)) + data


def _entries(raw_or_decoded: list, table) -> "dict[str, dict]":
    """A map field's entries as {key: value}, the last of a repeated key
    winning, as a decoder filling a map does. Entries arrive raw (the
    policy keeps them as bytes) or decoded (inside a decoded rule)."""
    found: "dict[str, dict]" = {}
    for entry in raw_or_decoded or []:
        if isinstance(entry, (bytes, bytearray)):
            entry = decode(table, bytes(entry))
        found[entry.get("key", "")] = entry.get("value") or {}
    return found


def _sorted_map(label: bytes, entries: "dict[str, dict]", value_table) -> bytes:
    out = _part(label) + _u64(len(entries))
    for key in sorted(entries):
        out += _part(key.encode("utf-8")) + _part(encode(value_table, entries[key]))
    return out


def _without_maps(rule: dict) -> dict:
    """A copy of a decoded rule with every nested map emptied."""
    rule = dict(rule)
    endpoints = []
    for endpoint in rule.get("endpoints") or []:
        endpoint = {k: v for k, v in endpoint.items() if k != "graphql_persisted_queries"}
        rules = []
        for l7 in endpoint.get("rules") or []:
            l7 = dict(l7)
            if "allow" in l7:
                l7["allow"] = {k: v for k, v in l7["allow"].items()
                               if k not in ("query", "params")}
            rules.append(l7)
        denies = [{k: v for k, v in deny.items() if k not in ("query", "params")}
                  for deny in endpoint.get("deny_rules") or []]
        endpoint["rules"], endpoint["deny_rules"] = rules, denies
        endpoints.append(endpoint)
    rule["endpoints"] = endpoints
    return rule


def rule_bytes(rule: dict) -> bytes:
    """The canonical bytes of one decoded NetworkPolicyRule (the map's
    value, not its entry)."""
    out = _part(encode(m.NetworkPolicyRule, _without_maps(rule)))
    entry, query = m.NetworkEndpoint.by_number[13].message, m.QueryEntry
    for i, endpoint in enumerate(rule.get("endpoints") or []):
        out += _u64(i) + _sorted_map(b"graphql_persisted_queries",
                                     _entries(endpoint.get("graphql_persisted_queries"), entry),
                                     m.GraphqlOperation)
        for j, l7 in enumerate(endpoint.get("rules") or []):
            out += _u64(j)
            if "allow" in l7:
                allow = l7["allow"]
                out += _sorted_map(b"allow_query", _entries(allow.get("query"), query),
                                   m.L7QueryMatcher)
                out += _sorted_map(b"allow_params", _entries(allow.get("params"), query),
                                   m.L7QueryMatcher)
        for j, deny in enumerate(endpoint.get("deny_rules") or []):
            out += _u64(j)
            out += _sorted_map(b"deny_query", _entries(deny.get("query"), query),
                               m.L7QueryMatcher)
            out += _sorted_map(b"deny_params", _entries(deny.get("params"), query),
                               m.L7QueryMatcher)
    return out


def policy_bytes(policy: dict) -> "bytes | None":
    """What the gateway hashes for a decoded SandboxPolicy (its network
    entries raw, as messages.SandboxPolicy keeps them); None with
    middlewares."""
    if policy.get("network_middlewares"):
        return None
    cleared = {k: v for k, v in policy.items()
               if k not in ("network_policies", "network_middlewares")}
    out = _part(encode(m.SandboxPolicy, cleared))
    rules = _entries(policy.get("network_policies"), m.NetworkPolicyEntry)
    out += _part(b"network_policies") + _u64(len(rules))
    for key in sorted(rules):
        out += _part(key.encode("utf-8")) + _part(rule_bytes(rules[key]))
    return out + _part(b"network_middlewares") + _u64(0)


def policy_hash(policy: dict) -> "str | None":
    """The lowercase hex SHA-256 of policy_bytes, or None."""
    preimage = policy_bytes(policy)
    return None if preimage is None else hashlib.sha256(preimage).hexdigest()
