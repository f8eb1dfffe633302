"""The ClickHouse HTTP interface over the embedded chdb store ("SQL for everyone").

chdb lets one process open a database path, so the data manager serves the part of the
ClickHouse HTTP protocol that clickhouse-connect (and curl) use: ``GET|HEAD /ping``,
``GET|POST /?query=...``, the query in the body, ``INSERT ... FORMAT X`` with the data in the
body (compressed or not), ``database``, ``default_format``, ``param_<name>`` query
parameters, other URL parameters as settings, and the ``X-ClickHouse-*`` response headers.
Each request runs on a fresh chdb connection handle (about 1 ms), so ``USE`` and settings
never leak between clients.

Who may do what (``dart.data.sqlguard`` holds the rules and says which layer enforces which):
analytics clients (no credentials, or user ``default``) get ``readonly = 1`` and read
statements only; the writer (``HttpConfig.writer_user`` with the password from the
environment, sent the way clickhouse-connect sends it: basic auth, ``X-ClickHouse-User`` /
``X-ClickHouse-Key`` or ``user`` / ``password`` parameters) may also write. Nobody reaches
outside the projection (host files, URLs, other servers, programs). Every request is bounded
(``SqlLimits``); a refused request is a 401/403/413/503 with a ClickHouse-style body.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import os
import re
import socket
import tempfile
import threading
import urllib.parse
import uuid
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from dart.data import sqlguard
from dart.data.config import HttpConfig, SqlLimits
from dart.errors import ConfigError, DartError
from dart.web.httplimits import ConnectionLimits, LimitedSite

log = logging.getLogger(__name__)

# URL parameters the HTTP layer consumes itself (none of them reaches chdb as a setting); every
# other parameter must be a setting in sqlguard.ALLOWED_SETTINGS (else 400 naming it).
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "session_id", "session_timeout", "session_check",
    "query_id", "quota_key", "compress", "decompress", "wait_end_of_query", "client_protocol_version",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
    "enable_http_compression", "buffer_size", "user", "password", "http_response_buffer_size", "role",
})
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_INSERT = re.compile(r"^\s*INSERT\b", re.IGNORECASE)
_INSERT_ANYWHERE = re.compile(r"\bINSERT\b", re.IGNORECASE)
# An INSERT whose statement and data share the body (clickhouse-connect's insert()): the data
# starts after the format name and one line break (or one space).
_BODY_INSERT = re.compile(rb"^\s*INSERT\b.*?\bFORMAT\s+(\w+)(?:[ \t]*\r?\n|[ \t])?", re.IGNORECASE | re.DOTALL)
_SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CODE = re.compile(r"Code:\s*(\d+)")
_REFUSED_CODES = {  # chdb's own refusals under the settings the endpoint applies, and the rule each enforces
    "164": "read-only, enforced by chdb's readonly = 1",        # READONLY
    "497": "read-only, enforced by chdb's readonly = 1",        # ACCESS_DENIED
    "344": "insert-data-is-data, enforced by input_format_values_interpret_expressions = 0",  # SUPPORT_IS_DISABLED
}
_IN_SCOPE = re.compile(r"\s*: In scope SELECT formatQuerySingleLine\(.*", re.DOTALL)


class BadRequest(DartError, ValueError):
    """An HTTP request the endpoint cannot read (answered with 400)."""


class BodyTooLarge(BadRequest):
    """A body that inflates past its bound (answered with 413)."""


class Unauthorized(DartError, PermissionError):
    """Credentials that name no role, or a wrong password (answered with 401)."""


HASH_SCHEME = "pbkdf2_sha256"
HASH_ITERATIONS = 20_000
"""PBKDF2 rounds for a writer password hashed at start-up (checked on every writer request, so
few: the endpoint is on loopback, the hash only keeps the password itself out of the process and
its files)."""


def hash_password(password: str, *, iterations: int = HASH_ITERATIONS, salt: bytes | None = None) -> str:
    """``pbkdf2_sha256$ITERATIONS$SALT_HEX$HASH_HEX``: what a writer password file may hold instead
    of the password (``python -c 'from dart.data.http import hash_password; print(hash_password("..."))'``)."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogateescape"), salt, iterations)
    return f"{HASH_SCHEME}${iterations}${salt.hex()}${digest.hex()}"


@dataclass(frozen=True, slots=True)
class Writer:
    """The writer role: its user and a PBKDF2 hash of its password (never the password)."""

    user: str
    password_hash: str = field(repr=False)

    def __post_init__(self) -> None:
        scheme, iterations, salt, digest = [*self.password_hash.split("$"), "", "", ""][:4]
        if scheme != HASH_SCHEME or not iterations.isdigit() or not salt or not digest:
            raise ConfigError(f"writer password hash: expected {HASH_SCHEME}$ITERATIONS$SALT_HEX$HASH_HEX")

    @classmethod
    def from_secret(cls, user: str, secret: str) -> Writer:
        """From a password file's text: a hash as written by ``hash_password``, or the password
        itself (hashed here; the caller drops the text)."""
        secret = secret.strip()
        return cls(user, secret if secret.startswith(HASH_SCHEME + "$") else hash_password(secret))

    @classmethod
    def from_file(cls, user: str, path: str | Path) -> Writer:
        try:
            return cls.from_secret(user, Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"writer password file {path}: {exc}") from exc

    def check(self, password: str) -> bool:
        _, iterations, salt, digest = self.password_hash.split("$")
        got = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogateescape"), bytes.fromhex(salt),
                                  int(iterations))
        return hmac.compare_digest(got.hex(), digest)


def writer_from_env(user: str, file_env: str = "DART_SQL_WRITER_PASSWORD_FILE",
                    environ: Mapping[str, str] | None = None) -> Writer | None:
    """The writer role as the data manager starts it: ``$<file_env>`` names the password file
    (Docker secrets' ``*_FILE`` convention); None when unset (no writer). A password in the
    environment itself (``DART_SQL_WRITER_PASSWORD``, as before) is refused: the environment
    of a process stays readable in ``/proc/<pid>/environ`` for its whole life."""
    env = os.environ if environ is None else environ
    if env.get("DART_SQL_WRITER_PASSWORD"):
        raise ConfigError("DART_SQL_WRITER_PASSWORD is no longer read: put the password (or "
                          f"dart.data.http.hash_password's hash of it) in a file and name it in ${file_env}")
    path = env.get(file_env)
    return Writer.from_file(user, path) if path else None


def credentials(headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str | None, str]:
    """(user, password) the way a ClickHouse client may send them: ``Authorization: Basic``,
    ``X-ClickHouse-User`` / ``X-ClickHouse-Key`` headers, or ``user`` / ``password`` parameters."""
    auth = headers.get("Authorization", "")
    if auth[:6].lower() == "basic ":
        try:
            user, _, password = base64.b64decode(auth[6:].strip(), validate=True).decode("utf-8").partition(":")
        except ValueError as exc:  # binascii.Error, UnicodeDecodeError, non-ASCII text
            raise Unauthorized(f"unreadable Authorization header: {exc}") from exc
        return user, password
    if "X-ClickHouse-User" in headers:
        return headers["X-ClickHouse-User"], headers.get("X-ClickHouse-Key", "")
    return query.get("user"), query.get("password", "")


def role_of(user: str | None, password: str, writer: Writer | None) -> bool:
    """True for the writer, False for an analytics client; Unauthorized for anyone else.

    ``default`` (or no user) is the analytics role and needs no password: the endpoint is on
    loopback and that role cannot change anything."""
    if user in (None, "", "default"):
        return False
    if writer is not None and user == writer.user:
        if writer.check(password):
            return True
        raise Unauthorized(f"{user}: wrong password")
    raise Unauthorized(f"unknown user {user!r}: use 'default' (read-only) or the writer user")


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


def split_format(sql: str) -> tuple[str, str | None]:
    """``SELECT ... FORMAT X`` -> (``SELECT ...``, ``X``); no trailing FORMAT -> (sql, None)."""
    m = _TRAILING_FORMAT.search(sql)
    return (sql[: m.start()].rstrip(), m.group(1)) if m else (sql, None)


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


def _check_raw_query(raw: str) -> None:
    """UnicodeDecodeError for a percent-escape that is not UTF-8 (aiohttp would read it as U+FFFD)."""
    for part in raw.split("&"):
        for piece in part.split("=", 1):
            urllib.parse.unquote_to_bytes(piece.replace("+", " ")).decode("utf-8")


def parse_request(query: dict[str, str], body: bytes) -> SqlRequest:
    """The SQL, format and settings of one request (pure). ClickHouse semantics: the ``query``
    parameter is the start of the statement and the body is the rest (or the data of an
    INSERT that ends in ``FORMAT X``). BadRequest (HTTP 400) names a parameter that is not an
    allowed setting, holds control characters, or a body that is not UTF-8."""
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
        if not _SETTING.match(k):
            raise BadRequest(f"bad setting name {k!r} (rule: settings-allow-list)")
        try:
            sqlguard.check_setting(k)
        except sqlguard.SqlRefused as exc:
            raise BadRequest(f"URL parameter {k!r}: {exc}") from exc
    database = query.get("database") or None
    if database is not None and not _SETTING.match(database):
        raise BadRequest(f"bad database name {database!r}")
    fmt = query.get("default_format") or "TabSeparated"
    if not _SETTING.match(fmt):
        raise BadRequest(f"bad default_format {fmt!r}")
    try:
        sqlguard.check_format(fmt)
    except sqlguard.SqlRefused as exc:
        raise BadRequest(f"URL parameter 'default_format': {exc}") from exc
    insert_fmt = _TRAILING_FORMAT.search(url_sql)
    if url_sql and body and _INSERT.match(url_sql) and insert_fmt:
        return SqlRequest(url_sql, fmt, database, params, settings, body, insert_fmt.group(1))
    inline = None if url_sql else _BODY_INSERT.match(body)
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


def _params(req: SqlRequest) -> dict[str, Any]:
    return {"params": req.params} if req.params else {}


class Engine:
    """Runs SqlRequests on fresh chdb handles (blocking: call from a worker thread).

    Check what runs, run what was checked: the request's text reaches chdb only as an escaped
    string literal given to ClickHouse's own formatter (``canonical``); the canonical text it
    returns is what the rules of ``dart.data.sqlguard`` judge and what executes."""

    def __init__(self, path: Path, limits: SqlLimits | None = None, database: str = "dart") -> None:
        self.path = str(path)
        self.limits = limits or SqlLimits()
        self.database = database
        self.databases = sqlguard.OTHER_DATABASES
        """Lower-case names of the databases other than ours (``refresh_databases`` adds chdb's)."""

    def refresh_databases(self) -> None:
        """Create our database if it is not there yet (every session runs in it, never in chdb's
        ``default``) and learn every other database chdb has (blocking), so a dotted name in any
        of them is refused by name (``sqlguard.check_tables``)."""
        import chdb

        conn = chdb.connect(self.path)
        try:
            conn.query(f"CREATE DATABASE IF NOT EXISTS `{self.database}`", "TabSeparated")
            names = (conn.query("SELECT name FROM system.databases", "TabSeparatedRaw").bytes() or b"").decode()
        finally:
            conn.close()
        self.databases = sqlguard.OTHER_DATABASES | {n.lower() for n in names.split("\n")
                                                     if n and n.lower() != self.database.lower()}

    def kill(self, tag: str) -> None:
        """Stop the query run under ``tag`` (its client went away); blocking, best effort."""
        import chdb

        conn = chdb.connect(self.path)
        try:
            conn.query(f"KILL QUERY WHERE Settings['log_comment'] = {sqlguard.literal(tag)} ASYNC", "TabSeparated")
        except Exception:  # the query may have ended meanwhile
            log.debug("KILL QUERY %s failed", tag, exc_info=True)
        finally:
            conn.close()

    def _limit_settings(self, tag: str) -> str:
        lim = self.limits
        # Values expressions off: an INSERT's data is data, never a function call such as file().
        # log_comment tags the query so `kill` finds it (clients cannot set it: not in ALLOWED_SETTINGS).
        return (f"SET max_execution_time = {lim.max_execution_time_s:g}, max_result_rows = {lim.max_result_rows}, "
                f"max_result_bytes = {lim.max_result_bytes}, result_overflow_mode = 'throw', "
                f"max_memory_usage = {lim.max_memory_bytes}, input_format_values_interpret_expressions = 0, "
                f"input_format_values_deduce_templates_of_expressions = 0, log_comment = {sqlguard.literal(tag)}")

    @staticmethod
    def canonical(conn: Any, text: str) -> str:
        """ClickHouse's canonical text of the one statement in ``text`` (parsed, not executed):
        SqlRefused for several statements, BadSql for a syntax error or a canonical form that
        formats to something else again (then it cannot be trusted to be what was checked)."""

        def fmt(sql: str) -> str:
            try:
                res = conn.query(f"SELECT formatQuerySingleLine({sqlguard.literal(sql)})", "RawBLOB")
            except Exception as exc:
                msg = _IN_SCOPE.sub("", str(exc)).strip()
                if "Multi-statements are not allowed" in msg:
                    raise sqlguard.SqlRefused("one-statement", "send one statement per request: ClickHouse's parser "
                                              f"found more than one ({msg})", code=62, name="SYNTAX_ERROR") from None
                raise sqlguard.BadSql(msg) from None
            # A literal written '\xFF' comes back as the byte itself: keep it, written as an escape again.
            return (res.bytes() or b"").decode("utf-8", "surrogateescape")

        first = fmt(text)
        ascii_bytes = sqlguard.escape_bytes(first)
        if fmt(ascii_bytes) != first:
            raise sqlguard.BadSql("ClickHouse's canonical form of this query is not stable (formatting it again "
                                  "changes it), so it is not run; rewrite the query", "canonical-form")
        return ascii_bytes

    def precheck(self, req: SqlRequest) -> tuple[str, bytes | None, str | None]:
        """The checks on the request's text that need no chdb (so the server runs them before a
        query slot): the statement's size and bracket depth; returns (statement, INSERT data,
        data format) with the data of an ``INSERT ... VALUES`` split off."""
        head, data, data_format = req.sql, req.insert_data, req.insert_format
        # Only an INSERT's text may run past the size limit (its data after VALUES): skip lexing others.
        maybe_insert = len(req.sql) <= self.limits.max_query_chars or _INSERT_ANYWHERE.search(req.sql[:4096])
        if data is None and maybe_insert and (split := sqlguard.split_insert(req.sql)) is not None:
            head, text, data_format = split
            data = text.encode("utf-8")
        if len(head) > self.limits.max_query_chars:
            raise sqlguard.SqlRefused("query-size", f"the statement is {len(head)} characters, over the limit of "
                                      f"{self.limits.max_query_chars} (SqlLimits.max_query_chars)", code=62,
                                      name="SYNTAX_ERROR")
        if (depth := sqlguard.bracket_depth(head)) > self.limits.max_bracket_depth:
            raise sqlguard.SqlRefused("query-size", f"the statement nests brackets {depth} deep, over the limit of "
                                      f"{self.limits.max_bracket_depth} (SqlLimits.max_bracket_depth)", code=62,
                                      name="SYNTAX_ERROR")
        return head, data, data_format

    def run(self, req: SqlRequest, *, writer: bool = False, tag: str = "") -> tuple[bytes, str, dict[str, Any]]:
        """Run one request; SqlRefused / BadSql for a statement this role may not run (nothing ran).
        ``tag`` names the query for ``kill``."""
        import chdb

        sqlguard.check_text(req.sql)
        if req.database not in (None, self.database):
            raise sqlguard.SqlRefused("dart-database-only", f"database {req.database} is refused: clients of this "
                                      f"endpoint reach the database {self.database}", code=497, name="ACCESS_DENIED")
        head, data, data_format = self.precheck(req)
        conn = chdb.connect(self.path)
        try:
            # Always our database: chdb's `default` is a window on the host's files.
            conn.query(f"USE `{self.database}`", "TabSeparated")
            if req.settings:
                try:
                    conn.query("SET " + ", ".join(f"{k} = {sqlguard.literal(v)}" for k, v in req.settings.items()),
                               "TabSeparated")
                except Exception as exc:  # a value chdb cannot read for that setting: the client's error
                    raise sqlguard.BadSql(f"a URL setting's value: {str(exc).strip()}", "bad-setting-value") from None
            # After the client's settings, so its own values cannot raise the limits or lift readonly.
            conn.query(self._limit_settings(tag or f"dart-http-{uuid.uuid4()}"), "TabSeparated")
            if not writer:
                conn.query("SET readonly = 1", "TabSeparated")
            canonical = self.canonical(conn, head)
            statement = sqlguard.inspect(canonical)
            sqlguard.check_keyword(statement, writer=writer)
            if writer and statement.keyword in sqlguard.READ_KEYWORDS:
                conn.query("SET readonly = 1", "TabSeparated")  # the writer's reads are reads too
            # chdb runs every statement of the text it is given, EXPLAIN AST A; B included: the text
            # sent is itself ClickHouse's canonical one statement, not a prefix glued to a checked one.
            explain = self.canonical(conn, f"EXPLAIN AST {canonical}")
            ast = conn.query(explain, "TabSeparatedRaw", **_params(req)).bytes().decode("utf-8", "replace")
            sqlguard.check_ast(ast, writer=writer, database=self.database, statement=statement,
                               databases=self.databases)
            if writer:
                sqlguard.check_writer(statement, ast, self.database)
            inserts_data = statement.keyword == "INSERT" and statement.output_format is not None \
                and "SELECT" not in statement.words
            if data is not None or inserts_data:
                if data is None or not inserts_data:
                    raise sqlguard.BadSql("an INSERT's data goes after VALUES or FORMAT X (in the body, or the "
                                          "statement in ?query= and the data in the body)")
                fmt = statement.output_format or data_format or "TabSeparated"
                return self._insert(conn, canonical, fmt, data, req)
            fmt = statement.output_format or req.default_format
            res = conn.query(canonical, fmt, **_params(req))
            data = res.bytes() or b""
            return data, fmt, self._summary(res, len(data))
        finally:
            conn.close()

    def _insert(self, conn: Any, canonical: str, fmt: str, data: bytes,
                req: SqlRequest) -> tuple[bytes, str, dict[str, Any]]:
        fd, tmp = tempfile.mkstemp(prefix="dart-http-insert-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            head = _TRAILING_FORMAT.sub("", canonical).rstrip()
            # The checked canonical head, a file name of ours and a checked format name.
            sql = f"{head} FROM INFILE {sqlguard.literal(tmp)} FORMAT {fmt}"
            res = conn.query(sql, "TabSeparated", **_params(req))
            return b"", fmt, self._summary(res, 0)
        finally:
            os.unlink(tmp)

    @staticmethod
    def _summary(res: Any, result_bytes: int) -> dict[str, Any]:
        def num(name: str) -> int:
            fn = getattr(res, name, None)
            try:
                return int(fn()) if callable(fn) else 0
            except Exception:  # older chdb builds lack some counters
                return 0

        return {
            "read_rows": str(num("rows_read")), "read_bytes": str(num("bytes_read")),
            "written_rows": str(num("rows_written")), "written_bytes": str(num("bytes_written")),
            "total_rows_to_read": "0", "result_rows": "0", "result_bytes": str(result_bytes),
            "elapsed_ns": str(int(float(getattr(res, "elapsed", lambda: 0.0)()) * 1e9)),
        }


def _lowest_priority() -> None:
    """Nice 19 for the calling thread (on Linux a thread's nice value is its own)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class Slots:
    """Query slots: ``total`` at once, ``per_client`` of them per client, ``max_waiting`` waiting;
    ``acquire`` raises TimeoutError after ``timeout`` (or at once when the queue is full)."""

    def __init__(self, total: int, per_client: int, max_waiting: int) -> None:
        self.total, self.per_client, self.max_waiting = total, per_client, max_waiting
        self.running: dict[Any, int] = {}
        self.waiting = 0
        self._changed = asyncio.Condition()

    def _free(self, client: Any) -> bool:
        return sum(self.running.values()) < self.total and self.running.get(client, 0) < self.per_client

    async def acquire(self, client: Any, timeout: float) -> None:
        async with self._changed:
            if not self._free(client):
                if self.waiting >= self.max_waiting:
                    raise TimeoutError("queue full")
                self.waiting += 1
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: self._free(client)), timeout)
                finally:
                    self.waiting -= 1
            self.running[client] = self.running.get(client, 0) + 1

    async def release(self, client: Any) -> None:
        async with self._changed:
            left = self.running.get(client, 0) - 1
            if left > 0:
                self.running[client] = left
            else:
                self.running.pop(client, None)
            self._changed.notify_all()


class SqlServer:
    """aiohttp app serving an Engine; ``await start()`` returns the bound port.

    No client can starve it: connections are bounded (``dart.web.httplimits``: count, request
    head and idle deadlines), a body must arrive within ``body_timeout_s`` and is inflated on a
    worker thread within ``max_inflate_ratio``, statements are bounded in size and nesting before
    ClickHouse parses them, and queries take slots (``max_concurrent``, ``max_concurrent_per_client``,
    a bounded queue with a wait limit); a client that goes away has its query killed, and its slot
    comes back when the query has stopped."""

    def __init__(self, path: Path, *, host: str = "127.0.0.1", port: int = 0, limits: SqlLimits | None = None,
                 writer: Writer | None = None, database: str = "dart") -> None:
        self.limits = limits or SqlLimits()
        self.database = database
        """The one database clients reach (with the catalogue tables in sqlguard)."""
        self.engine = Engine(path, self.limits, database)
        self.host = host
        self.port = port
        self.writer = writer
        lim = self.limits
        self._pool = ThreadPoolExecutor(max_workers=lim.max_concurrent, thread_name_prefix="dart-sql")
        # Inflating bodies, telling clients apart and killing queries never wait behind running
        # queries, nor behind each other.
        # Inflating runs at the lowest CPU priority: a client's bombs never take CPU from the projection.
        self._inflate = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dart-sql-inflate",
                                           initializer=_lowest_priority)
        self._aux = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dart-sql-aux")
        self._killer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dart-sql-kill")
        self.slots = Slots(lim.max_concurrent, lim.max_concurrent_per_client, lim.max_queued)
        self.site = LimitedSite(ConnectionLimits(lim.max_connections, lim.header_timeout_s, lim.idle_timeout_s))
        self._runner: web.AppRunner | None = None

    @classmethod
    def from_config(cls, http: HttpConfig, path: Path, database: str,
                    environ: Mapping[str, str] | None = None) -> SqlServer:
        """The endpoint as the data manager serves it: ``http``'s address and limits, the writer
        role from ``$<http.writer_password_file_env>`` when set."""
        return cls(path, host=http.host, port=http.port, limits=http.limits,
                   writer=writer_from_env(http.writer_user, http.writer_password_file_env, environ), database=database)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> int:
        await asyncio.get_running_loop().run_in_executor(self._aux, self.engine.refresh_databases)
        app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=[self.site.middleware])
        app.router.add_route("GET", "/ping", self._ping)
        app.router.add_route("HEAD", "/ping", self._ping)
        app.router.add_route("*", "/", self._query)
        # lingering_time: after refusing an oversized body, drain it for at most a second
        # (aiohttp's default is 10 s per connection), then drop the connection.
        # auto_decompress off: aiohttp would inflate on the event loop; _answer inflates on a thread.
        # handler_cancellation: a client that hangs up cancels its handler, which kills its query.
        self._runner = web.AppRunner(app, access_log=None, lingering_time=1.0, auto_decompress=False,
                                     handler_cancellation=True, keepalive_timeout=self.limits.idle_timeout_s)
        await self._runner.setup()
        # Bind the socket here so port 0 tells us which port it got.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        await self.site.start(self._runner, sock)
        log.info("SQL over HTTP at %s (ClickHouse protocol, read-only for analytics clients%s; at most %d connections; "
                 "try: dart sql --url %s 'SELECT 1')", self.url, ", writer enabled" if self.writer else "",
                 self.site.max_connections, self.url)
        return self.port

    async def stop(self) -> None:
        await self.site.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._aux.shutdown(wait=False, cancel_futures=True)
        self._inflate.shutdown(wait=False, cancel_futures=True)
        self._killer.shutdown(wait=False, cancel_futures=True)

    def _release(self, loop: asyncio.AbstractEventLoop, client: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed (the server stopped) first
            asyncio.run_coroutine_threadsafe(self.slots.release(client), loop)

    async def _ping(self, request: web.Request) -> web.Response:
        return web.Response(text="Ok.\n")

    async def _query(self, request: web.Request) -> web.Response:
        try:
            return await self._answer(request)
        except Exception as exc:  # never an unhandled exception: a ClickHouse-style 500, and keep serving
            log.exception("SQL request failed unexpectedly")
            return self._error(f"Code: 1001. DB::Exception: dart SQL endpoint: internal error "
                               f"({type(exc).__name__}). (STD_EXCEPTION)", {})

    async def _answer(self, request: web.Request) -> web.Response:
        headers = {"X-ClickHouse-Timezone": "UTC", "X-ClickHouse-Server-Display-Name": "dart-chdb"}
        try:
            _check_raw_query(request.rel_url.raw_query_string)
            query = {k: v for k, v in request.query.items()}
            query_id = query.get("query_id") or str(uuid.uuid4())
        except (UnicodeError, ValueError) as exc:
            return self._error(f"Code: 27. DB::Exception: bad request: unreadable URL parameters: {exc} "
                               "(rule: malformed-request)", headers, status=400)
        headers["X-ClickHouse-Query-Id"] = query_id if _SETTING.match(query_id.replace("-", "_")) else "invalid"
        log.debug("%s %s encoding=%s", request.method, query, request.headers.get("Content-Encoding"))
        lim = self.limits
        max_body = lim.max_body_bytes
        try:
            writer = role_of(*credentials(request.headers, query), self.writer)
        except Unauthorized as exc:
            return self._error(f"Code: 516. DB::Exception: {exc}. (AUTHENTICATION_FAILED)", headers, status=401)
        if request.content_length is not None and request.content_length > max_body:
            # Close the connection rather than read the body to its end to keep it alive.
            headers["Connection"] = "close"
            return self._error(f"Code: 307. DB::Exception: request body of {request.content_length} bytes is over the "
                               f"limit of {max_body} (SqlLimits.max_body_bytes). (TOO_MANY_BYTES)", headers, status=413)
        loop = asyncio.get_running_loop()
        try:
            raw = await asyncio.wait_for(request.read(), lim.body_timeout_s)
            encoding = request.headers.get("Content-Encoding", "")
            bound = min(max_body, max(len(raw) * lim.max_inflate_ratio, 1 << 16))
            inflate = functools.partial(decompress, raw, encoding, max_bytes=bound)
            # Only a compressed body waits for the inflating threads (a plain one never queues behind bombs).
            body = await loop.run_in_executor(self._inflate, inflate) if encoding.strip() else inflate()
            req = parse_request(query, body)
        except TimeoutError:
            headers["Connection"] = "close"
            return self._error(f"Code: 159. DB::Exception: the request body did not arrive within {lim.body_timeout_s:g} s "
                               "(SqlLimits.body_timeout_s). (TIMEOUT_EXCEEDED)", headers, status=408)
        except web.HTTPRequestEntityTooLarge:
            return self._error(f"Code: 307. DB::Exception: request body is over the limit of {max_body} bytes "
                               "(SqlLimits.max_body_bytes). (TOO_MANY_BYTES)", headers, status=413)
        except BodyTooLarge as exc:
            return self._error(f"Code: 307. DB::Exception: {exc}. (TOO_MANY_BYTES)", headers, status=413)
        except (DartError, OSError) as exc:
            return self._error(f"Code: 27. DB::Exception: bad request: {exc}", headers, status=400)
        if req.database not in (None, self.database):
            refused = sqlguard.SqlRefused("dart-database-only", f"database {req.database} is refused: clients of this "
                                          f"endpoint reach the database {self.database}", code=497, name="ACCESS_DENIED")
            return self._error(refused.clickhouse_text(), headers, status=403)
        try:  # before a slot: a bomb never holds one
            await loop.run_in_executor(self._aux, self.engine.precheck, req)  # it lexes the whole text
        except sqlguard.SqlRefused as exc:
            return self._error(exc.clickhouse_text(), headers, status=403)
        client = self.site.client(request)
        if client is None:  # its connection was closed meanwhile (evicted, or the client left)
            raise asyncio.CancelledError
        self.site.busy(request)  # bounded by the slots and the queue: never evicted for a new connection
        try:
            await self.slots.acquire(client, lim.queue_timeout_s)
        except TimeoutError:
            return self._error(f"Code: 202. DB::Exception: {lim.max_concurrent} queries are running "
                               f"(SqlLimits.max_concurrent, {lim.max_concurrent_per_client} per client) and "
                               f"{self.slots.waiting} waiting; retry later. (TOO_MANY_SIMULTANEOUS_QUERIES)", headers,
                               status=503)
        tag = f"dart-http-{uuid.uuid4()}"
        job = self._pool.submit(self.engine.run, req, writer=writer, tag=tag)
        # The slot comes back when the query has stopped (not when its client left).
        job.add_done_callback(lambda _: self._release(loop, client))
        try:
            data, fmt, summary = await asyncio.wrap_future(job)
        except asyncio.CancelledError:  # the client went away: stop its query
            loop.run_in_executor(self._killer, self.engine.kill, tag)
            raise
        except sqlguard.SqlRefused as exc:
            log.info("refused %s: %s", query_id, exc)
            return self._error(exc.clickhouse_text(), headers, status=403)
        except sqlguard.BadSql as exc:  # ClickHouse's own syntax error passes through, with the rule
            text = str(exc) if str(exc).startswith("Code:") else f"Code: 62. DB::Exception: dart SQL endpoint: {exc}. " \
                "(SYNTAX_ERROR)"
            return self._error(text, headers, status=400)
        except Exception as exc:  # chdb raises its own error type; report it the ClickHouse way
            m = _CODE.search(str(exc))
            if m and m.group(1) in _REFUSED_CODES:  # refused by chdb itself, not failed
                return self._error(f"{str(exc).rstrip()} (rule: {_REFUSED_CODES[m.group(1)]})", headers, status=403)
            return self._error(str(exc), headers)
        headers.update({"X-ClickHouse-Format": fmt, "X-ClickHouse-Summary": json.dumps(summary)})
        ctype = "text/plain; charset=UTF-8" if fmt.startswith(("TabSeparated", "TSV", "CSV", "JSON", "Pretty")) \
            else "application/octet-stream"
        return web.Response(body=data, headers={**headers, "Content-Type": ctype})

    @staticmethod
    def _error(message: str, headers: dict[str, str], status: int = 500) -> web.Response:
        m = _CODE.search(message)
        code = m.group(1) if m else "1001"
        text = message if message.startswith("Code:") else f"Code: {code}. DB::Exception: {message}"
        return web.Response(status=status, text=text.rstrip() + "\n",
                            headers={**headers, "X-ClickHouse-Exception-Code": code})
