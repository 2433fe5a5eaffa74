//! What the service says it made, checked before any guest code runs: the
//! sandbox is the one this run asked for, no bigger than asked, reachable
//! only at an endpoint the operator allowed, and sealed from the network.

use serde_json::Value;

/// Operations the run needs the endpoint to serve.
const NEEDED: [&str; 3] = ["exec", "upload", "download"];

/// Checks a running sandbox; returns its endpoint (no trailing slash).
pub fn sandbox(v: &Value, name: &str, allowed: &[String]) -> Result<String, String> {
    if v["displayName"].as_str() != Some(name) {
        return Err("the service reports another display name than the run asked for".into());
    }
    let core = &v["core"];
    let endpoint = &core["endpoint"];
    match endpoint["protocol"].as_str() {
        None | Some("http") => {}
        Some(other) => {
            return Err(format!(
                "the sandbox endpoint's protocol is {}, not http",
                short(other)
            ));
        }
    }
    let served: Vec<&str> = endpoint["capabilities"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(missing) = NEEDED.iter().find(|n| !served.contains(n)) {
        return Err(format!("the sandbox endpoint does not serve {missing}"));
    }
    let uri = endpoint["uri"]
        .as_str()
        .ok_or("the service reports no sandbox endpoint")?
        .trim_end_matches('/');
    let origin = origin_of(uri).ok_or("the sandbox endpoint is not an http(s) URL")?;
    if !allowed.contains(&origin) {
        return Err(format!(
            "the sandbox endpoint's origin {} is not allowed: add it to SANDBOX_PLUGIN_HTTP_ORIGINS (and keep it out of SANDBOX_PLUGIN_API_KEY_ORIGINS)",
            short(&origin)
        ));
    }
    // The size this adapter asks for (the operator's choice): the service
    // must not report more.
    let (want_cpus, want_mib) = (crate::settings::cpus(), crate::settings::memory_mib());
    let cpus = number(&core["resources"]["cpus"]);
    let memory = number(&core["resources"]["memoryMib"]);
    match (cpus, memory) {
        (Some(c), Some(m)) if c > 0 && c <= want_cpus && m > 0 && m <= want_mib => {}
        (Some(_), Some(_)) => {
            return Err(format!(
                "the sandbox is not the size asked for ({want_cpus} CPU, {want_mib} MiB or less)"
            ));
        }
        _ => return Err("the service reports no CPU or memory size for the sandbox".into()),
    }
    Ok(uri.to_string())
}

/// The effective policy must deny everything and allow nothing, from any
/// layer: one allow rule and the run does not start.
pub fn deny_all(v: &Value) -> Result<(), String> {
    let effective = &v["effective"];
    if !effective.is_object() {
        return Err("the answer holds no effective policy".into());
    }
    match effective["mode"].as_str() {
        Some("denyAll") => {}
        Some(mode) => return Err(format!("the effective mode is {}", short(mode))),
        None => return Err("the effective policy states no mode".into()),
    }
    match &effective["allowNetworks"] {
        Value::Null => Ok(()),
        Value::Array(rules) if rules.is_empty() => Ok(()),
        Value::Array(rules) => Err(format!("{} allow rule(s) are in force", rules.len())),
        _ => Err("the allow list is not a list".into()),
    }
}

/// `scheme://host:port` of an http(s) URL, the port written out, as the
/// host states the allowed origins.
pub fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (h, after) = inner.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse::<u16>().ok()?,
            None if after.is_empty() => default,
            None => return None,
        };
        (format!("[{h}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse::<u16>().ok()?),
            None => (authority.to_string(), default),
        }
    };
    Some(format!("{scheme}://{}:{port}", host.to_ascii_lowercase()))
}

/// A 64-bit number the API may send as a JSON number or a string.
fn number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

/// A service-chosen word, bounded and printable, for an error message.
pub fn short(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(40)
        .collect()
}
