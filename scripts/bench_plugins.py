"""The same adapter in Rust and in JavaScript, side by side in one run.

    make bench-plugins      (BENCH_N runs each, default 60; BENCH_STARTS 3)

remote-plimsoll (Rust, wit-bindgen) and remote-js (JavaScript,
componentize-js) both forward a snippet to one upstream plimsolld (the
wasm provider). For each plugin:

- size: the component file;
- start: spawn to the first Run answered through it (listening, the
  plugin compiled or loaded from the compile cache, described, its smoke
  test run upstream), with an empty cache (cold) and a filled one (warm);
- per run: the median client wall time of `console.log(1)` through the
  plugin, minus the median straight to the upstream, measured interleaved
  in the same run: what the plugin (a fresh instance per call, its
  request and answer) and the second daemon add.
"""

import collections
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "compat"))

from test_published_client import plimsolld_bin  # noqa: E402

N = int(os.environ.get("BENCH_N", "60"))
STARTS = int(os.environ.get("BENCH_STARTS", "3"))
RUN = json.dumps({"protocol": 4, "javascript": {"code": "console.log(1)"}}).encode()


class Spawned:
    def __init__(self, env: dict):
        full = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
                "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1", **env}
        self.began = time.perf_counter()
        self.p = subprocess.Popen([plimsolld_bin()], env=full, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.p.stderr:
            if "plimsolld listening" in line:
                self.addr = json.loads(line)["addr"]
                break
        else:
            raise RuntimeError("plimsolld did not start")
        # The log is read to its end: a daemon whose stderr pipe fills
        # blocks on its next audit line, before the answer it belongs to.
        self.tail: "collections.deque[str]" = collections.deque(maxlen=20)
        threading.Thread(target=self.tail.extend, args=(self.p.stderr,), daemon=True).start()
        host, port = self.addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def run(self) -> float:
        t = time.perf_counter()
        self.conn.request("POST", "/plimsoll.v1.SandboxService/Run", RUN,
                          {"content-type": "application/json"})
        r = self.conn.getresponse()
        body = json.loads(r.read())
        if r.status != 200 or body["javascript"]["stdout"] != "MQo=":
            self.p.kill()
            raise RuntimeError(f"{body}: {''.join(self.tail)[-2000:]}")
        return time.perf_counter() - t

    def stop(self):
        self.p.kill()
        self.p.wait()


def ms(xs):
    return statistics.median(xs) * 1000


def main():
    target = Path(plimsolld_bin()).parent.parent
    upstream = Spawned({"SANDBOX_PROVIDER": "wasm", "PLIMSOLL_COMPILE_CACHE": "off"})
    results = {}
    try:
        for name in ["remote-plimsoll", "remote-js"]:
            env = {"SANDBOX_PROVIDER": name,
                   "SANDBOX_PLUGIN_HTTP_ORIGINS": f"http://{upstream.addr}"}
            size = (target / "plugins" / f"{name}.wasm").stat().st_size
            cold, warm = [], []
            for _ in range(STARTS):
                with tempfile.TemporaryDirectory() as tmp:
                    cache = os.path.join(tmp, "cache")
                    for into in (cold, warm):
                        d = Spawned({**env, "PLIMSOLL_COMPILE_CACHE": cache})
                        d.run()
                        into.append(time.perf_counter() - d.began)
                        d.stop()
            d = Spawned({**env, "PLIMSOLL_COMPILE_CACHE": "off"})
            # The upstream closes a connection idle for 60 s; the starts
            # above may take that long.
            upstream.conn.close()
            try:
                for _ in range(5):  # connections and caches warm
                    d.run()
                    upstream.run()
                via, direct = [], []
                for _ in range(N):
                    via.append(d.run())
                    direct.append(upstream.run())
            finally:
                d.stop()
            results[name] = {
                "size_mib": round(size / (1 << 20), 2),
                "start_cold_ms": round(ms(cold)),
                "start_warm_ms": round(ms(warm)),
                "run_via_ms": round(ms(via), 2),
                "run_direct_ms": round(ms(direct), 2),
                "per_run_overhead_ms": round(ms(via) - ms(direct), 2),
            }
            print(name, json.dumps(results[name]), flush=True)
    finally:
        upstream.stop()
    rust, js = results["remote-plimsoll"], results["remote-js"]
    print(json.dumps({"js_over_rust": {
        "size": round(js["size_mib"] / rust["size_mib"], 1),
        "start_cold": round(js["start_cold_ms"] / rust["start_cold_ms"], 1),
        "start_warm": round(js["start_warm_ms"] / rust["start_warm_ms"], 1),
        "per_run_overhead": round(js["per_run_overhead_ms"] / rust["per_run_overhead_ms"], 1),
    }}))


if __name__ == "__main__":
    main()
