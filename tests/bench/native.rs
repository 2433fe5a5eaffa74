//! The baseline a bare wasm run is measured against (issue 16): the same
//! snippet in QuickJS built natively from the sources the guest is built
//! from, unsandboxed, in the same benchmark run.

use std::time::{Duration, Instant};

use crate::SNIPPET;
use crate::stats::{faults_row, minor_faults, summary};

/// A fresh QuickJS runtime and full context per run, natively: what the
/// guest does for a run, without the sandbox, the snapshot or the copy-on-
/// write instance. `console.log` appends to a string, as the guest's writes
/// to its output import.
pub fn native_quickjs(n: usize) -> Duration {
    use rquickjs::{Context, Function, Object, Runtime};
    let once = || {
        let rt = Runtime::new().expect("runtime");
        let ctx = Context::full(&rt).expect("context");
        ctx.with(|ctx| {
            let out = std::rc::Rc::new(std::cell::RefCell::new(String::new()));
            let sink = out.clone();
            let console = Object::new(ctx.clone()).expect("console");
            let log = Function::new(ctx.clone(), move |s: rquickjs::Coerced<String>| {
                let mut o = sink.borrow_mut();
                o.push_str(&s.0);
                o.push('\n');
            })
            .expect("log");
            console.set("log", log).expect("set log");
            ctx.globals().set("console", console).expect("set console");
            ctx.eval::<(), _>(SNIPPET).expect("eval");
            assert_eq!(out.borrow().as_str(), "42\n");
        });
    };
    for _ in 0..200 {
        once();
    }
    let mut v = Vec::with_capacity(n);
    let faults = minor_faults();
    for _ in 0..n {
        let t = Instant::now();
        once();
        v.push(t.elapsed());
    }
    let p50 = summary("native QuickJS, fresh runtime+context (unsandboxed)", v);
    faults_row(faults, n);
    p50
}

/// The figure issue 16 sets at 1.0 or less.
pub fn ratio_line(wasm: Duration, native: Duration) {
    println!(
        "bare wasm run / native QuickJS fresh context, p50: {:.2}x",
        wasm.as_secs_f64() / native.as_secs_f64()
    );
}
