"""OpenShell's messages the fake serves, as tables for protowire: field
names and numbers as OpenShell publishes them (openshell.v1,
openshell.sandbox.v1, openshell.datamodel.v1 at v0.1.2), written here; the
protos are not copied, and the fake does not use the package it is proven
against. Only what the fake reads or answers is declared: unknown fields
are skipped on decode.

`google.protobuf.Struct` values (a template's resources and driver config)
and map entries whose values are messages are kept as raw bytes: the fake
stores and echoes them, and compares them byte for byte.
"""

from __future__ import annotations

import hashlib
import struct

from protowire import (
    BOOL, BYTES, ENUM, INT32, INT64, MAP_SS, MESSAGE, STRING, UINT32,
    Field as F, Message as M, decode, encode,
)

WorkspaceSelector = M("openshell.datamodel.v1.WorkspaceSelector", [
    F(1, "workspace", STRING, presence=True),
    F(2, "all_workspaces", BYTES, presence=True),
])
Duration = M("google.protobuf.Duration", [F(1, "seconds", INT64), F(2, "nanos", INT32)])

# ---- the policy (openshell.sandbox.v1), in field-number order: the fake
# re-encodes it to hash it, as the client does.
FilesystemPolicy = M("openshell.sandbox.v1.FilesystemPolicy", [
    F(1, "include_workdir", BOOL),
    F(2, "read_only", STRING, repeated=True),
    F(3, "read_write", STRING, repeated=True),
])
LandlockPolicy = M("openshell.sandbox.v1.LandlockPolicy", [F(1, "compatibility", STRING)])
ProcessPolicy = M("openshell.sandbox.v1.ProcessPolicy", [
    F(1, "run_as_user", STRING), F(2, "run_as_group", STRING)])
# A policy's network entries, read (never re-encoded: the policy keeps its
# entries as raw bytes) to build a sandbox's jail. Only the fields the fake
# acts on are declared: where (host, port or ports) and who (binaries).
NetworkEndpoint = M("openshell.sandbox.v1.NetworkEndpoint", [
    F(1, "host", STRING),
    F(2, "port", UINT32),
    F(9, "ports", UINT32, repeated=True),
])
NetworkBinary = M("openshell.sandbox.v1.NetworkBinary", [F(1, "path", STRING)])
NetworkPolicyRule = M("openshell.sandbox.v1.NetworkPolicyRule", [
    F(1, "name", STRING),
    F(2, "endpoints", MESSAGE, message=NetworkEndpoint, repeated=True),
    F(3, "binaries", MESSAGE, message=NetworkBinary, repeated=True),
])
NetworkPolicyEntry = M("map<string, NetworkPolicyRule> entry", [
    F(1, "key", STRING), F(2, "value", MESSAGE, message=NetworkPolicyRule)])
SandboxPolicy = M("openshell.sandbox.v1.SandboxPolicy", [
    F(1, "version", UINT32),
    F(2, "filesystem", MESSAGE, message=FilesystemPolicy),
    F(3, "landlock", MESSAGE, message=LandlockPolicy),
    F(4, "process", MESSAGE, message=ProcessPolicy),
    F(5, "network_policies", BYTES, repeated=True),      # map entries, raw
    F(6, "network_middlewares", BYTES, repeated=True),   # map entries, raw
])

# ---- sandboxes (openshell.v1)
SandboxTemplate = M("openshell.v1.SandboxTemplate", [
    F(1, "image", STRING),
    F(2, "runtime_class_name", STRING),
    F(4, "labels", MAP_SS),
    F(6, "environment", MAP_SS),
    F(7, "resources", BYTES, presence=True),       # google.protobuf.Struct, raw
    F(11, "driver_config", BYTES, presence=True),  # google.protobuf.Struct, raw
])
SandboxSpec = M("openshell.v1.SandboxSpec", [
    F(1, "log_level", STRING),
    F(5, "environment", MAP_SS),
    F(6, "template", MESSAGE, message=SandboxTemplate),
    F(7, "policy", MESSAGE, message=SandboxPolicy),
    F(8, "providers", STRING, repeated=True),
    F(12, "command", STRING, repeated=True),
    F(13, "tty", BOOL),
])
ObjectMeta = M("openshell.datamodel.v1.ObjectMeta", [
    F(1, "id", STRING),
    F(2, "name", STRING),
    F(4, "labels", MAP_SS),
    F(7, "workspace", STRING),
])
SandboxStatus = M("openshell.v1.SandboxStatus", [
    F(6, "phase", ENUM),
    F(9, "exit_code", INT32, presence=True),  # set once the main process ended
])
Sandbox = M("openshell.v1.Sandbox", [
    F(1, "metadata", MESSAGE, message=ObjectMeta),
    F(2, "spec", MESSAGE, message=SandboxSpec),
    F(3, "status", MESSAGE, message=SandboxStatus),
])
PHASE = {"PROVISIONING": 1, "READY": 2, "ERROR": 3, "DELETING": 4, "STARTING": 8,
         "COMPLETED": 9}

CreateSandboxRequest = M("openshell.v1.CreateSandboxRequest", [
    F(1, "spec", MESSAGE, message=SandboxSpec),
    F(2, "name", STRING),
    F(3, "labels", MAP_SS),
    F(4, "annotations", MAP_SS),
    F(7, "workspace_scope", MESSAGE, message=WorkspaceSelector),
])
SandboxResponse = M("openshell.v1.SandboxResponse", [
    F(1, "sandbox", MESSAGE, message=Sandbox)])
GetSandboxRequest = M("openshell.v1.GetSandboxRequest", [
    F(1, "name", STRING), F(2, "workspace_scope", MESSAGE, message=WorkspaceSelector)])
DeleteSandboxRequest = M("openshell.v1.DeleteSandboxRequest", [
    F(1, "name", STRING), F(2, "workspace_scope", MESSAGE, message=WorkspaceSelector),
    F(3, "allow_missing", BOOL)])
DeleteSandboxResponse = M("openshell.v1.DeleteSandboxResponse", [
    F(2, "outcome", ENUM), F(3, "sandbox_id", STRING)])
DELETION = {"COMPLETED": 1, "ACCEPTED": 2, "ALREADY_ABSENT": 3}
ListSandboxesRequest = M("openshell.v1.ListSandboxesRequest", [
    F(1, "page_size", INT32), F(2, "page_token", STRING), F(3, "label_selector", STRING),
    F(4, "workspace_scope", MESSAGE, message=WorkspaceSelector)])
ListSandboxesResponse = M("openshell.v1.ListSandboxesResponse", [
    F(1, "sandboxes", MESSAGE, message=Sandbox, repeated=True),
    F(2, "next_page_token", STRING)])

# ---- the gateway's info
LimitSupport = M("openshell.v1.CpuResourceCapabilities", [F(1, "limit_supported", BOOL)])
ResourceCapabilities = M("openshell.v1.ResourceCapabilities", [
    F(1, "cpu", MESSAGE, message=LimitSupport), F(2, "memory", MESSAGE, message=LimitSupport)])
ComputeDriverCapabilities = M("openshell.v1.ComputeDriverCapabilities", [
    F(1, "driver_name", STRING), F(2, "driver_version", STRING),
    F(3, "resource_capabilities", MESSAGE, message=ResourceCapabilities)])
ComputeDriverInfo = M("openshell.v1.ComputeDriverInfo", [
    F(1, "name", STRING), F(2, "capabilities", MESSAGE, message=ComputeDriverCapabilities)])
GetGatewayInfoResponse = M("openshell.v1.GetGatewayInfoResponse", [
    F(1, "status", ENUM), F(2, "gateway_version", STRING),
    F(3, "compute_drivers", MESSAGE, message=ComputeDriverInfo, repeated=True)])

# ---- config (openshell.sandbox.v1)
SettingValue = M("openshell.sandbox.v1.SettingValue", [
    F(1, "string_value", STRING, presence=True), F(2, "bool_value", BOOL, presence=True)])
EffectiveSetting = M("openshell.sandbox.v1.EffectiveSetting", [
    F(1, "value", MESSAGE, message=SettingValue), F(2, "scope", ENUM)])
SettingsEntry = M("map<string, EffectiveSetting> entry", [
    F(1, "key", STRING), F(2, "value", MESSAGE, message=EffectiveSetting)])
GetSandboxConfigRequest = M("openshell.sandbox.v1.GetSandboxConfigRequest", [
    F(1, "name", STRING), F(3, "workspace_scope", MESSAGE, message=WorkspaceSelector)])
GetSandboxConfigResponse = M("openshell.sandbox.v1.GetSandboxConfigResponse", [
    F(1, "policy", MESSAGE, message=SandboxPolicy),
    F(2, "version", UINT32),
    F(3, "policy_hash", STRING),
    F(4, "settings", MESSAGE, message=SettingsEntry, repeated=True),
    F(6, "policy_source", ENUM),
    F(10, "workspace", STRING),
    F(13, "configuration_admitted", BOOL),
])
POLICY_SOURCE = {"SANDBOX": 1, "GLOBAL": 2}

# ---- exec
ExecSandboxRequest = M("openshell.v1.ExecSandboxRequest", [
    F(1, "sandbox", STRING),
    F(2, "command", STRING, repeated=True),
    F(3, "workdir", STRING),
    F(4, "environment", MAP_SS),
    F(6, "stdin", BYTES),
    F(10, "no_login_shell", BOOL),
    F(12, "workspace_scope", MESSAGE, message=WorkspaceSelector),
    F(105, "execution_timeout", MESSAGE, message=Duration),
])
ExecSandboxInput = M("openshell.v1.ExecSandboxInput", [  # oneof payload
    F(1, "start", MESSAGE, message=ExecSandboxRequest),
    F(2, "stdin", BYTES, presence=True),
    F(3, "resize", BYTES, presence=True),
])
Data = M("openshell.v1.ExecSandboxStdout", [F(1, "data", BYTES)])
ExitEvent = M("openshell.v1.ExecSandboxExit", [F(1, "exit_code", INT32)])
ExecSandboxEvent = M("openshell.v1.ExecSandboxEvent", [  # oneof payload
    F(1, "stdout", MESSAGE, message=Data),
    F(2, "stderr", MESSAGE, message=Data),
    F(3, "exit", MESSAGE, message=ExitEvent),
])


def policy_hash(policy: dict) -> "str | None":
    """OpenShell's policy identity, computed as its client does: SHA-256
    (lowercase hex) of the policy encoded with both maps emptied, its
    length first, then each map's name and entry count, every length and
    count a little-endian u64. With map entries it is not computed here (the
    entries' own encoding would be needed; plimsoll sends none)."""
    if policy.get("network_policies") or policy.get("network_middlewares"):
        return None
    encoded = encode(SandboxPolicy, policy)
    u64 = lambda n: struct.pack("<Q", n)  # noqa: E731
    preimage = u64(len(encoded)) + encoded
    for name in (b"network_policies", b"network_middlewares"):
        preimage += u64(len(name)) + name + u64(0)
    return hashlib.sha256(preimage).hexdigest()
