//! The host's bindings for the `plimsoll:provider` WIT, generated in one
//! place. Only the types are used: the capability functions are linked by
//! hand (see `capabilities`), so that what a plugin passes is read lazily
//! under a budget, and the adapter's exports are called by index (see
//! `call`). The generated names stay private; these are the curated ones.

mod generated {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/provider",
        imports: { default: async },
        exports: { default: async },
    });
}

pub use generated::PluginPre;
pub use generated::plimsoll::provider::container_engine as engine_if;
pub use generated::plimsoll::provider::grant as grant_if;
pub use generated::plimsoll::provider::http as http_if;
pub use generated::plimsoll::provider::log as log_if;
pub use generated::plimsoll::provider::types;
