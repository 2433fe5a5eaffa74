"""HTTP/1.1 plumbing over http.server: request bodies (Content-Length or
chunked), plain answers, and chunked streaming answers that can be cut off
mid-way on purpose.

http.server reads request heads only; bodies, keep-alive and chunked transfer
are up to the handler, so they live here, once.
"""

from __future__ import annotations

import json
import socket
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit


class BadRequest(Exception):
    pass


class Exchange:
    """One request and its answer."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self._h = handler
        url = urlsplit(handler.path)
        self.method = handler.command
        self.path = url.path
        self.raw_query = url.query
        self.query = parse_qs(url.query, keep_blank_values=True)
        self.headers = handler.headers
        self.answered = False
        self._chunked = "chunked" in (handler.headers.get("Transfer-Encoding") or "").lower()
        length = handler.headers.get("Content-Length")
        if not self._chunked and length is not None and not length.strip().isdigit():
            raise BadRequest("invalid Content-Length")
        self._remaining = int(length) if length and not self._chunked else 0
        self._chunk_left = 0
        self._body_done = not self._chunked and self._remaining == 0

    def header(self, name: str) -> "str | None":
        return self.headers.get(name)

    def arg(self, name: str) -> "str | None":
        values = self.query.get(name)
        return values[0] if values else None

    # ---- request body ------------------------------------------------------------

    def _read_some(self, limit: int) -> bytes:
        rfile = self._h.rfile
        if self._body_done:
            return b""
        if not self._chunked:
            data = rfile.read(min(limit, self._remaining))
            self._remaining -= len(data)
            if not data or self._remaining == 0:
                self._body_done = True
            return data
        if self._chunk_left == 0:
            line = rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadRequest("malformed chunked body")
            if size == 0:
                while rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                self._body_done = True
                return b""
            self._chunk_left = size
        data = rfile.read(min(limit, self._chunk_left))
        self._chunk_left -= len(data)
        if not data:
            self._body_done = True
        elif self._chunk_left == 0:
            rfile.readline(16)  # the CRLF after a chunk
        return data

    def read_exact(self, n: int) -> bytes:
        """n bytes, or fewer only at the end of the body."""
        out = bytearray()
        while len(out) < n:
            data = self._read_some(n - len(out))
            if not data:
                break
            out += data
        return bytes(out)

    def read_body(self) -> bytes:
        out = bytearray()
        while True:
            data = self._read_some(1 << 20)
            if not data:
                return bytes(out)
            out += data

    def read_json(self):
        raw = self.read_body()
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError as e:
            raise BadRequest(f"body is not valid JSON: {e}")

    # ---- plain answers -----------------------------------------------------------

    def reply(self, status: int, body: bytes = b"", content_type: "str | None" = None,
              headers: "dict[str, str] | None" = None) -> None:
        h = self._h
        if not self._body_done:
            h.close_connection = True  # an unread body would corrupt the next request
        h.send_response(status)
        if content_type:
            h.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        if h.close_connection:
            h.send_header("Connection", "close")
        h.end_headers()
        if body and self.method != "HEAD":
            h.wfile.write(body)
        h.wfile.flush()
        self.answered = True

    def json(self, status: int, obj, headers: "dict[str, str] | None" = None) -> None:
        self.reply(status, json.dumps(obj).encode(), "application/json", headers)

    # ---- streaming answers ---------------------------------------------------------

    def stream_start(self, status: int, content_type: str,
                     headers: "dict[str, str] | None" = None) -> None:
        h = self._h
        if not self._body_done:
            h.close_connection = True
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        self.answered = True

    def stream_write(self, data: bytes) -> None:
        if data:
            self._h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self._h.wfile.flush()

    def stream_end(self) -> None:
        self._h.wfile.write(b"0\r\n\r\n")
        self._h.wfile.flush()

    def abort(self) -> None:
        """Drop the connection mid-answer, as a crashed or cut peer would."""
        self._h.close_connection = True
        try:
            self._h.wfile.flush()
            self._h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
