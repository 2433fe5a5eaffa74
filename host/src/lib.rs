//! plimsoll: runs code that AI agents wrote inside a sandbox, and states the
//! isolation tier that actually held.
//!
//! The daemon (`plimsolld`) is a thin binary over this library, in layers:
//! - `api` speaks Connect over HTTP; `callers` says who is asking;
//! - `pipeline` is the run pipeline (validate with `admission`, admit under
//!   `quota`, check the floor, dispatch, seal the `record`, audit);
//! - `providers` hold the backends and the evidence for their tiers: the
//!   Disabled provider, `wasm` (QuickJS in this process), and plugins run by
//!   the `plugin_host`, whose container capability drives a container
//!   backend (`backends::docker`);
//! - `grants` is the operator's API grants and the broker that serves them;
//! - `config` puts together each part's settings into one closed list.
//!
//! `outcome`, `live`, `refusal`, `tier`, `text`, `env_vars`, `outbound` and
//! `store_limits` are leaves every layer may use.

pub mod admission;
pub mod api;
pub mod attest;
pub mod backends;
pub mod bounded_read;
pub mod callers;
pub mod compile_cache;
pub mod config;
pub mod dirs;
pub mod env_vars;
pub mod fd_limit;
pub mod grants;
pub mod hardened;
pub mod job;
pub mod limits;
pub mod live;
pub mod metrics;
pub mod outbound;
pub mod outcome;
pub mod pipeline;
pub mod plugin_check;
pub mod plugin_host;
pub mod providers;
pub mod quota;
pub mod record;
pub mod refusal;
pub mod replicas;
pub mod sessions;
pub mod state;
pub mod store_limits;
pub mod text;
pub mod tier;
pub mod tls;
pub mod wire;

pub use pipeline::Daemon;
