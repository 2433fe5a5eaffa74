//! What a model is told about a grant profile's SDK: one line per method
//! the profile both catalogs and grants, as `await <global>.<name>(...)`
//! calls it can write.
//!
//! Every word comes from a fixed template or from the frozen profile (its
//! name, global, catalog and allow list, all checked at load), never from a
//! request or an answer. The text is bounded: a profile's part stops at a
//! whole line past `MAX_PROFILE_DESCRIPTION`, and the whole at a whole
//! profile past `MAX_DESCRIPTION`, each saying how much it left out.

use super::Profile;
use super::catalog::CatalogEntry;

/// The most one profile's description takes, in bytes.
pub const MAX_PROFILE_DESCRIPTION: usize = 4 << 10;
/// The most every profile's descriptions take together, in bytes.
pub const MAX_DESCRIPTION: usize = 16 << 10;
/// Room kept for the closing "…and N more" line.
const TRAILER_ROOM: usize = 48;

/// One profile: a header naming it and its global, then one line per
/// granted catalog entry, `G.name(petId, body) — PUT /pets/{petId}: summary`.
/// A profile without such entries lists its granted routes instead.
pub fn describe_sdk(profile: &Profile) -> String {
    let g = profile.global.as_str();
    let granted: Vec<&CatalogEntry> = profile
        .catalog
        .iter()
        .filter(|e| {
            profile
                .allow
                .iter()
                .any(|r| r.template() == e.route.template())
        })
        .collect();
    if let Some(first) = granted.first() {
        let header = format!(
            "grant_profile \"{}\" (global {g}): call these methods with await, e.g. await {g}.{}(...)",
            profile.name, first.name
        );
        let lines: Vec<String> = granted.iter().map(|e| method_line(g, e)).collect();
        capped(header, &lines, MAX_PROFILE_DESCRIPTION, "method", "methods")
    } else {
        let header = format!(
            "grant_profile \"{}\" (global {g}): no SDK methods; call await {g}.call(method, path, body) \
             (or {g}.get, post, put, patch, del) on these routes, each * one path segment",
            profile.name
        );
        let lines: Vec<String> = profile
            .allow
            .iter()
            .map(|r| r.template().to_string())
            .collect();
        capped(header, &lines, MAX_PROFILE_DESCRIPTION, "route", "routes")
    }
}

/// Every profile given, sorted by name, a blank line between two, within
/// `MAX_DESCRIPTION`.
pub fn describe_all(profiles: &[&Profile]) -> String {
    let mut sorted: Vec<&Profile> = profiles.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    for (i, profile) in sorted.iter().enumerate() {
        let block = describe_sdk(profile);
        let separator = usize::from(!out.is_empty());
        let room = if i + 1 < sorted.len() {
            TRAILER_ROOM
        } else {
            0
        };
        if out.len() + separator + block.len() + room > MAX_DESCRIPTION {
            out.push_str(&more(sorted.len() - i, "grant profile", "grant profiles"));
            return out;
        }
        if separator == 1 {
            out.push('\n');
        }
        out.push_str(&block);
    }
    out
}

/// `G.name(p1, p2, body)`.
fn call_form(g: &str, e: &CatalogEntry) -> String {
    let mut args: Vec<&str> = e.params.iter().map(String::as_str).collect();
    if e.body {
        args.push("body");
    }
    format!("{g}.{}({})", e.name, args.join(", "))
}

/// `G.name(petId) — GET /pets/{petId}: summary`, each `*` of the route shown
/// as the parameter that fills it.
fn method_line(g: &str, e: &CatalogEntry) -> String {
    let mut params = e.params.iter();
    let path: Vec<String> = e
        .route
        .path_template()
        .split('/')
        .map(|segment| {
            if segment != "*" {
                return segment.to_string();
            }
            match params.next() {
                Some(p) => format!("{{{p}}}"),
                None => "*".to_string(),
            }
        })
        .collect();
    let mut line = format!(
        "{} — {} {}",
        call_form(g, e),
        e.route.method,
        path.join("/")
    );
    if !e.summary.is_empty() {
        line.push_str(": ");
        line.push_str(&e.summary);
    }
    line
}

/// The header and as many whole lines as fit in `cap` bytes, then a line
/// counting the rest.
fn capped(header: String, lines: &[String], cap: usize, one: &str, many: &str) -> String {
    let mut out = header;
    out.push('\n');
    for (i, line) in lines.iter().enumerate() {
        let room = if i + 1 < lines.len() { TRAILER_ROOM } else { 0 };
        if out.len() + line.len() + 1 + room > cap {
            out.push_str(&more(lines.len() - i, one, many));
            return out;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn more(n: usize, one: &str, many: &str) -> String {
    format!("…and {n} more {}\n", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::Grants;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn profile(name: &str, catalog: &str, allow: &str) -> std::sync::Arc<Profile> {
        let text = format!(
            r#"{{"profiles": {{"{name}": {{"base_url": "https://api.example.com",
                "allow": {allow}, "allowed_callers": ["anonymous"], "global": "api",
                "catalog": {catalog}}}}}}}"#
        );
        let grants = Grants::parse(&text, &no_env, None).expect("loads");
        grants.for_caller(name, "anonymous").expect("permitted")
    }

    #[test]
    fn lines_name_granted_methods_only() {
        let p = profile(
            "pets",
            r#"[{"route": "GET /pets/*", "name": "getPet", "summary": "One pet", "params": ["petId"]},
                {"route": "PUT /pets/*", "name": "putPet", "params": ["petId"], "body": true},
                {"route": "DELETE /pets/*", "name": "dropPet", "params": ["petId"]}]"#,
            r#"["GET /pets/*", "PUT /pets/*"]"#,
        );
        assert_eq!(
            describe_sdk(&p),
            "grant_profile \"pets\" (global api): call these methods with await, e.g. await api.getPet(...)\n\
             api.getPet(petId) — GET /pets/{petId}: One pet\n\
             api.putPet(petId, body) — PUT /pets/{petId}\n"
        );
    }

    #[test]
    fn a_profile_without_a_catalog_lists_its_routes() {
        let p = profile("bare", "[]", r#"["GET /a", "POST /b/*"]"#);
        let text = describe_sdk(&p);
        assert!(text.starts_with("grant_profile \"bare\" (global api): no SDK methods"));
        assert!(text.ends_with("\nGET /a\nPOST /b/*\n"), "{text}");
    }

    #[test]
    fn descriptions_are_capped_at_whole_lines() {
        let n = 400;
        let catalog: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"route": "GET /items{i}", "name": "item{i}", "summary": "{}"}}"#,
                    "s".repeat(40)
                )
            })
            .collect();
        let allow: Vec<String> = (0..n).map(|i| format!("\"GET /items{i}\"")).collect();
        let p = profile(
            "big",
            &format!("[{}]", catalog.join(",")),
            &format!("[{}]", allow.join(",")),
        );
        let text = describe_sdk(&p);
        assert!(text.len() <= MAX_PROFILE_DESCRIPTION, "{}", text.len());
        let last = text.lines().last().expect("a line");
        assert!(
            last.starts_with("…and ") && last.ends_with(" more methods"),
            "{last}"
        );
        let shown = text.lines().count() - 2;
        assert_eq!(last, format!("…and {} more methods", n - shown));

        let others: Vec<std::sync::Arc<Profile>> = (0..6)
            .map(|i| {
                profile(
                    &format!("p{i}"),
                    &format!("[{}]", catalog.join(",")),
                    &format!("[{}]", allow.join(",")),
                )
            })
            .collect();
        let refs: Vec<&Profile> = others.iter().rev().map(|p| &**p).collect();
        let all = describe_all(&refs);
        assert!(all.len() <= MAX_DESCRIPTION, "{}", all.len());
        assert!(all.starts_with("grant_profile \"p0\""));
        assert!(all.ends_with(" more grant profiles\n"), "{all}");
    }
}
