//! The outputs: operations in route order, the allow list and catalog, the
//! SDK, the grants file (checked by loading it as the daemon would) and the
//! tool description of the profile that load gave.

use std::collections::BTreeMap;

use openapiv3::Info;
use serde::Serialize;

use super::hooks::Hooks;
use super::operations::{Collected, Op};
use super::order::route_order;
use super::{Generated, Options, sdk};
use crate::grants::Grants;
use crate::grants::catalog::CatalogShape;
use crate::grants::describe::describe_sdk;
use crate::grants::route::{self, Route};

#[derive(Serialize)]
struct FileOut<'a> {
    profiles: BTreeMap<&'a str, ProfileOut<'a>>,
}

/// The profile's fields in the order the file shows them.
#[derive(Serialize)]
struct ProfileOut<'a> {
    base_url: &'a str,
    allow: &'a [String],
    allowed_callers: &'a [String],
    global: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    preamble: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    preamble_file: Option<String>,
    catalog: &'a [CatalogShape],
    #[serde(skip_serializing_if = "Option::is_none")]
    health_check: Option<&'a str>,
    #[serde(skip_serializing_if = "no_batches")]
    batch_of: &'a BTreeMap<String, Vec<String>>,
}

fn no_batches(b: &&BTreeMap<String, Vec<String>>) -> bool {
    b.is_empty()
}

fn no_env(_: &str) -> Option<String> {
    None
}

pub(super) fn finish(
    info: &Info,
    opts: &Options,
    found: Collected,
    hooks: Hooks,
) -> Result<Generated, Vec<String>> {
    let Collected {
        mut ops,
        skipped,
        warnings: collected,
        ..
    } = found;
    ops.sort_by(|a, b| route_order(&a.template, &b.template).then_with(|| a.name.cmp(&b.name)));
    let mut allow: Vec<String> = ops.iter().map(|o| o.template.clone()).collect();
    allow.dedup();
    let routes: Vec<Route> = allow
        .iter()
        .map(|t| Route::parse(t.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|why| vec![format!("an emitted route does not parse: {why}")])?;

    // A skipped literal path a wildcard of another operation still reaches:
    // the grant allows it whatever the SDK offers.
    let mut reachable: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for s in &skipped {
        let (Some(method), Some(path)) = (s.method, s.path.as_deref()) else {
            continue;
        };
        if let Ok(r) = route::find(&routes, method, path) {
            reachable.entry(s.warning).or_default().push(format!(
                "warning: {}: {method} {path} is still reachable through {}",
                s.label,
                r.template()
            ));
        }
    }
    let mut warnings = Vec::with_capacity(collected.len() + reachable.len());
    for (i, w) in collected.into_iter().enumerate() {
        warnings.push(w);
        if let Some(more) = reachable.remove(&i) {
            warnings.extend(more);
        }
    }
    if ops.is_empty() {
        warnings.push(
            "warning: no operation of the document can be granted; the profile allows nothing"
                .into(),
        );
    }

    let catalog: Vec<CatalogShape> = ops.iter().map(catalog_entry).collect();
    let sdk_js = sdk::render(&info.title, &info.version, &opts.global, &ops);
    let file = |preamble: Option<&str>, preamble_file: Option<String>| {
        let profile = ProfileOut {
            base_url: &opts.base_url,
            allow: &allow,
            allowed_callers: &opts.callers,
            global: &opts.global,
            preamble,
            preamble_file,
            catalog: &catalog,
            health_check: hooks.health_check.as_deref(),
            batch_of: &hooks.batch_of,
        };
        let out = FileOut {
            profiles: BTreeMap::from([(opts.profile.as_str(), profile)]),
        };
        serde_json::to_string_pretty(&out)
    };
    let inline = file(Some(sdk_js.as_str()), None)
        .map_err(|e| vec![format!("the profile does not serialize: {e}")])?;
    let grants = Grants::parse(&inline, &no_env, None)
        .map_err(|why| vec![format!("the generated profile does not load: {why}")])?;
    let caller = opts.callers.first().map(String::as_str).unwrap_or("");
    let profile = grants.for_caller(&opts.profile, caller).ok_or_else(|| {
        vec!["the generated profile does not admit its own first caller".to_string()]
    })?;
    let tool_txt = describe_sdk(&profile);
    let mut profile_json = file(None, Some(format!("{}.sdk.js", opts.profile)))
        .map_err(|e| vec![format!("the profile does not serialize: {e}")])?;
    profile_json.push('\n');
    Ok(Generated {
        profile_json,
        sdk_js,
        tool_txt,
        warnings,
    })
}

fn catalog_entry(op: &Op) -> CatalogShape {
    CatalogShape {
        route: op.template.clone(),
        name: op.name.clone(),
        summary: op.summary.clone(),
        params: op.params.clone(),
        body: op.body,
    }
}
