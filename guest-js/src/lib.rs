//! The QuickJS guest: evaluates one JavaScript snippet per instance.
//!
//! The host instantiates this component fresh for every run and throws the
//! instance away afterwards, so nothing here needs to be reset between runs and
//! nothing one run leaves behind can be seen by the next. The guest has no
//! filesystem, no sockets and no environment: its only ways out are the
//! `output` import (console) and the broker import (grants).
//!
//! Deadlines and memory caps are enforced by the host from outside the engine
//! (epoch interruption, memory growth traps); the guest does not police itself.

use std::cell::RefCell;
use std::rc::Rc;

use rquickjs::context::EvalOptions;
use rquickjs::function::{Opt, Rest};
use rquickjs::{
    CatchResultExt, CaughtError, Context, Ctx, Function, Object, Persistent, Promise, Runtime,
    Value,
};

mod preamble;

// The generated export glue takes `grant-client` flattened into plain
// arguments, more than clippy's default allows; it is not ours to shape.
#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        world: "guest",
        path: "../wit/js",
        generate_all,
    });
}

use bindings::plimsoll::broker::broker as host_broker;
use bindings::plimsoll::js::entropy;
use bindings::plimsoll::js::grant::GrantClient;
use bindings::plimsoll::js::output::{self, Channel};

/// Node's exit code when a top-level await never settles: the run did not fail
/// with an exception, but it did not finish either.
const EXIT_UNSETTLED: i32 = 13;

// No JS stack limit is set: QuickJS-ng ignores it when built for WASI (its
// stack check is compiled out there). Runaway recursion is stopped by the
// host instead, when the instance reaches its wasm stack limit and traps.

struct Guest;

impl bindings::Guest for Guest {
    fn initialize() {
        // A failure here leaves ENGINE empty and `run` builds its own.
        if let Ok(engine) = Engine::new() {
            ENGINE.with(|e| *e.borrow_mut() = Some(engine));
        }
    }

    fn run(code: String, grant: Option<GrantClient>) -> i32 {
        let engine = match ENGINE.with(|e| e.borrow_mut().take()) {
            Some(engine) => Ok(engine),
            None => Engine::new(),
        };
        let answer = engine.and_then(|engine| {
            let answer = evaluate(&engine, code, grant, false);
            // Never torn down: the host discards this instance after this
            // one run. Freeing the runtime would write to most of the heap
            // (every object and chunk header), and in a fresh instance each
            // page written is a page fault and, after the run, a page the
            // host has to reset.
            std::mem::forget(engine);
            answer
        });
        match answer {
            Ok(code) => code,
            Err(msg) => setup_failed(&msg),
        }
    }

    fn compile_preamble(code: String) -> Result<Vec<u8>, String> {
        let engine = Engine::new()?;
        let compiled = engine.ctx.with(|ctx| preamble::compile(&ctx, code));
        std::mem::forget(engine);
        compiled
    }

    fn session_run(code: String, cell: bool, grant: Option<GrantClient>) -> i32 {
        // Each call keeps its own output budget: the host answers per call.
        FULL.with(|f| f.set([false; 2]));
        let ready = ENGINE.with(|e| {
            let mut slot = e.borrow_mut();
            if slot.is_none() {
                *slot = Some(Engine::new()?);
            }
            Ok::<(), String>(())
        });
        if let Err(msg) = ready {
            return setup_failed(&msg);
        }
        // The engine stays in its slot while it runs: nothing the snippet
        // does can reach this code again before it returns.
        let answer = ENGINE.with(|e| match e.borrow().as_ref() {
            Some(engine) => evaluate(engine, code, grant, cell),
            None => Err("the session's engine is gone".to_string()),
        });
        answer.unwrap_or_else(|msg| setup_failed(&msg))
    }
}

/// Only engine set-up failures land here (out of memory while building the
/// context, say); the snippet never ran.
fn setup_failed(msg: &str) -> i32 {
    output::write(Channel::Stderr, &format!("plimsoll: {msg}\n"));
    1
}

bindings::export!(Guest with_types_in bindings);

/// Promises rejected with no handler attached, in the order they were
/// rejected; a handler attached later removes its promise again.
/// Each entry is (promise, reason). The reason is formatted only after the
/// job queue drains: formatting can run the script's own getters, which must
/// not happen inside the engine's rejection callback (a getter that rejects
/// another promise would re-enter it).
type Unhandled = Rc<RefCell<Vec<(Persistent<Value<'static>>, Persistent<Value<'static>>)>>>;

/// A ready JavaScript engine: runtime, context with globals installed, and
/// the list the rejection tracker fills.
/// Fields drop in declaration order: what holds values first, the runtime
/// last (QuickJS aborts if a runtime is freed with objects still alive).
struct Engine {
    unhandled: Unhandled,
    /// `Object.freeze` as the engine was built with it: a session's earlier
    /// call may have replaced the global one.
    freeze: Persistent<Function<'static>>,
    ctx: Context,
    rt: Runtime,
}

thread_local! {
    /// The engine `initialize` built, taken by the one `run` this instance
    /// will ever serve.
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

impl Engine {
    fn new() -> Result<Engine, String> {
        let rt = Runtime::new().map_err(|e| format!("engine start failed: {e}"))?;
        let ctx = Context::full(&rt).map_err(|e| format!("engine start failed: {e}"))?;
        let unhandled: Unhandled = Rc::new(RefCell::new(Vec::new()));
        let tracked = unhandled.clone();
        rt.set_host_promise_rejection_tracker(Some(Box::new(
            move |ctx: Ctx<'_>, promise: Value<'_>, reason: Value<'_>, is_handled: bool| {
                let mut list = tracked.borrow_mut();
                if is_handled {
                    list.retain(|(p, _)| {
                        p.clone()
                            .restore(&ctx)
                            .map(|p| p != promise)
                            .unwrap_or(true)
                    });
                } else {
                    list.push((
                        Persistent::save(&ctx, promise),
                        Persistent::save(&ctx, reason),
                    ));
                }
            },
        )));
        let freeze = ctx
            .with(|ctx| {
                install_globals(&ctx)?;
                let object: Object = ctx.globals().get("Object")?;
                let freeze: Function = object.get("freeze")?;
                Ok::<_, rquickjs::Error>(Persistent::save(&ctx, freeze))
            })
            .map_err(|e| format!("engine set-up failed: {e}"))?;
        Ok(Engine {
            unhandled,
            freeze,
            ctx,
            rt,
        })
    }
}

/// Evaluates one snippet (or cell) to completion in `engine`.
fn evaluate(
    engine: &Engine,
    code: String,
    grant: Option<GrantClient>,
    cell: bool,
) -> Result<i32, String> {
    let Engine {
        rt,
        ctx,
        unhandled,
        freeze,
    } = engine;
    // Rejections left from an earlier call of a session were reported then.
    unhandled.borrow_mut().clear();
    let seed = entropy::seed();

    // The script's completion value is a promise (top-level await is on); it
    // is kept across the job loop below and inspected once the queue drains.
    let main = ctx.with(
        |ctx| -> Result<Result<Persistent<Value<'static>>, i32>, String> {
            reseed_math_random(&ctx, seed).map_err(|e| format!("engine set-up failed: {e}"))?;
            // The grant client exists only in a granted run, under the
            // profile's name: a run without a grant has no transport at all.
            if let Some(grant) = grant {
                let freeze = freeze
                    .clone()
                    .restore(&ctx)
                    .map_err(|e| format!("engine set-up failed: {e}"))?;
                if let Err(code) = install_client(&ctx, grant, freeze)? {
                    return Ok(Err(code));
                }
            }
            let mut options = EvalOptions::default();
            options.global = true;
            // Snippets are classic scripts, as `node -e` runs them: sloppy mode.
            options.strict = false;
            options.promise = true;
            options.backtrace_barrier = true;
            options.filename = Some("snippet.js".to_string());
            match ctx.eval_with_options::<Value, _>(code, options).catch(&ctx) {
                Ok(value) => Ok(Ok(Persistent::save(&ctx, value))),
                Err(err) => {
                    report(
                        Channel::Stderr,
                        &format!("Uncaught {}", describe_caught(&ctx, err)),
                    );
                    Ok(Err(1))
                }
            }
        },
    )?;
    let main = match main {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };

    // Settle every promise: run queued jobs until none is left. A job that
    // throws outside any promise is an uncaught error, as in node.
    loop {
        match rt.execute_pending_job() {
            Ok(true) => continue,
            Ok(false) => break,
            Err(job) => {
                let text = job.0.with(|ctx| {
                    let thrown = ctx.catch();
                    describe_thrown(&ctx, &thrown)
                });
                report(Channel::Stderr, &format!("Uncaught {text}"));
                return Ok(1);
            }
        }
    }

    ctx.with(|ctx| -> Result<i32, String> {
        let main_promise = main.restore(&ctx).ok();
        if let Some(promise) = main_promise.as_ref().and_then(|v| v.as_promise()) {
            match promise.state() {
                rquickjs::promise::PromiseState::Rejected => {
                    let reason: Value = match promise.result::<Value>() {
                        Some(Err(rquickjs::Error::Exception)) => ctx.catch(),
                        Some(Ok(v)) => v,
                        _ => Value::new_undefined(ctx.clone()),
                    };
                    report(
                        Channel::Stderr,
                        &format!("Uncaught {}", describe_thrown(&ctx, &reason)),
                    );
                    return Ok(1);
                }
                rquickjs::promise::PromiseState::Pending => {
                    report(
                        Channel::Stderr,
                        "Warning: Detected unsettled top-level await; the snippet did not finish",
                    );
                    return Ok(EXIT_UNSETTLED);
                }
                rquickjs::promise::PromiseState::Resolved => {
                    if cell {
                        show_completion(&ctx, promise);
                    }
                }
            }
        }
        // Any other promise rejected with nobody listening fails the run, as
        // node's default `--unhandled-rejections=throw` does.
        // Taken out of the cell first: formatting may run script code that
        // rejects more promises, and the tracker must be free to record them.
        let list = std::mem::take(&mut *unhandled.borrow_mut());
        for (promise, reason) in list {
            let is_main = match (&main_promise, promise.restore(&ctx)) {
                (Some(m), Ok(p)) => *m == p,
                _ => false,
            };
            if !is_main {
                let text = match reason.restore(&ctx) {
                    Ok(r) => describe_thrown(&ctx, &r),
                    Err(_) => "a rejected promise".to_string(),
                };
                report(Channel::Stderr, &format!("Uncaught (in promise) {text}"));
                return Ok(1);
            }
        }
        Ok(0)
    })
}

/// A cell's last value, as a notebook shows it: printed unless it is
/// `undefined`, and kept as `_` for the next cell. An async script's promise
/// settles to `{ value }`, the completion value of its last statement.
fn show_completion<'js>(ctx: &Ctx<'js>, promise: &Promise<'js>) {
    let Some(Ok(settled)) = promise.result::<Value>() else {
        return;
    };
    let value = match settled.as_object() {
        Some(o) => o.get::<_, Value>("value").unwrap_or(settled.clone()),
        None => settled,
    };
    if value.is_undefined() {
        return;
    }
    let text = match value.as_string().and_then(|s| s.to_string().ok()) {
        Some(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        None => format_value(ctx, &value),
    };
    report(Channel::Stdout, &text);
    let _ = ctx.globals().set("_", value);
}

thread_local! {
    /// Per channel (stdout, stderr): whether the host has stopped keeping
    /// output, so formatting more of it would be wasted work.
    static FULL: std::cell::Cell<[bool; 2]> = const { std::cell::Cell::new([false; 2]) };
}

/// Largest piece of output handed to the host in one call.
const CHUNK: usize = 16 << 10;

fn channel_index(channel: Channel) -> usize {
    match channel {
        Channel::Stdout => 0,
        Channel::Stderr => 1,
    }
}

fn mark_full(channel: Channel) {
    FULL.with(|f| {
        let mut v = f.get();
        v[channel_index(channel)] = true;
        f.set(v);
    });
}

fn channel_full(channel: Channel) -> bool {
    FULL.with(|f| f.get()[channel_index(channel)])
}

/// Writes one line to a channel, in chunks the host can take without copying
/// much, and stops as soon as the host keeps no more.
fn report(channel: Channel, text: &str) {
    if channel_full(channel) {
        return;
    }
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(CHUNK);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        if !output::write(channel, piece) {
            mark_full(channel);
            return;
        }
        rest = tail;
    }
    if !output::write(channel, "\n") {
        mark_full(channel);
    }
}

fn describe_caught<'js>(ctx: &Ctx<'js>, err: CaughtError<'js>) -> String {
    match err {
        CaughtError::Exception(e) => describe_thrown(ctx, &e.into_value()),
        CaughtError::Value(v) => describe_thrown(ctx, &v),
        CaughtError::Error(e) => e.to_string(),
    }
}

/// Node-like text for a thrown value: an Error's name, message and stack; any
/// other value as the console would print it.
fn describe_thrown<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> String {
    if let Some(exc) = value.as_exception() {
        let name: String = exc
            .get::<_, Option<rquickjs::convert::Coerced<String>>>("name")
            .ok()
            .flatten()
            .map(|c| c.0)
            .unwrap_or_else(|| "Error".to_string());
        let message = exc.message().unwrap_or_default();
        let mut text = if message.is_empty() {
            name
        } else {
            format!("{name}: {message}")
        };
        if let Some(stack) = exc.stack() {
            let stack = stack.trim_end();
            if !stack.is_empty() {
                text.push('\n');
                text.push_str(stack);
            }
        }
        return text;
    }
    format_value(ctx, value)
}

/// How `console.log` prints one argument: strings as they are, everything else
/// in a compact JSON-like form (node's `util.inspect` is larger than the whole
/// engine; this is the useful core of it).
fn format_value<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> String {
    if let Some(s) = value.as_string() {
        return s.to_string().unwrap_or_default();
    }
    if value.is_undefined() {
        return "undefined".to_string();
    }
    if value.is_function() {
        return "[Function]".to_string();
    }
    if value.as_exception().is_some() {
        return describe_thrown(ctx, value);
    }
    if value.is_object()
        && let Ok(Some(json)) = ctx.json_stringify(value.clone())
        && let Ok(s) = json.to_string()
    {
        return s;
    }
    value
        .get::<rquickjs::convert::Coerced<String>>()
        .map(|c| c.0)
        .unwrap_or_else(|_| "[unprintable]".to_string())
}

/// Replaces `Math.random` with a xorshift128+ generator seeded from the
/// host for this run. QuickJS's own generator was seeded when the engine was
/// built, which for a snapshot means once for every run of the daemon.
fn reseed_math_random(ctx: &Ctx<'_>, seed: u64) -> rquickjs::Result<()> {
    // splitmix64 spreads one seed over two non-zero state words.
    let mut z = seed;
    let mut next = || {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    let state = Rc::new(RefCell::new([next() | 1, next() | 1]));
    let random = Function::new(ctx.clone(), move || -> f64 {
        let mut s = state.borrow_mut();
        let (mut s1, s0) = (s[0], s[1]);
        s[0] = s0;
        s1 ^= s1 << 23;
        s[1] = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26);
        // 53 random bits in [0, 1), as engines build a double from them.
        (s[1].wrapping_add(s0) >> 11) as f64 / (1u64 << 53) as f64
    })?;
    let math: Object = ctx.globals().get("Math")?;
    math.set("random", random)
}

fn console_writer<'js>(ctx: &Ctx<'js>, channel: Channel) -> rquickjs::Result<Function<'js>> {
    Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
        if channel_full(channel) {
            return;
        }
        let mut line = String::new();
        for (i, arg) in args.0.iter().enumerate() {
            if i > 0 {
                line.push(' ');
            }
            line.push_str(&format_value(&ctx, arg));
        }
        report(channel, &line);
    })
}

fn install_globals<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<()> {
    let globals = ctx.globals();

    let console = Object::new(ctx.clone())?;
    console.set("log", console_writer(ctx, Channel::Stdout)?)?;
    console.set("info", console_writer(ctx, Channel::Stdout)?)?;
    console.set("debug", console_writer(ctx, Channel::Stdout)?)?;
    console.set("warn", console_writer(ctx, Channel::Stderr)?)?;
    console.set("error", console_writer(ctx, Channel::Stderr)?)?;
    globals.set("console", console)?;
    Ok(())
}

/// The grant client, `<global>.call/get/put/post/patch/del`, installed for a
/// granted run only, then the profile's preamble (an SDK over the client,
/// say), then the client frozen so the snippet cannot swap its methods. The
/// broker decides every call whatever the client looks like: freezing only
/// keeps the snippet's view what the operator wrote.
/// `Err(code)` is a preamble that threw: reported, and the snippet not run.
fn install_client<'js>(
    ctx: &Ctx<'js>,
    grant: GrantClient,
    freeze: Function<'js>,
) -> Result<Result<(), i32>, String> {
    let host = client_object(ctx).map_err(|e| format!("engine set-up failed: {e}"))?;
    ctx.globals()
        .set(grant.global.as_str(), host.clone())
        .map_err(|e| format!("engine set-up failed: {e}"))?;
    if let Some(bytes) = grant.preamble
        && let Err(err) = preamble::run(ctx, bytes)
    {
        report(
            Channel::Stderr,
            &format!(
                "plimsoll: the grant's preamble failed: {}",
                describe_caught(ctx, err)
            ),
        );
        return Ok(Err(1));
    }
    freeze
        .call::<_, Value>((host,))
        .map_err(|e| format!("engine set-up failed: {e}"))?;
    Ok(Ok(()))
}

fn client_object<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
    let host = Object::new(ctx.clone())?;
    host.set("call", host_fn(ctx, None)?)?;
    for (name, method) in [
        ("get", "GET"),
        ("del", "DELETE"),
        ("put", "PUT"),
        ("post", "POST"),
        ("patch", "PATCH"),
    ] {
        host.set(name, host_fn(ctx, Some(method))?)?;
    }
    Ok(host)
}

/// One method of the `host` object: `call(method, path, body)` when `method`
/// is `None`, else the shorthand for that method, `(path, body)`. A body given
/// to `get` or `del` is sent too: the broker polices routes, not payloads.
fn host_fn<'js>(ctx: &Ctx<'js>, method: Option<&'static str>) -> rquickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>,
              a: Value<'js>,
              b: Opt<Value<'js>>,
              c: Opt<Value<'js>>|
              -> rquickjs::Result<Promise<'js>> {
            let text = |v: &Value<'js>| -> String {
                v.as_string()
                    .and_then(|s| s.to_string().ok())
                    .unwrap_or_default()
            };
            match method {
                None => {
                    let path = b.0.as_ref().map(text).unwrap_or_default();
                    host_call(&ctx, text(&a), path, c.0)
                }
                Some(m) => host_call(&ctx, m.to_string(), text(&a), b.0),
            }
        },
    )
}

/// `host.call(method, path, body)`: one brokered call, as a Promise. The body
/// is sent as JSON; a 2xx answer resolves to the parsed JSON (or the text when
/// it is not JSON); anything else rejects with an Error naming the status.
fn host_call<'js>(
    ctx: &Ctx<'js>,
    method: String,
    path: String,
    body: Option<Value<'js>>,
) -> rquickjs::Result<Promise<'js>> {
    let (promise, resolve, reject) = Promise::new(ctx)?;
    let body = match body {
        Some(v) if !v.is_undefined() => match ctx.json_stringify(v)? {
            Some(s) => Some(s.to_string()?.into_bytes()),
            None => None,
        },
        _ => None,
    };
    let request = host_broker::Request { method, path, body };
    match host_broker::call(&request) {
        Ok(response) => {
            let text = String::from_utf8_lossy(&response.body).into_owned();
            if (200..300).contains(&response.status) {
                let value = match ctx.json_parse(text.clone()) {
                    Ok(v) => v,
                    Err(_) => rquickjs::String::from_str(ctx.clone(), &text)?.into_value(),
                };
                resolve.call::<_, ()>((value,))?;
            } else {
                let err = make_error(ctx, &format!("host api {}: {}", response.status, text))?;
                reject.call::<_, ()>((err,))?;
            }
        }
        Err(e) => {
            let message = match e {
                host_broker::CallError::NoGrant => {
                    "no grant for this run: the host API is not available (the request named no grant_profile)".to_string()
                }
                host_broker::CallError::NotPermitted(why) => format!("not permitted by sandbox capability: {why}"),
                host_broker::CallError::BudgetExhausted(why) => format!("host call budget exhausted: {why}"),
                host_broker::CallError::Shed => "host api 503: calls are being shed after the API asked to back off".to_string(),
                host_broker::CallError::UpstreamFailed(why) => format!("host api call failed: {why}"),
            };
            let err = make_error(ctx, &message)?;
            reject.call::<_, ()>((err,))?;
        }
    }
    Ok(promise)
}

fn make_error<'js>(ctx: &Ctx<'js>, message: &str) -> rquickjs::Result<Value<'js>> {
    let ctor: Function = ctx.globals().get("Error")?;
    ctor.call((message.to_string(),))
}
