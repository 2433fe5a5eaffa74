"""What every cloud adapter's sessions are held to: no process a call
starts outlives the call (SECURITY.md, promise 13), shown the same way on
each."""

from __future__ import annotations

# Counts live processes whose command line is `sleep 300`, by reading /proc
# with node (the adapters' images have no python), skipping ones that end
# while it reads.
COUNT_SLEEPERS = """const fs = require('fs');
let n = 0;
for (const pid of fs.readdirSync('/proc').filter((p) => /^[0-9]+$/.test(p))) {
  try {
    n += fs.readFileSync(`/proc/${pid}/cmdline`, 'latin1') === 'sleep\\u0000300\\u0000';
  } catch {}
}
console.log(n);
"""


def assert_no_process_outlives_a_call(s) -> None:
    """The count is first seen to count two live sleepers inside the call
    that starts them (one detached in its own session), so a 0 in the next
    call means they are gone, not that the probe is blind; the session
    then goes on."""
    r = s.run_project({"count.js": COUNT_SLEEPERS},
                      ["(setsid sleep 300 &) ; (sleep 300 &) ; sleep 0.3; node count.js"],
                      timeout=60)
    step = r.steps[0]
    assert (step.exit_code, step.stdout, step.stderr) == (0, b"2\n", b""), step
    # The sweep that stopped them did not end the session: a session that
    # ended here would fail the next call with less to go on.
    assert s.ended is None, s.ended
    r = s.run_project({}, ["node count.js"], timeout=60)
    step = r.steps[0]
    assert (step.exit_code, step.stdout, step.stderr) == (0, b"0\n", b""), step
    assert s.ended is None
    assert s.run_javascript("console.log(7)", timeout=30).stdout == b"7\n"


# Processes that take their time to exit once killed: node holding a
# gigabyte each it has written to, so the kernel has pages to free.
# Written to stay alive; `ready` appears once the memory is touched.
BIG_HEAP = """const b = Buffer.alloc(1e9, 1);
require('fs').writeFileSync('ready-' + process.argv[2], String(b[0]));
setInterval(() => {}, 1e6);
"""


def assert_a_slow_exit_does_not_end_the_session(s) -> None:
    """A process the sweep has killed may still be in /proc while the kernel
    tears it down; it runs no more code, so it is not a leftover. The sweep
    must not count it as one, or the session ends (sandbox_changed) after
    any call that left a big process behind."""
    r = s.run_project({"big.js": BIG_HEAP},
                      ["rm -f ready-*; for i in 1 2 3; do (node big.js $i &); done; "
                       "while [ ! -e ready-1 ] || [ ! -e ready-2 ] || [ ! -e ready-3 ]; do sleep 0.05; done; echo up"],
                      timeout=60)
    step = r.steps[0]
    assert (step.exit_code, step.stdout) == (0, b"up\n"), step
    assert s.ended is None, s.ended
    assert s.run_javascript("console.log(8)", timeout=30).stdout == b"8\n"
