"""How long plimsolld takes from exec to serving its first run.

    make bench-startup      (BENCH_N starts each, default 10)

Each start is timed from the moment the process is spawned to the first
`Run` answered (listening and serving), with the wasm provider:

- compiled every start (PLIMSOLL_COMPILE_CACHE=off): the baseline;
- the first start with an empty cache (compiles and stores);
- starts that find the cache filled (the case issue 16 targets: <= 0.5 s).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "compat"))

from test_published_client import plimsolld_bin  # noqa: E402

N = int(os.environ.get("BENCH_N", "10"))


def start_to_first_run(cache: str) -> float:
    env = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0",
           "PLIMSOLL_METRICS_ADDR": "off", "PLIMSOLL_INSECURE": "1",
           "SANDBOX_PROVIDER": "wasm", "PLIMSOLL_COMPILE_CACHE": cache}
    t = time.perf_counter()
    p = subprocess.Popen([plimsolld_bin()], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:
            if "plimsolld listening" in line:
                addr = json.loads(line)["addr"]
                break
        else:
            raise RuntimeError("plimsolld did not start")
        body = json.dumps({"protocol": 4, "javascript": {"code": "console.log(1)"}}).encode()
        req = urllib.request.Request(f"http://{addr}/plimsoll.v1.SandboxService/Run", body,
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.load(r)["javascript"]["stdout"] == "MQo="
        return time.perf_counter() - t
    finally:
        p.kill()
        p.wait()


def main():
    off = [start_to_first_run("off") for _ in range(N)]
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        first = start_to_first_run(cache)
        warm = [start_to_first_run(cache) for _ in range(N)]
    med = statistics.median
    print(f"wasm provider, exec to first Run answered, {N} starts each:")
    print(f"  compiled every start (cache off)   p50 {med(off) * 1000:.0f} ms  max {max(off) * 1000:.0f} ms")
    print(f"  first start, empty cache           {first * 1000:.0f} ms")
    print(f"  cache filled                       p50 {med(warm) * 1000:.0f} ms  max {max(warm) * 1000:.0f} ms"
          f"  ({med(warm) / med(off):.2f}x the baseline; target <= 500 ms: "
          f"{'met' if med(warm) <= 0.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
