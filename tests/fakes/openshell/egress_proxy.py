"""The explicit proxy a jailed fake-openshell sandbox must use to get out.

OpenShell does not let a sandbox dial anything itself: its processes are
given `HTTPS_PROXY` and friends, pointing at a proxy on the host side of
the sandbox's network, and every other connection out is rejected (the
nft table `openshell_bypass`). The proxy takes `CONNECT host:port`, checks
the host and port (not an address the sandbox chose) against the policy's
endpoints, resolves the host itself, and for an endpoint marked
`tls: SKIP` relays the bytes untouched: "tls: skip — raw tunnel, no
termination, no credential injection"
(`crates/openshell-supervisor-network/src/proxy.rs`).

This is that proxy for the fake, one per jail, listening on the jail's
gateway at PROXY_PORT, the only port the jail's host rules let the
sandbox reach. It differs from OpenShell's where the fake cannot follow
(README.md): a CONNECT to an endpoint without `tls: SKIP` is refused,
because OpenShell would terminate that TLS with a CA of its own; a plain
`GET http://...` (forward proxying) is refused; names are resolved
through the fake's `resolve=` table (its stand-in for the supervisor's
DNS), and nothing else.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Callable

from forwarder import DIAL_TIMEOUT, NAME_TIMEOUT, Forwarder, ResolveTable, pipe
from network_policy import ALLOW, DENY

# OpenShell's default proxy port ("The proxy is on 10.200.0.1:3128 (or
# configured port)", crates/openshell-supervisor-process/src/process.rs).
PROXY_PORT = 3128
HEAD_LIMIT = 16 * 1024
LOCAL_NO_PROXY = "127.0.0.1,localhost,::1"


def environment(gateway: str) -> "dict[str, str]":
    """What OpenShell sets in every sandbox process, the entrypoint and each
    exec alike: `child_env::proxy_env_vars` (crates/openshell-supervisor-
    process/src/child_env.rs), all nine, so a client that reads any one
    spelling finds the proxy."""
    url = f"http://{gateway}:{PROXY_PORT}"
    return {"ALL_PROXY": url, "HTTP_PROXY": url, "HTTPS_PROXY": url,
            "NO_PROXY": LOCAL_NO_PROXY, "http_proxy": url, "https_proxy": url,
            "no_proxy": LOCAL_NO_PROXY, "grpc_proxy": url, "NODE_USE_ENV_PROXY": "1"}


def _answer(status: int, reason: str, error: str, detail: str) -> bytes:
    """An error the way OpenShell's proxy writes one: a JSON body with
    `error` and `detail`, and the connection closed after it."""
    body = json.dumps({"error": error, "detail": detail}, separators=(",", ":")).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def _read_head(sock: socket.socket) -> "tuple[bytes | None, bytes]":
    """(the request head up to its blank line, what followed it), or
    (None, b"") when the peer stops first or the head is too large."""
    seen = b""
    while b"\r\n\r\n" not in seen:
        chunk = sock.recv(4096)
        if not chunk or len(seen) + len(chunk) > HEAD_LIMIT:
            return None, b""
        seen += chunk
    head, rest = seen.split(b"\r\n\r\n", 1)
    return head, rest


def _target(text: str) -> "tuple[str, int]":
    """`host:port` or `[v6]:port`, as a CONNECT names it; ValueError when
    it is neither."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(text)
    return host.rstrip(".").lower(), int(port)


class ConnectProxy(Forwarder):
    """A Forwarder whose one port speaks HTTP CONNECT: the name comes from
    the request line, not from the bytes that follow it (the port's
    reader is never used), and the answer is an HTTP status."""

    def __init__(self, address: str, decide: "Callable[[str, int], str]",
                 resolve: ResolveTable, port: int = PROXY_PORT) -> None:
        super().__init__(address, {port: "sniff"},
                         lambda name, at: decide(name, at) == ALLOW, resolve)
        self.decide = decide
        self.log: "list[tuple[str, str]]" = []  # (what was asked, what came of it)
        self._log_lock = threading.Lock()

    def _note(self, asked: str, outcome: str) -> None:
        with self._log_lock:
            self.log.append((asked, outcome))
        if outcome != "tunnel":
            self.counts["refused"] += 1

    def _serve(self, conn: socket.socket, port: int, read_name) -> None:
        upstream = None
        try:
            conn.settimeout(NAME_TIMEOUT)
            head, early = _read_head(conn)
            if head is None:
                self._note("", "no request")
                return
            words = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            asked = " ".join(words[:2])
            if len(words) != 3 or words[0] != "CONNECT":
                # OpenShell forwards plain http:// requests too (and checks
                # them the same way); the fake does not.
                self._note(asked, "not connect")
                conn.sendall(_answer(501, "Not Implemented", "not_modelled",
                                     "fake-openshell's proxy serves CONNECT only"))
                return
            try:
                host, target_port = _target(words[1])
            except ValueError:
                self._note(asked, "bad target")
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                return
            verdict = self.decide(host, target_port)
            if verdict == DENY:
                self._note(asked, "denied")
                conn.sendall(_answer(403, "Forbidden", "policy_denied",
                                     f"CONNECT {host}:{target_port} not permitted by policy"))
                return
            if verdict != ALLOW:
                self._note(asked, "not skip")
                conn.sendall(_answer(
                    403, "Forbidden", "tls_not_modelled",
                    f"CONNECT {host}:{target_port} matches an endpoint without tls: SKIP; "
                    "OpenShell would terminate its TLS with the sandbox's own CA, "
                    "which fake-openshell does not model"))
                return
            # The proxy resolves the name, never the sandbox. A name with
            # no entry fails as a failed dial does in OpenShell: the
            # connection is dropped without an answer.
            where = self.resolve.lookup(host, target_port)
            if where is None:
                self._note(asked, "unresolved")
                return
            upstream = socket.create_connection(where, timeout=DIAL_TIMEOUT)
            if not self._track(upstream):
                return
            conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            self._note(asked, "tunnel")
            self.counts["forwarded"] += 1
            conn.settimeout(None)
            upstream.settimeout(None)
            if early:  # bytes a client sent before waiting for the 200
                upstream.sendall(early)
            back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
            back.start()
            pipe(conn, upstream)
            back.join()
        except OSError:
            pass
        finally:
            self._untrack(conn, upstream)
