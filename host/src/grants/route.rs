//! Route templates and the matcher the broker decides with.
//!
//! The rule is "approve exactly what goes on the wire": a path is accepted
//! only in the one spelling the upstream server will read the same way. So a
//! path the host would have to decode, normalise or re-encode is refused, not
//! repaired, and a wildcard binds one plain identifier, never a segment some
//! server treats specially (`..;`, `:custom`, `$batch`).

/// The methods a grant can name.
pub const METHODS: &[&str] = &["GET", "PUT", "POST", "PATCH", "DELETE"];

/// Longest path the broker will consider.
pub const MAX_PATH_BYTES: usize = 2048;

/// One `allow` entry: a method and a path of literal and `*` segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub method: &'static str,
    segments: Vec<Segment>,
    /// The entry as written (normalised method), for traces and budgets.
    template: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

impl Route {
    /// Parses `"METHOD /a/*/b"`. The template itself must be canonical, and
    /// `*` must be a whole segment.
    pub fn parse(entry: &str) -> Result<Route, String> {
        let (method, path) = entry
            .split_once(' ')
            .ok_or_else(|| format!("{entry:?} is not \"METHOD /path\""))?;
        let method = canonical_method(method).ok_or_else(|| {
            format!(
                "{entry:?}: the method must be one of {}",
                METHODS.join(", ")
            )
        })?;
        if path.contains('*') {
            // Wildcards are whole segments; the rest must be canonical.
            let literal = path.replace('*', "x");
            check_path(&literal).map_err(|why| format!("{entry:?}: {why}"))?;
            if path.split('/').any(|s| s.contains('*') && s != "*") {
                return Err(format!("{entry:?}: * must be a whole segment"));
            }
        } else {
            check_path(path).map_err(|why| format!("{entry:?}: {why}"))?;
        }
        let segments = path[1..]
            .split('/')
            .map(|s| {
                if s == "*" {
                    Segment::Any
                } else {
                    Segment::Literal(s.to_string())
                }
            })
            .collect();
        Ok(Route {
            method,
            segments,
            template: format!("{method} {path}"),
        })
    }

    /// `"METHOD /path/*"`, as configured.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// The template's path part.
    pub fn path_template(&self) -> &str {
        &self.template[self.method.len() + 1..]
    }

    fn matches(&self, method: &str, segments: &[&str]) -> bool {
        self.method == method
            && self.segments.len() == segments.len()
            && self.segments.iter().zip(segments).all(|(t, s)| match t {
                Segment::Literal(l) => l == s,
                Segment::Any => wildcard_ok(s),
            })
    }
}

/// GET, get, Get... → "GET"; anything else is refused.
pub fn canonical_method(m: &str) -> Option<&'static str> {
    METHODS.iter().copied().find(|k| k.eq_ignore_ascii_case(m))
}

/// Why a call was not matched. The text is fixed: it never repeats the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The path is not in canonical form.
    NotCanonical,
    /// Canonical, but no route of the grant matches it.
    NoRoute,
}

impl Denied {
    pub fn text(self) -> &'static str {
        match self {
            Denied::NotCanonical => "the path is not in canonical form",
            Denied::NoRoute => "no route of the grant matches this method and path",
        }
    }
}

/// The first route matching `method` and `path`.
pub fn find<'a>(routes: &'a [Route], method: &str, path: &str) -> Result<&'a Route, Denied> {
    find_index(routes, method, path).map(|i| &routes[i])
}

/// As `find`, the matching entry's index in `routes`.
pub fn find_index(routes: &[Route], method: &str, path: &str) -> Result<usize, Denied> {
    check_path(path).map_err(|_| Denied::NotCanonical)?;
    let method = canonical_method(method).ok_or(Denied::NoRoute)?;
    let segments: Vec<&str> = path[1..].split('/').collect();
    routes
        .iter()
        .position(|r| r.matches(method, &segments))
        .ok_or(Denied::NoRoute)
}

/// A path the broker can send exactly as approved.
pub fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return Err("the path is empty or too long");
    }
    if !path.starts_with('/') {
        return Err("the path must start with /");
    }
    if path == "/" {
        return Ok(());
    }
    for b in path.bytes() {
        // Only bytes that go on the wire as themselves: RFC 3986 pchar
        // without percent-escapes (an escape is a second spelling of some
        // other byte; decoded must equal raw). No ?, #, \, controls, spaces,
        // or non-ASCII (which a client would have to encode).
        let ok = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b);
        if !ok {
            return Err("the path holds a byte that is not sent as itself");
        }
    }
    for seg in path[1..].split('/') {
        if seg.is_empty() {
            return Err("the path has an empty segment");
        }
        if seg.bytes().all(|b| b == b'.') {
            return Err("the path has a dot segment");
        }
        if seg.contains(';') {
            // `..;/` and matrix parameters are read differently by servers.
            return Err("a segment holds ;");
        }
    }
    Ok(())
}

/// What a `*` may bind: one non-empty segment of unreserved characters.
fn wildcard_ok(seg: &str) -> bool {
    !seg.is_empty()
        && seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        && !seg.bytes().all(|b| b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn routes(entries: &[&str]) -> Vec<Route> {
        entries
            .iter()
            .map(|e| Route::parse(e).expect("route"))
            .collect()
    }

    #[test]
    fn templates_name_method_and_path_and_refusals_never_the_path() {
        let r = Route::parse("post /items/*/notes").expect("route");
        assert_eq!(r.template(), "POST /items/*/notes");
        assert_eq!(r.path_template(), "/items/*/notes");
        assert_eq!(Route::parse("DELETE /").expect("root").path_template(), "/");
        assert_eq!(
            Denied::NotCanonical.text(),
            "the path is not in canonical form"
        );
        assert_eq!(
            Denied::NoRoute.text(),
            "no route of the grant matches this method and path"
        );
    }

    #[test]
    fn the_path_length_limit_is_exact() {
        let at = format!("/{}", "a".repeat(MAX_PATH_BYTES - 1));
        assert_eq!(at.len(), MAX_PATH_BYTES);
        assert!(check_path(&at).is_ok());
        let over = format!("/{}", "a".repeat(MAX_PATH_BYTES));
        assert!(check_path(&over).is_err());
        assert!(check_path("").is_err());
    }

    #[test]
    fn templates_parse_or_are_refused() {
        for good in [
            "GET /items",
            "get /items/*",
            "POST /items/*/notes",
            "DELETE /a/b/c",
            "GET /",
        ] {
            Route::parse(good).expect(good);
        }
        for bad in [
            "HEAD /items",
            "GET items",
            "GET /items/",
            "GET /items//x",
            "GET /items/x*",
            "GET /items/../x",
            "GET /items?x=1",
            "GET /it%65ms",
            "GET /a;b",
            "/items",
        ] {
            assert!(Route::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn tricky_paths_are_refused() {
        let r = routes(&["GET /items/*", "POST /items/*/notes", "GET /admin/ok"]);
        let ok = |m: &str, p: &str| find(&r, m, p).map(|r| r.template().to_string());
        assert_eq!(ok("GET", "/items/42"), Ok("GET /items/*".into()));
        assert_eq!(ok("get", "/items/a-b_c.d~e"), Ok("GET /items/*".into()));
        assert_eq!(
            ok("Post", "/items/7/notes"),
            Ok("POST /items/*/notes".into())
        );
        for (m, p) in [
            ("GET", "/items/../admin/ok"),
            ("GET", "/items/%2e%2e"),
            ("GET", "/items/%2E%2E/admin"),
            ("GET", "/items/.."),
            ("GET", "/items/."),
            ("GET", "/items/..;/admin"),
            ("GET", "/items/1;jsessionid=x"),
            ("GET", "//items/1"),
            ("GET", "/items//1"),
            ("GET", "/items/1/"),
            ("GET", "/items%2f1"),
            ("GET", "/items/1%2fadmin"),
            ("GET", "/items/1?x=1"),
            ("GET", "/items/1#f"),
            ("GET", "/items\\1"),
            ("GET", "/items/\u{ff0e}\u{ff0e}"),
            ("GET", "/items/1\u{0}"),
            ("GET", "/items/1 2"),
            ("GET", "/items/a:b"),
            ("GET", "/items/$batch"),
            ("GET", "/items/1/2"),
            ("GET", "/items"),
            ("POST", "/items/1"),
            ("HEAD", "/items/1"),
            ("GET ", "/items/1"),
            ("G\u{0130}T", "/items/1"),
            ("GET", "items/1"),
            ("GET", "/admin/ok/"),
            ("GET", "/ADMIN/ok"),
            ("GET", ""),
        ] {
            assert!(find(&r, m, p).is_err(), "{m} {p:?} was allowed");
        }
    }

    proptest! {
        #[test]
        fn the_matcher_never_panics_and_only_approves_canonical_paths(
            method in "[A-Za-z]{0,8}",
            path in "[ -~\\u{80}-\\u{10ffff}]{0,64}",
        ) {
            let r = routes(&["GET /items/*", "PUT /items/*/x", "DELETE /a"]);
            if let Ok(route) = find(&r, &method, &path) {
                prop_assert!(check_path(&path).is_ok());
                prop_assert!(!path.contains(".."));
                prop_assert!(!path.contains('%'));
                prop_assert_eq!(route.method, canonical_method(&method).unwrap_or(""));
            }
        }

        #[test]
        fn wildcards_bind_only_unreserved_segments(seg in "[ -~]{1,12}") {
            let r = routes(&["GET /items/*"]);
            let path = format!("/items/{seg}");
            if find(&r, "GET", &path).is_ok() {
                prop_assert!(seg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b)));
                prop_assert!(!seg.bytes().all(|b| b == b'.'));
            }
        }
    }
}
