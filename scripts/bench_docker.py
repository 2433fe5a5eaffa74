"""The docker provider beside a plain `docker run --rm` of the same image
running the same snippet, and beside the engine's own floor, under runc and
under runsc, in one run.

    make bench-docker     (BENCH_N runs per measurement, default 40;
                           BENCH_RUNTIMES, default "runc,runsc";
                           BENCH_RATES, the steady schedules, default "2,5")

Per runtime, one after another:

- baseline: `docker run --rm -i --network none <image ID> node -` with the
  snippet on stdin, end to end (the CLI's wall time);
- engine floor: containers created and started beforehand with the run
  envelope (limits, read-only root, no capabilities, tmpfs, unprivileged
  user), attached, then timed from writing stdin to the engine reporting the
  exit status. Two of them: `cat` (the engine alone: stdin in, process exits,
  status out) and the gate's shape followed by `node -` with the snippet
  (the least any gated run can cost: the engine plus node's boot);
- plimsolld back to back: one `Run` after another over HTTP, end to end;
  runs/s over the batch is the rate one client sustains;
- plimsolld at a steady two, then five runs per second: a `Run` started on
  its schedule whatever the last one took, so the pool's refill is what is
  measured.

Engine calls go to the Docker API on its Unix socket, as the daemon's do;
only loopback and that socket are used.
"""

import concurrent.futures
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

SNIPPET = "console.log(6 * 7)"
# The steady schedules measured, in runs per second (BENCH_RATES, "2,5").
RATES = [float(r) for r in os.environ.get("BENCH_RATES", "2,5").split(",")]
N = int(os.environ.get("BENCH_N", "40"))
BIN = os.environ.get("PLIMSOLLD_BIN", "target/release/plimsolld")
DOCKER_SOCK = "/var/run/docker.sock"
# The floor's own containers carry this label, so any a failed run leaves
# are removed at the next start and at exit.
FLOOR_LABEL = "io.plimsoll.bench-floor"
IMAGE = subprocess.run(
    ["docker", "image", "inspect", "plimsoll/sandbox:bookworm", "--format", "{{.Id}}"],
    check=True, capture_output=True, text=True,
).stdout.strip()
# The daemon's defaults (SANDBOX_MEMORY_MB, SANDBOX_CPUS, SANDBOX_PIDS, the
# guest user): close enough to the run envelope for a floor.
ENVELOPE = {
    "NetworkMode": "none",
    "NanoCpus": 10**9,
    "Memory": 512 << 20,
    "MemorySwap": 512 << 20,
    "PidsLimit": 256,
    "ReadonlyRootfs": True,
    "CapDrop": ["ALL"],
    "SecurityOpt": ["no-new-privileges"],
    "Tmpfs": {"/tmp": "size=64m,noexec", "/work": "size=64m,noexec"},
    "LogConfig": {"Type": "none"},
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ms(x):
    return f"{x * 1000:.0f}"


class EngineConnection(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("docker")

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(DOCKER_SOCK)


def engine(method, path, body=None):
    c = EngineConnection()
    c.request(method, path, None if body is None else json.dumps(body),
              {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status >= 300:
        raise SystemExit(f"{method} {path}: {r.status} {data!r}")
    return json.loads(data) if data else None


def attach(cid):
    """A hijacked attach stream: the raw socket and any bytes already read."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(DOCKER_SOCK)
    s.sendall(
        f"POST /containers/{cid}/attach?stream=1&stdin=1&stdout=1&stderr=1 HTTP/1.1\r\n"
        "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n".encode()
    )
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    head, rest = buf.split(b"\r\n\r\n", 1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return s, rest


def floor_once(runtime, cmd, stdin):
    host = dict(ENVELOPE)
    if runtime:
        host["Runtime"] = runtime
    cid = engine("POST", "/containers/create", {
        "Image": IMAGE, "Cmd": cmd, "User": "61000", "WorkingDir": "/work",
        "Labels": {FLOOR_LABEL: "1"},
        "OpenStdin": True, "StdinOnce": True,
        "AttachStdin": True, "AttachStdout": True, "AttachStderr": True,
        "HostConfig": host,
    })["Id"]
    try:
        s, out = attach(cid)
        engine("POST", f"/containers/{cid}/start")
        time.sleep(1.0)  # started and settled, as a warm container is
        t = time.perf_counter()
        s.sendall(stdin)
        s.shutdown(socket.SHUT_WR)
        while chunk := s.recv(65536):
            out += chunk
        status = engine("POST", f"/containers/{cid}/wait")
        took = time.perf_counter() - t
        s.close()
        assert status["StatusCode"] == 0, status
        return took, out
    finally:
        engine("DELETE", f"/containers/{cid}?force=1")


def remove_labelled(label):
    """Removes every container carrying `label` (`key` or `key=value`)."""
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True, text=True, check=False,
    ).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)


def floor(runtime, n):
    cat = [floor_once(runtime, ["sh", "-c", "cat >/dev/null"], b"x\n")[0] for _ in range(n)]
    node = []
    for _ in range(n):
        took, out = floor_once(
            runtime, ["sh", "-c", 'read -r _ || exit 125; exec node -'],
            b"\n" + SNIPPET.encode(),
        )
        assert out.endswith(b"42\n"), out
        node.append(took)
    return cat, node


def baseline(runtime, n):
    times = []
    args = ["docker", "run", "--rm", "-i", "--network", "none"]
    if runtime:
        args += ["--runtime", runtime]
    args += [IMAGE, "node", "-"]
    for _ in range(n):
        t = time.perf_counter()
        out = subprocess.run(args, input=SNIPPET.encode(), capture_output=True, check=True)
        times.append(time.perf_counter() - t)
        assert out.stdout == b"42\n", out
    return times


def one_run(url, body):
    t = time.perf_counter()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        answer = json.load(r)
    took = time.perf_counter() - t
    assert answer["javascript"]["stdout"] == "NDIK", answer
    return took, answer["isolation"]


def plimsolld(runtime):
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "SANDBOX_PROVIDER": "docker",
        "SANDBOX_DOCKER_IMAGE": IMAGE,
        "PLIMSOLL_ADDR": f"127.0.0.1:{port}",
        "PLIMSOLL_INSECURE": "1",
        "PLIMSOLL_METRICS_ADDR": "off",
    }
    if runtime:
        env["SANDBOX_DOCKER_RUNTIME"] = runtime
    proc = subprocess.Popen([BIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "plimsolld listening" in line:
                break
        else:
            raise SystemExit("plimsolld did not start")
        # Its log keeps coming (an audit line per run): read to the end, or
        # a full pipe would stall the daemon.
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        url = f"http://127.0.0.1:{port}/plimsoll.v1.SandboxService/Run"
        body = json.dumps({"protocol": 4, "javascript": {"code": SNIPPET}}).encode()
        time.sleep(3)  # let the pool fill once, as a daemon in service has
        t = time.perf_counter()
        back = [one_run(url, body) for _ in range(N)]
        rate = N / (time.perf_counter() - t)
        steady = {}
        for per_sec in RATES:
            time.sleep(3)  # the pool refills
            # A steady rate: each run started on its schedule, so a slow
            # one does not slow the rate.
            start = time.perf_counter() + 0.1
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                futures = []
                for i in range(N):
                    delay = start + i / per_sec - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    futures.append(pool.submit(one_run, url, body))
                steady[per_sec] = [f.result()[0] for f in futures]
        return [x for x, _ in back], rate, steady, back[-1][1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # Killed, its containers (labelled with its PID) go too.
            proc.kill()
            remove_labelled(f"io.plimsoll.owner={proc.pid}")
            raise


def main():
    remove_labelled(FLOOR_LABEL)
    try:
        measure()
    finally:
        remove_labelled(FLOOR_LABEL)


def measure():
    runtimes = [r.strip() for r in os.environ.get("BENCH_RUNTIMES", "runc,runsc").split(",")]
    print(f"image {IMAGE}, snippet {SNIPPET!r}, {N} plimsolld runs per measurement")
    print()
    print("| runtime | tier | plain docker run p50 / p90 | engine floor: cat p50 | engine floor: gate + node p50 "
          "| plimsolld back to back p50 / p90, runs/s "
          + "".join(f"| plimsolld at {r:g} runs/s p50 / p90 (p90/p50) " for r in RATES)
          + "| p50 ratio to docker run |")
    print("|---|---|---|---|---|---|" + "---|" * len(RATES) + "---|")
    for name in runtimes:
        runtime = "" if name == "runc" else name
        base = baseline(runtime, max(10, N // 4))
        cat, node = floor(runtime, max(10, N // 4))
        back, rate, steady, tier = plimsolld(runtime)
        b50, o50 = statistics.median(base), statistics.median(back)
        cells = ""
        ratios = ""
        for r in RATES:
            s50 = statistics.median(steady[r])
            cells += f"| {ms(s50)} / {ms(pct(steady[r], 90))} ms ({pct(steady[r], 90) / s50:.2f}) "
            ratios += f", {s50 / b50:.2f} at {r:g}/s"
        print(
            f"| {name} | {tier} | {ms(b50)} / {ms(pct(base, 90))} ms "
            f"| {ms(statistics.median(cat))} ms | {ms(statistics.median(node))} ms "
            f"| {ms(o50)} / {ms(pct(back, 90))} ms, {rate:.1f} "
            + cells
            + f"| {o50 / b50:.2f} back to back{ratios} |"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
