//! `plimsoll grants from-openapi` (`plimsoll::grants::specgen`) on real
//! documents (tests/fixtures/openapi, see SOURCES.md there): the output
//! held to golden files, JSON and YAML of one document held to the same
//! bytes, the profile loaded as the daemon loads it, and the SDK run in
//! node and in QuickJS against a stub client.
//!
//! `PLIMSOLL_BLESS=1` writes the golden files instead of comparing; read
//! the diff before committing them.

use std::path::{Path, PathBuf};
use std::process::Command;

use plimsoll::grants::Grants;
use plimsoll::grants::specgen::{self, Generated, Options};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/openapi")
}

fn read(name: &str) -> String {
    let path = fixtures().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn options(base_url: &str, profile: &str, global: &str) -> Options {
    Options {
        base_url: base_url.into(),
        profile: profile.into(),
        global: global.into(),
        callers: vec!["anonymous".into()],
        ..Options::default()
    }
}

fn petstore_options() -> Options {
    options("https://petstore.example.com", "petstore", "petstore")
}

fn quayio_options() -> Options {
    options("https://quay.example.com", "quayio", "quay")
}

fn generate(file: &str, opts: &Options) -> Generated {
    let text = read(file);
    let format = specgen::sniff(Path::new(file), &text);
    specgen::generate(&text, format, opts).unwrap_or_else(|e| panic!("{file}: {e:#?}"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("plimsoll-specgen-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Each output against `expected/<stem>.*`, or written there when
/// `PLIMSOLL_BLESS=1`.
fn golden(stem: &str, g: &Generated) {
    let dir = fixtures().join("expected");
    let mut warnings = g.warnings.join("\n");
    if !warnings.is_empty() {
        warnings.push('\n');
    }
    let outputs = [
        (format!("{stem}.profile.json"), g.profile_json.as_str()),
        (format!("{stem}.sdk.js"), g.sdk_js.as_str()),
        (format!("{stem}.tool.txt"), g.tool_txt.as_str()),
        (format!("{stem}.warnings.txt"), warnings.as_str()),
    ];
    let bless = std::env::var("PLIMSOLL_BLESS").is_ok_and(|v| v == "1");
    for (name, got) in outputs {
        let path = dir.join(&name);
        if bless {
            std::fs::create_dir_all(&dir).expect("expected dir");
            std::fs::write(&path, got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; write the golden files with PLIMSOLL_BLESS=1",
                path.display()
            )
        });
        if want != got {
            let line = want
                .lines()
                .zip(got.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
            panic!(
                "{name} differs from its golden file at line {}:\n  want: {:?}\n  got:  {:?}\n\
                 (PLIMSOLL_BLESS=1 rewrites the golden files)",
                line + 1,
                want.lines().nth(line),
                got.lines().nth(line)
            );
        }
    }
}

#[test]
fn petstore_matches_its_golden_files() {
    let g = generate("petstore.yaml", &petstore_options());
    golden("petstore", &g);
}

#[test]
fn quayio_matches_its_golden_files_in_json_and_in_yaml() {
    let json = generate("quayio.json", &quayio_options());
    let yaml = generate("quayio.yaml", &quayio_options());
    assert!(
        json == yaml,
        "quayio.yaml and quayio.json gave different output"
    );
    assert_eq!(json.profile_json, yaml.profile_json);
    assert_eq!(json.sdk_js, yaml.sdk_js);
    golden("quayio", &json);
    // No route a grant cannot hold exactly made it through.
    let file: serde_json::Value = serde_json::from_str(&json.profile_json).expect("JSON");
    for route in file["profiles"]["quayio"]["allow"]
        .as_array()
        .expect("allow")
    {
        let route = route.as_str().expect("text");
        assert!(!route.ends_with('/'), "{route}");
        let path = route.split_once(' ').map(|(_, p)| p).unwrap_or("");
        assert!(path.starts_with("/api/v1/"), "{route}");
    }
}

#[test]
fn petstore_warnings_and_routes() {
    let g = generate("petstore.yaml", &petstore_options());
    let expected = [
        "warning: GET /pet/findByStatus (findPetsByStatus): required query parameter status; skipped",
        "warning: GET /pet/findByStatus (findPetsByStatus): GET /v2/pet/findByStatus is still reachable through GET /v2/pet/*",
        "warning: GET /pet/findByTags (findPetsByTags): required query parameter tags; skipped",
        "warning: GET /pet/findByTags (findPetsByTags): GET /v2/pet/findByTags is still reachable through GET /v2/pet/*",
        "warning: POST /pet/{petId} (updatePetWithForm): its request body is application/x-www-form-urlencoded, not JSON; skipped",
        "warning: POST /pet/{petId}/uploadImage (uploadFile): its request body is multipart/form-data, not JSON; skipped",
        "warning: GET /user/login (loginUser): required query parameter username; skipped",
        "warning: GET /user/login (loginUser): GET /v2/user/login is still reachable through GET /v2/user/*",
    ];
    assert_eq!(g.warnings.len(), expected.len(), "{:#?}", g.warnings);
    for line in expected {
        assert!(
            g.warnings.iter().any(|w| w == line),
            "missing {line:?} in {:#?}",
            g.warnings
        );
    }
    let file: serde_json::Value = serde_json::from_str(&g.profile_json).expect("JSON");
    let p = &file["profiles"]["petstore"];
    assert_eq!(
        p["allow"],
        serde_json::json!([
            "PUT /v2/pet",
            "POST /v2/pet",
            "GET /v2/pet/*",
            "DELETE /v2/pet/*",
            "GET /v2/store/inventory",
            "POST /v2/store/order",
            "GET /v2/store/order/*",
            "DELETE /v2/store/order/*",
            "POST /v2/user",
            "POST /v2/user/createWithArray",
            "POST /v2/user/createWithList",
            "GET /v2/user/logout",
            "GET /v2/user/*",
            "PUT /v2/user/*",
            "DELETE /v2/user/*",
        ])
    );
    assert_eq!(p["base_url"], "https://petstore.example.com");
    assert_eq!(p["global"], "petstore");
    assert_eq!(p["preamble_file"], "petstore.sdk.js");
    assert!(
        g.tool_txt
            .contains("\npetstore.getPetById(petId) — GET /v2/pet/{petId}: Find pet by ID\n")
    );
    assert!(g.tool_txt.contains(
        "\npetstore.updateUser(username, body) — PUT /v2/user/{username}: Updated user\n"
    ));
}

#[test]
fn the_written_profile_loads_with_its_sdk_file() {
    let g = generate("petstore.yaml", &petstore_options());
    let dir = scratch("load");
    std::fs::write(dir.join("petstore.sdk.js"), &g.sdk_js).expect("sdk");
    let no_env = |_: &str| -> Option<String> { None };
    let grants =
        Grants::parse(&g.profile_json, &no_env, Some(dir.as_path())).expect("the profile loads");
    let profile = grants
        .for_caller("petstore", "anonymous")
        .expect("permitted");
    assert_eq!(profile.preamble.as_deref(), Some(g.sdk_js.as_str()));
    assert_eq!(profile.catalog.len(), 15);
    assert_eq!(
        plimsoll::grants::describe::describe_sdk(&profile),
        g.tool_txt
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_petstore_sdk_runs_in_node() {
    let g = generate("petstore.yaml", &petstore_options());
    let dir = scratch("node");
    let sdk = dir.join("petstore.sdk.js");
    std::fs::write(&sdk, &g.sdk_js).expect("sdk");
    let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("specgen_sdk.mjs");
    let out = Command::new("node")
        .arg(&harness)
        .arg(&sdk)
        .output()
        .expect("node is on PATH");
    assert!(
        out.status.success(),
        "node: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let _ = std::fs::remove_dir_all(&dir);
}

const STUB: &str = r#"
globalThis.__calls = [];
globalThis.petstore = {
  call(method, path, body) {
    globalThis.__calls.push([method, path, body]);
    return Promise.resolve(null);
  },
};
"#;

const CHECK: &str = r#"
(function () {
  const calls = globalThis.__calls;
  try {
    petstore.getPetById(7);
    const first = calls[0];
    if (calls.length !== 1 || first.length !== 3 || first[0] !== "GET" ||
        first[1] !== "/v2/pet/7" || first[2] !== undefined) {
      return "first call: " + JSON.stringify(calls);
    }
    for (const bad of ["a/b", "..", ".", "", undefined]) {
      let caught = null;
      try { petstore.getPetById(bad); } catch (e) { caught = e; }
      if (!(caught instanceof TypeError)) return "no TypeError for " + String(bad);
    }
    if (calls.length !== 1) return "a refused argument was sent";
    petstore.updatePet({ name: "doggie" });
    if (JSON.stringify(calls[1]) !== JSON.stringify(["PUT", "/v2/pet", { name: "doggie" }])) {
      return "updatePet: " + JSON.stringify(calls[1]);
    }
    return "ok";
  } catch (e) {
    return "threw: " + String(e);
  }
})()
"#;

#[test]
fn the_petstore_sdk_runs_in_quickjs() {
    let g = generate("petstore.yaml", &petstore_options());
    let rt = rquickjs::Runtime::new().expect("runtime");
    let ctx = rquickjs::Context::full(&rt).expect("context");
    ctx.with(|ctx| {
        ctx.eval::<(), _>(STUB).expect("stub");
        ctx.eval::<(), _>(g.sdk_js.as_str())
            .expect("the SDK evaluates");
        let result: String = ctx.eval(CHECK).expect("check");
        assert_eq!(result, "ok");
    });
}
