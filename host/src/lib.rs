//! plimsoll: runs code that AI agents wrote inside a sandbox, and states the
//! isolation tier that actually held.
//!
//! The daemon (`plimsolld`) is a thin binary over this library:
//! `config` reads the environment, `api` speaks Connect over HTTP, `service`
//! is the run pipeline (validate, admit, floor check, dispatch, record), and
//! `providers` hold the backends and the evidence for their tiers.

pub mod admission;
pub mod api;
pub mod callers;
pub mod config;
pub mod grants;
pub mod hardened;
pub mod limits;
pub mod metrics;
pub mod plugins;
pub mod providers;
pub mod quota;
pub mod record;
pub mod refusal;
pub mod service;
pub mod text;
pub mod tier;
pub mod tls;
pub mod wire;

pub use service::Daemon;
