"""Run inside a fake-openshell sandbox (`python3 - '<json targets>'`, this
file on stdin): tries each target and prints one JSON list of outcomes.
It uses only what the sandbox is given, as a client there would: the
proxy is read from `HTTPS_PROXY`, never assumed.

A target is one of:

- {"via": "tunnel", "host", "port", "ca"?}: Python's own client through
  the proxy, `http.client.HTTPSConnection(proxy) + set_tunnel(host,
  port)`, checking the server's certificate against `ca` for `host`
  (plain HTTP in the tunnel when there is no `ca`);
- {"via": "raw", "host", "port", "sni", "ca"}: a CONNECT by hand, then
  TLS with a server name other than the CONNECT's;
- {"via": "forward", "url"}: a plain `GET http://...` to the proxy;
- {"via": "direct", "host", "port"}: a connection of its own;
- {"via": "resolve", "host"}: a name lookup of its own.

Outcomes: `answer:<body>` (something answered through), `refused:<status
line>` (the proxy said no), `closed:<why>` (it hung up without a word),
`status:<code>:<body>` (a forward request's answer), `timeout`,
`unreachable:<why>`, `unresolved`, `resolved:<address>`.
"""

import http.client
import json
import os
import socket
import ssl
import sys
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

PROXY = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])


def context(ca):
    return ssl.create_default_context(cafile=ca) if ca else None


def tunnel(t):
    if t.get("ca"):
        conn = http.client.HTTPSConnection(PROXY.hostname, PROXY.port, timeout=5,
                                           context=context(t["ca"]))
    else:
        conn = http.client.HTTPConnection(PROXY.hostname, PROXY.port, timeout=5)
    conn.set_tunnel(t["host"], t["port"])
    try:
        conn.request("GET", "/", headers={"Connection": "close"})
        return "answer:" + conn.getresponse().read().decode(errors="replace")
    except http.client.RemoteDisconnected:
        return "closed:eof"
    except OSError as e:
        # http.client says "Tunnel connection failed: 403 Forbidden".
        text = str(e)
        return "refused:" + text.split(": ", 1)[1] if "Tunnel connection failed" in text \
            else "closed:" + type(e).__name__
    finally:
        conn.close()


def raw(t):
    sock = socket.create_connection((PROXY.hostname, PROXY.port), timeout=5)
    target = f"{t['host']}:{t['port']}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            return "closed:eof"
        head += chunk
    status = head.split(b"\r\n", 1)[0].decode()
    if status.split()[1] != "200":
        return "refused:" + status.split(" ", 1)[1]
    tls = context(t["ca"]).wrap_socket(sock, server_hostname=t["sni"])
    tls.sendall(b"GET / HTTP/1.1\r\nHost: " + t["sni"].encode() + b"\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := tls.recv(4096):
        data += chunk
    return "answer:" + data.split(b"\r\n\r\n", 1)[-1].decode(errors="replace")


def forward(t):
    conn = http.client.HTTPConnection(PROXY.hostname, PROXY.port, timeout=5)
    try:
        conn.request("GET", t["url"])
        answer = conn.getresponse()
        return f"status:{answer.status}:" + answer.read().decode(errors="replace")
    except OSError as e:
        return "closed:" + type(e).__name__


def direct(t):
    try:
        sock = socket.create_connection((t["host"], t["port"]), timeout=3)
    except socket.gaierror:
        return "unresolved"
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return "unreachable:" + (e.strerror or type(e).__name__)
    with sock:
        sock.settimeout(3)
        try:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            data = sock.recv(4096)
        except OSError as e:
            return "closed:" + type(e).__name__
        return "answer:" + data.decode(errors="replace") if data else "closed:eof"


def resolve(t):
    try:
        return "resolved:" + socket.getaddrinfo(t["host"], 443)[0][4][0]
    except socket.gaierror:
        return "unresolved"


def one(t):
    try:
        return {"tunnel": tunnel, "raw": raw, "forward": forward, "direct": direct,
                "resolve": resolve}[t["via"]](t)
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return "closed:" + type(e).__name__


with ThreadPoolExecutor(16) as pool:
    print(json.dumps(list(pool.map(one, json.loads(sys.argv[1])))))
