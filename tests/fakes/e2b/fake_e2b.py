#!/usr/bin/env python3
"""fake-e2b: a named fake of E2B (hosted microVM sandboxes), for tests only.

One HTTP/1.1 server plays both of E2B's faces. A request carrying
`E2b-Sandbox-Id` (what the SDK sends when a sandbox URL is configured), or
with Host `<port>-<sandboxID>.<domain>`, goes to that sandbox's envd through
the edge; any other request is for the API (control plane). Fake-only
endpoints live under `/_fake/`. Each sandbox is a real docker container.

    python3 fake_e2b.py --port 0 --api-key KEY [--ready-file PATH]
                        [--resolve NAME:PORT=HOST:PORT ...] [--jail-pool CIDR]

prints `listening 127.0.0.1:PORT` as its first line (and writes the same
line to the ready file), and removes every container it made on SIGTERM or
SIGINT. From Python: `FakeE2B(api_key).start()`, then `.url`, `.live_count()`,
`.set_fault(...)`, `.stop()`.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import ssl
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from container import Docker  # noqa: E402
from control_plane import ControlPlane  # noqa: E402
from envd import ENVD_PORT, Envd  # noqa: E402
from faults import FaultError, Faults  # noqa: E402
from forwarder import ResolveTable  # noqa: E402
from httpio import BadRequest, Exchange  # noqa: E402
from jail import DEFAULT_POOL, Jails  # noqa: E402
from sandboxes import Registry, new_id  # noqa: E402

DEFAULT_IMAGE = "plimsoll/sandbox:bookworm"
# The envd version the fake claims: new enough for stdin (0.3.0), a default
# user (0.4.0), CloseStdin (0.5.2) and octet-stream uploads (0.5.7), older
# than file metadata (0.6.2), which the fake does not implement.
ENVD_VERSION = "0.5.7"
_SANDBOX_HOST = re.compile(r"^(\d+)-([a-z0-9]+)\.")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the SDK expects
    server_version = "fake-e2b"
    fake: "FakeE2B"  # set on the subclass made per server

    def setup(self) -> None:
        super().setup()
        # From the accept to here (a thread started for the connection),
        # and over TLS the handshake, timed as the fake's own work (both
        # sides of the handshake, in fact: the client's half is counted too).
        began = self.server.accepted_at.pop(self.request, None) or time.perf_counter()
        try:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()
        finally:
            self.fake._handled(began, time.perf_counter())

    def parse_request(self) -> bool:
        # The request line has just arrived: from here the time is the
        # fake's (parsing the head is Python's work, not the client's).
        self._began = time.perf_counter()
        return super().parse_request()

    def _dispatch(self) -> None:
        began = getattr(self, "_began", None) or time.perf_counter()
        try:
            self._serve()
        finally:
            self.fake._handled(began, time.perf_counter())

    def _serve(self) -> None:
        try:
            ex = Exchange(self)
        except BadRequest as e:
            self.close_connection = True
            self.send_error(400, str(e))
            return
        try:
            self.fake._route(ex)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-answer
        except BadRequest as e:
            if not ex.answered:
                ex.json(400, {"code": 400, "message": str(e)})
            self.close_connection = True
        except Exception:
            traceback.print_exc()
            self.close_connection = True
            if not ex.answered:
                ex.json(500, {"code": 500, "message": "fake-e2b internal error"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _dispatch

    def log_message(self, format, *args) -> None:  # noqa: A002
        if self.fake.verbose:
            super().log_message(format, *args)


class _Server(ThreadingHTTPServer):
    """Answers leave at once: an answer is written as its head and then its
    body, and with Nagle's algorithm on, the body waits for the client's
    delayed ACK of the head (40 ms on Linux), which no real edge adds."""

    connections = 0  # accepted so far, for tests of a client's connection reuse

    def __init__(self, *args, **kwargs) -> None:
        self.accepted_at: "dict" = {}
        super().__init__(*args, **kwargs)

    def get_request(self):
        sock, addr = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections += 1
        return sock, addr

    def process_request(self, request, client_address) -> None:
        # Starting a thread per connection is the fake's cost, not its
        # client's: the handler's first span begins here.
        self.accepted_at[request] = time.perf_counter()
        super().process_request(request, client_address)


class _TlsServer(_Server):
    """HTTPS, HTTP/1.1 only (ALPN says so). The handshake happens in the
    connection's own thread, on its first read, so a slow client cannot
    stall the accept loop."""

    context: ssl.SSLContext

    def get_request(self):
        sock, addr = super().get_request()
        return self.context.wrap_socket(sock, server_side=True,
                                        do_handshake_on_connect=False), addr

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up mid-exchange (a plugin at its deadline) is
        # not the fake's error; anything else is still printed.
        if isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError)):
            return
        super().handle_error(request, client_address)


class FakeE2B:
    def __init__(self, api_key: str, *, host: str = "127.0.0.1", port: int = 0,
                 image: str = DEFAULT_IMAGE, templates: "dict[str, str] | None" = None,
                 domain: "str | None" = None,
                 envd_version: str = ENVD_VERSION, docker: str = "docker",
                 verbose: bool = False, tls: "tuple[str, str] | None" = None,
                 resolve: "list[str] | None" = None, jail_pool: str = DEFAULT_POOL) -> None:
        self.instance_id = "fake-e2b-" + new_id(12)  # the container label's value
        self.host, self.port, self.verbose = host, port, verbose
        self.tls = tls  # (certificate chain PEM, key PEM) paths: serve https
        self.faults = Faults()
        self.docker = Docker(self.instance_id, docker)
        # Where a jailed sandbox's allowed names are dialled: the fake's
        # stand-in for public DNS (`NAME:PORT=HOST:PORT` entries).
        self.resolve = ResolveTable(resolve)
        self.jails = Jails(self.instance_id, self.resolve, pool=jail_pool, docker=docker)
        self.registry = Registry(self.docker, self.jails)
        self.control = ControlPlane(self.registry, self.faults, api_key=api_key,
                                    templates=templates or {"base": image},
                                    envd_version=envd_version, domain=domain)
        self.envd = Envd(self.registry, self.faults)
        # When request handlers ran (perf_counter pairs, the last 10000):
        # what the fake itself costs a client, the commands it runs
        # included. Benchmarks in the same process take their union from a
        # client's wall time to find the client's own overhead.
        self._handler_lock = threading.Lock()
        self.handler_spans: "list[tuple[float, float]]" = []
        self._server: "ThreadingHTTPServer | None" = None
        self._thread: "threading.Thread | None" = None

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> "FakeE2B":
        # What a fake that died without cleaning up left: its jails' rules
        # and networks (only a dead owner's; see jail.py).
        self.swept = self.jails.sweep()
        handler = type("Handler", (_Handler,), {"fake": self})
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            context.set_alpn_protocols(["http/1.1"])
            self._server = type("Server", (_TlsServer,), {"context": context})(
                (self.host, self.port), handler)
        else:
            self._server = _Server((self.host, self.port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="fake-e2b-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove every container this instance made."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.registry.stop()

    def __enter__(self) -> "FakeE2B":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    # ---- what tests look at and turn ------------------------------------------------------

    def _handled(self, began: float, ended: float) -> None:
        with self._handler_lock:
            self.handler_spans.append((began, ended))
            del self.handler_spans[:-10000]

    def handler_time(self, start: float, end: float) -> float:
        """Seconds within [start, end] when at least one handler ran."""
        with self._handler_lock:
            spans = sorted((max(a, start), min(b, end)) for a, b in self.handler_spans
                           if b > start and a < end)
        total, reach = 0.0, start
        for a, b in spans:
            if b > reach:
                total += b - max(a, reach)
                reach = b
        return total

    def live_count(self) -> int:
        return len(self.registry.all())

    def state(self) -> dict:
        live = self.registry.all()
        return {"instance": self.instance_id, "live": [s.id for s in live],
                "live_count": len(live),
                "containers": {s.id: s.container for s in live},
                **self.registry.counts, "faults": self.faults.snapshot(),
                "paused": [s.id for s in live if s.state == "paused"],
                "jails": {s.id: {**s.jail.describe(), "domains": s.gate.domains}
                          for s in live if s.jail is not None},
                "listings": dict(self.control.listings),
                "templates_used": dict(self.control.templates_used),
                "connections": self._server.connections if self._server else 0,
                "envd_api_keys_seen": self.envd.api_keys_seen}

    def pause(self, sandbox_id: str) -> None:
        """Marks a live sandbox paused, as E2B's pause would leave it (for
        tests of listings and the state filter; the API's pause route is
        not served)."""
        if not self.registry.pause(sandbox_id):
            raise KeyError(sandbox_id)

    def set_fault(self, name: str, count: "int | None" = 1, **params) -> None:
        self.faults.set(name, count, **params)

    def clear_faults(self, name: "str | None" = None) -> None:
        self.faults.clear(name)

    # ---- routing ----------------------------------------------------------------------------

    def _route(self, ex: Exchange) -> None:
        sandbox_id = ex.header("E2b-Sandbox-Id")
        port = ex.header("E2b-Sandbox-Port")
        host = _SANDBOX_HOST.match((ex.header("Host") or "").lower())
        if sandbox_id is None and host:
            port, sandbox_id = host.group(1), host.group(2)
        if sandbox_id is not None:
            return self.envd.serve(ex, sandbox_id, int(port) if port and port.isdigit()
                                   else ENVD_PORT)
        if ex.path.startswith("/_fake/"):
            return self._fake_api(ex)
        return self.control.serve(ex)

    def _fake_api(self, ex: Exchange) -> None:
        """Test-only endpoints; no API key, since they are not E2B's."""
        if ex.path == "/_fake/state" and ex.method == "GET":
            return ex.json(200, self.state())
        if ex.path == "/_fake/faults":
            if ex.method == "GET":
                return ex.json(200, self.faults.snapshot())
            if ex.method == "DELETE":
                self.faults.clear()
                return ex.reply(204)
            if ex.method == "POST":
                try:
                    self.faults.apply_json(ex.read_json())
                except FaultError as e:
                    return ex.json(400, {"code": 400, "message": str(e)})
                return ex.json(200, self.faults.snapshot())
        return ex.json(404, {"code": 404, "message": f"no route {ex.method} {ex.path}"})


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--ready-file", help="where to write 'listening 127.0.0.1:PORT'")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the 'base' template's image")
    parser.add_argument("--domain", help="the domain create answers name (default: null)")
    parser.add_argument("--tls-cert", help="serve https with this PEM certificate chain")
    parser.add_argument("--tls-key", help="the PEM private key for --tls-cert")
    parser.add_argument("--resolve", action="append", default=[], metavar="NAME:PORT=HOST:PORT",
                        help="where a jailed sandbox's firewall dials an allowed NAME:PORT "
                             "(curl style; repeatable): the fake's public DNS")
    parser.add_argument("--jail-pool", default=DEFAULT_POOL, metavar="CIDR",
                        help=f"IPv4 range the jails' /28 networks come from (default "
                             f"{DEFAULT_POOL})")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    try:
        ResolveTable(args.resolve)
    except ValueError as e:
        parser.error(f"--resolve: {e}")

    try:
        fake = FakeE2B(args.api_key, port=args.port, image=args.image, domain=args.domain,
                       verbose=args.verbose, resolve=args.resolve, jail_pool=args.jail_pool,
                       tls=(args.tls_cert, args.tls_key) if args.tls_cert else None)
    except ValueError as e:
        parser.error(str(e))
    fake.start()
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    line = f"listening {fake.host}:{fake.port}"
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(line + "\n")
        os.replace(tmp, args.ready_file)  # readers never see a half-written file
    print(line, flush=True)
    while not done.wait(0.5):  # wake up for signals
        pass
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
