//! The gateway's messages this plugin sends and reads, written here from
//! the field names and numbers OpenShell publishes (`openshell.v1`,
//! `openshell.sandbox.v1`, `openshell.datamodel.v1` at v0.1.2). Only the
//! fields used are declared: protobuf skips the rest when decoding, and
//! what is sent is exactly what is declared.

use std::collections::HashMap;

use prost::Message;
use prost_types::{Duration, Struct};

#[derive(Clone, PartialEq, Message)]
pub struct WorkspaceSelector {
    #[prost(string, optional, tag = "1")]
    pub workspace: Option<String>,
}

/// The workspace the operator chose (`settings`), for every call's scope.
pub fn workspace_scope() -> Option<WorkspaceSelector> {
    Some(WorkspaceSelector {
        workspace: Some(crate::settings::workspace()),
    })
}

#[derive(Clone, PartialEq, Message)]
pub struct GetGatewayInfoRequest {}

#[derive(Clone, PartialEq, Message)]
pub struct GetGatewayInfoResponse {
    #[prost(string, tag = "2")]
    pub gateway_version: String,
    #[prost(message, repeated, tag = "3")]
    pub compute_drivers: Vec<ComputeDriverInfo>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ComputeDriverInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub capabilities: Option<ComputeDriverCapabilities>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ComputeDriverCapabilities {
    #[prost(string, tag = "1")]
    pub driver_name: String,
    #[prost(message, optional, tag = "3")]
    pub resource_capabilities: Option<ResourceCapabilities>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceCapabilities {
    #[prost(message, optional, tag = "1")]
    pub cpu: Option<LimitSupport>,
    #[prost(message, optional, tag = "2")]
    pub memory: Option<LimitSupport>,
}

/// `CpuResourceCapabilities` and `MemoryResourceCapabilities` share this
/// one field.
#[derive(Clone, PartialEq, Message)]
pub struct LimitSupport {
    #[prost(bool, tag = "1")]
    pub limit_supported: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct CreateSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub spec: Option<SandboxSpec>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(map = "string, string", tag = "3")]
    pub labels: HashMap<String, String>,
    #[prost(message, optional, tag = "7")]
    pub workspace_scope: Option<WorkspaceSelector>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SandboxSpec {
    #[prost(message, optional, tag = "6")]
    pub template: Option<SandboxTemplate>,
    #[prost(message, optional, tag = "7")]
    pub policy: Option<SandboxPolicy>,
    #[prost(string, repeated, tag = "8")]
    pub providers: Vec<String>,
    /// The sandbox's main process, launched once; no shell parsing.
    #[prost(string, repeated, tag = "12")]
    pub command: Vec<String>,
    /// Whether the main process gets a pseudo-terminal.
    #[prost(bool, tag = "13")]
    pub tty: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct SandboxTemplate {
    #[prost(string, tag = "1")]
    pub image: String,
    #[prost(message, optional, tag = "7")]
    pub resources: Option<Struct>,
    #[prost(message, optional, tag = "11")]
    pub driver_config: Option<Struct>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SandboxPolicy {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(message, optional, tag = "2")]
    pub filesystem: Option<FilesystemPolicy>,
    #[prost(message, optional, tag = "3")]
    pub landlock: Option<LandlockPolicy>,
    #[prost(message, optional, tag = "4")]
    pub process: Option<ProcessPolicy>,
    /// Map fields (`network_policies` = 5, `network_middlewares` = 6) are
    /// kept as their raw entries (`NetworkPolicyEntry`): this plugin sends
    /// one only for a granted run (the guard), never a middleware.
    #[prost(bytes = "vec", repeated, tag = "5")]
    pub network_policies: Vec<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub network_middlewares: Vec<Vec<u8>>,
}

/// One `network_policies` map entry: its key (1) and its rule (2).
#[derive(Clone, PartialEq, Message)]
pub struct NetworkPolicyEntry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<NetworkPolicyRule>,
}

/// A rule: the endpoints it allows (2) to the binaries it names (3). Only
/// the fields this plugin sends are modelled; a rule read back with any
/// other re-encodes differently, which the policy's hash notices.
#[derive(Clone, PartialEq, Message)]
pub struct NetworkPolicyRule {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub endpoints: Vec<NetworkEndpoint>,
    #[prost(message, repeated, tag = "3")]
    pub binaries: Vec<NetworkBinary>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NetworkEndpoint {
    #[prost(string, tag = "1")]
    pub host: String,
    #[prost(uint32, tag = "2")]
    pub port: u32,
    /// `TlsMode` in the 0.1.x protos: 1 is SKIP, a raw tunnel (the
    /// proxy never terminates the sandbox's TLS).
    #[prost(int32, tag = "4")]
    pub tls: i32,
}

/// `TlsMode::SKIP`.
pub const TLS_SKIP: i32 = 1;

#[derive(Clone, PartialEq, Message)]
pub struct NetworkBinary {
    #[prost(string, tag = "1")]
    pub path: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct FilesystemPolicy {
    #[prost(bool, tag = "1")]
    pub include_workdir: bool,
    #[prost(string, repeated, tag = "2")]
    pub read_only: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub read_write: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LandlockPolicy {
    #[prost(string, tag = "1")]
    pub compatibility: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProcessPolicy {
    #[prost(string, tag = "1")]
    pub run_as_user: String,
    #[prost(string, tag = "2")]
    pub run_as_group: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct SandboxResponse {
    #[prost(message, optional, tag = "1")]
    pub sandbox: Option<Sandbox>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sandbox {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    pub spec: Option<SandboxSpec>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<SandboxStatus>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ObjectMeta {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(map = "string, string", tag = "4")]
    pub labels: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SandboxStatus {
    #[prost(int32, tag = "6")]
    pub phase: i32,
    /// Present once the main process has ended (128 + n for signal n).
    #[prost(int32, optional, tag = "9")]
    pub exit_code: Option<i32>,
}

pub const PHASE_PROVISIONING: i32 = 1;
pub const PHASE_READY: i32 = 2;
/// Terminal: the sandbox failed, or its main process ended nonzero.
pub const PHASE_ERROR: i32 = 3;
pub const PHASE_STARTING: i32 = 8;
/// Terminal: the main process ended with exit 0.
pub const PHASE_COMPLETED: i32 = 9;

#[derive(Clone, PartialEq, Message)]
pub struct GetSandboxRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub workspace_scope: Option<WorkspaceSelector>,
}

#[derive(Clone, PartialEq, Message)]
pub struct GetSandboxConfigRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "3")]
    pub workspace_scope: Option<WorkspaceSelector>,
}

#[derive(Clone, PartialEq, Message)]
pub struct GetSandboxConfigResponse {
    #[prost(message, optional, tag = "1")]
    pub policy: Option<SandboxPolicy>,
    #[prost(string, tag = "3")]
    pub policy_hash: String,
    #[prost(map = "string, message", tag = "4")]
    pub settings: HashMap<String, EffectiveSetting>,
    #[prost(int32, tag = "6")]
    pub policy_source: i32,
    #[prost(bool, tag = "13")]
    pub configuration_admitted: bool,
}

pub const POLICY_SOURCE_SANDBOX: i32 = 1;

#[derive(Clone, PartialEq, Message)]
pub struct EffectiveSetting {
    #[prost(message, optional, tag = "1")]
    pub value: Option<SettingValue>,
}

/// A setting's value: a oneof of which only the bool (field 2) matters
/// here; any other kind counts as "not false".
#[derive(Clone, PartialEq, Message)]
pub struct SettingValue {
    #[prost(string, optional, tag = "1")]
    pub string_value: Option<String>,
    #[prost(bool, optional, tag = "2")]
    pub bool_value: Option<bool>,
    #[prost(int64, optional, tag = "3")]
    pub int_value: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExecSandboxRequest {
    #[prost(string, tag = "1")]
    pub sandbox: String,
    #[prost(string, repeated, tag = "2")]
    pub command: Vec<String>,
    #[prost(string, tag = "3")]
    pub workdir: String,
    #[prost(map = "string, string", tag = "4")]
    pub environment: HashMap<String, String>,
    #[prost(bool, tag = "10")]
    pub no_login_shell: bool,
    #[prost(message, optional, tag = "12")]
    pub workspace_scope: Option<WorkspaceSelector>,
    #[prost(message, optional, tag = "105")]
    pub execution_timeout: Option<Duration>,
}

/// `ExecSandboxInput`: a oneof of `start` (1) and `stdin` (2).
#[derive(Clone, PartialEq, Message)]
pub struct ExecSandboxInput {
    #[prost(message, optional, tag = "1")]
    pub start: Option<ExecSandboxRequest>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub stdin: Option<Vec<u8>>,
}

/// `ExecSandboxEvent`: a oneof of `stdout` (1), `stderr` (2), `exit` (3).
#[derive(Clone, PartialEq, Message)]
pub struct ExecSandboxEvent {
    #[prost(message, optional, tag = "1")]
    pub stdout: Option<Data>,
    #[prost(message, optional, tag = "2")]
    pub stderr: Option<Data>,
    #[prost(message, optional, tag = "3")]
    pub exit: Option<ExitEvent>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Data {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExitEvent {
    #[prost(int32, tag = "1")]
    pub exit_code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteSandboxRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub workspace_scope: Option<WorkspaceSelector>,
    #[prost(bool, tag = "3")]
    pub allow_missing: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteSandboxResponse {
    #[prost(int32, tag = "2")]
    pub outcome: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct ListSandboxesRequest {
    #[prost(int32, tag = "1")]
    pub page_size: i32,
    #[prost(string, tag = "2")]
    pub page_token: String,
    #[prost(string, tag = "3")]
    pub label_selector: String,
    #[prost(message, optional, tag = "4")]
    pub workspace_scope: Option<WorkspaceSelector>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ListSandboxesResponse {
    #[prost(message, repeated, tag = "1")]
    pub sandboxes: Vec<Sandbox>,
    #[prost(string, tag = "2")]
    pub next_page_token: String,
}
