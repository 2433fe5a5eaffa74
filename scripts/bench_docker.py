"""The docker provider beside a plain `docker run --rm` of the same image
running the same snippet, under runc and under runsc, in one run.

    make bench-docker          (BENCH_N runs per side, default 40; BENCH_GAP_MS
                                pause between runs, default 0)

Each plimsolld run is one Run call over HTTP, end to end (the client's wall
time); each baseline is one `docker run --rm -i --network none` of the
image ID with the snippet on stdin, end to end. Runs go one after another,
so the warm pool refills only as fast as it can between them.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

SNIPPET = "console.log(6 * 7)"
N = int(os.environ.get("BENCH_N", "40"))
GAP = int(os.environ.get("BENCH_GAP_MS", "0")) / 1000
BIN = os.environ.get("PLIMSOLLD_BIN", "target/release/plimsolld")
IMAGE = subprocess.run(
    ["docker", "image", "inspect", "plimsoll/sandbox:bookworm", "--format", "{{.Id}}"],
    check=True, capture_output=True, text=True,
).stdout.strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def baseline(runtime):
    times = []
    args = ["docker", "run", "--rm", "-i", "--network", "none"]
    if runtime:
        args += ["--runtime", runtime]
    args += [IMAGE, "node", "-"]
    for _ in range(max(10, N // 4)):
        t = time.perf_counter()
        out = subprocess.run(args, input=SNIPPET.encode(), capture_output=True, check=True)
        times.append(time.perf_counter() - t)
        assert out.stdout == b"42\n", out
    return times


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
        time.sleep(3)  # let the pool fill once, as a daemon in service has
        url = f"http://127.0.0.1:{port}/plimsoll.v1.SandboxService/Run"
        body = json.dumps({"protocol": 4, "javascript": {"code": SNIPPET}}).encode()
        times = []
        for _ in range(N):
            t = time.perf_counter()
            req = urllib.request.Request(url, body, {"content-type": "application/json"})
            with urllib.request.urlopen(req) as r:
                answer = json.load(r)
            times.append(time.perf_counter() - t)
            assert answer["javascript"]["stdout"] == "NDIK", answer
            if GAP:
                time.sleep(GAP)
        return times, answer["isolation"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    print(f"image {IMAGE}, snippet {SNIPPET!r}, {N} plimsolld runs per runtime")
    print("| runtime | tier | plain docker run p50 / p90 (ms) | plimsolld p50 / p90 (ms) | p50 ratio |")
    print("|---|---|---|---|---|")
    for runtime in ["", "runsc"]:
        base = baseline(runtime)
        ours, tier = plimsolld(runtime)
        b50, o50 = statistics.median(base), statistics.median(ours)
        print(
            f"| {runtime or 'runc'} | {tier} | {b50*1000:.0f} / {pct(base, 90)*1000:.0f} "
            f"| {o50*1000:.0f} / {pct(ours, 90)*1000:.0f} | {o50/b50:.2f} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
