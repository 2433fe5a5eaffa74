//! Advice: what a granted run's calls could have cost less, read from its
//! CallTrace after the run.
//!
//! Two patterns, both visible in route templates alone (the trace holds no
//! paths, by design, so repeats of one item cannot be seen and are never
//! claimed):
//! - fan-out: three or more delivered reads of one per-item route (`GET
//!   /items/*`), where one call of a batch route could have served them;
//! - repeated read: two or more delivered reads of one fixed route (`GET
//!   /config`), where the first answer could have been kept.
//!
//! Advice never gates a call, never calls a model, and its text comes only
//! from the profile's routes and fixed words, never from the guest.

use serde::Serialize;

use super::Profile;
use super::broker::CallTrace;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    FanOut,
    RepeatedRead,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Low,
    Medium,
    High,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// One call of a batch route instead of many per-item calls.
    Batch,
    /// Keep the first answer instead of asking again.
    Cache,
    /// Nothing this profile offers; the operator may know better.
    None,
}

impl Pattern {
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::FanOut => "fan_out",
            Pattern::RepeatedRead => "repeated_read",
        }
    }
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
        }
    }
}

impl Remedy {
    pub fn as_str(self) -> &'static str {
        match self {
            Remedy::Batch => "batch",
            Remedy::Cache => "cache",
            Remedy::None => "none",
        }
    }
}

/// One thing a run could have done with fewer calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub pattern: Pattern,
    pub severity: Severity,
    pub remedy: Remedy,
    pub method: &'static str,
    /// The allow entry's path template the calls matched.
    pub route: String,
    pub calls: u32,
    pub extra_calls: u32,
    pub added_latency_ms: u64,
    pub bytes_moved: u64,
    /// The batch route the agent can call instead (granted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggested_route: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggested_calls: Option<u32>,
    /// A batch route the catalog offers that the operator could grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant_route: Option<String>,
    /// Whether the agent can act on it with what it is granted now.
    pub agent_fixable: bool,
    /// The trace was full: more calls were made than it shows.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

/// Reads per allow entry, delivered with a 2xx.
#[derive(Clone, Copy, Default)]
struct Reads {
    calls: u32,
    first_latency_ms: u64,
    first_bytes: u64,
    latency_ms: u64,
    bytes: u64,
}

/// The findings for one run. Linear in the trace and the allow list.
pub fn assess(trace: &CallTrace, profile: &Profile) -> Vec<Finding> {
    let mut reads = vec![Reads::default(); profile.allow.len()];
    for row in &trace.calls {
        if row.method != "GET" || !row.delivered || !(200..300).contains(&row.status) {
            continue;
        }
        let Some(r) = reads.get_mut(row.allow_index as usize) else {
            continue;
        };
        if r.calls == 0 {
            r.first_latency_ms = row.latency_ms;
            r.first_bytes = row.response_bytes;
        }
        r.calls += 1;
        r.latency_ms += row.latency_ms;
        r.bytes += row.response_bytes;
    }
    let partial = trace.dropped > 0;
    let mut out = Vec::new();
    for (i, r) in reads.iter().enumerate() {
        let route = &profile.allow[i];
        let per_item = route.path_template().split('/').any(|s| s == "*");
        let finding = |pattern, remedy, agent_fixable| Finding {
            pattern,
            severity: severity(r.calls - 1),
            remedy,
            method: route.method,
            route: route.path_template().to_string(),
            calls: r.calls,
            extra_calls: r.calls - 1,
            added_latency_ms: r.latency_ms - r.first_latency_ms,
            bytes_moved: r.bytes - r.first_bytes,
            suggested_route: None,
            suggested_calls: None,
            grant_route: None,
            agent_fixable,
            partial,
        };
        if per_item && r.calls >= 3 {
            if let Some(batch) = profile.batch_of.iter().find(|b| b.items.contains(&i)) {
                let mut f = finding(Pattern::FanOut, Remedy::Batch, batch.granted);
                if batch.granted {
                    f.suggested_route = Some(batch.route.template().to_string());
                    f.suggested_calls = Some(1);
                } else {
                    f.grant_route = Some(batch.route.template().to_string());
                }
                out.push(f);
            } else if let Some(parent) = ungranted_parent(profile, i) {
                let mut f = finding(Pattern::FanOut, Remedy::Batch, false);
                f.grant_route = Some(parent);
                out.push(f);
            } else {
                out.push(finding(Pattern::FanOut, Remedy::None, false));
            }
        } else if !per_item && r.calls >= 2 {
            out.push(finding(Pattern::RepeatedRead, Remedy::Cache, true));
        }
    }
    out
}

/// `GET /items` for `GET /items/*`, when the catalog offers it and allow
/// does not grant it: a listing the operator could grant.
fn ungranted_parent(profile: &Profile, i: usize) -> Option<String> {
    let path = profile.allow[i].path_template();
    let parent = path.strip_suffix("/*")?;
    let template = format!("GET {parent}");
    let offered = profile
        .catalog
        .iter()
        .any(|e| e.route.template() == template);
    let granted = profile.allow.iter().any(|r| r.template() == template);
    (offered && !granted).then_some(template)
}

fn severity(extra_calls: u32) -> Severity {
    match extra_calls {
        50.. => Severity::High,
        10.. => Severity::Medium,
        3.. => Severity::Low,
        _ => Severity::Info,
    }
}

/// What the audit stream keeps of a run's findings: counts only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub findings: u32,
    pub agent_fixable: u32,
    pub extra_calls: u64,
    pub added_latency_ms: u64,
    pub bytes_moved: u64,
    /// Findings whose remedy is a route the operator has not granted.
    pub ungranted_routes: u32,
}

pub fn totals(findings: &[Finding]) -> Totals {
    let mut t = Totals::default();
    for f in findings {
        t.findings += 1;
        t.agent_fixable += u32::from(f.agent_fixable);
        t.extra_calls += u64::from(f.extra_calls);
        t.added_latency_ms += f.added_latency_ms;
        t.bytes_moved += f.bytes_moved;
        t.ungranted_routes += u32::from(f.grant_route.is_some());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::broker::CallRow;
    use crate::grants::{ANONYMOUS, Grants};

    fn profile(extra: &str) -> std::sync::Arc<Profile> {
        let text = format!(
            r#"{{"profiles":{{"p":{{"base_url":"https://api.example.com",
                "allow":["GET /items/*","GET /config","POST /items","GET /users/*"],
                "allowed_callers":["*"],"advice":"caller"{extra}}}}}}}"#
        );
        let g = Grants::parse(&text, &|_| None, None).expect("grants");
        g.for_caller("p", ANONYMOUS).expect("profile")
    }

    fn rows(method: &'static str, allow_index: u32, status: u16, n: u32) -> Vec<CallRow> {
        (0..n)
            .map(|i| CallRow {
                seq: i + 1,
                method,
                route: String::new(),
                status,
                delivered: true,
                request_bytes: 0,
                response_bytes: 100,
                latency_ms: 10,
                allow_index,
            })
            .collect()
    }

    fn trace(rows: Vec<CallRow>) -> CallTrace {
        CallTrace {
            calls: rows,
            ..CallTrace::default()
        }
    }

    #[test]
    fn thirteen_reads_of_an_item_become_one_suggested_batch_call() {
        // The batch route granted: the agent can fix it.
        let text = r#"{"profiles":{"p":{"base_url":"https://api.example.com",
            "allow":["GET /items/*","GET /items"],"allowed_callers":["*"],
            "batch_of":{"GET /items":["GET /items/*"]},"advice":"caller"}}}"#;
        let g = Grants::parse(text, &|_| None, None).expect("grants");
        let p = g.for_caller("p", ANONYMOUS).expect("profile");
        let found = assess(&trace(rows("GET", 0, 200, 13)), &p);
        assert_eq!(found.len(), 1, "{found:?}");
        let f = &found[0];
        assert_eq!(f.pattern, Pattern::FanOut);
        assert_eq!(f.remedy, Remedy::Batch);
        assert_eq!((f.calls, f.extra_calls), (13, 12));
        assert_eq!(f.suggested_route.as_deref(), Some("GET /items"));
        assert_eq!(f.suggested_calls, Some(1));
        assert!(f.agent_fixable);
        assert_eq!(f.severity, Severity::Medium);
        assert_eq!((f.added_latency_ms, f.bytes_moved), (120, 1200));
    }

    #[test]
    fn only_delivered_successful_reads_count() {
        let p = profile("");
        assert!(assess(&trace(rows("GET", 0, 404, 13)), &p).is_empty());
        let mut undelivered = rows("GET", 0, 200, 13);
        undelivered.iter_mut().for_each(|r| r.delivered = false);
        assert!(assess(&trace(undelivered), &p).is_empty());
        assert!(assess(&trace(rows("POST", 2, 201, 13)), &p).is_empty());
        assert!(
            assess(&trace(rows("GET", 0, 200, 2)), &p).is_empty(),
            "two is not fan-out"
        );
        assert!(assess(&trace(rows("GET", 1, 200, 1)), &p).is_empty());
    }

    #[test]
    fn a_fixed_route_read_twice_is_a_cache_finding() {
        let p = profile("");
        let found = assess(&trace(rows("GET", 1, 200, 3)), &p);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].pattern, Pattern::RepeatedRead);
        assert_eq!(found[0].remedy, Remedy::Cache);
        assert_eq!(found[0].route, "/config");
        assert!(found[0].agent_fixable);
    }

    #[test]
    fn a_listing_only_the_catalog_offers_is_for_the_operator() {
        let p = profile(r#","catalog":[{"route":"GET /users","name":"listUsers"}]"#);
        let mut t = trace(rows("GET", 3, 200, 4));
        t.dropped = 1;
        let found = assess(&t, &p);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].grant_route.as_deref(), Some("GET /users"));
        assert!(!found[0].agent_fixable);
        assert!(found[0].partial);
        // No listing anywhere: a finding with no remedy.
        let found = assess(&trace(rows("GET", 0, 200, 4)), &p);
        assert_eq!(found[0].remedy, Remedy::None);
        let t = totals(&found);
        assert_eq!((t.findings, t.agent_fixable, t.extra_calls), (1, 0, 3));
    }

    #[test]
    fn severity_follows_the_extra_calls() {
        assert_eq!(severity(2), Severity::Info);
        assert_eq!(severity(3), Severity::Low);
        assert_eq!(severity(10), Severity::Medium);
        assert_eq!(severity(50), Severity::High);
    }
}
