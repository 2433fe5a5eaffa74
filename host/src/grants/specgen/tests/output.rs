//! What the generator writes: route order, health check and batches,
//! option checks, and the same bytes every time and in either format.

use super::*;

#[test]
fn routes_sort_literal_first_then_by_method() {
    let g = run(json!({
        "/user/{name}": {
            "parameters": [path_param("name")],
            "delete": get("deleteUser"),
            "get": get("getUser"),
        },
        "/user/login": {"get": get("login")},
        "/user": {"post": get("createUser"), "get": get("listUsers")},
        "/store/order": {"get": get("getOrder")},
    }));
    assert_eq!(
        allow(&g),
        [
            "GET /v1/store/order",
            "GET /v1/user",
            "POST /v1/user",
            "GET /v1/user/login",
            "GET /v1/user/*",
            "DELETE /v1/user/*",
        ]
    );
    let names: Vec<Value> = profile(&g)["catalog"]
        .as_array()
        .expect("catalog")
        .iter()
        .map(|e| e["name"].clone())
        .collect();
    assert_eq!(
        names,
        [
            "getOrder",
            "listUsers",
            "createUser",
            "login",
            "getUser",
            "deleteUser"
        ]
    );
}

#[test]
fn health_checks_and_batches_come_from_extensions_or_options() {
    let paths = json!({
        "/health": {"get": {"operationId": "health", "x-plimsoll-health-check": true, "responses": {}}},
        "/items": {"get": {"operationId": "listItems", "x-plimsoll-batch-of": ["getItem"], "responses": {}}},
        "/items/{id}": {"get": {"operationId": "getItem", "parameters": [path_param("id")], "responses": {}}},
    });
    let g = run(paths.clone());
    let p = profile(&g);
    assert_eq!(p["health_check"], "GET /v1/health");
    assert_eq!(p["batch_of"], json!({"GET /v1/items": ["GET /v1/items/*"]}));

    let mut o = opts();
    o.health_check = Some("listItems".into());
    o.batches.insert("listItems".into(), vec!["nope".into()]);
    let errors = run_with(paths, &o).expect_err("unknown");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("--batch listItems: no operation has the operationId nope")),
        "{errors:#?}"
    );

    let errors = refused(json!({"/items/{id}": {"get": {
        "operationId": "getItem", "x-plimsoll-health-check": true,
        "parameters": [path_param("id")], "responses": {}}}}));
    assert!(
        errors[0].contains("a health check must be a GET without path parameters"),
        "{errors:?}"
    );
}

#[test]
fn the_origin_the_servers_and_the_options_are_checked() {
    let mut bad = opts();
    bad.base_url = "http://api.example.com".into();
    bad.callers.clear();
    bad.profile = "a/b".into();
    bad.global = "class".into();
    let errors = run_with(json!({"/a": {"get": get("getA")}}), &bad).expect_err("bad options");
    assert_eq!(errors.len(), 4, "{errors:#?}");

    for url in [
        "https://{region}.example.com/v1",
        "v1",
        "https://api.example.com/v 1",
    ] {
        let text = json!({"openapi": "3.0.0", "info": {"title": "t", "version": "1"},
            "servers": [{"url": url}], "paths": {}});
        assert!(
            generate(&text.to_string(), Format::Json, &opts()).is_err(),
            "{url}"
        );
    }
    let swagger = json!({"swagger": "2.0", "info": {"title": "t", "version": "1"}, "paths": {}});
    assert!(generate(&swagger.to_string(), Format::Json, &opts()).is_err());
    let huge = " ".repeat(MAX_SPEC_BYTES + 1);
    let errors = generate(&huge, Format::Yaml, &opts()).expect_err("too big");
    assert!(errors[0].contains("over 8 MiB"), "{errors:?}");
}

const PETS_YAML: &str = r#"openapi: 3.0.3
info:
  title: Pets */ here
  version: 2.0
servers:
  - url: /api/
paths:
  /pets/{petId}:
    parameters:
      - name: pet_id
        in: path
        required: true
        schema: {type: string}
      - {name: petId, in: path, required: true, schema: {type: string}}
    get:
      operationId: get-pet
      summary: "  One   pet,\n by\tid "
      responses:
        200:
          description: ok
    put:
      operationId: put_pet
      requestBody:
        content:
          application/json:
            schema: {type: object}
      responses: {}
  /pets/search:
    get:
      operationId: searchPets
      parameters:
        - {name: q, in: query, required: true, schema: {type: string}}
      responses: {}
"#;

const PETS_JSON: &str = r#"{
  "openapi": "3.0.3",
  "info": {"title": "Pets */ here", "version": "2.0"},
  "servers": [{"url": "/api/"}],
  "paths": {
    "/pets/{petId}": {
      "parameters": [
        {"name": "pet_id", "in": "path", "required": true, "schema": {"type": "string"}},
        {"name": "petId", "in": "path", "required": true, "schema": {"type": "string"}}
      ],
      "get": {"operationId": "get-pet", "summary": "  One   pet,\n by\tid ",
              "responses": {"200": {"description": "ok"}}},
      "put": {"operationId": "put_pet",
              "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}},
              "responses": {}}
    },
    "/pets/search": {"get": {"operationId": "searchPets",
      "parameters": [{"name": "q", "in": "query", "required": true, "schema": {"type": "string"}}],
      "responses": {}}}
  }
}"#;

#[test]
fn output_is_the_same_every_time_and_in_either_format() {
    let o = opts();
    let yaml = generate(PETS_YAML, Format::Yaml, &o).expect("yaml");
    let again = generate(PETS_YAML, Format::Yaml, &o).expect("yaml again");
    let json = generate(PETS_JSON, Format::Json, &o).expect("json");
    assert_eq!(yaml, again);
    assert_eq!(yaml, json);

    assert_eq!(allow(&yaml), ["GET /api/pets/*", "PUT /api/pets/*"]);
    assert!(yaml.sdk_js.starts_with(
        "// Generated by `plimsoll grants from-openapi` from \"Pets * / here\" version 2.0.\n"
    ));
    assert!(
        yaml.sdk_js
            .contains("    [\"getPet\",\"GET\",0,\"/api/pets/\",\"\"],\n")
    );
    assert!(
        yaml.sdk_js
            .contains("    [\"putPet\",\"PUT\",1,\"/api/pets/\",\"\"],\n")
    );
    assert!(yaml.sdk_js.contains("globalThis[\"demo\"]"));
    assert_eq!(
        yaml.tool_txt,
        "grant_profile \"demo\" (global demo): call these methods with await, e.g. await demo.getPet(...)\n\
         demo.getPet(petId) — GET /api/pets/{petId}: One pet, by id\n\
         demo.putPet(petId, body) — PUT /api/pets/{petId}\n"
    );
    assert_eq!(yaml.warnings.len(), 2, "{:#?}", yaml.warnings);
    let p = profile(&yaml);
    assert_eq!(p["preamble_file"], "demo.sdk.js");
    assert!(p.get("preamble").is_none());
    let keys: Vec<&str> = yaml
        .profile_json
        .lines()
        .filter(|l| l.starts_with("      \""))
        .map(|l| l.trim().split('"').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        keys,
        [
            "base_url",
            "allow",
            "allowed_callers",
            "global",
            "preamble_file",
            "catalog"
        ]
    );
    assert!(yaml.profile_json.ends_with("}\n"));
}

#[test]
fn the_format_is_sniffed_from_the_name_then_the_text() {
    use std::path::Path;
    assert_eq!(sniff(Path::new("a.JSON"), "openapi: 3.0.0"), Format::Json);
    assert_eq!(sniff(Path::new("a.yml"), "{}"), Format::Yaml);
    assert_eq!(sniff(Path::new("a.yaml"), "{}"), Format::Yaml);
    assert_eq!(
        sniff(Path::new("spec"), "\u{feff}\n  {\"openapi\": 1}"),
        Format::Json
    );
    assert_eq!(sniff(Path::new("spec.txt"), "openapi: 3.0.0"), Format::Yaml);
}
