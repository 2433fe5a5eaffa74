"""A tiny protobuf codec: the binary wire format and the proto3 JSON mapping.

The fake must not lean on the client it is tested against, so it cannot use
the SDK's generated modules (or any protobuf package). envd's messages are few
and flat, so a table-driven codec is enough: a `Message` lists its fields, and
values travel as plain dicts keyed by the proto field name (snake_case):

    str / bytes / bool / int      scalars; enums as their number
    dict                          a nested message, or a map<string, string>
    list                          a repeated field
    float                         a google.protobuf.Timestamp, in epoch seconds

A key being present is what "set" means for fields with presence (`optional`,
oneof members, messages); other scalars equal to their default are left off
the wire, as proto3 does.
"""

from __future__ import annotations

import base64
import datetime as _dt
import re

# Field kinds. Each maps to one wire type and one JSON representation.
STRING, BYTES, BOOL, UINT32, INT32, SINT32, INT64, ENUM, MESSAGE, MAP_SS, TIMESTAMP = (
    "string", "bytes", "bool", "uint32", "int32", "sint32", "int64", "enum",
    "message", "map", "timestamp")

_VARINT_KINDS = {BOOL, UINT32, INT32, SINT32, INT64, ENUM}
_LEN_KINDS = {STRING, BYTES, MESSAGE, MAP_SS, TIMESTAMP}


class WireError(ValueError):
    """A message that does not decode: truncated, mistyped, or malformed."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class Field:
    def __init__(self, number: int, name: str, kind: str, *, message: "Message | None" = None,
                 enum: "dict[int, str] | None" = None, repeated: bool = False,
                 presence: bool = False) -> None:
        self.number, self.name, self.kind = number, name, kind
        self.json_name = _camel(name)
        self.message, self.enum, self.repeated = message, enum, repeated
        # A singular message always has presence; a scalar only when `optional`
        # or in a oneof; a repeated field never (empty is absent).
        self.presence = not repeated and (presence or kind in (MESSAGE, TIMESTAMP))


class Message:
    def __init__(self, full_name: str, fields: "list[Field]") -> None:
        self.full_name = full_name
        self.fields = fields
        self.by_number = {f.number: f for f in fields}
        # The JSON mapping accepts both the lowerCamelCase and the original name.
        self.by_json = {**{f.name: f for f in fields}, **{f.json_name: f for f in fields}}


def enum_type(values: "dict[str, int]") -> "dict[int, str]":
    return {number: name for name, number in values.items()}


# --------------------------------------------------------------------------
# Binary wire format
# --------------------------------------------------------------------------

def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1  # negative int32/int64 go out as 10-byte two's complement
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _get_varint(data: bytes, pos: int) -> "tuple[int, int]":
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint too long")


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 31)


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _is_default(field: Field, value) -> bool:
    if field.repeated or field.kind == MAP_SS:
        return not value
    return value in ("", b"", 0, False)


def _put_tag(out: bytearray, number: int, wire_type: int) -> None:
    _put_varint(out, (number << 3) | wire_type)


def _put_len(out: bytearray, number: int, payload: bytes) -> None:
    _put_tag(out, number, 2)
    _put_varint(out, len(payload))
    out += payload


def _encode_timestamp(seconds: float) -> bytes:
    whole = int(seconds // 1)
    nanos = int(round((seconds - whole) * 1e9))
    out = bytearray()
    if whole:
        _put_tag(out, 1, 0)
        _put_varint(out, whole)
    if nanos:
        _put_tag(out, 2, 0)
        _put_varint(out, nanos)
    return bytes(out)


def _encode_one(out: bytearray, field: Field, value) -> None:
    kind = field.kind
    if kind in _VARINT_KINDS:
        _put_tag(out, field.number, 0)
        _put_varint(out, _zigzag(value) if kind == SINT32 else int(value))
    elif kind == STRING:
        _put_len(out, field.number, value.encode("utf-8"))
    elif kind == BYTES:
        _put_len(out, field.number, bytes(value))
    elif kind == MESSAGE:
        _put_len(out, field.number, encode(field.message, value))
    elif kind == TIMESTAMP:
        _put_len(out, field.number, _encode_timestamp(value))
    else:  # pragma: no cover - table error
        raise AssertionError(kind)


def encode(message: Message, value: dict) -> bytes:
    out = bytearray()
    for field in message.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        if not field.presence and _is_default(field, item):
            continue
        if field.kind == MAP_SS:
            for key, val in item.items():
                entry = bytearray()
                _put_len(entry, 1, key.encode("utf-8"))
                _put_len(entry, 2, val.encode("utf-8"))
                _put_len(out, field.number, bytes(entry))
        elif field.repeated and field.kind in _VARINT_KINDS:
            # proto3 packs repeated scalars: one length-delimited run of
            # varints (a decoder must take either form; encoders write this).
            packed = bytearray()
            for element in item:
                _put_varint(packed, _zigzag(element) if field.kind == SINT32 else int(element))
            _put_len(out, field.number, bytes(packed))
        elif field.repeated:
            for element in item:
                _encode_one(out, field, element)
        else:
            _encode_one(out, field, item)
    return bytes(out)


def _decode_scalar(field: Field, wire_type: int, raw):
    kind = field.kind
    if kind in _VARINT_KINDS:
        if wire_type != 0:
            raise WireError(f"{field.name}: expected varint")
        if kind == BOOL:
            return raw != 0
        if kind == UINT32:
            return raw & 0xFFFFFFFF
        if kind == SINT32:
            return _unzigzag(raw & 0xFFFFFFFF)
        if kind in (INT32, ENUM):
            return _signed(raw, 32)
        return _signed(raw, 64)
    if wire_type != 2:
        raise WireError(f"{field.name}: expected length-delimited")
    if kind == STRING:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise WireError(f"{field.name}: invalid UTF-8") from e
    if kind == BYTES:
        return bytes(raw)
    if kind == MESSAGE:
        return decode(field.message, raw)
    if kind == TIMESTAMP:
        parts = decode(_TIMESTAMP, raw)
        return parts.get("seconds", 0) + parts.get("nanos", 0) / 1e9
    raise AssertionError(kind)  # pragma: no cover


def decode(message: Message, data: bytes) -> dict:
    out: dict = {}
    pos = 0
    while pos < len(data):
        key, pos = _get_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            raw, pos = _get_varint(data, pos)
        elif wire_type == 1:
            raw, pos = data[pos:pos + 8], pos + 8
        elif wire_type == 5:
            raw, pos = data[pos:pos + 4], pos + 4
        elif wire_type == 2:
            length, pos = _get_varint(data, pos)
            raw, pos = data[pos:pos + length], pos + length
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        if pos > len(data):
            raise WireError("truncated message")
        field = message.by_number.get(number)
        if field is None:
            continue  # unknown fields are skipped, as proto3 parsers do
        if field.kind == MAP_SS:
            entry = decode(_MAP_ENTRY, raw)
            out.setdefault(field.name, {})[entry.get("key", "")] = entry.get("value", "")
        elif field.repeated:
            if wire_type == 2 and field.kind in _VARINT_KINDS:  # packed
                inner, values = 0, []
                while inner < len(raw):
                    value, inner = _get_varint(raw, inner)
                    values.append(_decode_scalar(field, 0, value))
                out.setdefault(field.name, []).extend(values)
            else:
                out.setdefault(field.name, []).append(_decode_scalar(field, wire_type, raw))
        else:
            out[field.name] = _decode_scalar(field, wire_type, raw)
    return out


_MAP_ENTRY = Message("MapEntry", [Field(1, "key", STRING), Field(2, "value", STRING)])
_TIMESTAMP = Message("google.protobuf.Timestamp",
                     [Field(1, "seconds", INT64), Field(2, "nanos", INT32)])


# --------------------------------------------------------------------------
# proto3 JSON mapping
# --------------------------------------------------------------------------

def _rfc3339(seconds: float) -> str:
    moment = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:  # proto3 JSON writes 0, 3, 6 or 9 fractional digits
        micros = f"{moment.microsecond:06d}"
        text += "." + (micros[:3] if micros.endswith("000") else micros)
    return text + "Z"


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _parse_rfc3339(text: str) -> float:
    match = _RFC3339.match(text) if isinstance(text, str) else None
    if not match:
        raise WireError(f"invalid timestamp {text!r}")
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    moment = _dt.datetime.fromisoformat(match.group(1) + zone)
    return moment.timestamp() + float(match.group(2) or 0)


def _json_one(field: Field, value):
    kind = field.kind
    if kind == BYTES:
        return base64.b64encode(bytes(value)).decode("ascii")
    if kind == INT64:
        return str(int(value))  # 64-bit integers are JSON strings
    if kind == ENUM:
        return field.enum.get(value, value)
    if kind == MESSAGE:
        return to_json(field.message, value)
    if kind == TIMESTAMP:
        return _rfc3339(value)
    return value


def to_json(message: Message, value: dict) -> dict:
    out = {}
    for field in message.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        if not field.presence and _is_default(field, item):
            continue
        if field.kind == MAP_SS:
            out[field.json_name] = dict(item)
        elif field.repeated:
            out[field.json_name] = [_json_one(field, element) for element in item]
        else:
            out[field.json_name] = _json_one(field, item)
    return out


def _int_from_json(field: Field, value) -> int:
    if isinstance(value, bool):
        raise WireError(f"{field.json_name}: expected a number")
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise WireError(f"{field.json_name}: expected an integer")
    return value


def _from_json_one(field: Field, value):
    kind = field.kind
    if kind == STRING:
        if not isinstance(value, str):
            raise WireError(f"{field.json_name}: expected a string")
        return value
    if kind == BYTES:
        if not isinstance(value, str):
            raise WireError(f"{field.json_name}: expected base64 text")
        text = value.replace("-", "+").replace("_", "/")
        try:
            return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except ValueError as e:
            raise WireError(f"{field.json_name}: invalid base64") from e
    if kind == BOOL:
        if not isinstance(value, bool):
            raise WireError(f"{field.json_name}: expected a boolean")
        return value
    if kind == ENUM:
        if isinstance(value, str):
            for number, name in field.enum.items():
                if name == value:
                    return number
            raise WireError(f"{field.json_name}: unknown enum value {value!r}")
        return _int_from_json(field, value)
    if kind in (UINT32, INT32, SINT32, INT64):
        return _int_from_json(field, value)
    if kind == MESSAGE:
        return from_json(field.message, value)
    if kind == TIMESTAMP:
        return _parse_rfc3339(value)
    raise AssertionError(kind)  # pragma: no cover


def from_json(message: Message, obj) -> dict:
    if not isinstance(obj, dict):
        raise WireError(f"{message.full_name}: expected a JSON object")
    out = {}
    for key, value in obj.items():
        field = message.by_json.get(key)
        if field is None or value is None:
            continue  # unknown fields are discarded, as envd's JSON codec does
        if field.kind == MAP_SS:
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise WireError(f"{field.json_name}: expected a string map")
            out[field.name] = dict(value)
        elif field.repeated:
            if not isinstance(value, list):
                raise WireError(f"{field.json_name}: expected a list")
            out[field.name] = [_from_json_one(field, element) for element in value]
        else:
            out[field.name] = _from_json_one(field, value)
    return out
