//! Container backends: what the `container-engine` capability drives. Each
//! backend is a folder of its own implementing
//! `plugin_host::capabilities::container_engine::backend::ContainerBackend`;
//! nothing outside a backend's folder names the engine it talks to.

pub mod docker;
