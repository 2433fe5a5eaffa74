"""A load generator run as its own process by tests/operations.rs: callers
send runs to plimsolld at once, and every answer is reported as JSON lines
({caller, status, mark}) on stdout. Bounded: a fixed number of requests,
each with a 30 s timeout; loopback only.

    load.py URL '[{"token": T, "caller": NAME, "code": JS, "count": N, "parallel": bool}, ...]'
"""

import json
import sys
import threading
import urllib.error
import urllib.request


def run(url, token, code):
    body = json.dumps({"protocol": 4, "javascript": {"code": code}}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json",
                                             "authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("plimsoll-not-dispatched")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("plimsoll-not-dispatched")


def main():
    url, plan = sys.argv[1], json.loads(sys.argv[2])
    results, lock, threads = [], threading.Lock(), []

    def one(p):
        status, mark = run(url, p["token"], p["code"])
        with lock:
            results.append({"caller": p["caller"], "status": status, "mark": mark})

    def serial(p):
        for _ in range(p["count"]):
            one(p)

    for p in plan:
        if p["parallel"]:
            threads += [threading.Thread(target=one, args=(p,)) for _ in range(p["count"])]
        else:
            threads.append(threading.Thread(target=serial, args=(p,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
