//! A grant profile's preamble as bytecode: compiled once, for the host to
//! keep, and loaded by each granted run instead of parsed again.
//!
//! Parsing is most of what a preamble costs (a generated SDK is a few KiB
//! of source and a loop), and every run starts from the same snapshot, so
//! nothing a run parsed survives into the next. The host calls
//! `compile-preamble` once per profile and passes the bytes back in each
//! run's `grant-client`.

use std::cell::RefCell;
use std::rc::Rc;

use rquickjs::module::{Module, WriteOptions};
use rquickjs::{CatchResultExt, CaughtError, Ctx};

/// The module name errors and stacks show.
const NAME: &str = "preamble.js";

thread_local! {
    /// The bytecode buffers modules were loaded from. QuickJS reads
    /// bytecode in place (it keeps pointers into the buffer), so a buffer
    /// must live as long as the engine; a session's instance keeps one copy
    /// per distinct preamble, however many calls load it.
    static LOADED: RefCell<Vec<Rc<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// The preamble's bytecode, or the compiler's message.
pub fn compile(ctx: &Ctx<'_>, code: String) -> Result<Vec<u8>, String> {
    let module = Module::declare(ctx.clone(), NAME, code)
        .catch(ctx)
        .map_err(|e| e.to_string())?;
    // Without the source text (only `Function.prototype.toString` reads
    // it): less to copy into every run. Line numbers stay for stacks.
    let options = WriteOptions {
        strip_source: true,
        ..WriteOptions::default()
    };
    module.write(options).catch(ctx).map_err(|e| e.to_string())
}

/// Loads and evaluates the preamble module from `bytes`, to completion.
pub fn run<'js>(ctx: &Ctx<'js>, bytes: Vec<u8>) -> Result<(), CaughtError<'js>> {
    let kept = LOADED.with(|loaded| {
        let mut loaded = loaded.borrow_mut();
        if let Some(same) = loaded.iter().find(|b| ***b == *bytes) {
            return same.clone();
        }
        let kept: Rc<[u8]> = Rc::from(bytes);
        loaded.push(kept.clone());
        kept
    });
    // SAFETY: the bytes are what `compile` above wrote, in this same guest
    // build, handed back by the host, which keeps them out of the guest's
    // reach between compiling and this call; and the buffer lives in
    // LOADED for as long as the engine that reads it in place.
    let module = unsafe { Module::load(ctx.clone(), &kept) }.catch(ctx)?;
    let (_module, done) = module.eval().catch(ctx)?;
    done.finish::<()>().catch(ctx)
}
