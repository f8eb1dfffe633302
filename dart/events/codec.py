"""Typed events <-> Avro single-object encoding.

Wire format (Avro spec, "single object encoding"): the two marker bytes ``C3 01``, the
8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's parsing canonical form,
then the Avro binary body. The fingerprint tells a reader which schema wrote the record
without a registry service; older schema versions kept in ``schemas/history/`` stay
decodable and are resolved to the current record type.
"""

from __future__ import annotations

import array
import copy
import dataclasses
import datetime as dt
import io
import json
import struct
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from dart.errors import DecodeError
from dart.events.types import EVENT_TYPES, Event
from dart.resources import resource_dir

MARKER = b"\xc3\x01"
HEADER_BYTES = 10
SCHEMA_DIR = resource_dir("schemas")

_CRC64_EMPTY = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> int:
    """The Rabin CRC-64 fingerprint the Avro spec names CRC-64-AVRO."""
    fp = _CRC64_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def fingerprint(schema: dict[str, Any]) -> bytes:
    """8 bytes, little-endian, as they appear after the marker."""
    return struct.pack("<Q", crc64_avro(to_parsing_canonical_form(schema).encode()))


def _without_logical_types(node: Any) -> Any:
    # timestamp-millis is a long on the wire and in the canonical form; reading it as a plain
    # long keeps event_time an int in Python and skips a datetime round trip per record.
    if isinstance(node, dict):
        return {k: _without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_without_logical_types(v) for v in node]
    return node


def load_schema(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


# ---------------------------------------------------------------- dataclass <-> dict

_PACKED = {"packed_int32": "i", "packed_float32": "f"}
assert array.array("i").itemsize == 4 and array.array("f").itemsize == 4


def _pack(code: str, values: Any) -> bytes:
    arr = values if type(values) is array.array and values.typecode == code else array.array(code, values)
    if sys.byteorder == "big":
        arr = array.array(code, arr)
        arr.byteswap()
    return arr.tobytes()


def _unpack(code: str, data: bytes) -> array.array:
    arr = array.array(code)
    if len(data) % arr.itemsize:
        raise ValueError(f"packed array of {len(data)} bytes is not a multiple of {arr.itemsize}")
    arr.frombytes(data)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr



def _converters(cls: type) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Build (to_avro, from_avro) functions for one dataclass, following its type hints."""
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    out: dict[str, Callable[[Any], Any]] = {}
    inn: dict[str, Callable[[Any], Any]] = {}
    meta = {f.name: f.metadata.get("avro") for f in dataclasses.fields(cls)}
    for name in fields:
        tp = hints[name]
        if meta[name] in _PACKED:
            code = _PACKED[meta[name]]
            out[name] = lambda v, c=code: _pack(c, v)
            inn[name] = lambda v, c=code: _unpack(c, v)
            continue
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            to_, from_ = _converters(tp)
            out[name], inn[name] = to_, from_
        elif origin is list and args and dataclasses.is_dataclass(args[0]):
            to_, from_ = _converters(args[0])
            out[name] = lambda v, t=to_: [t(x) for x in v]
            inn[name] = lambda v, f=from_: [f(x) for x in v]
        elif isinstance(tp, type) and issubclass(tp, Enum):
            out[name] = lambda v: v.value if isinstance(v, Enum) else v
            inn[name] = lambda v, e=tp: e(v)
    plain = [n for n in fields if n not in out]
    special_out = list(out.items())
    special_in = list(inn.items())

    def to_avro(obj: Any) -> dict[str, Any]:
        d = {n: getattr(obj, n) for n in plain}
        for n, conv in special_out:
            d[n] = conv(getattr(obj, n))
        return d

    def from_avro(d: dict[str, Any]) -> Any:
        for n, conv in special_in:
            d[n] = conv(d[n])
        return cls(**d)

    return to_avro, from_avro


@dataclass(frozen=True)
class _Codec:
    cls: type[Event]
    writer: Any  # parsed schema the bytes were written with
    reader: Any | None  # current schema when the writer is an older version
    to_avro: Callable[[Any], dict[str, Any]]
    from_avro: Callable[[dict[str, Any]], Any]
    header: bytes


class Registry:
    """Every known schema (current and historical) by fingerprint, and every type by class."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        self._by_fp: dict[bytes, _Codec] = {}
        self._by_cls: dict[type, _Codec] = {}
        self._by_name: dict[str, type[Event]] = {}
        for cls in EVENT_TYPES:
            name = cls.SCHEMA.rsplit(".", 1)[-1]
            raw = load_schema(schema_dir / f"{name}.avsc")
            current = fastavro.parse_schema(_without_logical_types(copy.deepcopy(raw)))
            to_avro, from_avro = _converters(cls)
            header = MARKER + fingerprint(raw)
            codec = _Codec(cls, current, None, to_avro, from_avro, header)
            self._by_fp[header[2:]] = codec
            self._by_cls[cls] = codec
            self._by_name[name] = cls
            for old_path in sorted((schema_dir / "history").glob(f"{name}.v*.avsc")):
                old_raw = load_schema(old_path)
                old = fastavro.parse_schema(_without_logical_types(old_raw))
                self._by_fp[fingerprint(old_raw)] = _Codec(cls, old, current, to_avro, from_avro, b"")

    def names_by_fingerprint(self) -> dict[bytes, str]:
        """Every known writer fingerprint (8 bytes, as on the wire) -> its event type's short name."""
        return {fp: codec.cls.SCHEMA.rsplit(".", 1)[-1] for fp, codec in self._by_fp.items()}

    def encode(self, event: Event) -> bytes:
        codec = self._by_cls.get(type(event))
        if codec is None:
            raise TypeError(f"{type(event).__name__} is not an event type")
        buf = io.BytesIO()
        buf.write(codec.header)
        fastavro.schemaless_writer(buf, codec.writer, codec.to_avro(event))
        return buf.getvalue()

    def encode_dict(self, event: Event) -> dict[str, Any]:
        """The Avro-ready dict of an event (what the writer receives)."""
        return self._by_cls[type(event)].to_avro(event)

    def decode(self, data: bytes | None) -> Event:
        if data is None:
            raise DecodeError("no value (tombstone or empty record)")
        if len(data) < HEADER_BYTES or data[:2] != MARKER:
            raise DecodeError(
                f"not an Avro single-object record: expected marker c301, got {bytes(data[:2]).hex() or 'nothing'}"
                f" ({len(data)} bytes)"
            )
        fp = bytes(data[2:HEADER_BYTES])
        codec = self._by_fp.get(fp)
        if codec is None:
            raise DecodeError(f"unknown schema fingerprint {fp.hex()} (CRC-64-AVRO bytes as on the wire)")
        buf = io.BytesIO(data)
        buf.seek(HEADER_BYTES)
        try:
            record = fastavro.schemaless_reader(buf, codec.writer, codec.reader)
        except Exception as exc:  # fastavro raises many types on garbage
            raise DecodeError(f"corrupt {codec.cls.__name__} body: {type(exc).__name__}: {exc}") from exc
        if buf.tell() != len(data):
            raise DecodeError(f"{codec.cls.__name__} body has {len(data) - buf.tell()} trailing bytes")
        try:
            return codec.from_avro(record)
        except (TypeError, ValueError) as exc:
            raise DecodeError(f"{codec.cls.__name__} record does not fit its type: {exc}") from exc


_REGISTRY: Registry | None = None


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry()
    return _REGISTRY


def encode(event: Event) -> bytes:
    """Single-object Avro bytes of an event."""
    return registry().encode(event)


def decode(data: bytes | None) -> Event:
    """The event in ``data``; raises :class:`DecodeError` naming what was seen."""
    return registry().decode(data)


def to_json_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict of an event (bytes as hex, times as ISO strings), for `dart tail`."""

    def conv(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.hex()
        if isinstance(v, array.array):
            return v.tolist()
        if isinstance(v, Enum):
            return v.value
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    d = {"type": type(event).__name__, **conv(event)}
    d["event_time_iso"] = dt.datetime.fromtimestamp(event.event_time / 1000, dt.UTC).isoformat()
    return d
