"""A soak: many mixed runs from several concurrent clients against real
daemons, with what each daemon holds measured before and after.

    make soak                 the full soak (20,000 wasm runs; 500 docker
                              runs under runc and runsc), numbers for
                              docs/benchmarks.md
    scripts/soak.py --short   about a minute, part of `make test`

wasm runs mix ordinary snippets, timeouts, memory bombs, output floods,
malformed requests and clients that hang up mid-run. docker runs mix
snippets, projects, timeouts and granted runs (which make a run directory
and a broker socket each) under runc, and snippets and projects under runsc.
Before and after (once the daemon is idle again): RSS, open descriptors,
threads, run containers, run directories and the sandboxes' host cgroups.
The targets: RSS within 10% (after a warm-up round), everything else back
to its start value, and no error but a marked capacity refusal for a valid
run. Exits non-zero, naming what broke, when a target is missed.
"""

import http.server
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BIN = os.environ.get("PLIMSOLLD_BIN", "target/release/plimsolld")
SHORT = "--short" in sys.argv
WASM_RUNS = 1_000 if SHORT else 20_000
DOCKER_RUNS = 40 if SHORT else 500
CLIENTS = 4
TOKEN = "soak-token-" + "0" * 32
RUN_ROOT = "/run/plimsoll-runs"
CGROUP_ROOT = "/sys/fs/cgroup/pids/docker"


def image_id():
    return subprocess.run(
        ["docker", "image", "inspect", "plimsoll/sandbox:bookworm", "--format", "{{.Id}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


class Daemon:
    def __init__(self, env):
        full = {
            "PATH": os.environ["PATH"],
            # Port 0: the daemon binds a free port itself and reports it in
            # its listening line (a port chosen here could be taken first).
            "PLIMSOLL_ADDR": "127.0.0.1:0",
            "PLIMSOLL_TOKEN": TOKEN,
            "PLIMSOLL_METRICS_ADDR": "off",
            "PLIMSOLL_LOG_FORMAT": "json",
        }
        full.update(env)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([BIN], env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for line in self.proc.stderr:
            self.log.write(line)
            if b"plimsolld listening" in line:
                self.port = int(json.loads(line)["addr"].rsplit(":", 1)[1])
                break
        else:
            raise SystemExit("plimsolld did not start:\n" + self.tail())
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.write(line)

    def tail(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def url(self, procedure="Run"):
        return f"http://127.0.0.1:{self.port}/plimsoll.v1.SandboxService/{procedure}"

    def state(self):
        pid = self.proc.pid
        status = open(f"/proc/{pid}/status").read()
        field = lambda k: int(next(l.split()[1] for l in status.splitlines() if l.startswith(k)))
        return {
            "rss_kib": field("VmRSS:"),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": field("Threads:"),
            "containers": count_containers(pid),
            "run_dirs": len(os.listdir(RUN_ROOT)) if os.path.isdir(RUN_ROOT) else 0,
            "cgroups": len([d for d in os.listdir(CGROUP_ROOT) if os.path.isdir(os.path.join(CGROUP_ROOT, d))])
            if os.path.isdir(CGROUP_ROOT) else 0,
        }

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=90)


def count_containers(pid):
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.plimsoll.owner={pid}"],
        capture_output=True, text=True,
    ).stdout
    return len(out.split())


def post(url, body, timeout=60):
    req = urllib.request.Request(url, body, {
        "content-type": "application/json",
        "authorization": f"Bearer {TOKEN}",
    })
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("plimsoll-not-dispatched"), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("plimsoll-not-dispatched"), None


def hang_up(port, body):
    """Sends a whole run request and closes the connection at once."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\nauthorization: Bearer " + TOKEN.encode()
            + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )


def js(code, timeout_ms=0, grant=""):
    run = {"protocol": 4, "javascript": {"code": code}}
    if timeout_ms:
        run["timeoutMs"] = timeout_ms
    if grant:
        run["javascript"]["grantProfile"] = grant
    return json.dumps(run).encode()


def project(steps, timeout_ms=0):
    run = {"protocol": 4, "project": {"files": [{"path": "in.txt", "content": "soak\n"}],
                                      "steps": steps, "artifacts": ["in.txt"]}}
    if timeout_ms:
        run["timeoutMs"] = timeout_ms
    return json.dumps(run).encode()


# Each kind: (weight, make(daemon) -> (url, body) or None for a hang-up, check(status, mark, body)).
def expect_exit(code, timed_out=False, or_else=None):
    """`or_else`: another (code, timed_out) that is as right, e.g. a memory
    bomb on a loaded machine reaching its deadline before the memory cap."""
    wanted = [(code, timed_out)] + ([or_else] if or_else else [])
    def check(status, mark, body):
        if status == 429 and mark == "capacity":
            return "capacity"
        if status != 200:
            return f"status {status} mark {mark}"
        result = body.get("javascript") or {}
        got = (result.get("exitCode", 0), result.get("timedOut", False))
        return None if got in wanted else f"answered {got}, wanted one of {wanted}"
    return check


def expect_refusal(reason):
    def check(status, mark, body):
        return None if mark == reason else f"status {status} mark {mark}, wanted {reason}"
    return check


def expect_project(outcome):
    def check(status, mark, body):
        if status == 429 and mark == "capacity":
            return "capacity"
        if status != 200:
            return f"status {status} mark {mark}"
        got = body["project"]["outcome"]
        return None if got == outcome else f"outcome {got}, wanted {outcome}"
    return check


WASM_KINDS = [
    (60, lambda d: (d.url(), js("let s = 0; for (let i = 0; i < 1000; i++) s += i; console.log(s)")), expect_exit(0)),
    (5, lambda d: (d.url(), js("while (true) {}", timeout_ms=50)), expect_exit(124, True)),
    (5, lambda d: (d.url(), js("let a = []; while (true) a.push(new Array(1e5).fill(1))")),
     expect_exit(137, or_else=(124, True))),
    (10, lambda d: (d.url(), js("for (let i = 0; i < 2e4; i++) console.log('x'.repeat(100))")), expect_exit(0)),
    (5, lambda d: (d.url(), js("throw new Error('boom')")), expect_exit(1)),
    (10, lambda d: (d.url(), b'{"protocol":4,"javascript":{"code":1}}'), expect_refusal("request")),
    (5, lambda d: None, None),
]

DOCKER_KINDS_RUNC = [
    (45, lambda d: (d.url(), js("console.log(6*7)")), expect_exit(0)),
    (20, lambda d: (d.url(), project(["cat in.txt", "python3 -c 'print(6*7)'"])), expect_project("PROJECT_OUTCOME_COMPLETED")),
    (10, lambda d: (d.url(), js("while (true) {}", timeout_ms=1000)), expect_exit(137, True)),
    (20, lambda d: (d.url(), js("host.get('/ping').then(() => console.log('ok'))", grant="soak")), expect_exit(0)),
    (5, lambda d: None, None),
]

DOCKER_KINDS_RUNSC = [
    (60, lambda d: (d.url(), js("console.log(6*7)")), expect_exit(0)),
    (30, lambda d: (d.url(), project(["cat in.txt"])), expect_project("PROJECT_OUTCOME_COMPLETED")),
    (10, lambda d: (d.url(), js("while (true) {}", timeout_ms=1000)), expect_exit(137, True)),
]


def drive(daemon, kinds, total):
    weights = [k[0] for k in kinds]
    errors, counts, lock = [], {"ok": 0, "capacity": 0, "hung_up": 0}, threading.Lock()
    per_client = total // CLIENTS

    def client(seed):
        rng = random.Random(seed)
        for _ in range(per_client):
            _, make, check = rng.choices(kinds, weights)[0]
            made = make(daemon)
            if made is None:
                hang_up(daemon.port, js("let t = Date.now(); while (Date.now() - t < 20) {}"))
                with lock:
                    counts["hung_up"] += 1
                continue
            url, body = made
            status, mark, answer = post(url, body)
            verdict = check(status, mark, answer)
            with lock:
                if verdict is None:
                    counts["ok"] += 1
                elif verdict == "capacity":
                    counts["capacity"] += 1
                else:
                    errors.append(verdict)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts, errors


def settle(daemon, before, keys):
    """Waits (at most 30 s) for the daemon to drop what runs held."""
    deadline = time.time() + 30
    while True:
        now = daemon.state()
        if all(now[k] <= before[k] for k in keys) or time.time() > deadline:
            return now
        time.sleep(0.5)


def soak(name, env, kinds, total, settle_keys):
    d = Daemon(env)
    try:
        time.sleep(3)  # let a warm pool fill, as a daemon in service has
        # A warm-up round, so one-time allocations (thread pools, caches)
        # are in the starting figure.
        drive(d, kinds, min(total // 10, 200))
        before = settle(d, d.state(), [])
        t = time.time()
        counts, errors = drive(d, kinds, total)
        took = time.time() - t
        after = settle(d, before, settle_keys)
    finally:
        d.stop()
    broken = []
    if errors:
        broken.append(f"{len(errors)} errors, e.g. {errors[:3]}")
    if after["rss_kib"] > before["rss_kib"] * 1.10:
        broken.append(f"RSS grew from {before['rss_kib']} to {after['rss_kib']} KiB")
    for k in settle_keys:
        if after[k] > before[k]:
            broken.append(f"{k}: {before[k]} before, {after[k]} after")
    print(f"| {name} | {total} | {took:.0f} s | {counts['ok']} ok, {counts['capacity']} capacity, "
          f"{counts['hung_up']} hung up, {len(errors)} errors | "
          + " ".join(f"{k} {before[k]}->{after[k]}" for k in before) + " |", flush=True)
    return broken


class Ping(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "11")
        self.end_headers()
        self.wfile.write(b'{"ok":true}')

    def log_message(self, *args):
        pass


def main():
    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ping)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    grants = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"profiles": {"soak": {
        "base_url": f"http://127.0.0.1:{api.server_address[1]}",
        "allow": ["GET /ping"],
        "allowed_callers": ["static"],
    }}}, grants)
    grants.close()
    image = image_id()
    print(f"soak ({'short' if SHORT else 'full'}): {CLIENTS} concurrent clients")
    print("| daemon | runs | time | answers | before -> after |")
    print("|---|---|---|---|---|")
    broken = []
    broken += soak("wasm", {"SANDBOX_PROVIDER": "wasm"}, WASM_KINDS, WASM_RUNS,
                   ["fds", "threads"])
    docker = {"SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_IMAGE": image}
    broken += soak("docker runc", dict(docker, PLIMSOLL_GRANTS_FILE=grants.name),
                   DOCKER_KINDS_RUNC, DOCKER_RUNS, ["fds", "threads", "containers", "run_dirs"])
    broken += soak("docker runsc", dict(docker, SANDBOX_DOCKER_RUNTIME="runsc"),
                   DOCKER_KINDS_RUNSC, DOCKER_RUNS // 2, ["fds", "threads", "containers", "cgroups"])
    os.unlink(grants.name)
    if broken:
        print("soak: targets missed:\n  " + "\n  ".join(broken), file=sys.stderr)
        sys.exit(1)
    print("soak: every target held")


if __name__ == "__main__":
    main()
