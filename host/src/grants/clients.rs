//! The clients a granted run's code finds preloaded, for node and for
//! python: one of each, speaking to the broker over a container's socket
//! or a hosted sandbox's guard, whichever the run's environment names.

pub const NODE: &str = include_str!("clients/host.cjs");
pub const PYTHON: &str = include_str!("clients/sitecustomize.py");
