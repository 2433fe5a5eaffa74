//! `plimsoll callers`: the callers file (PLIMSOLL_CLIENTS_FILE).
//!
//! The file holds SHA-256 digests, never tokens. It is rewritten whole
//! (temporary file, fsync, rename) under a lock directory, created with mode
//! 0600, and a symlink or anything but a regular file is refused. A running
//! daemon keeps the callers it read at start: restart it to apply a change.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use plimsoll::callers::{self, ClientsFile, Entry};
use plimsoll::dirs::{self, Dir};

/// A caller to add: what `create` and `import` both take.
#[derive(clap::Args)]
pub struct NewCaller {
    #[arg(long)]
    file: PathBuf,
    #[arg(long)]
    id: String,
    /// Scopes; default code:run.
    #[arg(long = "scope")]
    scopes: Vec<String>,
    #[arg(long)]
    paid_seconds_per_day: Option<u64>,
}

#[derive(Subcommand)]
pub enum Action {
    /// Adds a caller with a new random token, printed once on stdout.
    Create(NewCaller),
    /// Adds a caller whose token (at least 32 characters) is read from stdin.
    Import(NewCaller),
    /// Lists callers and scopes; tokens are never stored, so never shown.
    List {
        #[arg(long)]
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Replaces a caller's token (the old one stops working at the next
    /// daemon start); prints the new one, or reads it from stdin.
    Rotate {
        #[arg(long)]
        file: PathBuf,
        #[arg(long)]
        id: String,
        #[arg(long)]
        token_stdin: bool,
    },
    /// Removes a caller.
    Revoke {
        #[arg(long)]
        file: PathBuf,
        #[arg(long)]
        id: String,
    },
}

pub fn run(action: Action) -> Result<(), String> {
    match action {
        Action::Create(new) => {
            let token = callers::new_token()?;
            add(new, &token)?;
            println!("{token}");
            remind();
        }
        Action::Import(new) => {
            let token = read_token()?;
            add(new, &token)?;
            remind();
        }
        Action::List { file, json } => {
            let (dir, name) =
                dirs::parent_of(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let f = load(&dir, &name, &file)?.unwrap_or_default();
            if json {
                let list: Vec<_> = f
                    .clients
                    .iter()
                    .map(|c| serde_json::json!({"id": c.id, "scopes": c.scopes, "paid_seconds_per_day": c.paid_seconds_per_day}))
                    .collect();
                println!("{}", serde_json::Value::Array(list));
            } else {
                for c in &f.clients {
                    println!("{}\t{}", c.id, c.scopes.join(","));
                }
            }
        }
        Action::Rotate {
            file,
            id,
            token_stdin,
        } => {
            let token = if token_stdin {
                read_token()?
            } else {
                callers::new_token()?
            };
            change(&file, |f| {
                let e = f
                    .clients
                    .iter_mut()
                    .find(|c| c.id == id)
                    .ok_or_else(|| format!("no caller {id:?}"))?;
                e.token_sha256 = callers::fingerprint(&token);
                Ok(())
            })?;
            if !token_stdin {
                println!("{token}");
            }
            remind();
        }
        Action::Revoke { file, id } => {
            change(&file, |f| {
                let before = f.clients.len();
                f.clients.retain(|c| c.id != id);
                if f.clients.len() == before {
                    return Err(format!("no caller {id:?}"));
                }
                Ok(())
            })?;
            remind();
        }
    }
    Ok(())
}

fn remind() {
    eprintln!(
        "plimsoll: running daemons keep the callers they read at start; restart them to apply this"
    );
}

fn read_token() -> Result<String, String> {
    let mut s = String::new();
    std::io::stdin()
        .take(8192)
        .read_to_string(&mut s)
        .map_err(|e| format!("reading the token from stdin: {e}"))?;
    let t = s.trim_end_matches(['\n', '\r']).to_string();
    if !callers::valid_token(&t) {
        return Err("the token must be 32 to 4096 visible ASCII characters".into());
    }
    Ok(t)
}

/// Adds a caller with this token's digest (the file's checks refuse a
/// repeated id or token).
fn add(new: NewCaller, token: &str) -> Result<(), String> {
    let entry = Entry {
        id: new.id,
        token_sha256: callers::fingerprint(token),
        scopes: if new.scopes.is_empty() {
            vec![callers::RUN_SCOPE.to_string()]
        } else {
            new.scopes
        },
        paid_seconds_per_day: new.paid_seconds_per_day,
    };
    change(&new.file, |f| {
        f.clients.push(entry);
        Ok(())
    })
}

/// The file, if it exists; a symlink or anything but a regular file is an
/// error.
fn load(dir: &Dir, name: &OsStr, path: &Path) -> Result<Option<ClientsFile>, String> {
    match dir.symlink_metadata(name) {
        Ok(m) if m.is_file() => {
            let bytes =
                dirs::read_nofollow(dir, name).map_err(|e| format!("{}: {e}", path.display()))?;
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
            ClientsFile::parse(&text).map(Some)
        }
        Ok(_) => Err(format!(
            "{} is not a regular file (symlinks are refused)",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Loads, changes, validates and rewrites the file atomically, under a lock,
/// all through one handle on its directory: a file, lock or temporary
/// swapped for a symlink in between cannot send a write elsewhere.
fn change(
    path: &Path,
    f: impl FnOnce(&mut ClientsFile) -> Result<(), String>,
) -> Result<(), String> {
    let (dir, name) = dirs::parent_of(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lock = name.clone();
    lock.push(".lock");
    dir.create_dir(&lock).map_err(|e| {
        format!(
            "{}.lock is locked by another change ({e}); remove it if no change is running",
            path.display()
        )
    })?;
    let result = (|| {
        let mut file = load(&dir, &name, path)?.unwrap_or_default();
        f(&mut file)?;
        file.normalise()?;
        let mut text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
        text.push('\n');
        dirs::replace(&dir, &name, text.as_bytes(), 0o600)
            .map_err(|e| format!("{}: {e}", path.display()))
    })();
    let _ = dir.remove_dir(&lock);
    result
}
