//! `/metrics`: counts and timings in the Prometheus text format, on a
//! listener of its own.
//!
//! Every label value is one the operator configured or the code fixed (a
//! shed reason, a grant profile's name, a method, a route *template*); none
//! is taken from a request. So no path, query, body, token or caller secret
//! can reach a series, whatever a caller sends.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub runs: IntCounter,
    pub runs_failed: IntCounter,
    pub inflight: IntGauge,
    pub shed: IntCounterVec,
    pub host_calls: IntCounterVec,
    pub host_call_latency: HistogramVec,
    pub advice_findings: IntCounterVec,
    pub sessions_open: IntGauge,
    pub sessions_opened: IntCounter,
    pub sessions_ended: IntCounterVec,
    pub session_calls: IntCounter,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let runs = IntCounter::new("plimsoll_runs_total", "Runs dispatched to the provider.")?;
        let runs_failed = IntCounter::new(
            "plimsoll_runs_failed_total",
            "Runs that failed in the daemon or provider after dispatch (not the code's own failures).",
        )?;
        let inflight = IntGauge::new("plimsoll_inflight", "Runs in flight now.")?;
        let shed = IntCounterVec::new(
            Opts::new(
                "plimsoll_shed_total",
                "Runs refused by a limit, by which limit.",
            ),
            &["reason"],
        )?;
        let host_calls = IntCounterVec::new(
            Opts::new(
                "plimsoll_host_calls_total",
                "Brokered calls that reached the API, by profile, method and route template.",
            ),
            &["profile", "method", "route"],
        )?;
        let advice_findings = IntCounterVec::new(
            Opts::new(
                "plimsoll_advice_findings_total",
                "Advice findings after granted runs, by profile, pattern, severity, remedy and whether the agent could act on it.",
            ),
            &["profile", "pattern", "severity", "remedy", "agent_fixable"],
        )?;
        let host_call_latency = HistogramVec::new(
            HistogramOpts::new(
                "plimsoll_host_call_latency_seconds",
                "Latency of brokered calls, by profile, method and route template.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0,
            ]),
            &["profile", "method", "route"],
        )?;
        let sessions_open = IntGauge::new(
            "plimsoll_sessions_open",
            "Sessions whose sandbox is held now.",
        )?;
        let sessions_opened =
            IntCounter::new("plimsoll_sessions_opened_total", "Sessions opened.")?;
        let sessions_ended = IntCounterVec::new(
            Opts::new(
                "plimsoll_sessions_ended_total",
                "Sessions ended and freed, by how they ended.",
            ),
            &["end"],
        )?;
        let session_calls = IntCounter::new(
            "plimsoll_session_calls_total",
            "Session calls dispatched to a session's sandbox.",
        )?;
        registry.register(Box::new(sessions_open.clone()))?;
        registry.register(Box::new(sessions_opened.clone()))?;
        registry.register(Box::new(sessions_ended.clone()))?;
        registry.register(Box::new(session_calls.clone()))?;
        registry.register(Box::new(runs.clone()))?;
        registry.register(Box::new(runs_failed.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        registry.register(Box::new(shed.clone()))?;
        registry.register(Box::new(host_calls.clone()))?;
        registry.register(Box::new(advice_findings.clone()))?;
        registry.register(Box::new(host_call_latency.clone()))?;
        for c in crate::backends::docker::metrics::collectors() {
            registry.register(c)?;
        }
        // Shed reasons exist from the start, at 0, so a dashboard can tell
        // "none" from "not exported".
        for r in [
            "at_capacity",
            "per_key",
            "rate",
            "paid_caller",
            "paid_daemon",
            "sessions",
            "sessions_per_caller",
            "sessions_per_owner",
        ] {
            shed.with_label_values(&[r]);
        }
        Ok(Metrics {
            registry,
            runs,
            runs_failed,
            inflight,
            shed,
            host_calls,
            advice_findings,
            host_call_latency,
            sessions_open,
            sessions_opened,
            sessions_ended,
            session_calls,
        })
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Counts a granted run's advice findings (fixed words only).
    pub fn record_advice(&self, profile: &str, findings: &[crate::grants::advice::Finding]) {
        for f in findings {
            let labels = [
                profile,
                f.pattern.as_str(),
                f.severity.as_str(),
                f.remedy.as_str(),
                if f.agent_fixable { "true" } else { "false" },
            ];
            self.advice_findings.with_label_values(&labels).inc();
        }
    }

    /// Records a granted run's calls from its trace (templates only).
    pub fn record_calls(&self, profile: &str, trace: &crate::grants::broker::CallTrace) {
        for c in &trace.calls {
            let labels = [profile, c.method, c.route.as_str()];
            self.host_calls.with_label_values(&labels).inc();
            self.host_call_latency
                .with_label_values(&labels)
                .observe(c.latency_ms as f64 / 1000.0);
        }
    }
}

/// The metrics router: `GET /metrics` only.
pub fn router(metrics: std::sync::Arc<Metrics>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    m.render(),
                )
            }
        }),
    )
}
