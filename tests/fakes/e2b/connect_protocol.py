"""The Connect RPC protocol, server side, as envd speaks it over HTTP/1.1.

Unary calls: the body is one bare message; `application/json` or
`application/proto`. Errors are a JSON body `{"code": "<code>", "message": ...}`
with the HTTP status the Connect spec pairs with the code.

Streaming calls: `application/connect+json` or `application/connect+proto`.
Each message is an envelope: one flags byte, a big-endian u32 length, the
payload. The response always answers 200; it ends with an envelope whose flags
carry 0x02 and whose payload is JSON: `{}`, or `{"error": {...}}`.
"""

from __future__ import annotations

import json
import struct

import protowire

# Connect error codes and the HTTP status each maps to (Connect protocol spec).
HTTP_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403,
    "resource_exhausted": 429, "failed_precondition": 400, "aborted": 409,
    "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02


class RpcError(Exception):
    """An RPC failing with a Connect code; the message reaches the client."""

    def __init__(self, code: str, message: str) -> None:
        assert code in HTTP_STATUS, code
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    def to_json(self) -> dict:
        return {"code": self.code, "message": self.message}


class Codec:
    """One of the two codecs, for one call: how payloads (de)serialize."""

    def __init__(self, name: str, streaming: bool) -> None:
        self.name, self.streaming = name, streaming
        base = "application/connect+" if streaming else "application/"
        self.content_type = base + name

    def decode(self, message: protowire.Message, payload: bytes) -> dict:
        try:
            if self.name == "proto":
                return protowire.decode(message, payload)
            return protowire.from_json(message, json.loads(payload or b"{}"))
        except (protowire.WireError, ValueError) as e:
            raise RpcError("invalid_argument", f"cannot decode {message.full_name}: {e}")

    def encode(self, message: protowire.Message, value: dict) -> bytes:
        if self.name == "proto":
            return protowire.encode(message, value)
        return json.dumps(protowire.to_json(message, value), separators=(",", ":")).encode()


def codec_for(content_type: str) -> "Codec | None":
    """The codec a request's Content-Type names, or None (answer 415)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return {
        "application/json": Codec("json", False),
        "application/proto": Codec("proto", False),
        "application/connect+json": Codec("json", True),
        "application/connect+proto": Codec("proto", True),
    }.get(media)


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def end_stream(error: "RpcError | None" = None) -> bytes:
    body = {"error": error.to_json()} if error else {}
    return envelope(json.dumps(body).encode(), FLAG_END_STREAM)


def read_envelope(read_exact) -> "tuple[int, bytes] | None":
    """One envelope from a request body (`read_exact(n)` returns fewer bytes
    only at its end); None at a clean end of the body."""
    head = read_exact(5)
    if not head:
        return None
    if len(head) < 5:
        raise RpcError("invalid_argument", "truncated envelope header")
    flags, length = struct.unpack(">BI", head)
    payload = read_exact(length)
    if len(payload) < length:
        raise RpcError("invalid_argument", "truncated envelope")
    if flags & FLAG_COMPRESSED:
        raise RpcError("unimplemented", "compressed messages are not supported")
    return flags, payload


def parse_timeout_ms(value: "str | None") -> "float | None":
    """`Connect-Timeout-Ms` in seconds; None when absent. At most 10 digits."""
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit() or len(value) > 10:
        raise RpcError("invalid_argument", f"invalid Connect-Timeout-Ms {value!r}")
    return int(value) / 1000.0
