#!/usr/bin/env bash
# Starts plimsolld with the wasm provider on a loopback port, runs one snippet
# through the published Python client, prints what came back, and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
snippet="${1:-examples/hello.js}"
bin="${PLIMSOLLD_BIN:-target/release/plimsolld}"
log="$(mktemp)"
port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SANDBOX_PROVIDER=wasm PLIMSOLL_INSECURE=1 PLIMSOLL_METRICS_ADDR=off PLIMSOLL_ADDR="127.0.0.1:$port" PLIMSOLL_LOG_FORMAT=text "$bin" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
.venv/bin/python - "$port" "$snippet" <<'PY'
import sys
from plimsoll_client import Client
port, path = sys.argv[1], sys.argv[2]
client = Client(f"http://127.0.0.1:{port}")
result = client.run_javascript(open(path).read(), minimum_isolation="process")
print(f"provider:  {result.provider}")
print(f"isolation: {result.isolation}")
print(f"exit code: {result.exit_code}")
print(f"duration:  {result.duration_ms} ms" if result.duration_ms else "duration:  <1 ms")
print(f"record:    v{result.record.version} {result.record.sha256} (checked by the client)")
print("stdout:")
sys.stdout.write(result.stdout.decode())
PY
