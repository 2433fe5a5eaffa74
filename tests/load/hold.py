#!/usr/bin/env python3
"""Holds connections open against a listener the way someone without a token
can: connections that send nothing, half an HTTP/2 preface, half a request
line, or half a TLS handshake.

usage: hold.py HOST PORT PLAN

PLAN is JSON: {"idle": N, "half_preface": N, "half_request": N,
"half_tls": N, "sources": ["127.0.0.1", ...]}. Connections are spread over
the source addresses in turn (any 127.x address works on Linux), so a test
can make many peers. Prints "held N" once every connection is open, then
waits until its stdin closes, then prints "closed M": how many of its
connections the server had closed by then (counted until the number stops
growing, so a busy server has time to catch up).
"""

import json
import resource
import socket
import sys
import time

# A TLS record header announcing a 512-byte handshake message, then the
# first bytes of a ClientHello: the server waits for the rest.
HALF_TLS = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03]) + b"\x00" * 16
PAYLOADS = {
    "idle": b"",
    "half_preface": b"PRI * HTTP/2.0\r\n",
    "half_request": b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
    "half_tls": HALF_TLS,
}


def main():
    host, port, plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sources = plan.get("sources") or ["127.0.0.1"]
    held = []
    n = 0
    for kind, payload in PAYLOADS.items():
        for _ in range(plan.get(kind, 0)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((sources[n % len(sources)], 0))
            n += 1
            try:
                s.connect((host, port))
                if payload:
                    s.sendall(payload)
            except OSError:
                # Refused or closed at once: the server made its choice.
                pass
            held.append(s)
    print(f"held {len(held)}", flush=True)
    sys.stdin.read()
    # The server closes what it refuses as it gets to it; on a busy machine
    # that can trail the last connect. Count until the number has not grown
    # for half a second (at most 10 s), so a slow server is not read as one
    # that kept the connections.
    for s in held:
        s.setblocking(False)
    closed, steady_since, started = -1, time.monotonic(), time.monotonic()
    while True:
        now_closed = sum(1 for s in held if is_closed(s))
        if now_closed != closed:
            closed, steady_since = now_closed, time.monotonic()
        if time.monotonic() - steady_since >= 0.5 or time.monotonic() - started >= 10:
            break
        time.sleep(0.05)
    for s in held:
        s.close()
    print(f"closed {closed}", flush=True)


def is_closed(s):
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


if __name__ == "__main__":
    main()
