"""OpenShell's messages the fake serves, as tables for protowire: field
names and numbers as OpenShell publishes them (openshell.v1,
openshell.sandbox.v1, openshell.datamodel.v1 at v0.1.2), written here; the
protos are not copied, and the fake does not use the package it is proven
against. Only what the fake reads or answers is declared (and, for the
policy's network entries, all that its hash covers): unknown fields are
skipped on decode.

`google.protobuf.Struct` values (a template's resources and driver config)
and map entries whose values are messages are kept as raw bytes: the fake
stores and echoes them, and compares them byte for byte.
"""

from __future__ import annotations

from protowire import (
    BOOL, BYTES, ENUM, INT32, INT64, MAP_SS, MESSAGE, STRING, UINT32,
    Field as F, Message as M,
)
from protowire import decode, encode  # noqa: F401 - the tests decode and encode with these

WorkspaceSelector = M("openshell.datamodel.v1.WorkspaceSelector", [
    F(1, "workspace", STRING, presence=True),
    F(2, "all_workspaces", BYTES, presence=True),
])
Duration = M("google.protobuf.Duration", [F(1, "seconds", INT64), F(2, "nanos", INT32)])

# ---- the policy (openshell.sandbox.v1), in field-number order: the fake
# re-encodes it to hash it, as the gateway does (policy_hash.py).
FilesystemPolicy = M("openshell.sandbox.v1.FilesystemPolicy", [
    F(1, "include_workdir", BOOL),
    F(2, "read_only", STRING, repeated=True),
    F(3, "read_write", STRING, repeated=True),
])
LandlockPolicy = M("openshell.sandbox.v1.LandlockPolicy", [F(1, "compatibility", STRING)])
ProcessPolicy = M("openshell.sandbox.v1.ProcessPolicy", [
    F(1, "run_as_user", STRING), F(2, "run_as_group", STRING)])
# A policy's network entries. The policy keeps them as the raw bytes sent
# (they are what GetSandboxConfig reads back); they are decoded to build a
# sandbox's jail, and re-encoded only to hash them (policy_hash.py). A
# hash over fewer fields than the gateway's messages hold would differ
# from the gateway's, so these tables declare every field of OpenShell
# 0.1.2's rule, endpoint and L7 messages. Maps whose values are messages
# are declared as their wire form: repeated key/value entries.
NetworkTlsMode = {"UNSPECIFIED": 0, "SKIP": 1, "TERMINATE": 2, "PASSTHROUGH": 3}
L7QueryMatcher = M("openshell.sandbox.v1.L7QueryMatcher", [
    F(1, "glob", STRING), F(2, "any", STRING, repeated=True)])


def _entry(value: M) -> M:
    return M(f"map<string, {value.full_name}> entry", [
        F(1, "key", STRING), F(2, "value", MESSAGE, message=value)])


QueryEntry = _entry(L7QueryMatcher)


def _l7(name: str) -> M:
    # L7Allow and L7DenyRule share their fields, numbers and types.
    return M(f"openshell.sandbox.v1.{name}", [
        F(1, "method", STRING), F(2, "path", STRING), F(3, "command", STRING),
        F(4, "query", MESSAGE, message=QueryEntry, repeated=True),
        F(5, "operation_type", STRING), F(6, "operation_name", STRING),
        F(7, "fields", STRING, repeated=True),
        F(9, "params", MESSAGE, message=QueryEntry, repeated=True),
    ])


L7Allow, L7DenyRule = _l7("L7Allow"), _l7("L7DenyRule")
L7Rule = M("openshell.sandbox.v1.L7Rule", [F(1, "allow", MESSAGE, message=L7Allow)])
GraphqlOperation = M("openshell.sandbox.v1.GraphqlOperation", [
    F(1, "operation_type", STRING), F(2, "operation_name", STRING),
    F(3, "fields", STRING, repeated=True)])
McpOptions = M("openshell.sandbox.v1.McpOptions", [
    F(1, "strict_tool_names", BOOL, presence=True),
    F(2, "allow_all_known_mcp_methods", BOOL, presence=True),
    F(3, "versions", STRING, repeated=True)])
NetworkCredentialBinding = M("openshell.sandbox.v1.NetworkCredentialBinding", [
    F(1, "provider", STRING)])
NetworkEndpoint = M("openshell.sandbox.v1.NetworkEndpoint", [
    F(1, "host", STRING),
    F(2, "port", UINT32),
    F(3, "protocol", STRING),
    F(4, "tls", ENUM),          # NetworkTlsMode: an enum in 0.1.2, a string before
    F(5, "enforcement", ENUM),
    F(6, "access", ENUM),
    F(7, "rules", MESSAGE, message=L7Rule, repeated=True),
    F(8, "allowed_ips", STRING, repeated=True),
    F(9, "ports", UINT32, repeated=True),
    F(10, "deny_rules", MESSAGE, message=L7DenyRule, repeated=True),
    F(11, "allow_encoded_slash", BOOL),
    F(12, "persisted_queries", STRING),
    F(13, "graphql_persisted_queries", MESSAGE, message=_entry(GraphqlOperation),
      repeated=True),
    F(14, "graphql_max_body_bytes", UINT32),
    F(15, "path", STRING),
    F(16, "websocket_credential_rewrite", BOOL),
    F(17, "request_body_credential_rewrite", BOOL),
    F(18, "advisor_proposed", BOOL),
    F(19, "credential_signing", STRING),
    F(20, "signing_service", STRING),
    F(21, "signing_region", STRING),
    F(22, "json_rpc_max_body_bytes", UINT32),
    F(23, "mcp", MESSAGE, message=McpOptions),
    F(24, "credential_binding", MESSAGE, message=NetworkCredentialBinding),
    F(25, "allow_uninspected_credentials", BOOL),
    F(26, "provider_credentialed", BOOL),
])
NetworkBinary = M("openshell.sandbox.v1.NetworkBinary", [F(1, "path", STRING)])
NetworkPolicyRule = M("openshell.sandbox.v1.NetworkPolicyRule", [
    F(1, "name", STRING),
    F(2, "endpoints", MESSAGE, message=NetworkEndpoint, repeated=True),
    F(3, "binaries", MESSAGE, message=NetworkBinary, repeated=True),
])
NetworkPolicyEntry = _entry(NetworkPolicyRule)
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

