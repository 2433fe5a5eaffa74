"""Docker sessions, under runc and runsc, beside the single runs they replace.

    make bench-docker          (runs scripts/bench_docker.py, then this;
                                BENCH_N cells and opens per runtime, default 40)

For each runtime, in one daemon (SANDBOX_SESSION_POOL=2, opens naming
`languages: ["javascript"]`):

- open: OpenSession end to end, with the pool given time to refill between
  opens (BENCH_OPEN_GAP_MS, default 1500) as a daemon in service has;
- first cell: the session's first JavaScript cell (the kernel may already
  run in a pooled container);
- cell: later `6*7` cells in one open session, back to back;
- baseline: a single Run of `console.log(6*7)` on the same daemon, the
  cheapest way to the same answer without a session.

Each figure is a client's wall time over a keep-alive HTTP/1.1 connection.
"""

import http.client
import json
import os
import statistics
import subprocess
import sys
import time

from bench_docker import IMAGE, free_port, pct  # the same image and helpers

N = int(os.environ.get("BENCH_N", "40"))
OPEN_GAP = int(os.environ.get("BENCH_OPEN_GAP_MS", "1500")) / 1000
BIN = os.environ.get("PLIMSOLLD_BIN", "target/release/plimsolld")


class Api:
    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, procedure, body):
        t = time.perf_counter()
        self.conn.request("POST", f"/plimsoll.v1.SandboxService/{procedure}", json.dumps(body),
                          {"content-type": "application/json"})
        r = self.conn.getresponse()
        answer = json.loads(r.read())
        elapsed = time.perf_counter() - t
        assert r.status == 200, (procedure, r.status, answer)
        return elapsed, answer


def cell(api, sid, code="6*7"):
    elapsed, a = api.call("SessionRun", {"protocol": 4, "sessionId": sid,
                                         "cell": {"language": "javascript", "code": code}})
    assert a["run"]["cell"]["stdout"] == "NDIK", a  # "42\n"
    return elapsed


def measure(runtime):
    port = free_port()
    env = {"PATH": os.environ["PATH"], "SANDBOX_PROVIDER": "docker", "SANDBOX_DOCKER_IMAGE": IMAGE,
           "SANDBOX_DOCKER_RUNTIME": runtime, "PLIMSOLL_ADDR": f"127.0.0.1:{port}",
           "PLIMSOLL_INSECURE": "1", "PLIMSOLL_METRICS_ADDR": "off",
           "SANDBOX_MAX_SESSIONS": "4", "SANDBOX_SESSION_POOL": "2"}
    proc = subprocess.Popen([BIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "plimsolld listening" in line:
                break
        else:
            raise SystemExit("plimsolld did not start")
        time.sleep(5)  # both pools filled once
        api = Api(port)
        runs = []
        for _ in range(N):
            t, a = api.call("Run", {"protocol": 4, "javascript": {"code": "console.log(6*7)"}})
            assert a["javascript"]["stdout"] == "NDIK", a
            runs.append(t)
        opens, firsts = [], []
        for _ in range(max(10, N // 4)):
            time.sleep(OPEN_GAP)
            t, a = api.call("OpenSession", {"protocol": 4, "languages": ["javascript"]})
            opens.append(t)
            firsts.append(cell(api, a["sessionId"]))
            api.call("CloseSession", {"protocol": 4, "sessionId": a["sessionId"]})
        time.sleep(OPEN_GAP)
        _, a = api.call("OpenSession", {"protocol": 4, "languages": ["javascript"]})
        sid, tier = a["sessionId"], a["isolation"]
        cell(api, sid)
        cells = [cell(api, sid) for _ in range(N)]
        api.call("CloseSession", {"protocol": 4, "sessionId": sid})
        return tier, runs, opens, firsts, cells
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def ms(xs):
    return f"{statistics.median(xs)*1000:.1f} / {pct(xs, 90)*1000:.1f}"


def main():
    print(f"image {IMAGE}; {N} cells and runs, opens {max(10, N // 4)} with {OPEN_GAP:.1f} s between")
    print("| runtime | tier | single Run p50 / p90 (ms) | OpenSession p50 / p90 | first JS cell | JS cell | cell / Run p50 |")
    print("|---|---|---|---|---|---|---|")
    for runtime in ["runc", "runsc"]:
        tier, runs, opens, firsts, cells = measure(runtime)
        print(f"| {runtime} | {tier} | {ms(runs)} | {ms(opens)} | {ms(firsts)} | {ms(cells)} "
              f"| {statistics.median(cells)/statistics.median(runs):.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
