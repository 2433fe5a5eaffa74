"""The session agent (plugins/docker/src/session) in a real container.

Each test starts a container the way the host does (the envelope in
host/src/backends/docker/envelope.rs: read-only root, no network, no
capabilities, the guest uid, noexec tmpfs, memory and pids limits, the shipped
seccomp profile under runc) with the agent as its main process, and speaks the
session protocol over the container's stdin and stdout, under runc and runsc.
Nothing here trusts the agent's own account of cleanliness: after a sweep, a
snippet scans /proc itself.

    .venv/bin/python -m pytest tests/session_agent -q
    .venv/bin/python -m pytest tests/session_agent -q -s -k latency   # numbers
"""

from __future__ import annotations

import base64
import json
import os
import queue
import statistics
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "plugins" / "docker" / "src" / "session"
IMAGE = os.environ.get("SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:bookworm")
SESSION_SH = 'node -e "$1" "$2" "$3"; exit $?'
# No python3 on PATH: node through a symlink the container makes itself.
NO_PYTHON_SH = ('mkdir -p /tmp/bin && ln -s "$(command -v node)" /tmp/bin/node && '
                'PATH=/tmp/bin exec node -e "$1" "$2" "$3"')


def runtimes() -> list[str]:
    try:
        info = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [r for r in ("runc", "runsc") if f'"{r}"' in info]


def docker_args(runtime: str, shell: str) -> list[str]:
    args = ["docker", "run", "-i", "--rm", "--runtime", runtime, "--read-only",
            "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--user", "61000:61000", "--memory", "512m", "--memory-swap", "512m", "--cpus", "1",
            "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=16m",
            "--tmpfs", "/work:rw,noexec,nosuid,nodev,size=128m,uid=61000,gid=61000",
            "--shm-size", "16m", "--ipc", "private", "--log-driver", "none",
            "--ulimit", "core=0", "--ulimit", "msgqueue=0", "--ulimit", "nofile=4096:4096",
            "-w", "/work"]
    if runtime == "runc":
        # As the host: the pids limit and the shipped profile under runc only
        # (its runsc build crashes on a pids limit; gVisor filters itself).
        args += ["--pids-limit", "256",
                 "--security-opt", f"seccomp={ROOT / 'plugins' / 'docker' / 'seccomp.json'}"]
    args += ["--entrypoint", "/bin/sh", IMAGE, "-c", shell, "plimsoll-session"]
    return args + [(SRC / f).read_text() for f in ("agent.js", "kernel.js", "kernel.py")]


def unb64(d: dict) -> dict:
    d = dict(d)
    for k in ("stdout", "stderr"):
        if k in d:
            d[k] = base64.b64decode(d[k]).decode("utf-8", "replace")
    return d


class Session:
    """One container; calls are written whole and read to their `done`."""

    def __init__(self, runtime: str, shell: str = SESSION_SH) -> None:
        self.runtime = runtime
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(docker_args(runtime, shell), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, timeout: float = 60) -> dict:
        line = self.lines.get(timeout=timeout)
        assert line is not None, "the agent's stdout ended"
        return json.loads(line)

    def send(self, raw: bytes) -> None:
        self.proc.stdin.write(raw)
        self.proc.stdin.flush()

    def call(self, kind: str, timeout: float = 60, **fields) -> list[dict]:
        """The lines between begin and done."""
        rid = uuid.uuid4().hex
        self.send((json.dumps({"id": rid, "kind": kind, **fields}) + "\n").encode())
        assert self.next_line(timeout) == {"begin": rid}
        out = []
        while (line := self.next_line(timeout)) != {"done": rid}:
            assert "begin" not in line and "done" not in line, line
            out.append(line)
        return out

    def hello(self, languages=("python", "javascript")) -> dict:
        [line] = self.call("hello", languages=list(languages))
        return line["hello"]

    def snippet(self, code: str, budget_ms: int = 20000, output_limit: int = 1 << 16,
                env: list[str] | None = None) -> dict:
        [line] = self.call("snippet", code=code, budget_ms=budget_ms,
                           output_limit=output_limit, env=env or [])
        return unb64(line["process"])

    def project(self, steps: list[str], files=(), artifacts=(), budget_ms: int = 20000,
                output_limit: int = 1 << 16, artifact_bytes: int = 1 << 20,
                env: list[str] | None = None) -> list[dict]:
        return self.call("project", files=[{"path": p, "content": c} for p, c in files],
                         steps=steps, artifacts=list(artifacts), budget_ms=budget_ms,
                         output_limit=output_limit, artifact_bytes=artifact_bytes,
                         env=env or [])

    def cell(self, language: str, code: str, budget_ms: int = 20000,
             output_limit: int = 1 << 16, files=()) -> dict:
        [line] = self.call("cell", language=language, code=code, budget_ms=budget_ms,
                           output_limit=output_limit,
                           files=[{"path": p, "content": c} for p, c in files])
        return unb64(line["cell"]) if "cell" in line else line

    def processes(self) -> tuple[int, list[dict]]:
        """Every process in the container, seen from a snippet: (its pid, list)."""
        out = self.snippet(SCAN)
        assert out["exit_code"] == 0, out
        seen = json.loads(out["stdout"])
        return seen["self"], seen["procs"]

    def close(self) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


SCAN = r"""
const fs = require('fs');
const procs = [];
for (const n of fs.readdirSync('/proc')) {
  if (!/^\d+$/.test(n)) continue;
  try {
    const stat = fs.readFileSync(`/proc/${n}/stat`, 'latin1');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const argv = fs.readFileSync(`/proc/${n}/cmdline`, 'latin1').split('\0').slice(0, 2)
      .map((a) => a.slice(0, 24));
    procs.push({ pid: +n, state: f[0], ppid: +f[1], argv });
  } catch (_) {}
}
console.log(JSON.stringify({ self: process.pid, procs }));
"""


def strays(s: Session, kernels: int | None = None) -> list[dict]:
    """Processes that should not exist: not PID 1, the agent, a kernel, the
    scanning snippet, or a killed child of the Python kernel awaiting its
    reaping. Also checks how many kernels are alive when told."""
    me, procs = s.processes()
    agent = next(p["pid"] for p in procs if p["ppid"] == 1 and p["argv"][:2] == ["node", "-e"])
    kern = {p["pid"] for p in procs if p["ppid"] == agent and p["pid"] != me
            and p["state"] != "Z" and (p["argv"][1:2] in (["-e"], ["-I"]))}
    if kernels is not None:
        assert len(kern) == kernels, procs
    bad = []
    for p in procs:
        if p["pid"] in (1, agent, me) or p["pid"] in kern:
            continue
        if p["state"] == "Z" and p["ppid"] in kern:
            continue
        bad.append(p)
    return bad


def expected_runtimes() -> list[str]:
    found = runtimes()
    # Under CI both must be there (setup starts dockerd with runsc): a
    # missing engine or runtime fails, never skips into a pass.
    if os.environ.get("CI"):
        assert found == ["runc", "runsc"], f"docker with runc and runsc is required, found {found}"
    return found or ["none"]


@pytest.fixture(params=expected_runtimes())
def runtime(request) -> str:
    if request.param == "none":
        pytest.skip("no docker engine (outside CI only)")
    return request.param


@pytest.fixture
def s(runtime):
    sess = Session(runtime)
    yield sess
    sess.close()


# ---- hello, requests ----

def test_hello_reports_versions_and_answers_at_once(s):
    t = time.perf_counter()
    hello = s.hello()
    assert hello["node"].startswith("v24.")
    assert hello["python"] == "3.11"
    # Container start dominates; the answer itself must not wait on kernels.
    assert time.perf_counter() - t < 20
    # hello started the kernel, but the first cell is the first in it.
    assert s.cell("python", "1")["interpreter_started"] is True


def test_bad_requests_are_answered_and_survived(s):
    s.send(b"this is not json\n")
    assert "bad" in s.next_line()
    s.send(b'{"kind": "hello"}\n\n')
    assert "bad" in s.next_line()
    assert s.call("nope") == [{"error": "unknown kind"}]
    [err] = s.call("snippet", budget_ms=1000)
    assert err["error"].startswith("bad request")
    assert s.hello()["node"]


def test_requests_written_together_are_answered_in_order(s):
    ids = [uuid.uuid4().hex for _ in range(3)]
    reqs = [{"id": ids[0], "kind": "cell", "language": "python", "code": "import time; time.sleep(0.2); 1",
             "budget_ms": 10000, "output_limit": 100},
            {"id": ids[1], "kind": "snippet", "code": "console.log(2)", "budget_ms": 10000, "output_limit": 100},
            {"id": ids[2], "kind": "hello"}]
    s.send(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
    seen = [s.next_line() for _ in range(9)]
    assert [list(x)[0] for x in seen] == ["begin", "cell", "done", "begin", "process", "done",
                                          "begin", "hello", "done"]
    assert [x["begin"] for x in seen[0::3]] == ids


def test_stdin_eof_ends_the_agent_and_the_container(s):
    assert s.cell("python", "import threading, time\n"
                  "threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()")["exit_code"] == 0
    assert s.cell("javascript", "setInterval(() => {}, 1000); 1")["exit_code"] == 0
    t = time.perf_counter()
    assert s.close() == 0
    assert time.perf_counter() - t < 10


# ---- snippets ----

def test_snippet_output_exit_code_and_env(s):
    out = s.snippet("console.log('hi', process.env.FOO, process.cwd()); console.error('oops');"
                    " process.exitCode = 3", env=["FOO=bar=baz"])
    assert out == {"stdout": "hi bar=baz /work\n", "stderr": "oops\n", "exit_code": 3,
                   "timed_out": False, "stdout_truncated": False, "stderr_truncated": False}
    assert s.snippet("process.kill(process.pid, 'SIGKILL')")["exit_code"] == 137


def test_snippet_timeout_kills_it_and_what_it_started(s):
    t = time.perf_counter()
    out = s.snippet("require('child_process').spawn('sleep', ['1000'], {detached: true, stdio: 'ignore'});"
                    "console.log('started'); setInterval(() => {}, 1000)", budget_ms=1500)
    assert (out["exit_code"], out["timed_out"], out["stdout"]) == (124, True, "started\n")
    assert time.perf_counter() - t < 8
    assert strays(s) == []


# ---- projects ----

def test_project_overwrites_and_stops_at_the_first_failing_step(s):
    end = s.project(["cat a.txt d/e/b.txt"], files=[("a.txt", "one"), ("d/e/b.txt", "B")])
    assert unb64(end[1]["step"])["stdout"] == "oneB"
    lines = s.project(["cat a.txt", "echo err >&2; exit 3", "echo never"], files=[("a.txt", "two")])
    assert [list(x) for x in lines] == [["start"], ["step"], ["start"], ["step"], ["end"]]
    first, second = unb64(lines[1]["step"]), unb64(lines[3]["step"])
    assert (first["command"], first["stdout"], first["exit_code"]) == ("cat a.txt", "two", 0)
    assert (second["stderr"], second["exit_code"], second["timed_out"]) == ("err\n", 3, False)
    assert set(second) == {"command", "stdout", "stderr", "exit_code", "timed_out", "duration_ms",
                           "stdout_truncated", "stderr_truncated"}
    assert lines[-1] == {"end": {"outcome": "completed", "detail": "", "artifacts_truncated": False}}


def test_project_replaces_links_and_fifos_and_never_leaves_work(s):
    s.project(["echo orig > /tmp/target && ln -s /tmp/target link.txt && mkfifo fifo && ln -s /tmp out"])
    lines = s.project(["test ! -L link.txt && test -f fifo && cat link.txt fifo /tmp/target"],
                      files=[("link.txt", "new "), ("fifo", "data ")])
    step = unb64(lines[1]["step"])
    assert (step["exit_code"], step["stdout"]) == (0, "new data orig\n")
    # A link on the way is refused, not followed; so is a path leaving /work.
    for path, code in [("out/x", "ELOOP"), ("../x", "EINVAL"), ("a/../../x", "EINVAL"), ("/tmp/x", "EINVAL")]:
        assert s.project(["true"], files=[(path, "x")]) == [{"end": {
            "outcome": "setup_failed", "detail": f"writing {path}: {code}", "artifacts_truncated": False}}]
    # (echo, not ls: this gVisor's ls fails on statx.)
    assert unb64(s.project(["echo /tmp/*"])[1]["step"])["stdout"] == "/tmp/target\n"


def test_project_artifacts(s):
    lines = s.project(["printf 'b\\0n' > out.bin && head -c 5000 /dev/zero > big.bin && ln -s out.bin link"
                       " && mkfifo fifo && mkdir dir && ln -s /etc etc"],
                      artifacts=["out.bin", "big.bin", "link", "fifo", "dir", "missing", "etc/passwd"],
                      artifact_bytes=1000)
    arts = [x["artifact"] for x in lines if "artifact" in x]
    assert arts == [{"path": "out.bin", "content": base64.b64encode(b"b\0n").decode()}]
    assert lines[-1]["end"] == {"outcome": "completed", "detail": "", "artifacts_truncated": True}


def test_project_timeout(s):
    t = time.perf_counter()
    lines = s.project(["echo a", "sleep 30", "echo never"], budget_ms=1500)
    assert time.perf_counter() - t < 8
    assert [list(x) for x in lines] == [["start"], ["step"], ["start"], ["step"], ["end"]]
    step = unb64(lines[3]["step"])
    assert (step["exit_code"], step["timed_out"]) == (124, True)
    assert lines[-1]["end"]["outcome"] == "timed_out"


def test_files_persist_between_calls_and_kinds(s):
    s.project(["echo from-step > made.txt"], files=[("given.txt", "given")])
    assert s.snippet("process.stdout.write(require('fs').readFileSync('given.txt', 'utf8'))")["stdout"] == "given"
    assert s.cell("python", "open('made.txt').read()")["stdout"] == "'from-step\\n'\n"
    assert s.cell("python", "import helper; helper.V", files=[("helper.py", "V = 3")])["stdout"] == "3\n"
    assert s.cell("javascript", "require('./m.js').v", files=[("m.js", "exports.v = 4")])["stdout"] == "4\n"
    assert s.cell("javascript", "require('fs').readFileSync('given.txt', 'utf8')")["stdout"] == "'given'\n"


# ---- cells ----

def test_python_cells_keep_state_and_print_the_final_expression(s):
    first = s.cell("python", "x = 41\ndef f(y):\n    return y * 2")
    assert first["interpreter_started"] is True and first["stdout"] == ""
    out = s.cell("python", "print('side'); x + 1")
    assert (out["stdout"], out["exit_code"], out["interpreter_started"]) == ("side\n42\n", 0, False)
    assert s.cell("python", "_ + f(1)")["stdout"] == "44\n"
    assert s.cell("python", "None")["stdout"] == ""
    assert s.cell("python", "__name__, [1, 'a']")["stdout"] == "('__main__', [1, 'a'])\n"
    assert s.cell("python", "class P: pass\nimport pickle; type(pickle.loads(pickle.dumps(P()))).__name__")["stdout"] == "'P'\n"


def test_javascript_cells_keep_state_and_redeclare_like_a_notebook(s):
    assert s.cell("javascript", "let x = 1; const c = 'c'; class A { f() { return 7 } };"
                  " function g() { return 8 }; var v = 9")["stdout"] == ""
    assert s.cell("javascript", "x + 1")["stdout"] == "2\n"
    assert s.cell("javascript", "_ * 10")["stdout"] == "20\n"
    assert s.cell("javascript", "let x = 5; const c = 'd'; class A {}; x + c")["stdout"] == "'5d'\n"
    assert s.cell("javascript", "[g(), v, typeof A, globalThis._]")["stdout"] == "[ 8, 9, 'function', '5d' ]\n"
    assert s.cell("javascript", "console.log('out'); ({a: 1})")["stdout"] == "out\n{ a: 1 }\n"
    assert s.cell("javascript", "undefined")["stdout"] == ""


def test_python_exceptions_and_exit(s):
    s.cell("python", "def boom():\n    return 1 / 0\nkept = 1")
    out = s.cell("python", "print('before')\nboom()")
    assert (out["exit_code"], out["stdout"]) == (1, "before\n")
    assert out["stderr"].startswith("Traceback (most recent call last):\n  File \"<cell-2>\", line 2")
    assert "ZeroDivisionError: division by zero" in out["stderr"] and 'File "<cell-1>"' in out["stderr"]
    assert "kernel" not in out["stderr"] and "<string>" not in out["stderr"]
    syntax = s.cell("python", "def f(:")
    assert syntax["exit_code"] == 1 and "SyntaxError" in syntax["stderr"] and "Traceback" not in syntax["stderr"]
    assert s.cell("python", "import sys; sys.exit()")["exit_code"] == 0
    assert s.cell("python", "sys.exit(0)")["exit_code"] == 0
    assert s.cell("python", "sys.exit(4)")["exit_code"] == 1
    assert s.cell("python", "sys.exit('why')")["stderr"] == "why\n"
    assert s.cell("python", "exit(2)")["exit_code"] == 1
    out = s.cell("python", "kept")
    assert (out["stdout"], out["interpreter_ended"], out["interpreter_started"]) == ("1\n", False, False)


def test_javascript_exceptions(s):
    out = s.cell("javascript", "function boom() { throw new TypeError('bad') }\nconsole.log('before'); boom()")
    assert (out["exit_code"], out["stdout"]) == (1, "before\n")
    assert out["stderr"].startswith("Uncaught TypeError: bad\n    at boom (cell-1:1:25)\n    at cell-1:2")
    assert "[eval]" not in out["stderr"] and "inspector" not in out["stderr"]
    out = s.cell("javascript", "await Promise.reject(new Error('later'))")
    assert out["exit_code"] == 1 and out["stderr"].startswith("Uncaught Error: later")
    assert s.cell("javascript", "throw 5")["stderr"] == "Uncaught 5\n"
    syntax = s.cell("javascript", "let = = 1")
    assert syntax["exit_code"] == 1 and "SyntaxError" in syntax["stderr"]
    # Async failures are reported, never fatal.
    out = s.cell("javascript", "setTimeout(() => { throw new Error('late') }, 0);"
                 " Promise.reject(new Error('dropped')); await new Promise(r => setTimeout(r, 50)); 1")
    assert (out["exit_code"], out["stdout"]) == (0, "1\n")
    assert "Uncaught Error: late" in out["stderr"] and "Uncaught Error: dropped" in out["stderr"]
    assert s.cell("javascript", "typeof boom")["stdout"] == "'function'\n"


@pytest.mark.parametrize("language,slow", [
    ("python", "print('going')\nwhile True: pass"),
    ("javascript", "console.log('going'); while (true) {}"),
    ("javascript", "console.log('going'); await new Promise(() => {})"),
])
def test_a_cell_out_of_time_costs_the_kernel(s, language, slow):
    s.cell(language, "x = 1" if language == "python" else "var x = 1")
    t = time.perf_counter()
    out = s.cell(language, slow, budget_ms=1500)
    assert time.perf_counter() - t < 15
    assert (out["exit_code"], out["timed_out"], out["interpreter_ended"]) == (124, True, True)
    assert out["stdout"] == "going\n"
    after = s.cell(language, "x")
    assert after["interpreter_started"] is True and after["exit_code"] == 1
    assert "x" in after["stderr"] and "not defined" in after["stderr"]
    assert strays(s, kernels=1) == []


@pytest.mark.parametrize("language,code,status", [
    ("python", "import os\nprint('bye', flush=True)\nos._exit(7)", 7),
    ("javascript", "console.log('bye'); process.exit(9)", 9),
    ("python", "import os, signal\nprint('bye')\nos.kill(os.getpid(), signal.SIGKILL)", 137),
])
def test_a_kernel_that_dies_is_reported_and_replaced(s, language, code, status):
    s.cell(language, "kept = 1" if language == "python" else "var kept = 1")
    out = s.cell(language, code)
    assert (out["exit_code"], out["interpreter_ended"], out["timed_out"], out["stdout"]) == (status, True, False, "bye\n")
    after = s.cell(language, "1 + 1")
    assert (after["stdout"], after["interpreter_started"]) == ("2\n", True)


def test_top_level_await(s):
    js = s.cell("javascript", "await new Promise(r => setTimeout(r, 10)); 5")
    assert (js["stdout"], js["exit_code"]) == ("5\n", 0)
    py = s.cell("python", "import asyncio\nawait asyncio.sleep(0.01)\n5")
    assert (py["stdout"], py["exit_code"]) == ("5\n", 0)
    py = s.cell("python", "async def two():\n    return 2\nawait two()")
    assert py["stdout"] == "2\n"
    py = s.cell("python", "x = await two()\nx + 1")
    assert py["stdout"] == "3\n"


def test_output_caps(s):
    out = s.snippet("process.stdout.write('x'.repeat(100000)); console.error('e')", output_limit=1000)
    assert (len(out["stdout"]), out["stdout_truncated"], out["stderr"], out["stderr_truncated"]) == (1000, True, "e\n", False)
    step = unb64(s.project(["head -c 100000 /dev/zero | tr '\\0' y"], output_limit=10)[1]["step"])
    assert (step["stdout"], step["stdout_truncated"]) == ("y" * 10, True)
    py = s.cell("python", "print('p' * 100000)\n'tail'", output_limit=500)
    assert (py["stdout"], py["stdout_truncated"], py["exit_code"]) == ("p" * 500, True, 0)
    js = s.cell("javascript", "console.error('j'.repeat(100000)); 1", output_limit=500)
    assert (js["stderr"], js["stderr_truncated"], js["stdout"]) == ("j" * 500, True, "1\n")
    # The cap drops output, not the session.
    assert s.cell("python", "'ok'")["stdout"] == "'ok'\n"


def test_output_is_exact_across_pipe_chunks(s):
    want = "".join(f"{i}\n" for i in range(30000))
    py = s.cell("python", "import sys\nfor i in range(30000): sys.stdout.write(f'{i}\\n')", output_limit=1 << 20)
    assert py["stdout"] == want and not py["stdout_truncated"]
    js = s.cell("javascript", "for (let i = 0; i < 30000; i++) process.stdout.write(i + '\\n'); undefined",
                output_limit=1 << 20)
    assert js["stdout"] == want and not js["stdout_truncated"]
    out = s.cell("python", "print('no newline', end='')")
    assert out["stdout"] == "no newline"
    step = unb64(s.project(["echo $FOO; seq 0 29999"], env=["FOO=bar"], output_limit=1 << 20)[1]["step"])
    assert step["stdout"] == "bar\n" + want


def test_background_output_between_cells_is_dropped(s):
    py = s.cell("python", "import threading, sys\n"
                "def late():\n    print('late')\n    print('late', file=sys.stderr)\n"
                "threading.Timer(0.3, late).start()\nprint('now')")
    assert py["stdout"] == "now\n"
    js = s.cell("javascript", "setTimeout(() => { console.log('late'); console.error('late') }, 300);"
                " console.log('now')")
    assert js["stdout"] == "now\n"
    time.sleep(1)
    for language, code in (("python", "print('next')"), ("javascript", "console.log('next')")):
        out = s.cell(language, code)
        assert (out["stdout"], out["stderr"]) == ("next\n", ""), language


# ---- the sweep ----

def test_the_sweep_after_project_steps(s):
    s.hello()
    lines = s.project(["sleep 1000 &", "sh -c '(sleep 1000 &) &'", "setsid sleep 1000 & echo ok",
                       "nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 &"])
    assert lines[-1]["end"]["outcome"] == "completed" and {"swept": False} not in lines
    assert strays(s, kernels=2) == []


# A relay of processes whose main thread has exited (they read as zombies
# while their other thread runs); each member writes its number to the beat
# file, forks the next member from that thread, and ends. One relay: a second
# would keep members the scan counts alive, and so the sweep going.
RELAY = r"""
import ctypes, os, threading, time
libc = ctypes.CDLL(None)
libc.pthread_exit.argtypes = [ctypes.c_void_p]
def member(n):
    def step():
        try:
            with open('/work/beat', 'w') as f:
                f.write(str(n))
        except OSError:
            pass
        time.sleep(0.001)
        if os.fork() == 0:
            member(n + 1)
        os._exit(0)
    threading.Thread(target=step).start()
    libc.pthread_exit(None)
if os.fork() == 0:
    os.setsid()
    member(0)
time.sleep(0.2)
"""
# Whether the relay still beats: its number moves within half a second.
BEATING = r"""
const fs = require('fs');
const read = () => { try { return fs.readFileSync('/work/beat', 'latin1'); } catch (_) { return ''; } };
const before = read();
setTimeout(() => console.log(JSON.stringify(read() !== before)), 500);
"""


def test_a_relay_of_zombie_leaders_does_not_outlive_the_sweep(s):
    # A zombie with live threads was killed but not counted, so a round could
    # count nothing while the member forked after its scan lived on, and the
    # sweep said clean. Before the fix a relay was seen to escape, but
    # rarely (once in some 60 calls on runc), so this test shows a
    # regression only sometimes; with the fix it must pass every time.
    s.hello()
    for _ in range(12):
        lines = s.project(["python3 relay.py"], files=[("relay.py", RELAY)])
        assert lines[-1]["end"]["outcome"] == "completed", lines
        assert {"swept": False} not in lines, lines
        out = s.snippet(BEATING)
        assert (out["exit_code"], out["stdout"]) == (0, "false\n"), out


def test_a_sweep_ends_before_the_next_step_starts(s):
    # A step whose leftover holds its pipes is swept on exit. That sweep must
    # be over before anything else starts, or it kills what comes next (it
    # did: a CI run saw exit 137). Threads in the Python kernel, which every
    # sweep spares, keep starting processes, so a sweep usually runs all its
    # rounds (about a second); whether it does is timing, so the test does not
    # ask, it only requires every step and the snippet after them to survive.
    spawner = ("import os, threading, time\n"
               "def spawn():\n"
               "    live = set()\n"  # 16 a thread: the pids limit (256) stays far
               "    while True:\n"
               "        for pid in list(live):\n"
               "            try:\n"
               "                if os.waitpid(pid, os.WNOHANG)[0]:\n"
               "                    live.discard(pid)\n"
               "            except ChildProcessError:\n"
               "                live.discard(pid)\n"
               "        if len(live) >= 16:\n"
               "            time.sleep(0.001)\n"
               "            continue\n"
               "        try:\n"
               "            live.add(os.posix_spawn('/bin/sleep', ['sleep', '1000'], os.environ))\n"
               "        except OSError:\n"
               "            time.sleep(0.001)\n"
               "for _ in range(2):\n"
               "    threading.Thread(target=spawn, daemon=True).start()")
    settled = lambda lines: [line for line in lines if line != {"swept": False}]
    lines = settled(s.call("cell", language="python", code=spawner, budget_ms=20000,
                           output_limit=1 << 16, files=[]))
    assert unb64(lines[0]["cell"])["exit_code"] == 0, lines
    for _ in range(3):  # three chances for a sweep to outlast its step
        lines = settled(s.project(["setsid sleep 1000 & echo a", "sleep 0.3; echo b", "echo c"]))
        steps = [unb64(line["step"]) for line in lines if "step" in line]
        assert [(r["exit_code"], r["stdout"]) for r in steps] == [(0, "a\n"), (0, "b\n"), (0, "c\n")], steps
        assert lines[-1]["end"]["outcome"] == "completed", lines
    lines = settled(s.call("snippet", code="setTimeout(() => console.log('d'), 500)",
                           budget_ms=20000, output_limit=1 << 16, env=[]))
    out = unb64(lines[0]["process"])
    assert (out["exit_code"], out["stdout"]) == (0, "d\n"), out


def test_the_sweep_after_cells(s):
    out = s.cell("python", "import subprocess\n"
                 "p = subprocess.Popen(['sleep', '1000'])\n"
                 "subprocess.Popen('(sleep 1000 &) &', shell=True).wait()\n"
                 "subprocess.Popen(['setsid', 'sleep', '1000'])\n"
                 "p.poll() is None")
    assert out["stdout"] == "True\n"
    out = s.cell("javascript", "const cp = require('child_process');"
                 " cp.spawn('sleep', ['1000']); cp.spawn('sleep', ['1000'], {detached: true}).unref();"
                 " cp.execSync(\"sh -c '(sleep 1000 &) &'\", {stdio: 'ignore'}); 1")
    assert out["exit_code"] == 0
    assert strays(s, kernels=2) == []
    # The Python kernel collects its killed children when the agent has swept.
    for _ in range(20):
        _, procs = s.processes()
        if not [p for p in procs if p["state"] == "Z"]:
            break
        time.sleep(0.1)
    assert [p for p in procs if p["state"] == "Z"] == []
    assert s.cell("python", "p.wait() in (-9, 0)")["stdout"] == "True\n"


def test_the_sweep_stops_a_fork_loop(s):
    lines = s.project(["(while :; do sleep 1000 & done) >/dev/null 2>&1 & sleep 0.3; echo spawned"])
    assert unb64(lines[1]["step"])["stdout"] == "spawned\n"
    assert {"swept": False} not in lines
    assert strays(s) == []
    out = s.cell("python", "import subprocess\n"
                 "subprocess.Popen(\"while :; do sleep 1000 & done\", shell=True)\n"
                 "import time; time.sleep(0.3)")
    assert out["exit_code"] == 0
    assert strays(s, kernels=1) == []


def test_after_a_snippet_nothing_survives(s):
    s.snippet("const cp = require('child_process');"
              "cp.spawn('sh', ['-c', 'sleep 1000 & (sleep 1000 &) &'], {detached: true, stdio: 'inherit'})")
    assert strays(s) == []


def test_a_process_whose_main_thread_exited_is_swept(s):
    # Its leader shows as a zombie while another thread runs on: alive all
    # the same, and out of the call's process group. The thread beats on a
    # file, so the next call can see whether anything still runs, whatever
    # /proc shows of the zombie.
    code = ("import os, threading, time, ctypes\n"
            "def beat():\n"
            "    while True:\n"
            "        with open('/work/hb', 'a') as f: f.write('x')\n"
            "        time.sleep(0.05)\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    threading.Thread(target=beat).start()\n"
            "    time.sleep(0.2)\n"
            "    ctypes.CDLL(None).pthread_exit(None)\n"
            "time.sleep(0.5)\n")
    s.project(["python3 z.py"], files=[("z.py", code)])
    lines = s.project(["a=$(wc -c < hb); sleep 0.6; b=$(wc -c < hb); echo $a $b"])
    step = next(line["step"] for line in lines if "step" in line)
    out = base64.b64decode(step["stdout"]).decode().split()
    assert len(out) == 2 and int(out[0]) > 0 and out[0] == out[1], out


# ---- refusals, failures ----

def test_cell_files_refused_leave_the_kernel_alone(s):
    s.cell("python", "kept = 5")
    s.project(["ln -s /tmp d"])
    out = s.cell("python", "kept", files=[("d/x.py", "")])
    assert out == {"cell_refused": {"why": "files", "detail": "d/x.py: ELOOP"}}
    after = s.cell("python", "kept")
    assert (after["stdout"], after["interpreter_started"]) == ("5\n", False)


def test_no_python_is_a_refusal_not_a_failure(runtime):
    s = Session(runtime, NO_PYTHON_SH)
    try:
        assert s.hello()["python"] is None
        out = s.cell("python", "1")
        assert out["cell_refused"]["why"] == "no_interpreter"
        assert s.cell("javascript", "1 + 1")["stdout"] == "2\n"
    finally:
        s.close()


def test_a_cell_out_of_memory(s):
    """Under runc the cgroup's OOM killer takes the biggest process, the
    kernel, and the session goes on. gVisor has no OOM killer inside the
    sandbox: the host's kills the whole sandbox, so under runsc the session
    ends (stdout closes, the container exits 137). The host must expect both."""
    if s.runtime == "runsc":
        with pytest.raises(AssertionError, match="stdout ended"):
            s.cell("python", "kept = 1\nhog = b'x' * (700 << 20)")
        assert s.proc.wait(timeout=30) == 137
        return
    out = s.cell("python", "kept = 1\nhog = b'x' * (700 << 20)")
    assert out["interpreter_ended"] is True and out["exit_code"] == 137, out
    assert s.cell("python", "1")["interpreter_started"] is True
    assert s.snippet("console.log('alive')")["stdout"] == "alive\n"


# ---- numbers ----

def test_latency(runtime):
    """Not a pass/fail bound: prints what opening a session and a warm cell
    cost here (run with -s)."""
    s = Session(runtime)
    try:
        s.send((json.dumps({"id": "00", "kind": "hello", "languages": ["python", "javascript"]}) + "\n").encode())
        assert s.next_line() == {"begin": "00"}
        hello_ms = (time.perf_counter() - s.started) * 1000
        s.next_line()
        s.next_line()
        t = time.perf_counter()
        s.hello()
        warm_hello_ms = (time.perf_counter() - t) * 1000
        p50 = {}
        for language in ("javascript", "python"):
            s.cell(language, "0")
            times = []
            for i in range(50):
                t = time.perf_counter()
                out = s.cell(language, f"{i} + 1")
                times.append((time.perf_counter() - t) * 1000)
                assert out["stdout"] == f"{i + 1}\n"
            p50[language] = statistics.median(times)
        print(f"\n[{runtime}] docker run -> hello begin {hello_ms:.0f} ms; hello on a running agent"
              f" {warm_hello_ms:.1f} ms; warm cell p50: javascript {p50['javascript']:.2f} ms,"
              f" python {p50['python']:.2f} ms")
    finally:
        s.close()
