//! The health check and the batch routes, from the document's
//! `x-plimsoll-health-check` / `x-plimsoll-batch-of` or the operator's
//! `--health-check` / `--batch` (which win), as route templates.

use std::collections::BTreeMap;

use super::Options;
use super::operations::{BATCH_OF_EXT, Collected, HEALTH_CHECK_EXT, Op, shown};

/// What the profile's `health_check` and `batch_of` say, by template.
#[derive(Debug, Default)]
pub(super) struct Hooks {
    pub health_check: Option<String>,
    pub batch_of: BTreeMap<String, Vec<String>>,
}

enum Found {
    Op(usize),
    Skipped,
    Unknown,
}

fn find(c: &Collected, key: &str) -> Found {
    if let Some(i) = c.ops.iter().position(|o| o.key == key) {
        Found::Op(i)
    } else if c.keys.contains(key) {
        Found::Skipped
    } else {
        Found::Unknown
    }
}

/// `who` names where the reference came from, for the message.
fn lookup(c: &Collected, key: &str, who: &str, errors: &mut Vec<String>) -> Option<usize> {
    match find(c, key) {
        Found::Op(i) => Some(i),
        Found::Skipped => {
            errors.push(format!(
                "{who}: {} was skipped (see its warning), so it cannot be used here",
                shown(key)
            ));
            None
        }
        Found::Unknown => {
            errors.push(format!(
                "{who}: no operation has the operationId {}",
                shown(key)
            ));
            None
        }
    }
}

pub(super) fn resolve(c: &Collected, opts: &Options) -> Result<Hooks, Vec<String>> {
    let mut errors = Vec::new();
    let mut hooks = Hooks::default();

    let chosen = match &opts.health_check {
        Some(key) => lookup(c, key, "--health-check", &mut errors),
        None => {
            let marked: Vec<&Op> = c.ops.iter().filter(|o| o.health_check).collect();
            match marked.as_slice() {
                [] => None,
                [one] => c.ops.iter().position(|o| o.key == one.key),
                [a, b, ..] => {
                    errors.push(format!(
                        "{HEALTH_CHECK_EXT} is set on both {} and {}; keep one",
                        a.label, b.label
                    ));
                    None
                }
            }
        }
    };
    if let Some(i) = chosen {
        let op = &c.ops[i];
        if op.method != "GET" || !op.path_params.is_empty() {
            errors.push(format!(
                "{}: a health check must be a GET without path parameters",
                op.label
            ));
        } else {
            hooks.health_check = Some(op.template.clone());
        }
    }

    let mut lists: Vec<(String, usize, &[String])> = Vec::new();
    for (i, op) in c.ops.iter().enumerate() {
        if let Some(items) = &op.batch_of {
            lists.push((
                format!("{} ({BATCH_OF_EXT})", op.label),
                i,
                items.as_slice(),
            ));
        }
    }
    for (key, items) in &opts.batches {
        let who = format!("--batch {}", shown(key));
        if let Some(i) = lookup(c, key, &who, &mut errors) {
            lists.push((who, i, items.as_slice()));
        }
    }
    for (who, i, items) in lists {
        let batch = &c.ops[i];
        if batch.method != "GET" {
            errors.push(format!("{who}: a batch operation must be a GET"));
            continue;
        }
        if items.is_empty() {
            errors.push(format!("{who}: names no per-item operation"));
            continue;
        }
        let mut routes = Vec::new();
        for item in items {
            let Some(j) = lookup(c, item, &who, &mut errors) else {
                continue;
            };
            if j == i {
                errors.push(format!("{who}: lists itself"));
            } else if c.ops[j].method != "GET" {
                errors.push(format!("{who}: {} is not a GET", c.ops[j].label));
            } else {
                routes.push(c.ops[j].template.clone());
            }
        }
        let entry = hooks.batch_of.entry(batch.template.clone()).or_default();
        entry.extend(routes);
        entry.sort_by(|a, b| super::order::route_order(a, b));
        entry.dedup();
    }

    if errors.is_empty() {
        Ok(hooks)
    } else {
        Err(errors)
    }
}
