// Loaded with `node --import` before the snippet, in a pre-booted
// container only when the host gave it an end-frame nonce. Once every
// 'exit' listener has run, it writes the host's end frames: stderr's, then
// stdout's with the exit code, each after all the output written before
// it on its stream. After an uncaught exception it writes nothing (node
// prints the error after 'exit'), and the host waits for the engine.
const nonce = process.env.PLIMSOLL_END;
delete process.env.PLIMSOLL_END;
if (nonce) {
  let thrown = false;
  process.on('uncaughtExceptionMonitor', () => { thrown = true; });
  const emit = process.emit;
  const framing = function (event, ...args) {
    const r = emit.call(this, event, ...args);
    // Code that wrapped process.emit itself may run exit callbacks after
    // this returns: then the host waits for the engine instead.
    if (event === 'exit' && !thrown && process.emit === framing) {
      // What node exits with once the 'exit' listeners have run.
      const code = (process.exitCode ?? 0) & 255;
      try {
        process.stderr.write('\0plimsoll-end:' + nonce + '\n');
        process.stdout.write('\0plimsoll-end:' + nonce + ':' + code + '\n');
      } catch {}
    }
    return r;
  };
  process.emit = framing;
}
