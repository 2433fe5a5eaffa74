"""Servers outside a jailed sandbox, and the probe run inside it, for the
jail tests of fake-e2b and fake-openshell.

- `TlsServer`: stands for the daemon's guard, on loopback, with a
  self-signed certificate for the names given (made with `openssl`). It
  answers `guard-ok` to anything asked over TLS and records each SNI, so
  a test can tell the sandbox's own TLS reached it end to end.
- `HttpServer`: plain HTTP on loopback, answering `http-ok` and recording
  each Host header.
- `Greeter`: a host service on 0.0.0.0 that greets whoever connects and
  records them: what a sandbox must not reach.
- `PROBE`: a Python script for the sandbox. Given a JSON list of targets,
  it connects to each (in parallel), speaks (TLS with the SNI asked for,
  then an HTTP request; or plain HTTP) and prints what happened:
  `answer:<bytes>` only when something answered; `closed:...` when the
  connection was accepted and then closed without an answer (a firewall
  that must see the name before it decides does that); `timeout` or
  `unreachable:...` when no connection was made.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from pathlib import Path


class _Listener:
    def __init__(self, host: str) -> None:
        self.socket = socket.create_server((host, 0))
        self.port = self.socket.getsockname()[1]
        self.seen: "list[str]" = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn, peer), daemon=True).start()

    def answer(self, conn: socket.socket, peer) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.socket.close()


class TlsServer(_Listener):
    def __init__(self, directory: Path, names: "list[str]") -> None:
        key, cert = directory / "server.key", directory / "server.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "2", "-subj", f"/CN={names[0]}",
                        "-addext", "subjectAltName=" + ",".join(f"DNS:{n}" for n in names)],
                       check=True, capture_output=True)
        self.pem = cert.read_text()
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.context.sni_callback = lambda sock, name, ctx: self.seen.append(name)
        super().__init__("127.0.0.1")

    def answer(self, conn: socket.socket, peer) -> None:
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(4096)
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n"
                            b"\r\nguard-ok")
        except (OSError, ssl.SSLError):
            pass


class HttpServer(_Listener):
    def __init__(self) -> None:
        super().__init__("127.0.0.1")

    def answer(self, conn: socket.socket, peer) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"host:"):
                    self.seen.append(line[5:].strip().decode())
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n"
                         b"\r\nhttp-ok")


class Greeter(_Listener):
    def __init__(self) -> None:
        super().__init__("0.0.0.0")

    def answer(self, conn: socket.socket, peer) -> None:
        self.seen.append(peer[0])
        with conn:
            conn.sendall(b"host-service\n")


def host_address() -> str:
    """The host's own address on its default route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("1.1.1.1", 53))  # no packet is sent: the route picks the address
        return s.getsockname()[0]


def reached(result: str) -> bool:
    return result.startswith("answer:")


def silent(result: str) -> bool:
    """No connection was made: the host dropped it or nothing routes there."""
    return result == "timeout" or result.startswith("unreachable:")


PROBE = r'''
import json, socket, ssl, sys
from concurrent.futures import ThreadPoolExecutor

def one(p):
    try:
        s = socket.create_connection((p["host"], p["port"]), timeout=3)
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return "unreachable:" + (e.strerror or type(e).__name__)
    try:
        s.settimeout(5)
        if p.get("sni"):
            ctx = ssl.create_default_context(cafile=p["ca"]) if p.get("ca") \
                else ssl._create_unverified_context()
            s = ctx.wrap_socket(s, server_hostname=p["sni"])
        host = p.get("sni") or p.get("name") or p["host"]
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
        data = s.recv(4096)
        return "answer:" + data.decode(errors="replace") if data else "closed:eof"
    except TimeoutError:
        return "closed:silent"
    except OSError as e:
        return "closed:" + type(e).__name__

with ThreadPoolExecutor(16) as pool:
    print(json.dumps(list(pool.map(one, json.loads(sys.argv[1])))))
'''
