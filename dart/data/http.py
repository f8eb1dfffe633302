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
``X-ClickHouse-Key`` or ``user`` / ``password`` parameters) may also ingest: INSERT, and CREATE
in the dart database (what migrations run), never DROP, TRUNCATE or ALTER. Nobody reaches
outside the projection (host files, URLs, other servers, programs). Every request is bounded
(``SqlLimits``), and so is the endpoint's own work on it; a refused request is a
401/403/413/429/503 with a ClickHouse-style body.

The parts: ``sqlauth`` (credentials, the writer's hash, the login throttle), ``sqlrequest``
(reading a request), ``sqlengine`` (running it on chdb), this module (the server); their public
names are importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from dart.data import sqlguard
from dart.data.config import HttpConfig, SqlLimits
from dart.data.sqlauth import (
    HASH_ITERATIONS,
    HASH_SCHEME,
    LoginThrottle,
    Unauthorized,
    Writer,
    credentials,
    hash_password,
    needs_password_check,
    role_of,
    writer_from_env,
)
from dart.data.sqlengine import Engine
from dart.data.sqlrequest import (
    NAME,
    TRANSPORT_PARAMS,
    BadRequest,
    BodyTooLarge,
    SqlRequest,
    check_raw_query,
    decompress,
    parse_request,
    split_format,
    trailing_format,
)
from dart.errors import DartError
from dart.web.httplimits import ConnectionLimits, LimitedSite

__all__ = ["HASH_ITERATIONS", "HASH_SCHEME", "TRANSPORT_PARAMS", "BadRequest", "BodyTooLarge", "Engine", "LoginThrottle",
           "Slots", "SqlRequest", "SqlServer", "Unauthorized", "Writer", "credentials", "decompress", "hash_password",
           "parse_request", "role_of", "split_format", "trailing_format", "writer_from_env"]
log = logging.getLogger(__name__)
_CODE = re.compile(r"Code:\s*(\d+)")
_SMALL_BODY = 64 * 1024
"""A plain body up to this size is read on the threads for small requests (``_aux``)."""
_SEND_CHUNK = 1 << 20
_REFUSED_CODES = {  # chdb's own refusals under the settings the endpoint applies, and the rule each enforces
    "164": "read-only, enforced by chdb's readonly = 1",        # READONLY
    "497": "read-only, enforced by chdb's readonly = 1",        # ACCESS_DENIED
    "344": "insert-data-is-data, enforced by input_format_values_interpret_expressions = 0",  # SUPPORT_IS_DISABLED
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
        # Reading requests, checking passwords and killing queries never wait behind running
        # queries, nor behind each other. Compressed bodies are inflated and read on threads of
        # their own at the lowest CPU priority (a client's bombs never take CPU from the projection),
        # large plain ones on threads of their own (reading them is linear, but takes longer): a
        # small request never queues behind either.
        self._inflate = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dart-sql-inflate",
                                           initializer=_lowest_priority)
        self._large = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dart-sql-large")
        self._aux = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dart-sql-aux")
        self._auth = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dart-sql-auth")
        self._killer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dart-sql-kill")
        self.logins = LoginThrottle(lim.max_login_failures, lim.login_failure_window_s)
        self.unsent = 0
        """Bytes of finished results not yet taken by their clients (at most ``max_unsent_bytes``)."""
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
        self._large.shutdown(wait=False, cancel_futures=True)
        self._auth.shutdown(wait=False, cancel_futures=True)
        self._killer.shutdown(wait=False, cancel_futures=True)

    def _release(self, loop: asyncio.AbstractEventLoop, client: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed (the server stopped) first
            asyncio.run_coroutine_threadsafe(self.slots.release(client), loop)

    async def _ping(self, request: web.Request) -> web.Response:
        return web.Response(text="Ok.\n")

    async def _query(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._answer(request)
        except Exception as exc:  # never an unhandled exception: a ClickHouse-style 500, and keep serving
            log.exception("SQL request failed unexpectedly")
            return self._error(f"Code: 1001. DB::Exception: dart SQL endpoint: internal error "
                               f"({type(exc).__name__}). (STD_EXCEPTION)", {})

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        headers = {"X-ClickHouse-Timezone": "UTC", "X-ClickHouse-Server-Display-Name": "dart-chdb"}
        try:
            check_raw_query(request.rel_url.raw_query_string)
            query = {k: v for k, v in request.query.items()}
            query_id = query.get("query_id") or str(uuid.uuid4())
        except (UnicodeError, ValueError) as exc:
            return self._error(f"Code: 27. DB::Exception: bad request: unreadable URL parameters: {exc} "
                               "(rule: malformed-request)", headers, status=400)
        headers["X-ClickHouse-Query-Id"] = query_id if NAME.match(query_id.replace("-", "_")) else "invalid"
        log.debug("%s %s encoding=%s", request.method, query, request.headers.get("Content-Encoding"))
        writer = await self._login(request, query, headers)
        if isinstance(writer, web.Response):
            return writer
        req = await self._read(request, query, headers)
        if isinstance(req, web.Response):
            return req
        client = self.site.client(request)
        if client is None:  # its connection was closed meanwhile (evicted, or the client left)
            raise asyncio.CancelledError
        self.site.busy(request)  # bounded by the slots and the queue: never evicted for a new connection
        lim = self.limits
        try:
            await self.slots.acquire(client, lim.queue_timeout_s)
        except TimeoutError:
            return self._error(f"Code: 202. DB::Exception: {lim.max_concurrent} queries are running "
                               f"(SqlLimits.max_concurrent, {lim.max_concurrent_per_client} per client) and "
                               f"{self.slots.waiting} waiting; retry later. (TOO_MANY_SIMULTANEOUS_QUERIES)", headers,
                               status=503)
        loop = asyncio.get_running_loop()
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
            log.info("refused %s: %s", headers["X-ClickHouse-Query-Id"], exc)
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
        return await self._send(request, data, fmt, headers)

    async def _login(self, request: web.Request, query: dict[str, str], headers: dict[str, str]) -> bool | web.Response:
        """The request's role (True: the writer), or the 401/429 answer. The password check (PBKDF2)
        runs on a thread of its own, and at most ``max_login_failures`` wrong ones per client per
        ``login_failure_window_s``: past that, logins are refused unchecked until the window passes."""
        try:
            user, password = credentials(request.headers, query)
            if not needs_password_check(user, self.writer):
                return role_of(user, password, self.writer)  # no password to check: nothing costly
        except Unauthorized as exc:
            return self._error(f"Code: 516. DB::Exception: {exc}. (AUTHENTICATION_FAILED)", headers, status=401)
        lim = self.limits
        client = self.site.client(request)
        if client is None:  # its connection was closed meanwhile
            raise asyncio.CancelledError
        if (wait := self.logins.retry_after(client)) > 0:
            return self._error(f"Code: 516. DB::Exception: {user}: too many wrong passwords from this client "
                               f"({lim.max_login_failures} in {lim.login_failure_window_s:g} s, "
                               f"SqlLimits.max_login_failures); retry in {wait:.0f} s. (AUTHENTICATION_FAILED)",
                               {**headers, "Retry-After": str(max(1, round(wait)))}, status=429)
        self.logins.begin(client)
        ok = False
        try:
            ok = await asyncio.get_running_loop().run_in_executor(self._auth, role_of, user, password, self.writer)
            return ok
        except Unauthorized as exc:
            return self._error(f"Code: 516. DB::Exception: {exc}. (AUTHENTICATION_FAILED)", headers, status=401)
        finally:
            self.logins.end(client, ok=ok)

    async def _read(self, request: web.Request, query: dict[str, str],
                    headers: dict[str, str]) -> SqlRequest | web.Response:
        """The request's body read, inflated, parsed and pre-checked (size, nesting) before it may
        wait for a query slot (a bomb never holds one), or the 400/403/408/413 answer. All of it
        runs on a worker thread (none of it on the event loop), in time linear in the body."""
        lim = self.limits
        max_body = lim.max_body_bytes
        if request.content_length is not None and request.content_length > max_body:
            # Close the connection rather than read the body to its end to keep it alive.
            headers["Connection"] = "close"
            return self._error(f"Code: 307. DB::Exception: request body of {request.content_length} bytes is over the "
                               f"limit of {max_body} (SqlLimits.max_body_bytes). (TOO_MANY_BYTES)", headers, status=413)
        try:
            raw = await asyncio.wait_for(request.read(), lim.body_timeout_s)
            encoding = request.headers.get("Content-Encoding", "")
            bound = min(max_body, max(len(raw) * lim.max_inflate_ratio, 1 << 16))
            # A small plain body never queues behind large or compressed ones.
            pool = self._inflate if encoding.strip() else self._large if len(raw) > _SMALL_BODY else self._aux
            return await asyncio.get_running_loop().run_in_executor(pool, self._prepare, query, raw, encoding, bound)
        except TimeoutError:
            headers["Connection"] = "close"
            return self._error(f"Code: 159. DB::Exception: the request body did not arrive within {lim.body_timeout_s:g} s "
                               "(SqlLimits.body_timeout_s). (TIMEOUT_EXCEEDED)", headers, status=408)
        except web.HTTPRequestEntityTooLarge:
            return self._error(f"Code: 307. DB::Exception: request body is over the limit of {max_body} bytes "
                               "(SqlLimits.max_body_bytes). (TOO_MANY_BYTES)", headers, status=413)
        except BodyTooLarge as exc:
            return self._error(f"Code: 307. DB::Exception: {exc}. (TOO_MANY_BYTES)", headers, status=413)
        except sqlguard.SqlRefused as exc:
            return self._error(exc.clickhouse_text(), headers, status=403)
        except (DartError, OSError) as exc:
            return self._error(f"Code: 27. DB::Exception: bad request: {exc}", headers, status=400)

    def _prepare(self, query: dict[str, str], raw: bytes, encoding: str, bound: int) -> SqlRequest:
        """Inflate, parse and pre-check one request (blocking; on a worker thread)."""
        req = parse_request(query, decompress(raw, encoding, max_bytes=bound), self.limits.max_query_chars)
        if req.database not in (None, self.database):
            raise sqlguard.SqlRefused("dart-database-only", f"database {req.database} is refused: clients of this "
                                      f"endpoint reach the database {self.database}", code=497, name="ACCESS_DENIED")
        self.engine.precheck(req)
        return req

    async def _send(self, request: web.Request, data: bytes, fmt: str, headers: dict[str, str]) -> web.StreamResponse:
        """Send a result a MiB at a time, within ``max_unsent_bytes`` for all results held for their
        clients and ``send_timeout_s`` a MiB: a client that does not read loses its connection, and
        the memory its result held is free again."""
        lim = self.limits
        if self.unsent + len(data) > lim.max_unsent_bytes:
            return self._error(f"Code: 241. DB::Exception: results not yet taken by their clients hold {self.unsent} "
                               f"bytes; this one ({len(data)} bytes) would pass the limit of {lim.max_unsent_bytes} "
                               "(SqlLimits.max_unsent_bytes); retry later. (MEMORY_LIMIT_EXCEEDED)", headers, status=503)
        ctype = "text/plain; charset=UTF-8" if fmt.startswith(("TabSeparated", "TSV", "CSV", "JSON", "Pretty")) \
            else "application/octet-stream"
        response = web.StreamResponse(headers={**headers, "Content-Type": ctype})
        response.content_length = len(data)
        self.unsent += len(data)
        try:
            view = memoryview(data)
            await asyncio.wait_for(response.prepare(request), lim.send_timeout_s)
            for start in range(0, len(data) if request.method != "HEAD" else 0, _SEND_CHUNK):
                await asyncio.wait_for(response.write(view[start:start + _SEND_CHUNK]), lim.send_timeout_s)
            await asyncio.wait_for(response.write_eof(), lim.send_timeout_s)
        except TimeoutError:
            log.info("closing a connection: its client took no part of its result for %g s (SqlLimits.send_timeout_s)",
                     lim.send_timeout_s)
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError from None
        except ConnectionError:  # the client went away while its result was sent
            raise asyncio.CancelledError from None
        finally:
            self.unsent -= len(data)
        return response

    @staticmethod
    def _error(message: str, headers: dict[str, str], status: int = 500) -> web.Response:
        m = _CODE.search(message)
        code = m.group(1) if m else "1001"
        text = message if message.startswith("Code:") else f"Code: {code}. DB::Exception: {message}"
        return web.Response(status=status, text=text.rstrip() + "\n",
                            headers={**headers, "X-ClickHouse-Exception-Code": code})
