"""The data path of a jailed sandbox's egress firewall: a forwarder on the
jail's gateway address that learns which name a connection is for, asks
whether that name may be reached, and if so dials it and copies bytes both
ways. It never terminates TLS: on a TLS port it reads the ClientHello only
as far as the server name (SNI) and hands the very same bytes on, so the
sandbox's TLS session ends at the real server, certificate and all.

Where a name is dialled is the fake's stand-in for public DNS: a table of
`NAME:PORT=HOST:PORT` entries, the shape of curl's `--resolve`. A name
that is allowed but has no entry is closed, as a name that does not
resolve would fail.

The forwarder knows no vendor's rules: it is given, per port, how to read
the name (`sni`, `host`, or `sniff` for either), and a function that says
whether a (name, port) may pass, which it asks afresh for each connection.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable

HELLO_LIMIT = 64 * 1024  # a ClientHello larger than this is not worth reading
HEAD_LIMIT = 16 * 1024   # nor an HTTP request head larger than this
NAME_TIMEOUT = 10.0      # how long a connection has to say which name it wants
DIAL_TIMEOUT = 10.0
_TLS_HANDSHAKE, _CLIENT_HELLO, _SNI_EXTENSION, _HOST_NAME = 0x16, 1, 0, 0


# ---- the fake's public DNS ----------------------------------------------------------------

class ResolveTable:
    """Where an allowed NAME:PORT is dialled: {(name, port): (host, port)}."""

    def __init__(self, entries: "list[str] | None" = None) -> None:
        self._targets: "dict[tuple[str, int], tuple[str, int]]" = {}
        self._lock = threading.Lock()
        for entry in entries or []:
            self.add(entry)

    def add(self, entry: str) -> None:
        """One `NAME:PORT=HOST:PORT` entry (HOST may be `[v6]`); ValueError
        when it is not one."""
        left, sep, right = entry.partition("=")
        name, port = _split_host_port(left)
        host, target_port = _split_host_port(right)
        if not sep or not name or not host:
            raise ValueError(f"{entry!r} is not NAME:PORT=HOST:PORT")
        with self._lock:
            self._targets[(_normal(name), port)] = (host, target_port)

    def lookup(self, name: str, port: int) -> "tuple[str, int] | None":
        with self._lock:
            return self._targets.get((_normal(name), port))

    def entries(self) -> "list[str]":
        with self._lock:
            return [f"{n}:{p}={f'[{h}]' if ':' in h else h}:{hp}"
                    for (n, p), (h, hp) in sorted(self._targets.items())]


def _split_host_port(text: str) -> "tuple[str, int]":
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} has no port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _normal(name: str) -> str:
    return name.strip().rstrip(".").lower()


# ---- reading the name a connection is for ----------------------------------------------------

class _Short(Exception):
    """The peer stopped (or lied about a length) before the name was read."""


def _recv_exact(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise _Short()
        data += chunk
    return data


def read_sni(sock: socket.socket) -> "tuple[str | None, bytes]":
    """(the server name of the ClientHello, every byte read). A hello may
    span several TLS records (large key shares do), so records are read
    until the handshake message is whole."""
    seen, handshake = b"", b""
    try:
        while True:
            header = _recv_exact(sock, 5)
            seen += header
            length = int.from_bytes(header[3:5], "big")
            if header[0] != _TLS_HANDSHAKE or not 0 < length <= 18432:
                return None, seen
            fragment = _recv_exact(sock, length)
            seen += fragment
            handshake += fragment
            if len(handshake) >= 4:
                if handshake[0] != _CLIENT_HELLO:
                    return None, seen
                need = 4 + int.from_bytes(handshake[1:4], "big")
                if need > HELLO_LIMIT:
                    return None, seen
                if len(handshake) >= need:
                    return sni_of_hello(handshake[4:need]), seen
    except (_Short, OSError):
        return None, seen


class _Cursor:
    """Reads a byte string front to back, refusing to read past its end."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, count: int) -> bytes:
        if self.pos + count > len(self.data):
            raise _Short()
        self.pos += count
        return self.data[self.pos - count:self.pos]

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def done(self) -> bool:
        return self.pos >= len(self.data)


def sni_of_hello(body: bytes) -> "str | None":
    """The host_name of a ClientHello body's server_name extension, or None
    (no extension, or a body that does not parse)."""
    hello = _Cursor(body)
    try:
        hello.take(2 + 32)                # legacy version, random
        hello.take(hello.number(1))       # session id
        hello.take(hello.number(2))       # cipher suites
        hello.take(hello.number(1))       # compression methods
        if hello.done():
            return None                   # no extensions at all
        extensions = _Cursor(hello.take(hello.number(2)))
        while not extensions.done():
            kind, data = extensions.number(2), extensions.take(extensions.number(2))
            if kind != _SNI_EXTENSION:
                continue
            listing = _Cursor(data)
            names = _Cursor(listing.take(listing.number(2)))
            while not names.done():
                name_type, name = names.number(1), names.take(names.number(2))
                if name_type == _HOST_NAME:
                    return _hostname(name)
            return None
    except _Short:
        return None
    return None


def read_host(sock: socket.socket) -> "tuple[str | None, bytes]":
    """(the Host header of an HTTP/1 request head, without its port; every
    byte read). A head with no Host, or two, names nothing."""
    seen = b""
    try:
        while b"\r\n\r\n" not in seen:
            chunk = sock.recv(4096)
            if not chunk:
                return None, seen
            seen += chunk
            if len(seen) > HEAD_LIMIT:
                return None, seen
    except OSError:
        return None, seen
    head = seen.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
    hosts = [line.split(b":", 1)[1].strip() for line in head
             if b":" in line and line.split(b":", 1)[0].strip().lower() == b"host"]
    if len(hosts) != 1:
        return None, seen
    host = hosts[0]
    if host.startswith(b"["):
        return None, seen  # an IPv6 literal names no domain
    name, _, port = host.partition(b":")
    if port and not port.isdigit():
        return None, seen
    return _hostname(name), seen


def read_either(sock: socket.socket) -> "tuple[str | None, bytes]":
    """SNI when the first byte starts a TLS handshake, the Host header
    otherwise (a port that may carry either)."""
    try:
        first = sock.recv(1, socket.MSG_PEEK)
    except OSError:
        return None, b""
    if not first:
        return None, b""
    return read_sni(sock) if first[0] == _TLS_HANDSHAKE else read_host(sock)


def _hostname(raw: bytes) -> "str | None":
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    name = _normal(name)
    if not name or len(name) > 253 or any(c.isspace() or c in "/\\@" for c in name):
        return None
    return name


READERS = {"sni": read_sni, "host": read_host, "sniff": read_either}


# ---- the forwarder ---------------------------------------------------------------------------

class Forwarder:
    """Listens on `address` at each port of `ports` ({port: reader name});
    for each connection reads the name, and when `allows(name, port)` and
    the resolve table has a target, dials it and pipes; otherwise closes,
    after accepting, as a firewall that must see the name before deciding
    does. Threads throughout: a jail carries a handful of connections."""

    def __init__(self, address: str, ports: "dict[int, str]",
                 allows: "Callable[[str, int], bool]", resolve: ResolveTable) -> None:
        self.address, self.ports, self.allows, self.resolve = address, dict(ports), allows, resolve
        self._listeners: "list[socket.socket]" = []
        self._open: "set[socket.socket]" = set()
        self._lock = threading.Lock()
        self._closed = False
        self.counts = {"accepted": 0, "forwarded": 0, "refused": 0}

    def start(self) -> "Forwarder":
        try:
            for port, how in self.ports.items():
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._listeners.append(listener)
                listener.bind((self.address, port))
                listener.listen(64)
                threading.Thread(target=self._accept, args=(listener, port, READERS[how]),
                                 name=f"jail-{self.address}:{port}", daemon=True).start()
        except OSError:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop listening and cut every connection still open."""
        with self._lock:
            self._closed = True
            sockets = self._listeners + list(self._open)
            self._listeners, self._open = [], set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv
            except OSError:
                pass
            sock.close()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.add(sock)
            return True

    def _untrack(self, *socks: "socket.socket | None") -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
        for sock in socks:
            if sock is not None:
                sock.close()

    def _accept(self, listener: socket.socket, port: int, read_name) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            if not self._track(conn):
                conn.close()
                return
            self.counts["accepted"] += 1
            threading.Thread(target=self._serve, args=(conn, port, read_name),
                             daemon=True).start()

    def _serve(self, conn: socket.socket, port: int, read_name) -> None:
        upstream = None
        try:
            conn.settimeout(NAME_TIMEOUT)
            name, seen = read_name(conn)
            # Asked per connection: a change of the rules applies to the
            # next connection, not to one already piped.
            target = (self.resolve.lookup(name, port)
                      if name is not None and self.allows(name, port) else None)
            if target is None:
                self.counts["refused"] += 1
                return
            upstream = socket.create_connection(target, timeout=DIAL_TIMEOUT)
            if not self._track(upstream):
                return
            self.counts["forwarded"] += 1
            conn.settimeout(None)
            upstream.settimeout(None)
            upstream.sendall(seen)
            back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
            back.start()
            pipe(conn, upstream)
            back.join()
        except OSError:
            pass
        finally:
            self._untrack(conn, upstream)


def pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copies until the source ends, then passes the end on (a half
    close, so the other direction may still finish)."""
    try:
        while True:
            chunk = source.recv(65536)
            if not chunk:
                break
            sink.sendall(chunk)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
