"""One SQL endpoint request as the ClickHouse HTTP protocol sends it, read into a ``SqlRequest``
(pure: no chdb, no sockets): URL parameters, the body (inflated within a bound), the statement and
an INSERT's data. Linear in the request's size: no backtracking regex (the server runs this on a
worker thread as well)."""

from __future__ import annotations

import re
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dart.data import sqlguard
from dart.errors import DartError

# URL parameters the HTTP layer consumes itself (none of them reaches chdb as a setting); every
# other parameter must be a setting in sqlguard.ALLOWEDNAMES (else 400 naming it).
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "session_id", "session_timeout", "session_check",
    "query_id", "quota_key", "compress", "decompress", "wait_end_of_query", "client_protocol_version",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
    "enable_http_compression", "buffer_size", "user", "password", "http_response_buffer_size", "role",
})
_INSERT = re.compile(r"^\s*INSERT\b", re.IGNORECASE)
_BODY_INSERT = re.compile(rb"\s*INSERT\b", re.IGNORECASE)
_FORMAT_NAME = re.compile(rb"FORMAT\s+(\w+)(?:[ \t]*\r?\n|[ \t])?", re.IGNORECASE)
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""A setting, database or format name."""


class BadRequest(DartError, ValueError):
    """An HTTP request the endpoint cannot read (answered with 400)."""


class BodyTooLarge(BadRequest):
    """A body that inflates past its bound (answered with 413)."""


@dataclass(frozen=True, slots=True)
class SqlRequest:
    """A parsed HTTP request: what to run and how (pure data, built by ``parse_request``)."""

    sql: str
    default_format: str
    database: str | None
    params: dict[str, str]
    settings: dict[str, str]
    insert_data: bytes | None = None
    """Body of an ``INSERT ... FORMAT X`` whose query came in the URL."""
    insert_format: str | None = None


def trailing_format(sql: str) -> tuple[str, str] | None:
    """(the text before it, the name) when ``sql`` ends in ``FORMAT name`` (then an optional ``;``),
    else None. String operations only: the regex this replaces (``\\bFORMAT\\s+(\\w+)\\s*;?\\s*$``)
    backtracked over a long run of spaces, 0.37 s for an 8 KB URL, on the event loop."""
    end = sql.rstrip()
    end = end[:-1].rstrip() if end.endswith(";") else end
    k = len(end)
    while k and (end[k - 1].isalnum() or end[k - 1] == "_"):
        k -= 1
    before = end[:k].rstrip()
    if k == len(end) or len(before) == k or before[-6:].upper() != "FORMAT":
        return None
    if len(before) > 6 and (before[-7].isalnum() or before[-7] == "_"):
        return None  # xFORMAT: not the keyword
    return before[:-6].rstrip(), end[k:]


def split_format(sql: str) -> tuple[str, str | None]:
    """``SELECT ... FORMAT X`` -> (``SELECT ...``, ``X``); no trailing FORMAT -> (sql, None)."""
    found = trailing_format(sql)
    return found if found is not None else (sql, None)


_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd", "lz4": b"\x04\x22\x4d\x18"}


def _inflate(d: Any, body: bytes, max_bytes: int, chunk: int = 1 << 20) -> bytes:
    """Run an lz4/zstd streaming decompressor a chunk at a time, stopping past ``max_bytes``
    (their ``max_length`` allocates its whole size up front, so it cannot be the bound itself)."""
    out = bytearray(d.decompress(body, max_length=chunk))
    while not d.eof and not d.needs_input and len(out) <= max_bytes:
        out += d.decompress(b"", max_length=chunk)
    return bytes(out)


def decompress(body: bytes, encoding: str, *, max_bytes: int = 1 << 62) -> bytes:
    """Undo a Content-Encoding clickhouse-connect or curl may use; BadRequest past ``max_bytes``
    inflated (so a small compressed bomb cannot fill memory).

    The endpoint reads bodies as sent (aiohttp's own inflating is off: it runs on the event loop
    with no ratio bound) and calls this on a worker thread. A body without the format's magic
    bytes is taken as not compressed (some clients name an encoding they did not apply).
    """
    enc = encoding.strip().lower()
    if enc in ("", "identity", "none"):
        return body
    if enc not in (*_MAGIC, "deflate"):
        raise BadRequest(f"unsupported Content-Encoding {encoding!r} (use gzip, deflate, lz4 or zstd)")
    if enc in _MAGIC and not body.startswith(_MAGIC[enc]):
        return body
    try:
        if enc in ("gzip", "deflate"):
            d = zlib.decompressobj(wbits=31 if enc == "gzip" else 15)
            out = d.decompress(body, max_bytes + 1)
        elif enc == "lz4":
            import lz4.frame

            out = _inflate(lz4.frame.LZ4FrameDecompressor(), body, max_bytes)
        else:
            from backports import zstd

            out = _inflate(zstd.ZstdDecompressor(), body, max_bytes)
    except zlib.error:
        if enc != "deflate":
            raise BadRequest("body is not valid gzip") from None
        try:  # raw deflate (no zlib header), as some clients send it
            out = zlib.decompressobj(wbits=-15).decompress(body, max_bytes + 1)
        except zlib.error:
            return body
    except Exception as exc:  # the lz4/zstd bindings raise their own error types
        raise BadRequest(f"body is not valid {enc}: {exc}") from exc
    if len(out) > max_bytes:
        raise BodyTooLarge(f"body inflates to more than {max_bytes} bytes (SqlLimits.max_body_bytes, and at most "
                           "SqlLimits.max_inflate_ratio times its compressed size)")
    return out


def body_insert(body: bytes, max_head_chars: int | None = None) -> re.Match[bytes] | None:
    """An INSERT whose statement and data share the body (clickhouse-connect's insert()): the
    match of its first ``FORMAT name`` (group 1) and one line break or space after it, where the
    data starts; None when the body is no such INSERT, or when its head is longer than
    ``max_head_chars`` (it would be refused anyway: only that much is looked at, so the data, up
    to the body limit, costs nothing). Looks for each ``FORMAT`` with a find (the lazy
    ``INSERT.*?FORMAT`` regex this replaces cost 11 ms on a 180 KB body, 2 s on 32 MB)."""
    start = _BODY_INSERT.match(body)
    if start is None:
        return None
    # A head of max_head_chars characters is at most 4 bytes each; a match in the last 64 bytes
    # of the window may have been cut short, and its head would be too long anyway.
    window = body if max_head_chars is None else body[:4 * max_head_chars + 128]
    end = len(window) if len(window) == len(body) else len(window) - 64
    upper = window.upper()
    k = upper.find(b"FORMAT", start.end())
    while 0 <= k < end:
        if body[k - 1] not in _WORD_BYTES and (m := _FORMAT_NAME.match(window, k)) is not None:
            return m if m.end() <= end else None
        k = upper.find(b"FORMAT", k + 6)
    return None


def check_raw_query(raw: str) -> None:
    """UnicodeDecodeError for a percent-escape that is not UTF-8 (aiohttp would read it as U+FFFD)."""
    for part in raw.split("&"):
        for piece in part.split("=", 1):
            urllib.parse.unquote_to_bytes(piece.replace("+", " ")).decode("utf-8")


def _url_parameter(name: str, check: Callable[[str], object], value: str) -> None:
    """``check`` of one URL parameter's value; its refusal is the client's 400, naming the parameter."""
    try:
        check(value)
    except sqlguard.SqlRefused as exc:
        raise BadRequest(f"URL parameter {name!r}: {exc}") from exc


def parse_request(query: dict[str, str], body: bytes, max_head_chars: int | None = None) -> SqlRequest:
    """The SQL, format and settings of one request (pure). ClickHouse semantics: the ``query``
    parameter is the start of the statement and the body is the rest (or the data of an
    INSERT that ends in ``FORMAT X``). BadRequest (HTTP 400) names a parameter that is not an
    allowed setting, holds control characters, or a body that is not UTF-8. An INSERT's statement
    is looked for in the body's first ``max_head_chars`` characters only (a longer one is refused
    by the size limit)."""
    for k, v in query.items():
        try:
            sqlguard.check_text(k, "a URL parameter name")
            sqlguard.check_text(v, f"URL parameter {k!r}")
        except sqlguard.BadSql as exc:
            raise BadRequest(str(exc)) from exc
    url_sql = query.get("query", "")
    params = {k[len("param_"):]: v for k, v in query.items() if k.startswith("param_")}
    settings = {k: v for k, v in query.items() if k not in TRANSPORT_PARAMS and not k.startswith("param_")}
    for k in settings:
        if not NAME.match(k):
            raise BadRequest(f"bad setting name {k!r} (rule: settings-allow-list)")
        _url_parameter(k, sqlguard.check_setting, k)
    database = query.get("database") or None
    if database is not None and not NAME.match(database):
        raise BadRequest(f"bad database name {database!r}")
    fmt = query.get("default_format") or "TabSeparated"
    if not NAME.match(fmt):
        raise BadRequest(f"bad default_format {fmt!r}")
    _url_parameter("default_format", sqlguard.check_format, fmt)
    insert_fmt = trailing_format(url_sql) if url_sql and body and _INSERT.match(url_sql) else None
    if insert_fmt is not None:
        return SqlRequest(url_sql, fmt, database, params, settings, body, insert_fmt[1])
    inline = None if url_sql else body_insert(body, max_head_chars)
    try:
        if inline:
            head = body[: inline.end()].decode("utf-8").rstrip()
            return SqlRequest(head, fmt, database, params, settings, body[inline.end():], inline.group(1).decode())
        text = body.decode("utf-8", errors="strict") if body else ""
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the query is not UTF-8: {exc} (rule: malformed-request)") from exc
    sql = f"{url_sql}\n{text}" if url_sql and text else (url_sql or text)
    if not sql.strip():
        raise BadRequest("empty query: pass ?query=... or the query in the body")
    return SqlRequest(sql, fmt, database, params, settings)
