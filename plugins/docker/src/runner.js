// The project runner: runs inside the sandbox container, under node, as the
// guest user. The plan arrives on stdin as one JSON document; the report
// leaves on stdout as one JSON object per line, so the steps that finished
// are known even if the host kills the container at its deadline.
//
// Lines: {"start":i}, {"step":{...}}, {"artifact":{...}}, {"end":{...}}.
//
// The runner is not a security boundary: the steps run as the same user in
// the same container and could write to this process's stdout. A forged
// report can only misstate the caller's own run, and the adapter checks the
// report's shape against the plan before believing any of it.
'use strict';
const fs = require('fs');
const path = require('path');
const { spawn } = require('child_process');

const WORK = '/work';
const emit = (o) => fs.writeSync(1, JSON.stringify(o) + '\n');

function finish(outcome, detail, artifactsTruncated) {
  emit({ end: { outcome, detail, artifacts_truncated: !!artifactsTruncated } });
  process.exit(0);
}

let plan;
try {
  plan = JSON.parse(fs.readFileSync(0, 'utf8'));
} catch (e) {
  finish('setup_failed', 'the runner could not read its plan');
}
const deadline = Date.now() + plan.budget_ms;
const limit = plan.output_limit;

for (const f of plan.files) {
  const p = path.join(WORK, f.path);
  try {
    fs.mkdirSync(path.dirname(p), { recursive: true });
    fs.writeFileSync(p, f.content, { flag: 'wx' });
  } catch (e) {
    finish('setup_failed', `writing ${f.path}: ${e.code || 'failed'}`);
  }
}

function capture() {
  return { chunks: [], n: 0, cut: false };
}
function taker(c) {
  return (d) => {
    const room = limit - c.n;
    if (d.length > room) c.cut = true;
    if (room > 0) {
      const part = d.subarray(0, room);
      c.chunks.push(part);
      c.n += part.length;
    }
  };
}

function runStep(command) {
  return new Promise((resolve) => {
    const started = Date.now();
    const so = capture();
    const se = capture();
    let timedOut = false;
    let exitCode = null;
    const child = spawn('/bin/sh', ['-c', command], {
      cwd: WORK,
      detached: true, // its own process group, so a deadline kills it whole
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const killGroup = () => {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch (_) {}
    };
    child.stdout.on('data', taker(so));
    child.stderr.on('data', taker(se));
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, Math.max(0, deadline - Date.now()));
    child.on('exit', (code, signal) => {
      exitCode = code !== null ? code : 128 + (require('os').constants.signals[signal] || 0);
      // Background processes the step left would hold its output open.
      killGroup();
    });
    child.on('error', () => {
      exitCode = 127;
    });
    child.on('close', () => {
      clearTimeout(timer);
      resolve({
        command,
        stdout: Buffer.concat(so.chunks).toString('base64'),
        stderr: Buffer.concat(se.chunks).toString('base64'),
        exit_code: timedOut ? 124 : exitCode === null ? 127 : exitCode,
        timed_out: timedOut,
        duration_ms: Date.now() - started,
        stdout_truncated: so.cut,
        stderr_truncated: se.cut,
      });
    });
  });
}

function collectArtifacts() {
  let total = 0;
  let truncated = false;
  for (const a of plan.artifacts) {
    let fd;
    try {
      // The final component is never followed; a link is not an artifact.
      fd = fs.openSync(path.join(WORK, a), fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
      const st = fs.fstatSync(fd);
      if (!st.isFile()) continue;
      if (total + st.size > plan.artifact_bytes) {
        truncated = true;
        continue;
      }
      const content = fs.readFileSync(fd);
      total += content.length;
      emit({ artifact: { path: a, content: content.toString('base64') } });
    } catch (_) {
      // A missing artifact is left out: the steps may not have made it.
    } finally {
      if (fd !== undefined) fs.closeSync(fd);
    }
  }
  return truncated;
}

(async () => {
  let outcome = 'completed';
  for (let i = 0; i < plan.steps.length; i++) {
    emit({ start: i });
    const r = await runStep(plan.steps[i]);
    emit({ step: r });
    if (r.timed_out) {
      outcome = 'timed_out';
      break;
    }
    if (r.exit_code !== 0) break;
  }
  finish(outcome, '', collectArtifacts());
})();
