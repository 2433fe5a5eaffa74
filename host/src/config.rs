//! Configuration: one closed list of environment variables.
//!
//! Each part of the daemon declares the variables it reads and parses them
//! itself (`api::settings`, `callers::settings`, `quota`, `grants`,
//! `providers::settings`, `plugin_host::settings`,
//! `backends::docker::settings`). This module puts their lists together into
//! the one list `plimsolld -h` prints, reports every variable with our
//! prefixes that is not on it (almost always a typo, and a typo in a
//! security setting silently means its default), and holds the rules that
//! span parts. Nothing else in the daemon reads the environment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::api::settings::ListenerSettings;
use crate::attest::receipts::Receipts;
use crate::callers::settings::{Auth, CallerSettings};
use crate::env_vars::{ConfigError, Env, Var, invalid, var};
use crate::grants::Grants;
use crate::grants::guard::GuardSettings;
use crate::plugin_host::settings::PluginSettings;
use crate::providers::{ProviderKind, ProviderSettings};
use crate::quota::QuotaSettings;
use crate::sessions::SessionSettings;
use crate::state::StateSettings;

/// The daemon's own variables.
const DAEMON: &[Var] = &[
    var("PLIMSOLL_LOG_FORMAT", "json", "log format: json or text"),
    var(
        "PLIMSOLL_HARDENED",
        "(unset)",
        "1 refuses to start unless every production safeguard holds (docs/hardened-mode.md)",
    ),
];

/// Every part's variables, in the order `plimsolld -h` prints them.
pub const PARTS: &[(&str, &[Var])] = &[
    ("daemon", DAEMON),
    ("listeners", crate::api::settings::VARIABLES),
    ("callers", crate::callers::settings::VARIABLES),
    ("per-caller limits", crate::quota::VARIABLES),
    ("shared state", crate::state::settings::VARIABLES),
    ("replicas", crate::replicas::settings::VARIABLES),
    ("sessions", crate::sessions::settings::VARIABLES),
    ("grants", crate::grants::VARIABLES),
    ("guard", crate::grants::guard::settings::VARIABLES),
    ("signed records", crate::attest::receipts::VARIABLES),
    ("providers", crate::providers::settings::VARIABLES),
    ("provider plugins", crate::plugin_host::settings::VARIABLES),
    ("docker", crate::backends::docker::settings::VARIABLES),
];

/// Whether `name` is on the closed list.
pub fn is_known(name: &str) -> bool {
    PARTS
        .iter()
        .flat_map(|(_, vars)| vars.iter())
        .any(|v| v.name == name)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub log_format: LogFormat,
    pub hardened: bool,
    pub listeners: ListenerSettings,
    pub callers: CallerSettings,
    pub providers: ProviderSettings,
    /// Grant profiles, frozen.
    pub grants: Arc<Grants>,
    /// Where hosted sandboxes reach granted runs' brokers, if anywhere.
    pub guard: Option<GuardSettings>,
    pub quotas: QuotaSettings,
    /// Where the per-caller limits are counted.
    pub state: StateSettings,
    /// How replicas forward session calls to one another, if they do.
    pub replicas: Option<crate::replicas::ReplicaSettings>,
    pub sessions: SessionSettings,
    /// The key the daemon signs each record with, if one is configured.
    pub receipts: Option<Arc<Receipts>>,
    /// The variables that were set (non-empty), for hardened mode's
    /// "explicit" checks.
    pub set: BTreeSet<String>,
    /// Variables with our prefixes that are not on the list.
    pub unknown: Vec<String>,
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigErrors> {
        let mut vars = BTreeMap::new();
        for (k, v) in std::env::vars_os() {
            let Ok(k) = k.into_string() else { continue };
            match v.into_string() {
                Ok(v) => {
                    vars.insert(k, v);
                }
                // Reading a non-UTF-8 value as "unset" could silently drop a
                // limit; one of ours that is not text is an error instead.
                Err(_) if has_our_prefix(&k) => {
                    return Err(ConfigErrors(vec![ConfigError::NotText(k)]));
                }
                Err(_) => {}
            }
        }
        Config::from_map(&vars)
    }

    /// Parses a given environment; separate from `from_env` so it is
    /// testable. Every part is parsed, and every error is reported, the
    /// provider's first: an operator fixes them in one go, and a misspelt
    /// provider is never reported as some other part's problem.
    /// Long on purpose: one parse per part, then the rules that span parts.
    pub fn from_map(vars: &BTreeMap<String, String>) -> Result<Config, ConfigErrors> {
        let env = Env::new(vars);
        let mut errors = Vec::new();
        let providers = part(&mut errors, ProviderSettings::from_env(&env));
        let log_format = part(
            &mut errors,
            match env.get("PLIMSOLL_LOG_FORMAT") {
                None | Some("json") => Ok(LogFormat::Json),
                Some("text") => Ok(LogFormat::Text),
                Some(_) => Err(invalid("PLIMSOLL_LOG_FORMAT", "must be json or text")),
            },
        );
        let hardened = part(&mut errors, env.flag("PLIMSOLL_HARDENED"));
        let listeners = part(&mut errors, ListenerSettings::from_env(&env));
        let grants = part(&mut errors, Grants::from_env(&env));
        let guard = part(&mut errors, GuardSettings::from_env(&env));
        let receipts = part(&mut errors, Receipts::from_env(&env));
        let callers = part(&mut errors, CallerSettings::from_env(&env));
        let quotas = part(&mut errors, QuotaSettings::from_env(&env));
        let state = part(&mut errors, StateSettings::from_env(&env));
        let replicas = part(
            &mut errors,
            crate::replicas::ReplicaSettings::from_env(&env),
        );
        let max_concurrent = providers.as_ref().map_or(8, |p| p.max_concurrent);
        let sessions = part(&mut errors, SessionSettings::from_env(&env, max_concurrent));
        if let (Some(p), Some(s)) = (&providers, &sessions)
            && s.enabled()
            && !p.kind.runs_code()
        {
            errors.push(invalid(
                "SANDBOX_MAX_SESSIONS",
                "sessions are on, but the Disabled provider runs nothing; unset it",
            ));
        }
        let mut providers = providers;
        if let (Some(p), Some(s)) = (providers.as_mut(), &sessions) {
            match p.docker.as_mut() {
                Some(d) => {
                    d.session_pool = s.pool;
                    d.session_lifetime = s.lifetime;
                }
                None if s.pool > 0 => errors.push(invalid(
                    "SANDBOX_SESSION_POOL",
                    "only the docker provider keeps warm session containers",
                )),
                None => {}
            }
        }

        // The rules between parts, where both parts parsed.
        if let (Some(p), Some(g)) = (&providers, &grants)
            && !g.is_empty()
            && !p.kind.carries_grants()
            // A plugin may carry one through a container engine or the
            // guard: whether it does is known once it loads, and a start
            // without a way is refused then (`providers::start`).
            && !(matches!(p.kind, ProviderKind::Plugin(_))
                && (p.docker.is_some() || matches!(guard, Some(Some(_)))))
        {
            errors.push(invalid(
                "PLIMSOLL_GRANTS_FILE",
                "grant profiles are configured, but this provider has no way to carry a grant (wasm and docker do; a hosted plugin needs PLIMSOLL_GUARD_ADDR and PLIMSOLL_GUARD_URL)",
            ));
        }
        // A listener with nothing to serve is only a way in.
        if let (Some(Some(_)), Some(g)) = (&guard, &grants)
            && g.is_empty()
        {
            errors.push(invalid(
                "PLIMSOLL_GUARD_ADDR",
                "the guard is configured, but no grant profiles are (PLIMSOLL_GRANTS_FILE): unset it",
            ));
        }
        // In hardened mode this is one of the violations it names together.
        if let (Some(p), Some(c)) = (&providers, &callers)
            && matches!(c.auth, Auth::Open)
            && p.kind.runs_code()
            && !c.insecure
            && hardened != Some(true)
        {
            errors.push(invalid(
                "PLIMSOLL_CLIENTS_FILE",
                "no authentication is configured (no clients file, no PLIMSOLL_TOKEN), and this provider runs code: configure callers, or set PLIMSOLL_INSECURE=1 for development on loopback",
            ));
        }
        if let (Some(p), Some(q)) = (&providers, &quotas)
            && q.metered
            && !matches!(p.kind, ProviderKind::Plugin(_))
        {
            errors.push(invalid(
                "SANDBOX_PLUGIN_METERED",
                "only a plugin provider's service can be metered",
            ));
        }
        let (
            Some(providers),
            Some(log_format),
            Some(hardened),
            Some(listeners),
            Some(grants),
            Some(guard),
            Some(callers),
            Some(quotas),
            Some(state),
            Some(replicas),
            Some(sessions),
            Some(receipts),
        ) = (
            providers, log_format, hardened, listeners, grants, guard, callers, quotas, state,
            replicas, sessions, receipts,
        )
        else {
            return Err(ConfigErrors(errors));
        };
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }

        // The variable an operator named to hold the API key is read, not
        // unknown, whatever its name.
        let key_var = PluginSettings::key_variable(&env);
        let unknown = env
            .names()
            .filter(|k| has_our_prefix(k) && !is_known(k))
            .filter(|k| Some(k.as_str()) != key_var)
            .cloned()
            .collect();
        let set = vars
            .iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        Ok(Config {
            log_format,
            hardened,
            listeners,
            callers,
            providers,
            grants: Arc::new(grants),
            guard,
            quotas,
            state,
            replicas,
            sessions,
            receipts: receipts.map(Arc::new),
            set,
            unknown,
        })
    }
}

/// Everything wrong with a configuration, in the order found: the
/// provider's part first.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            all => {
                write!(f, "{} problems:", all.len())?;
                for e in all {
                    write!(f, "\n  - {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigErrors {}

/// One part's settings, or its error kept for the report.
fn part<T>(errors: &mut Vec<ConfigError>, r: Result<T, ConfigError>) -> Option<T> {
    r.map_err(|e| errors.push(e)).ok()
}

fn has_our_prefix(name: &str) -> bool {
    name.starts_with("PLIMSOLL_") || name.starts_with("SANDBOX_")
}

/// The text `plimsolld -h` prints.
pub fn help_text() -> String {
    let mut s = String::from(
        "plimsolld: runs code that AI agents wrote inside a sandbox, and states the isolation tier that held.\n\n\
         Usage: plimsolld        (configuration comes only from the environment)\n       \
         plimsolld -h     (this text)\n\nEnvironment variables:\n",
    );
    for (part, vars) in PARTS {
        s.push_str(&format!("\n {part}:\n"));
        for v in *vars {
            s.push_str(&format!(
                "  {:<24} default {}\n  {:<24} {}\n",
                v.name, v.default, "", v.meaning
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment in open development mode unless the test sets
    /// authentication itself.
    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let auth = [
            "PLIMSOLL_TOKEN",
            "PLIMSOLL_CLIENTS_FILE",
            "PLIMSOLL_INSECURE",
        ];
        if !auth.iter().any(|k| m.contains_key(*k)) {
            m.insert("PLIMSOLL_INSECURE".into(), "1".into());
        }
        m
    }

    #[test]
    fn a_provider_that_runs_code_needs_callers_or_an_explicit_opt_in() {
        let open = |extra: &[(&str, &str)]| {
            let mut m = env(extra);
            m.remove("PLIMSOLL_INSECURE");
            Config::from_map(&m)
        };
        assert!(open(&[("SANDBOX_PROVIDER", "wasm")]).is_err());
        assert!(open(&[]).is_ok(), "disabled needs nothing");
        assert!(
            open(&[
                ("SANDBOX_PROVIDER", "wasm"),
                ("PLIMSOLL_TOKEN", &"t".repeat(32))
            ])
            .is_ok()
        );
        assert!(
            open(&[("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_TOKEN", "short")]).is_err(),
            "a short shared token"
        );
        assert!(
            open(&[("PLIMSOLL_TLS_CERT", "/x")]).is_err(),
            "cert without key"
        );
        assert!(open(&[("PLIMSOLL_METRICS_ADDR", "nowhere")]).is_err());
        let c = open(&[("PLIMSOLL_METRICS_ADDR", "off")]).expect("off");
        assert_eq!(c.listeners.metrics_addr, None);
        // The shared token never shows in debug output.
        let c = open(&[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_TOKEN", &"s".repeat(40)),
        ])
        .expect("token");
        assert!(!format!("{:?}", c.callers.auth).contains("sss"));
    }

    #[test]
    fn a_guard_with_no_grant_to_carry_is_refused() {
        let e = Config::from_map(&env(&[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_GUARD_ADDR", "127.0.0.1:8747"),
            ("PLIMSOLL_GUARD_URL", "https://guard.example.com"),
        ]))
        .expect_err("refused");
        assert!(e.to_string().contains("PLIMSOLL_GUARD_ADDR"), "{e}");
    }

    #[test]
    fn unset_provider_is_disabled() {
        let c = Config::from_map(&env(&[])).expect("valid");
        assert_eq!(c.providers.kind, ProviderKind::Disabled);
        assert_eq!(c.listeners.addr.to_string(), "127.0.0.1:8746");
    }

    #[test]
    fn unknown_provider_lists_known_ones() {
        let e = Config::from_map(&env(&[("SANDBOX_PROVIDER", "Dock r")])).expect_err("refused");
        let text = e.to_string();
        assert!(text.contains("disabled") && text.contains("wasm"), "{text}");
    }

    #[test]
    fn wasm_refuses_limits_it_cannot_enforce() {
        for name in ["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"] {
            let e = Config::from_map(&env(&[("SANDBOX_PROVIDER", "wasm"), (name, "1")]))
                .expect_err("refused");
            assert_eq!(
                e,
                ConfigErrors(vec![ConfigError::Unenforceable(name, "wasm")])
            );
        }
    }

    #[test]
    fn unknown_prefixed_variables_are_collected() {
        let c = Config::from_map(&env(&[("SANDBOX_PROVDER", "wasm"), ("HOME", "/root")]))
            .expect("valid");
        assert_eq!(c.unknown, vec!["SANDBOX_PROVDER".to_string()]);
    }

    /// A plugin directory holding an (empty) `remote-plimsoll.wasm`: the
    /// configuration checks that the named plugin is there.
    fn plugin_dir() -> &'static str {
        static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        DIR.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("plimsoll-cfg-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            std::fs::write(dir.join("remote-plimsoll.wasm"), b"").expect("file");
            dir.display().to_string()
        })
    }

    #[test]
    fn every_error_is_reported_at_once_the_provider_first() {
        let mut m = env(&[
            ("SANDBOX_PROVIDER", "dokcer"),
            ("PLIMSOLL_PLUGIN_DIR", plugin_dir()),
            ("PLIMSOLL_METRICS_ADDR", "nowhere"),
            ("SANDBOX_RATE_BURST", "3"),
        ]);
        // No authentication either: a misspelt provider must not read as an
        // authentication problem.
        m.remove("PLIMSOLL_INSECURE");
        let e = Config::from_map(&m).expect_err("refused");
        let names: Vec<String> =
            e.0.iter()
                .map(|e| match e {
                    ConfigError::Invalid { name, .. } => name.to_string(),
                    other => format!("{other:?}"),
                })
                .collect();
        assert_eq!(
            names,
            [
                "SANDBOX_PROVIDER",
                "PLIMSOLL_METRICS_ADDR",
                "SANDBOX_RATE_BURST"
            ],
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("no plugin") && text.contains("remote-plimsoll"),
            "{text}"
        );
        assert!(!text.contains("authentication"), "{text}");
    }

    /// Long on purpose: the plugin settings' cross-checks (a key over plain
    /// http, a key with nowhere to go, limits a plugin cannot enforce,
    /// settings without a plugin), each beside the valid case it spoils.
    #[test]
    fn plugin_settings_are_checked() {
        let base = [
            ("SANDBOX_PROVIDER", "remote-plimsoll"),
            ("PLIMSOLL_PLUGIN_DIR", plugin_dir()),
            ("KEY", "secret-value"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            Config::from_map(&env(&v))
        };
        // A key is never sent over plain http.
        assert!(
            with(&[
                ("SANDBOX_PLUGIN_HTTP_ORIGINS", "http://127.0.0.1:9"),
                ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY")
            ])
            .is_err()
        );
        let c = with(&[
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://api.example.com"),
            ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY"),
        ])
        .expect("valid");
        let (name, value) = c
            .providers
            .plugin
            .http
            .expect("grant")
            .api_key
            .expect("key");
        assert_eq!(name, "authorization");
        assert!(value.is_sensitive());
        // A key with nowhere to go, an unset key variable, limits a plugin
        // cannot enforce, and plugin settings without a plugin.
        assert!(with(&[("SANDBOX_PLUGIN_API_KEY_ENV", "KEY")]).is_err());
        // The key's origins: only among the allowed ones, and only with a key.
        let two = "https://a.example,https://b.example";
        let c = with(&[
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", two),
            ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY"),
            ("SANDBOX_PLUGIN_API_KEY_ORIGINS", "https://a.example"),
        ])
        .expect("key origins");
        assert_eq!(c.providers.plugin.http.expect("grant").key_origins.len(), 1);
        for (origins, key, key_origins) in [
            (two, Some("KEY"), "https://c.example"),
            (two, Some("KEY"), " , "),
            (two, None, "https://a.example"),
        ] {
            let mut vars = vec![
                ("SANDBOX_PLUGIN_HTTP_ORIGINS", origins),
                ("SANDBOX_PLUGIN_API_KEY_ORIGINS", key_origins),
            ];
            if let Some(k) = key {
                vars.push(("SANDBOX_PLUGIN_API_KEY_ENV", k));
            }
            assert!(with(&vars).is_err(), "{key_origins:?}");
        }
        assert!(
            with(&[
                ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://a.example"),
                ("SANDBOX_PLUGIN_API_KEY_ENV", "NOPE")
            ])
            .is_err()
        );
        assert!(with(&[("SANDBOX_PIDS", "10")]).is_err());
        assert!(
            Config::from_map(&env(&[
                ("SANDBOX_PROVIDER", "wasm"),
                ("SANDBOX_PLUGIN_MAX_TIER", "vm")
            ]))
            .is_err()
        );
        // A key variable with our prefix is read, so not reported as unknown.
        let c = Config::from_map(&env(&[
            ("SANDBOX_PROVIDER", "remote-plimsoll"),
            ("PLIMSOLL_PLUGIN_DIR", plugin_dir()),
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://a.example"),
            ("SANDBOX_PLUGIN_API_KEY_ENV", "PLIMSOLL_UPSTREAM_KEY"),
            ("PLIMSOLL_UPSTREAM_KEY", "k"),
        ]))
        .expect("valid");
        assert!(c.unknown.is_empty(), "{:?}", c.unknown);
        // The debug form of the whole configuration never shows the key.
        let shown = format!(
            "{:?}",
            with(&[
                ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://a.example"),
                ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY")
            ])
        );
        assert!(!shown.contains("secret-value"), "{shown}");
        // A traded key: https only, with the account name, sent as a bearer,
        // never as is; its debug form shows neither the key nor its body.
        let trade = [
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://a.example"),
            ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY"),
            (
                "SANDBOX_PLUGIN_KEY_EXCHANGE_URL",
                "https://hub.example/v2/auth/token",
            ),
            ("SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER", "me"),
        ];
        let c = with(&trade).expect("exchange");
        let http = c.providers.plugin.http.clone().expect("grant");
        assert!(http.api_key.is_none());
        assert_eq!(http.exchange.as_ref().expect("exchange").identifier, "me");
        assert!(!format!("{c:?}").contains("secret-value"));
        let swap = |name: &'static str, value: &'static str| {
            let mut v: Vec<_> = trade.iter().copied().filter(|(k, _)| *k != name).collect();
            if !value.is_empty() {
                v.push((name, value));
            }
            with(&v)
        };
        assert!(swap("SANDBOX_PLUGIN_KEY_EXCHANGE_URL", "http://127.0.0.1:9/t").is_err());
        assert!(
            swap(
                "SANDBOX_PLUGIN_KEY_EXCHANGE_URL",
                "https://u:p@hub.example/t"
            )
            .is_err()
        );
        assert!(swap("SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER", "").is_err());
        // The plugin may not reach the exchange itself.
        assert!(
            swap(
                "SANDBOX_PLUGIN_KEY_EXCHANGE_URL",
                "https://a.example/v2/auth/token"
            )
            .is_err()
        );
        assert!(swap("SANDBOX_PLUGIN_API_KEY_ENV", "").is_err());
        assert!(swap("SANDBOX_PLUGIN_API_KEY_HEADER", "x-api-key").is_err());
        assert!(swap("SANDBOX_PLUGIN_KEY_EXCHANGE_URL", "").is_err());
        assert!(swap("SANDBOX_PLUGIN_HTTP_ORIGINS", "").is_err());
    }

    #[test]
    fn bounds_are_checked() {
        assert!(Config::from_map(&env(&[("SANDBOX_MEMORY_MB", "0")])).is_err());
        assert!(Config::from_map(&env(&[("SANDBOX_MAX_CONCURRENT", "5000")])).is_err());
        assert!(Config::from_map(&env(&[("SANDBOX_MEMORY_MB", "-1")])).is_err());
    }
}
