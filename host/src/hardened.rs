//! Hardened mode (`PLIMSOLL_HARDENED=1`): the daemon starts only if every
//! production safeguard holds, and names every one that does not, together.
//! A warning is not a policy: in hardened mode each of these is a refusal.

use crate::callers::settings::Auth;
use crate::config::Config;
use crate::providers::ProviderKind;
use crate::tier::Tier;

/// Everything wrong with `cfg` for hardened mode, before any provider is
/// started (so a misconfigured daemon touches nothing).
/// Long on purpose: one rule of hardened mode per check, read as a list.
pub fn violations(cfg: &Config) -> Vec<String> {
    let mut v = Vec::new();
    let set = |name: &str| cfg.set.contains(name);

    match &cfg.providers.kind {
        ProviderKind::Disabled => v.push(
            "SANDBOX_PROVIDER: hardened mode serves runs; set a provider with the kernel or vm tier (docker with SANDBOX_DOCKER_RUNTIME=runsc)".into(),
        ),
        ProviderKind::Wasm => v.push(
            "SANDBOX_PROVIDER=wasm is the process tier; hardened mode needs kernel or vm (docker with SANDBOX_DOCKER_RUNTIME=runsc)".into(),
        ),
        ProviderKind::Docker => {
            if cfg.providers.docker.as_ref().is_none_or(|e| e.runtime != "runsc") {
                v.push("SANDBOX_DOCKER_RUNTIME: runc is the container tier; hardened mode needs runsc (kernel)".into());
            }
        }
        ProviderKind::Plugin(_) => {
            if cfg.providers.plugin.sha256.is_none() {
                v.push("SANDBOX_PLUGIN_SHA256: the plugin must be pinned by digest".into());
            }
            if cfg.providers.plugin.max_tier.is_none_or(|t| !t.meets(Tier::Kernel)) {
                v.push("SANDBOX_PLUGIN_MAX_TIER: a plugin must be allowed kernel or vm, and reach it".into());
            }
        }
    }

    match &cfg.callers.auth {
        Auth::Clients(..) => {}
        Auth::Shared(_) => v.push(
            "PLIMSOLL_TOKEN: one shared token cannot tell callers apart; use PLIMSOLL_CLIENTS_FILE"
                .into(),
        ),
        Auth::Open => v.push("PLIMSOLL_CLIENTS_FILE: callers must authenticate".into()),
    }
    if cfg.callers.insecure {
        v.push("PLIMSOLL_INSECURE must be unset".into());
    }

    // /metrics must stay on loopback (checked below), so TLS matters for
    // the API listener only.
    if cfg.listeners.tls.is_none() && !cfg.listeners.addr.ip().is_loopback() {
        v.push(format!(
            "PLIMSOLL_TLS_CERT/PLIMSOLL_TLS_KEY: the API listens on {} without TLS",
            cfg.listeners.addr
        ));
    }

    // An unsigned record is the daemon's word only while the answer is in
    // hand; signed, anyone holding the public key can check it later.
    if cfg.receipts.is_none() {
        v.push(
            "PLIMSOLL_RECORD_SIGNING_KEY: records must be signed, so they can be checked away from the daemon"
                .into(),
        );
    }

    // A guard without TLS of its own leans on a proxy in front of it that
    // the daemon cannot see: its tokens may cross a network in clear.
    if cfg.guard.as_ref().is_some_and(|g| g.tls.is_none()) {
        v.push(
            "PLIMSOLL_GUARD_TLS_CERT/PLIMSOLL_GUARD_TLS_KEY: the guard must serve TLS itself"
                .into(),
        );
    }

    if let Some(e) = &cfg.providers.docker {
        let pinned = e
            .image
            .strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        if !pinned {
            v.push("SANDBOX_DOCKER_IMAGE: name the image by its ID (sha256:...), not a tag".into());
        }
        for name in [
            "SANDBOX_MEMORY_MB",
            "SANDBOX_CPUS",
            "SANDBOX_PIDS",
            "SANDBOX_DISK_MB",
        ] {
            if !set(name) {
                v.push(format!(
                    "{name}: the resource envelope must be set explicitly"
                ));
            }
        }
    }

    // Warnings are not policies: in hardened mode a typo in a variable's
    // name (whose setting would silently be its default) is a refusal.
    for name in &cfg.unknown {
        v.push(format!(
            "{name} is not a plimsolld variable (a typo means its default)"
        ));
    }
    for name in cfg.grants.open_to_all() {
        v.push(format!(
            "PLIMSOLL_GRANTS_FILE: profile {name} admits every caller (\"*\"); name the callers"
        ));
    }
    if let Some(m) = cfg.listeners.metrics_addr
        && !m.ip().is_loopback()
    {
        v.push(format!(
            "PLIMSOLL_METRICS_ADDR: /metrics has no authentication; keep it on loopback or off (it is {m})"
        ));
    }

    let q = &cfg.quotas;
    if q.rate_per_min == 0 {
        v.push("SANDBOX_RATE_PER_MIN: every caller needs a rate limit".into());
    } else if q.burst > q.rate_per_min {
        v.push("SANDBOX_RATE_BURST: the burst may not exceed one minute's rate".into());
    }
    if q.per_caller_concurrency == 0 || q.per_caller_concurrency >= cfg.providers.max_concurrent {
        v.push(
            "SANDBOX_PER_KEY_CONCURRENT: each caller needs a concurrency cap below SANDBOX_MAX_CONCURRENT".into(),
        );
    }
    // A session holds a slot for its whole life: without a per-caller cap,
    // one caller could hold every session (and so every slot) at once.
    let s = &cfg.sessions;
    if s.enabled()
        && (s.max_per_caller == 0 || (s.max_sessions > 1 && s.max_per_caller >= s.max_sessions))
    {
        v.push(
            "SANDBOX_MAX_SESSIONS_PER_CALLER: with sessions on, each caller needs a cap below SANDBOX_MAX_SESSIONS".into(),
        );
    }
    if q.metered
        && let Auth::Clients(_, file) = &cfg.callers.auth
    {
        for c in file
            .clients
            .iter()
            .filter(|c| c.paid_seconds_per_day.is_none())
        {
            v.push(format!(
                "PLIMSOLL_CLIENTS_FILE: caller {} has no paid_seconds_per_day on a metered provider",
                c.id
            ));
        }
    }
    if cfg.state.plaintext_off_host() {
        v.push(
            "PLIMSOLL_STATE_URL: the shared store is on another host without TLS; use rediss://"
                .into(),
        );
    }
    v
}

/// After the provider started: its evidence must stand behind kernel or vm.
pub fn tier_violation(tier: Tier) -> Option<String> {
    (!tier.meets(Tier::Kernel)).then(|| {
        format!("the provider's verified tier is {tier}; hardened mode needs kernel or vm")
    })
}
