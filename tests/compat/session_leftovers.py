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
    r = s.run_project({}, ["node count.js"], timeout=60)
    step = r.steps[0]
    assert (step.exit_code, step.stdout, step.stderr) == (0, b"0\n", b""), step
    assert s.ended is None
    assert s.run_javascript("console.log(7)", timeout=30).stdout == b"7\n"
