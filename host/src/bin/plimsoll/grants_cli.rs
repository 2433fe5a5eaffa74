//! `plimsoll grants from-openapi SPEC ...`: an OpenAPI 3.0 document turned
//! into a grant profile, its SDK preamble and its tool description
//! (`plimsoll::grants::specgen`), written as three files. Offline: nothing
//! is fetched, whatever the document names.
//!
//! Exit 0 when the files were written (warnings or not), 1 when the
//! document gave errors (each printed; nothing written), 2 for a bad
//! command line or a file that cannot be read or written.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use plimsoll::bounded_read::{self, Unread};
use plimsoll::grants::specgen::{self, MAX_SPEC_BYTES, Options};

use crate::client::shown;
use crate::run::{EXIT_USAGE, fail};

#[derive(Subcommand)]
pub enum Action {
    /// Writes NAME.profile.json, NAME.sdk.js and NAME.tool.txt from an
    /// OpenAPI 3.0 document (JSON or YAML). Operations a grant cannot name
    /// exactly are skipped with a warning. Exit 0: written; 1: the document
    /// gave errors, nothing written; 2: a bad command line or file.
    FromOpenapi(FromOpenapiArgs),
}

#[derive(Args)]
pub struct FromOpenapiArgs {
    /// The OpenAPI 3.0 document (.json, .yaml or .yml; else sniffed).
    spec: PathBuf,
    /// The API's origin, https://host[:port] (http only for a loopback IP);
    /// the document's servers give only the base path.
    #[arg(long)]
    base_url: String,
    /// The profile's name, also the stem of the files written.
    #[arg(long)]
    profile: String,
    /// The client's JavaScript global.
    #[arg(long, default_value = "host")]
    global: String,
    /// A caller that may use the profile (repeat for more; "*" for all).
    #[arg(long = "caller", value_name = "ID", required = true)]
    callers: Vec<String>,
    /// The directory the files are written to (created if absent).
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Names an operation's SDK method: operationId (or "METHOD /path")
    /// = name.
    #[arg(long = "rename", value_name = "OP=NAME")]
    renames: Vec<String>,
    /// The operation the breaker probes (a GET without parameters).
    #[arg(long, value_name = "OP")]
    health_check: Option<String>,
    /// A batch operation and the per-item operations it replaces.
    #[arg(long = "batch", value_name = "OP=OP1,OP2")]
    batches: Vec<String>,
    /// Skips a path item that is a $ref, with a warning, instead of
    /// refusing the document.
    #[arg(long)]
    skip_refs: bool,
    /// Replaces files already there.
    #[arg(long)]
    force: bool,
}

pub fn run(action: Action) -> ExitCode {
    match action {
        Action::FromOpenapi(args) => from_openapi(args),
    }
}

fn from_openapi(args: FromOpenapiArgs) -> ExitCode {
    let opts = match options(&args) {
        Ok(o) => o,
        Err(why) => return fail(EXIT_USAGE, &why),
    };
    let names = [
        format!("{}.profile.json", args.profile),
        format!("{}.sdk.js", args.profile),
        format!("{}.tool.txt", args.profile),
    ];
    if !args.force {
        for name in &names {
            let path = args.out.join(name);
            if fs::symlink_metadata(&path).is_ok() {
                return fail(
                    EXIT_USAGE,
                    &format!("{} exists; pass --force to replace it", path.display()),
                );
            }
        }
    }
    let text = match read_spec(&args.spec) {
        Ok(t) => t,
        Err(why) => return fail(EXIT_USAGE, &why),
    };
    let format = specgen::sniff(&args.spec, &text);
    let generated = match specgen::generate(&text, format, &opts) {
        Ok(g) => g,
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {}", shown(e));
            }
            eprintln!(
                "plimsoll: {} error{} in {}; nothing written",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" },
                args.spec.display()
            );
            return ExitCode::from(1);
        }
    };
    for w in &generated.warnings {
        eprintln!("{}", shown(w));
    }
    if let Err(e) = fs::create_dir_all(&args.out) {
        return fail(EXIT_USAGE, &format!("{}: {e}", args.out.display()));
    }
    let contents = [
        &generated.profile_json,
        &generated.sdk_js,
        &generated.tool_txt,
    ];
    for (name, body) in names.iter().zip(contents) {
        let path = args.out.join(name);
        if let Err(e) = write_file(&args.out, name, body.as_bytes(), args.force) {
            return fail(EXIT_USAGE, &format!("writing {}: {e}", path.display()));
        }
        println!("wrote {}", path.display());
    }
    eprintln!(
        "plimsoll: add the profile to PLIMSOLL_GRANTS_FILE and put {} beside that file; read its allow list first",
        names[1]
    );
    ExitCode::SUCCESS
}

/// The options, or what is wrong with the command line.
fn options(args: &FromOpenapiArgs) -> Result<Options, String> {
    if !plimsoll::grants::names::valid_name(&args.profile) {
        return Err(format!(
            "--profile {:?}: a profile name is 1-128 of letters, digits, '.', '_', '-'",
            args.profile
        ));
    }
    let mut renames = BTreeMap::new();
    for r in &args.renames {
        let (op, name) = r
            .rsplit_once('=')
            .filter(|(op, name)| !op.is_empty() && !name.is_empty())
            .ok_or_else(|| format!("--rename {r:?}: write OP=NAME"))?;
        if renames.insert(op.to_string(), name.to_string()).is_some() {
            return Err(format!("--rename names {op:?} twice"));
        }
    }
    let mut batches = BTreeMap::new();
    for b in &args.batches {
        let (op, items) = b
            .split_once('=')
            .filter(|(op, items)| !op.is_empty() && !items.is_empty())
            .ok_or_else(|| format!("--batch {b:?}: write OP=OP1,OP2"))?;
        let items: Vec<String> = items.split(',').map(|s| s.trim().to_string()).collect();
        if items.iter().any(String::is_empty) {
            return Err(format!("--batch {b:?}: an empty operation name"));
        }
        if batches.insert(op.to_string(), items).is_some() {
            return Err(format!("--batch names {op:?} twice"));
        }
    }
    Ok(Options {
        base_url: args.base_url.clone(),
        profile: args.profile.clone(),
        global: args.global.clone(),
        callers: args.callers.clone(),
        renames,
        health_check: args.health_check.clone(),
        batches,
        skip_refs: args.skip_refs,
    })
}

/// The document: a regular file of UTF-8 text within `MAX_SPEC_BYTES`.
fn read_spec(path: &Path) -> Result<String, String> {
    let shown_path = path.display();
    let bytes = match bounded_read::read_regular(path, MAX_SPEC_BYTES as u64) {
        Ok((bytes, _)) => bytes,
        Err(Unread::Io(e)) => return Err(format!("{shown_path}: {e}")),
        Err(Unread::NotAFile) => {
            return Err(format!(
                "{shown_path}: not a regular file (a pipe, device or directory is not read)"
            ));
        }
        Err(Unread::TooLarge) => {
            return Err(format!(
                "{shown_path}: larger than {} MiB",
                MAX_SPEC_BYTES >> 20
            ));
        }
    };
    String::from_utf8(bytes).map_err(|_| format!("{shown_path}: not UTF-8 text"))
}

/// Writes `name` in `dir`. Without `force` the file must not exist (the
/// open fails on anything there, a symlink included); with it, the bytes
/// go to a fresh temporary name renamed over the old file, so a symlink
/// there is replaced, never written through.
fn write_file(dir: &Path, name: &str, bytes: &[u8], force: bool) -> std::io::Result<()> {
    let path = dir.join(name);
    if !force {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        f.write_all(bytes)?;
        return f.sync_all();
    }
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
