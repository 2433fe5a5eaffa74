//! The reference monitor for the `container-engine` capability.
//!
//! A plugin describes the container it wants; this module decides whether the
//! host will create it. The rules are the isolation the docker provider
//! promises, so they live in the host where a plugin (buggy or hostile)
//! cannot change them: a spec that asks for anything weaker is refused whole,
//! never quietly repaired, so the plugin learns its mistake and the operator's
//! log shows it.

use std::path::{Component, Path};

/// What a container spec is held to: the backend's verified facts and the
/// directories the host made for the current call.
#[derive(Debug, Clone)]
pub struct ContainerPolicy {
    /// The only OCI runtime containers may use ("" is the engine's default,
    /// runc; "runsc" for gVisor).
    pub runtime: String,
    /// The image ID the host verified at start; the only image a spec may
    /// name.
    pub image: String,
    /// The guest `uid:gid` the operator configured: not merely a non-root
    /// user, this one.
    pub user: String,
    /// Directories the host created for the current call; the only sources a
    /// mount may name. Empty until the host creates per-run directories.
    pub run_dirs: Vec<String>,
}

/// The fields of a container spec the monitor reads, borrowed from the
/// plugin's request.
pub struct Spec<'a> {
    pub image: &'a str,
    pub command: &'a [String],
    pub env: &'a [String],
    pub user: &'a str,
    pub read_only_root: bool,
    pub network: &'a str,
    pub privileged: bool,
    pub cap_add: &'a [String],
    pub runtime: &'a str,
    pub host_namespaces: &'a [String],
    pub mounts: &'a [String],
}

/// Checks `spec` against `policy`. `Err` names the first rule broken, in words
/// fit for the plugin's error and the operator's log (no spec contents).
pub fn check(spec: &Spec<'_>, policy: &ContainerPolicy) -> Result<(), &'static str> {
    if spec.privileged {
        return Err("privileged containers are never created");
    }
    if !spec.cap_add.is_empty() {
        return Err("adding capabilities is not allowed: every capability is dropped");
    }
    if !spec.host_namespaces.is_empty() {
        return Err("joining a host namespace (network, pid, ipc, uts, user) is not allowed");
    }
    if spec.network != "none" {
        return Err("the only network a container may have is none");
    }
    if !spec.read_only_root {
        return Err("the root filesystem must be read-only");
    }
    if spec.runtime != policy.runtime {
        return Err("the runtime must be exactly the one the operator configured");
    }
    check_user(spec.user)?;
    if spec.user != policy.user {
        return Err("the user must be the guest uid:gid the operator configured");
    }
    check_image(spec.image)?;
    if spec.image != policy.image {
        return Err("the image must be exactly the one the host verified at start");
    }
    if spec.command.is_empty() || spec.command.iter().any(|a| a.contains('\0')) {
        return Err("the command must be a non-empty argument vector without NUL bytes");
    }
    for e in spec.env {
        let Some((key, _)) = e.split_once('=') else {
            return Err("environment entries must be KEY=value");
        };
        let key_ok = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !key_ok || e.contains('\0') {
            return Err("environment keys must be [A-Za-z0-9_]+ and values free of NUL");
        }
        if loader_var(key) {
            return Err(
                "loader-affecting environment variables (LD_*, GLIBC_TUNABLES, ...) are not allowed",
            );
        }
    }
    for m in spec.mounts {
        check_mount(m, policy)?;
    }
    Ok(())
}

/// Environment variables that change how the dynamic loader or libc behave.
pub fn loader_var(key: &str) -> bool {
    key.starts_with("LD_")
        || matches!(
            key,
            "GLIBC_TUNABLES" | "LOCPATH" | "NLSPATH" | "GCONV_PATH" | "MALLOC_CONF" | "HOSTALIASES"
        )
}

fn check_user(user: &str) -> Result<(), &'static str> {
    let Some((uid, gid)) = user.split_once(':') else {
        return Err("the user must be numeric uid:gid");
    };
    let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) else {
        return Err(
            "the user must be numeric uid:gid (names are resolved inside the image, where anything goes)",
        );
    };
    if uid == 0 || gid == 0 {
        return Err("containers never run as uid or gid 0");
    }
    Ok(())
}

/// Only content-addressed image IDs: a tag can be re-pointed between the
/// host's check and the engine's use of it.
fn check_image(image: &str) -> Result<(), &'static str> {
    let hex = image.strip_prefix("sha256:").unwrap_or("");
    if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err("the image must be a content-addressed ID (sha256:<64 hex>), not a tag")
    }
}

fn check_mount(m: &str, policy: &ContainerPolicy) -> Result<(), &'static str> {
    let Some((source, target)) = m.split_once(':') else {
        return Err("mounts must be source:target");
    };
    let clean = |p: &str| {
        let path = Path::new(p);
        path.is_absolute()
            && path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    };
    if !clean(source) || !clean(target) || target.contains(':') {
        return Err("mount paths must be absolute and clean (no ., .., or options)");
    }
    if !policy.run_dirs.iter().any(|d| d == source) {
        return Err("a mount may only name a directory the host created for this run");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn policy() -> ContainerPolicy {
        ContainerPolicy {
            runtime: "runsc".into(),
            image: IMAGE.into(),
            user: "61000:61000".into(),
            run_dirs: vec!["/var/lib/plimsoll/runs/abc".into()],
        }
    }

    struct Owned {
        image: String,
        command: Vec<String>,
        env: Vec<String>,
        user: String,
        read_only_root: bool,
        network: String,
        privileged: bool,
        cap_add: Vec<String>,
        runtime: String,
        host_namespaces: Vec<String>,
        mounts: Vec<String>,
    }

    impl Owned {
        fn good() -> Owned {
            Owned {
                image: IMAGE.into(),
                command: vec!["node".into(), "-e".into(), "1".into()],
                env: vec!["PATH=/usr/bin".into()],
                user: "61000:61000".into(),
                read_only_root: true,
                network: "none".into(),
                privileged: false,
                cap_add: vec![],
                runtime: "runsc".into(),
                host_namespaces: vec![],
                mounts: vec!["/var/lib/plimsoll/runs/abc:/work".into()],
            }
        }
        fn spec(&self) -> Spec<'_> {
            Spec {
                image: &self.image,
                command: &self.command,
                env: &self.env,
                user: &self.user,
                read_only_root: self.read_only_root,
                network: &self.network,
                privileged: self.privileged,
                cap_add: &self.cap_add,
                runtime: &self.runtime,
                host_namespaces: &self.host_namespaces,
                mounts: &self.mounts,
            }
        }
    }

    #[test]
    fn a_compliant_spec_passes() {
        assert_eq!(check(&Owned::good().spec(), &policy()), Ok(()));
    }

    /// Long on purpose: the table of every weakening the monitor refuses, one
    /// row each, so a rule removed fails its own row.
    #[test]
    fn every_weakening_is_refused_by_the_rule_that_names_it() {
        // Each case names the rule that must refuse it, not only that
        // something does: the checks overlap (a root user also differs from
        // the configured one), and a rule that stopped working would go
        // unnoticed behind the next.
        type Mutate = fn(&mut Owned);
        let cases: &[(&str, &str, Mutate)] = &[
            ("privileged", "privileged", |o| o.privileged = true),
            ("cap add", "capabilit", |o| {
                o.cap_add = vec!["SYS_ADMIN".into()]
            }),
            ("host pid", "namespace", |o| {
                o.host_namespaces = vec!["pid".into()]
            }),
            ("host network", "network", |o| o.network = "host".into()),
            ("bridge network", "network", |o| o.network = "bridge".into()),
            ("empty network", "network", |o| o.network = String::new()),
            ("writable root", "read-only", |o| o.read_only_root = false),
            ("default runtime", "runtime", |o| o.runtime = String::new()),
            ("other runtime", "runtime", |o| o.runtime = "runc".into()),
            ("root user", "uid or gid 0", |o| o.user = "0:0".into()),
            ("root group", "uid or gid 0", |o| o.user = "61000:0".into()),
            ("named user", "numeric uid:gid", |o| o.user = "root".into()),
            ("uid only", "numeric uid:gid", |o| o.user = "61000".into()),
            ("named group", "numeric uid:gid", |o| {
                o.user = "61000:staff".into()
            }),
            ("another user", "configured", |o| {
                o.user = "61001:61001".into()
            }),
            ("tag image", "content-addressed", |o| {
                o.image = "node:22".into()
            }),
            ("short digest", "content-addressed", |o| {
                o.image = "sha256:abc".into()
            }),
            ("uppercase digest", "content-addressed", |o| {
                o.image = IMAGE.to_uppercase()
            }),
            ("digest without prefix", "content-addressed", |o| {
                o.image = IMAGE["sha256:".len()..].to_string()
            }),
            ("another image", "verified at start", |o| {
                o.image = format!("sha256:{}", "f".repeat(64))
            }),
            ("empty command", "argument vector", |o| o.command = vec![]),
            ("NUL in command", "argument vector", |o| {
                o.command = vec!["node\0".into()]
            }),
            ("LD_PRELOAD", "loader", |o| {
                o.env = vec!["LD_PRELOAD=/tmp/x.so".into()]
            }),
            ("GLIBC_TUNABLES", "loader", |o| {
                o.env = vec!["GLIBC_TUNABLES=x".into()]
            }),
            ("bad env", "KEY=value", |o| o.env = vec!["NOEQUALS".into()]),
            ("empty key", "keys must be", |o| o.env = vec!["=x".into()]),
            ("odd key", "keys must be", |o| o.env = vec!["A-B=1".into()]),
            ("NUL in value", "keys must be", |o| {
                o.env = vec!["A=x\0y".into()]
            }),
            ("host root mount", "directory the host created", |o| {
                o.mounts = vec!["/:/host".into()]
            }),
            ("docker socket", "directory the host created", |o| {
                o.mounts = vec!["/var/run/docker.sock:/var/run/docker.sock".into()]
            }),
            ("escape via ..", "absolute and clean", |o| {
                o.mounts = vec!["/var/lib/plimsoll/runs/abc/../..:/work".into()]
            }),
            ("target with ..", "absolute and clean", |o| {
                o.mounts = vec!["/var/lib/plimsoll/runs/abc:/work/..".into()]
            }),
            ("sibling run dir", "directory the host created", |o| {
                o.mounts = vec!["/var/lib/plimsoll/runs/abd:/work".into()]
            }),
            ("mount options", "absolute and clean", |o| {
                o.mounts = vec!["/var/lib/plimsoll/runs/abc:/work:rw".into()]
            }),
            ("relative mount", "absolute and clean", |o| {
                o.mounts = vec!["runs/abc:/work".into()]
            }),
            ("relative target", "absolute and clean", |o| {
                o.mounts = vec!["/var/lib/plimsoll/runs/abc:work".into()]
            }),
            ("no target", "source:target", |o| {
                o.mounts = vec!["/var/lib/plimsoll/runs/abc".into()]
            }),
        ];
        for (name, rule, mutate) in cases {
            let mut o = Owned::good();
            mutate(&mut o);
            match check(&o.spec(), &policy()) {
                Err(why) => assert!(
                    why.contains(rule),
                    "{name} was refused by another rule: {why}"
                ),
                Ok(()) => panic!("{name} was allowed"),
            }
        }
    }

    #[test]
    fn no_mount_is_allowed_before_the_host_creates_run_dirs() {
        let p = ContainerPolicy {
            runtime: "runsc".into(),
            image: IMAGE.into(),
            user: "61000:61000".into(),
            run_dirs: vec![],
        };
        assert!(check(&Owned::good().spec(), &p).is_err());
        let mut o = Owned::good();
        o.mounts.clear();
        assert_eq!(check(&o.spec(), &p), Ok(()));
    }

    #[test]
    fn loader_variables() {
        for k in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "GLIBC_TUNABLES",
            "GCONV_PATH",
        ] {
            assert!(loader_var(k), "{k}");
        }
        assert!(!loader_var("PATH"));
        assert!(!loader_var("NODE_ENV"));
    }
}
