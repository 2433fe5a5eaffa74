#!/usr/bin/env python3
"""Holds connections against a listener the way a tokenless attacker with a
loop can: every connection the server closes is opened again at once, so
the listener is always full and always being asked for more.

usage: churn.py HOST PORT PLAN

PLAN is JSON: {"sockets": N, "sources": ["127.0.0.2", ...], "seconds": S}.
Opens N connections spread over the source addresses (any 127.x address
works on Linux), sends nothing, and reopens each one the moment the server
closes it, for S seconds at most or until stdin closes. Prints "churning"
once all N were opened the first time, and at the end "reopened M": how
many connections it had to open again (the server's closes it undid).
Bounded: it stops by itself after S seconds.
"""

import json
import resource
import selectors
import socket
import sys
import time


def main():
    host, port, plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sources = plan["sources"]
    deadline = time.monotonic() + plan["seconds"]
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")

    def open_one(i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((sources[i % len(sources)], 0))
        try:
            s.connect((host, port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            return False
        sel.register(s, selectors.EVENT_READ, i)
        return True

    for i in range(plan["sockets"]):
        open_one(i)
    print("churning", flush=True)
    reopened = 0
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            if key.data == "stdin":
                if not sys.stdin.readline():
                    deadline = 0
                continue
            s = key.fileobj
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data:
                continue
            # Closed by the server: open it again straight away.
            sel.unregister(s)
            s.close()
            if open_one(key.data):
                reopened += 1
    print(f"reopened {reopened}", flush=True)


if __name__ == "__main__":
    main()
