//! The generator's refusals and skips, each on a small document; the
//! outputs' order, hooks and determinism are in `output`.

use serde_json::{Value, json};

use super::naming::{fallback_name, lower_camel};
use super::*;

mod output;

fn opts() -> Options {
    Options {
        base_url: "https://api.example.com".into(),
        profile: "demo".into(),
        global: "demo".into(),
        callers: vec!["anonymous".into()],
        ..Options::default()
    }
}

/// A JSON document with `paths` under the base path `/v1`.
fn doc(paths: Value) -> String {
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Demo", "version": "1"},
        "servers": [{"url": "https://api.example.com/v1"}],
        "paths": paths,
    })
    .to_string()
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}})
}

fn get(id: &str) -> Value {
    json!({"operationId": id, "responses": {}})
}

fn run_with(paths: Value, o: &Options) -> Result<Generated, Vec<String>> {
    generate(&doc(paths), Format::Json, o)
}

fn run(paths: Value) -> Generated {
    run_with(paths, &opts()).unwrap_or_else(|e| panic!("refused: {e:#?}"))
}

fn refused(paths: Value) -> Vec<String> {
    match run_with(paths, &opts()) {
        Ok(g) => panic!("accepted: {}", g.profile_json),
        Err(e) => e,
    }
}

fn profile(g: &Generated) -> Value {
    let file: Value = serde_json::from_str(&g.profile_json).expect("JSON");
    file["profiles"]["demo"].clone()
}

fn allow(g: &Generated) -> Vec<String> {
    profile(g)["allow"]
        .as_array()
        .expect("allow")
        .iter()
        .map(|v| v.as_str().expect("text").to_string())
        .collect()
}

#[test]
fn names_are_lower_camel_case_or_made_from_the_route() {
    assert_eq!(lower_camel("get-stations"), "getStations");
    assert_eq!(lower_camel("findPetsByStatus"), "findPetsByStatus");
    assert_eq!(lower_camel("list_all.items/now"), "listAllItemsNow");
    assert_eq!(lower_camel("HTTPGet"), "httpGet");
    assert_eq!(lower_camel("GetURL"), "getURL");
    assert_eq!(fallback_name("GET", "/pet/{petId}"), "getPetByPetId");
    assert_eq!(fallback_name("PUT", "/a/{x}/b-c/{y_z}"), "putABCByXAndYZ");
    assert_eq!(fallback_name("POST", "/store/order"), "postStoreOrder");

    let g = run(json!({"/pet/{petId}": {"get": {
        "parameters": [path_param("pet_id")], "responses": {}}}}));
    let g2 = run(json!({"/pet/{pet_id}": {"get": {
        "parameters": [path_param("pet_id")], "responses": {}}}}));
    assert!(
        g.warnings[0].contains("path parameter petId is not declared"),
        "{:?}",
        g.warnings
    );
    let p = profile(&g2);
    let entry = &p["catalog"][0];
    assert_eq!(entry["name"], "getPetByPetId");
    assert_eq!(entry["params"], json!(["petId"]));
    assert_eq!(entry["route"], "GET /v1/pet/*");
}

#[test]
fn a_thenable_name_is_refused_with_the_rename_that_fixes_it() {
    let errors = refused(json!({"/items/{id}": {"get": {
        "operationId": "then", "parameters": [path_param("id")], "responses": {}}}}));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("GET /items/{id} (then)"),
        "{}",
        errors[0]
    );
    assert!(errors[0].contains("--rename 'then=NAME'"), "{}", errors[0]);

    let mut o = opts();
    o.renames.insert("then".into(), "getItem".into());
    let paths = json!({"/items/{id}": {"get": {
        "operationId": "then", "parameters": [path_param("id")], "responses": {}}}});
    let g = run_with(paths, &o).expect("renamed");
    assert_eq!(profile(&g)["catalog"][0]["name"], "getItem");

    for word in ["delete", "class", "constructor", "toString", "call"] {
        let errors = refused(json!({"/x": {"get": get(word)}}));
        assert!(errors[0].contains("--rename"), "{word}: {errors:?}");
    }
}

#[test]
fn two_operations_one_name_is_refused_naming_both() {
    let errors = refused(json!({
        "/a": {"get": get("get-items")},
        "/b": {"get": get("get_items")},
    }));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("GET /a (get-items)"), "{}", errors[0]);
    assert!(errors[0].contains("GET /b (get_items)"), "{}", errors[0]);
    assert!(errors[0].contains("\"getItems\""), "{}", errors[0]);
    assert!(errors[0].contains("--rename OP=NAME"), "{}", errors[0]);
}

#[test]
fn a_path_item_reference_is_refused_unless_skipped() {
    let paths = json!({
        "/a": {"$ref": "#/components/pathItems/A"},
        "/b": {"get": get("getB")},
    });
    let errors = refused(paths.clone());
    assert!(
        errors[0].contains("/a: the path item is a reference"),
        "{errors:?}"
    );
    assert!(errors[0].contains("--skip-refs"), "{errors:?}");

    let mut o = opts();
    o.skip_refs = true;
    let g = run_with(paths, &o).expect("skipped");
    assert_eq!(allow(&g), ["GET /v1/b"]);
    assert_eq!(g.warnings.len(), 1);
    assert!(g.warnings[0].starts_with("warning: /a: the path item is a reference"));
    assert!(g.warnings[0].ends_with("; skipped"));
}

#[test]
fn an_external_reference_anywhere_is_refused() {
    let errors = refused(json!({"/a": {"get": {
        "operationId": "getA",
        "parameters": [{"$ref": "common.yaml#/components/parameters/Limit"}],
        "responses": {}}}}));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("\"common.yaml#/components/parameters/Limit\""));
    assert!(errors[0].contains("points outside the document"));

    let errors = refused(json!({"/a": {"get": {"operationId": "getA", "responses": {
        "200": {"description": "ok", "content": {"application/json": {
            "schema": {"$ref": "https://schemas.example.com/a.json"}}}}}}}}));
    assert!(errors[0].contains("outside the document"), "{errors:?}");
}

#[test]
fn references_to_components_are_followed_one_level() {
    let text = json!({
        "openapi": "3.0.0",
        "info": {"title": "Refs", "version": "1"},
        "paths": {"/a/{id}": {"post": {
            "operationId": "postA",
            "parameters": [{"$ref": "#/components/parameters/Id"}],
            "requestBody": {"$ref": "#/components/requestBodies/A"},
            "responses": {}}}},
        "components": {
            "parameters": {"Id": path_param("id"), "Again": {"$ref": "#/components/parameters/Id"}},
            "requestBodies": {"A": {"content": {"application/vnd.a+json": {}}}},
        },
    });
    let g = generate(&text.to_string(), Format::Json, &opts()).expect("followed");
    assert_eq!(allow(&g), ["POST /a/*"]);
    assert_eq!(profile(&g)["catalog"][0]["body"], true);

    let mut twice = text.clone();
    twice["paths"]["/a/{id}"]["post"]["parameters"][0]["$ref"] =
        json!("#/components/parameters/Again");
    let errors = generate(&twice.to_string(), Format::Json, &opts()).expect_err("a ref to a ref");
    assert!(
        errors[0].contains("leads to another reference"),
        "{errors:?}"
    );
}

#[test]
fn a_required_query_parameter_skips_its_operation() {
    let g = run(json!({
        "/pet/findByStatus": {"get": {
            "operationId": "findPetsByStatus",
            "parameters": [{"name": "status", "in": "query", "required": true, "schema": {"type": "string"}},
                           {"name": "limit", "in": "query", "schema": {"type": "integer"}}],
            "responses": {}}},
        "/pet": {"get": {
            "operationId": "listPets",
            "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer"}},
                           {"name": "Authorization", "in": "header", "required": true, "schema": {"type": "string"}}],
            "responses": {}}},
    }));
    assert_eq!(
        g.warnings,
        [
            "warning: GET /pet/findByStatus (findPetsByStatus): required query parameter status; skipped"
        ]
    );
    assert_eq!(allow(&g), ["GET /v1/pet"]);
}

#[test]
fn a_skipped_literal_still_reachable_through_a_wildcard_is_said() {
    let g = run(json!({
        "/pets/{id}": {"get": {"operationId": "getPet", "parameters": [path_param("id")], "responses": {}}},
        "/pets/search": {"get": {
            "operationId": "searchPets",
            "parameters": [{"name": "q", "in": "cookie", "required": true, "schema": {"type": "string"}}],
            "responses": {}}},
    }));
    assert_eq!(
        g.warnings,
        [
            "warning: GET /pets/search (searchPets): required cookie parameter q; skipped",
            "warning: GET /pets/search (searchPets): GET /v1/pets/search is still reachable through GET /v1/pets/*",
        ]
    );
}

#[test]
fn parameters_inside_a_segment_and_other_unsendable_shapes_are_skipped() {
    let g = run(json!({
        "/files/{name}.json": {"get": {"operationId": "getFile", "parameters": [path_param("name")], "responses": {}}},
        "/x{a}": {"get": {"operationId": "getX", "parameters": [path_param("a")], "responses": {}}},
        "/pair/{a}{b}": {"get": {"operationId": "getPair", "parameters": [path_param("a"), path_param("b")], "responses": {}}},
        "/undeclared/{id}": {"get": get("getUndeclared")},
        "/trailing/": {"get": get("getTrailing")},
        "/form": {"post": {"operationId": "postForm", "requestBody": {"content": {
            "application/x-www-form-urlencoded": {}}}, "responses": {}}},
        "/ping": {"head": get("headPing"), "get": get("getPing")},
    }));
    let joined = g.warnings.join("\n");
    for (label, why) in [
        ("GET /files/{name}.json (getFile)", "is not a whole segment"),
        ("GET /x{a} (getX)", "is not a whole segment"),
        ("GET /pair/{a}{b} (getPair)", "is not a whole segment"),
        ("GET /undeclared/{id} (getUndeclared)", "not declared"),
        ("GET /trailing/ (getTrailing)", "empty segment"),
        (
            "POST /form (postForm)",
            "application/x-www-form-urlencoded, not JSON",
        ),
        ("HEAD /ping (headPing)", "cannot name HEAD"),
    ] {
        assert!(
            g.warnings
                .iter()
                .any(|w| w.starts_with(&format!("warning: {label}: ")) && w.contains(why)),
            "{label}: {why}\n{joined}"
        );
    }
    assert_eq!(g.warnings.len(), 7, "{joined}");
    assert_eq!(allow(&g), ["GET /v1/ping"]);
}

#[test]
fn deep_yaml_nesting_is_refused_before_the_parser_sees_it() {
    // Quadratic in the YAML scanner: 200,000 levels took 81 s before this
    // check, and an 8 MiB document would take hours.
    let deep = format!(
        "openapi: 3.0.0\nx: {}{}\n",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    let started = std::time::Instant::now();
    let Err(errors) = generate(&deep, Format::Yaml, &opts()) else {
        panic!("a 200,000-deep document was accepted");
    };
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert!(errors[0].contains("deeper than 64"), "{errors:?}");
    // Brackets inside quotes and comments are text, not nesting.
    let quoted = format!(
        "openapi: 3.0.0\ninfo: {{title: \"{}\", version: '1'}} # {}\npaths: {{}}\n",
        "[".repeat(100),
        "{".repeat(100)
    );
    let out = generate(&quoted, Format::Yaml, &opts());
    assert!(
        out.as_ref()
            .err()
            .is_none_or(|e| !e[0].contains("deeper than")),
        "{out:?}"
    );
}

#[test]
fn a_paths_key_that_is_not_a_path_is_refused_not_dropped() {
    let errors = refused(json!({"users/{id}": {"delete": get("removeUser")}}));
    assert!(errors[0].contains("does not start with /"), "{errors:?}");
}
