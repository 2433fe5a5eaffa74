//! Locates the components that `make guest` built, so the daemon can embed
//! them: the QuickJS guest (the wasm provider) and the docker adapter (the
//! docker provider). The daemon then runs exactly the bytes whose digests it
//! reports, with no file that could be swapped at run time.

use std::path::PathBuf;

fn main() {
    embed(
        "PLIMSOLL_GUEST_JS_WASM",
        "plimsoll_guest_js.wasm",
        "the QuickJS guest component",
    );
    embed(
        "PLIMSOLL_DOCKER_PLUGIN_WASM",
        "plimsoll_plugin_docker.wasm",
        "the docker adapter component",
    );
}

fn embed(var: &str, file: &str, what: &str) {
    println!("cargo:rerun-if-env-changed={var}");
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => {
            // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
            let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
            let target = out
                .ancestors()
                .nth(4)
                .expect("OUT_DIR is inside the target directory")
                .to_path_buf();
            target.join("wasm32-wasip2").join("guest").join(file)
        }
    };
    if !path.is_file() {
        panic!(
            "{what} is missing at {}.\n\
             Build it first with `make guest` (the Makefile builds it before the host).",
            path.display()
        );
    }
    println!("cargo:rerun-if-changed={}", path.display());
    println!("cargo:rustc-env={var}={}", path.display());
}
