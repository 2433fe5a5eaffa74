//! Locates the QuickJS guest component that `make guest` built, so the
//! daemon can embed it: the wasm provider then runs exactly the bytes whose
//! digest it reports, with no file that could be swapped at run time.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=PLIMSOLL_GUEST_JS_WASM");
    let path = match std::env::var_os("PLIMSOLL_GUEST_JS_WASM") {
        Some(p) => PathBuf::from(p),
        None => {
            // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
            let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
            let target = out
                .ancestors()
                .nth(4)
                .expect("OUT_DIR is inside the target directory")
                .to_path_buf();
            target
                .join("wasm32-wasip2")
                .join("guest")
                .join("plimsoll_guest_js.wasm")
        }
    };
    if !path.is_file() {
        panic!(
            "the QuickJS guest component is missing at {}.\n\
             Build it first with `make guest` (the Makefile builds it before the host).",
            path.display()
        );
    }
    println!("cargo:rerun-if-changed={}", path.display());
    println!("cargo:rustc-env=PLIMSOLL_GUEST_JS_WASM={}", path.display());
}
