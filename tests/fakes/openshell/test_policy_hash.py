"""The policy hash fake-openshell states in GetSandboxConfig
(policy_hash.py), against what OpenShell itself says: hashes a real
v0.1.2 gateway reported for policies without network entries, and the
canonical-bytes vector of OpenShell's own test for a rule with every kind
of nested map. Policies are built with the stubs of OpenShell's published
package and decoded with the fake's tables, as the fake receives them.
No docker is needed.

Run: .venv-openshell/bin/python -m pytest -q tests/fakes/openshell/test_policy_hash.py
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from openshell._proto import sandbox_pb2 as sb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2b"))
sys.path.insert(0, str(HERE))
import messages  # noqa: E402
from policy_hash import policy_hash, rule_bytes  # noqa: E402


def ours(policy: sb.SandboxPolicy, raw: "bytes | None" = None) -> "str | None":
    wire = raw if raw is not None else policy.SerializeToString(deterministic=True)
    return policy_hash(messages.decode(messages.SandboxPolicy, wire))


# Hashes a real OpenShell v0.1.2 gateway reported for these policies.
GATEWAY_VECTORS = [
    (dict(ro=["/bin", "/usr", "/lib", "/etc", "/proc", "/dev/urandom", "/sys/fs/cgroup",
              "/runner.mjs"], rw=["/tmp", "/dev/null"], compat="hard_requirement"),
     "d1c56801c3fcf0b1d8473339f3b625b1cbf43d5401c1268026551dd28a39d871"),
    (dict(ro=["/bin", "/usr", "/lib", "/proc", "/dev/urandom", "/etc", "/var/log"],
          rw=["/tmp", "/dev/null"], compat="best_effort", include=True),
     "a45a8ff3564f00ae26cbd66f1131f37eedd8b54a66fbfec103d65a204c19c6e8"),
    (dict(ro=["/bin", "/usr", "/lib", "/proc", "/dev/urandom", "/etc", "/runner.mjs"],
          rw=["/sandbox/work", "/tmp", "/dev/null"], compat="best_effort"),
     "cb87d045a485ed8bbbd10c0580ef19f61a72312572b48664000d6c68014653bc"),
    (dict(ro=["/bin", "/usr", "/lib", "/proc", "/dev/urandom", "/etc", "/runner.mjs",
              "/sys/fs/cgroup"], rw=["/sandbox/work", "/tmp", "/dev/null"],
          compat="best_effort", process=("1000", "1000")),
     "a407726e71fc08e1452222192dafdfffe9676ce9c3c6ff3f6e7ae1d1ffd24917"),
]


@pytest.mark.parametrize("p,want", GATEWAY_VECTORS)
def test_the_policy_hash_is_the_gateways(p, want):
    policy = sb.SandboxPolicy(
        version=1,
        filesystem=sb.FilesystemPolicy(include_workdir=p.get("include", False),
                                       read_only=p["ro"], read_write=p["rw"]),
        landlock=sb.LandlockPolicy(compatibility=p["compat"]))
    if "process" in p:
        policy.process.run_as_user, policy.process.run_as_group = p["process"]
    assert ours(policy) == want


def test_rule_bytes_are_openshells():
    """OpenShell's `rule_bytes_keep_their_encoding` (crates/openshell-core/
    src/policy_identity.rs @ 475e7dce): the SHA-256 of a rule's canonical
    bytes, its endpoint carrying an allow rule with query and params maps,
    a deny rule with a query map, and persisted GraphQL queries."""
    rule = sb.NetworkPolicyRule()
    endpoint = rule.endpoints.add(host="h")
    allow = endpoint.rules.add().allow
    allow.query["x"].glob, allow.query["y"].glob = "1", "2"
    allow.params["p"].glob, allow.params["q"].glob = "3", "4"
    deny = endpoint.deny_rules.add()
    deny.query["x"].glob, deny.query["y"].glob = "1", "2"
    endpoint.graphql_persisted_queries["a"].SetInParent()
    endpoint.graphql_persisted_queries["b"].SetInParent()
    decoded = messages.decode(messages.NetworkPolicyRule, rule.SerializeToString())
    assert (hashlib.sha256(rule_bytes(decoded)).hexdigest()
            == "7f10cf8b6715748d89a0e6232036f9de0c666506b953c525149a2bd52a1891b8")


def guarded(*, var_log: bool = False, pinned: bool = False) -> sb.SandboxPolicy:
    policy = sb.SandboxPolicy(
        version=1,
        filesystem=sb.FilesystemPolicy(
            read_only=["/bin", "/usr", "/lib", "/etc", "/proc", "/dev/urandom", "/sys/fs/cgroup"]
            + (["/var/log"] if var_log else []), read_write=["/tmp", "/dev/null"]),
        landlock=sb.LandlockPolicy(compatibility="hard_requirement"))
    rule = policy.network_policies["guard"]
    rule.name = "guard"
    endpoint = rule.endpoints.add(host="guard.example.com", port=443,
                                  tls=sb.NETWORK_TLS_MODE_SKIP)
    if pinned:
        endpoint.allowed_ips.append("203.0.113.7/32")
    rule.binaries.add(path="/usr/local/bin/node")
    return policy


# Not from a gateway: computed by the research's separate re-implementation
# (/work/notes/openshell-guard-research.md §1), which reproduces the vector
# above and the gateway's d1c56801... A change here is a change of the
# fake's encoding of a rule (the tls enum, allowed_ips, binaries).
@pytest.mark.parametrize("var_log,pinned,want", [
    (False, False, "74fef01c29e2584e9a64215ad290ec1074f32c6e502fe44d0b633dd9e18fffa4"),
    (True, False, "489dd33fa829fdd470429284903aaadd0993715065769c2f6d5a09c4ec7255ef"),
    (False, True, "472e7221a17d859fe822d14999d6f1bee3deb3c643019bc2be73bb6abecb115c"),
    (True, True, "fd597f0a7f8b314e177da3c5e00c90fa1e0207dd283b1ab602ddfc4f260eb566"),
])
def test_a_guard_entry_hashes_as_computed_from_openshells_algorithm(var_log, pinned, want):
    assert ours(guarded(var_log=var_log, pinned=pinned)) == want


def test_the_hash_does_not_follow_the_wire_order_of_maps_or_packing():
    """Entries in any order, and `ports` packed or not, are one policy to
    the gateway (it decodes them into its own messages first)."""
    policy = guarded()
    second = policy.network_policies["a-first"]
    second.name = "a-first"
    second.endpoints.add(host="x.test", ports=[443, 8443], tls=sb.NETWORK_TLS_MODE_SKIP)
    base = sb.SandboxPolicy()
    base.CopyFrom(policy)
    base.ClearField("network_policies")

    def entry(key: str, rule_wire: bytes) -> bytes:
        body = (b"\x0a" + bytes([len(key)]) + key.encode()
                + b"\x12" + bytes([len(rule_wire)]) + rule_wire)
        return b"\x2a" + bytes([len(body)]) + body   # SandboxPolicy field 5

    guard = policy.network_policies["guard"].SerializeToString()
    first = policy.network_policies["a-first"].SerializeToString()
    # The same rule with its ports unpacked (endpoint field 9, one varint each).
    endpoint = policy.network_policies["a-first"].endpoints[0]
    unpacked_endpoint = (b"\x0a\x06x.test" + b"\x20\x01"
                         + b"\x48" + bytes([0xbb, 0x03]) + b"\x48" + bytes([0xfb, 0x41]))
    assert sb.NetworkEndpoint.FromString(unpacked_endpoint) == endpoint
    unpacked = (b"\x0a\x07a-first" + b"\x12" + bytes([len(unpacked_endpoint)])
                + unpacked_endpoint)
    want = ours(policy)
    assert want == ours(policy, base.SerializeToString() + entry("guard", guard)
                        + entry("a-first", first))
    assert want == ours(policy, base.SerializeToString() + entry("a-first", unpacked)
                        + entry("guard", guard))


def test_middlewares_are_not_hashed_here():
    policy = guarded()
    policy.network_middlewares["m"].name = "m"
    assert ours(policy) is None
