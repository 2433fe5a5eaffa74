//! The operator's session settings. Sessions are off unless
//! `SANDBOX_MAX_SESSIONS` is set: a session holds a sandbox, and one of
//! the daemon's run slots, between calls, for as long as it lives.

use std::time::Duration;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};

pub const VARIABLES: &[Var] = &[
    var(
        "SANDBOX_MAX_SESSIONS",
        "0 (sessions off)",
        "sessions open at once, daemon-wide; each holds one of SANDBOX_MAX_CONCURRENT's slots",
    ),
    var(
        "SANDBOX_MAX_SESSIONS_PER_CALLER",
        "0 (no cap)",
        "sessions one caller may hold open at once",
    ),
    var(
        "SANDBOX_MAX_SESSIONS_PER_OWNER",
        "0 (no cap)",
        "sessions one caller may hold for one owner; at the cap the owner's least recently used idle session is replaced",
    ),
    var(
        "SANDBOX_SESSION_LIFETIME",
        "30m",
        "a session's whole life, from open (1s to 12h; a request may ask for less)",
    ),
    var(
        "SANDBOX_SESSION_IDLE",
        "5m",
        "a session with no call for this long ends (0 never, else 1s to 12h; a request may ask for less)",
    ),
    var(
        "SANDBOX_SESSION_POOL",
        "0",
        "docker: session containers kept started for opens that name languages",
    ),
];

const LONGEST: Duration = Duration::from_secs(12 * 3600);
/// An idle timeout shorter than this would end sessions between two calls
/// of one agent's turn.
pub const MIN_IDLE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// 0: sessions are off.
    pub max_sessions: u32,
    pub max_per_caller: u32,
    pub max_per_owner: u32,
    pub lifetime: Duration,
    /// Zero: never idle out.
    pub idle: Duration,
    pub pool: u32,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            max_sessions: 0,
            max_per_caller: 0,
            max_per_owner: 0,
            lifetime: Duration::from_secs(30 * 60),
            idle: Duration::from_secs(5 * 60),
            pool: 0,
        }
    }
}

impl SessionSettings {
    /// Parses the session variables against the daemon's run slots, which
    /// sessions share. Settings that would do nothing are refused.
    pub fn from_env(env: &Env, max_concurrent: u32) -> Result<SessionSettings, ConfigError> {
        let d = SessionSettings::default();
        let max_sessions = env
            .u32_in("SANDBOX_MAX_SESSIONS", 0, max_concurrent)
            .map_err(|_| {
                invalid(
                    "SANDBOX_MAX_SESSIONS",
                    format!(
                        "must be from 0 to SANDBOX_MAX_CONCURRENT ({max_concurrent}): each open session holds a run slot"
                    ),
                )
            })?
            .unwrap_or(0);
        let max_per_caller = env
            .u32_in("SANDBOX_MAX_SESSIONS_PER_CALLER", 0, 1024)?
            .unwrap_or(0);
        let max_per_owner = env
            .u32_in("SANDBOX_MAX_SESSIONS_PER_OWNER", 0, 1024)?
            .unwrap_or(0);
        let lifetime = match env.get("SANDBOX_SESSION_LIFETIME") {
            None => d.lifetime,
            Some(v) => duration(v)
                .filter(|t| *t >= Duration::from_secs(1) && *t <= LONGEST)
                .ok_or_else(|| {
                    invalid(
                        "SANDBOX_SESSION_LIFETIME",
                        "must be a duration from 1s to 12h, such as 30m",
                    )
                })?,
        };
        let idle = match env.get("SANDBOX_SESSION_IDLE") {
            None => d.idle,
            Some(v) => duration(v)
                .filter(|t| t.is_zero() || (*t >= MIN_IDLE && *t <= LONGEST))
                .ok_or_else(|| {
                    invalid(
                        "SANDBOX_SESSION_IDLE",
                        "must be 0 or a duration from 1s to 12h, such as 5m",
                    )
                })?,
        };
        let pool = env.u32_in("SANDBOX_SESSION_POOL", 0, 64)?.unwrap_or(0);
        let on = max_sessions > 0;
        for (name, set) in [
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", max_per_caller > 0),
            ("SANDBOX_MAX_SESSIONS_PER_OWNER", max_per_owner > 0),
            ("SANDBOX_SESSION_POOL", pool > 0),
        ] {
            if set && !on {
                return Err(invalid(
                    name,
                    "is set, but sessions are off (SANDBOX_MAX_SESSIONS is 0)",
                ));
            }
        }
        if pool > max_sessions {
            return Err(invalid(
                "SANDBOX_SESSION_POOL",
                "must not exceed SANDBOX_MAX_SESSIONS",
            ));
        }
        Ok(SessionSettings {
            max_sessions,
            max_per_caller,
            max_per_owner,
            lifetime,
            idle,
            pool,
        })
    }

    pub fn enabled(&self) -> bool {
        self.max_sessions > 0
    }
}

/// A duration as operators write them: whole numbers with units `ms`, `s`,
/// `m` or `h`, one or more (`90s`, `1h30m`); `0` alone is zero.
pub fn duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60)?),
            "h" => Duration::from_secs(n.checked_mul(3600)?),
            _ => return None,
        };
        rest = &rest[unit..];
        total = total.checked_add(part)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<SessionSettings, ConfigError> {
        let vars: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        SessionSettings::from_env(&Env::new(&vars), 8)
    }

    #[test]
    fn durations_as_operators_write_them() {
        assert_eq!(duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(duration("0"), Some(Duration::ZERO));
        for bad in ["", "5", "m", "5x", "-5s", "1.5s", "5 s", "9999999999h"] {
            assert_eq!(duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn off_by_default_and_what_would_do_nothing_is_refused() {
        let s = parse(&[]).expect("defaults");
        assert!(!s.enabled());
        assert_eq!(s.lifetime, Duration::from_secs(1800));
        assert!(parse(&[("SANDBOX_MAX_SESSIONS_PER_CALLER", "2")]).is_err());
        assert!(
            parse(&[("SANDBOX_MAX_SESSIONS", "9")]).is_err(),
            "above the run slots"
        );
        assert!(parse(&[("SANDBOX_MAX_SESSIONS", "4"), ("SANDBOX_SESSION_POOL", "5")]).is_err());
        assert!(
            parse(&[
                ("SANDBOX_MAX_SESSIONS", "4"),
                ("SANDBOX_SESSION_IDLE", "500ms")
            ])
            .is_err()
        );
        assert!(
            parse(&[
                ("SANDBOX_MAX_SESSIONS", "4"),
                ("SANDBOX_SESSION_LIFETIME", "13h")
            ])
            .is_err()
        );
        let s = parse(&[
            ("SANDBOX_MAX_SESSIONS", "4"),
            ("SANDBOX_SESSION_IDLE", "0"),
            ("SANDBOX_SESSION_LIFETIME", "2m"),
        ])
        .expect("valid");
        assert_eq!(
            (s.idle, s.lifetime),
            (Duration::ZERO, Duration::from_secs(120))
        );
    }
}
