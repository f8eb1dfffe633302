"""Connection limits for dart's aiohttp servers (the SQL endpoint, ``dart serve``, /metrics, the
guest agent), and the ``Host``/``Origin`` check (:mod:`dart.web.hostcheck`) on every request.

aiohttp alone keeps a connection that sends half a request head open for as long as the client
likes, and accepts connections until the process runs out of file descriptors (and with it
everything else in the process: the data manager's projection shares them). ``LimitedSite``
serves an ``AppRunner``'s handlers on a bound socket with:

- at most ``max_connections`` open at once, never more than a quarter of the process's
  descriptor limit; a new connection past it takes the place of the one that has waited longest
  without a handler holding or awaiting work (``busy``: a query slot), so half-sent requests and
  idle connections cannot lock clients out (one whose request has not begun goes first); when
  every connection is busy, the new one is closed;
- a client (on loopback: the user owning the peer socket, from ``/proc/net/tcp``; else the peer
  address) holding the most connections is the one that loses its oldest idle one;
- a request head that must be complete ``header_timeout_s`` after its first byte;
- a connection with no request in progress closed after ``idle_timeout_s`` (a client that
  stops reading its response counts as idle too).

A request's body and its run are the handler's to bound (the SQL endpoint reads the body under
a deadline and bounds each query). ``serve`` binds a socket and serves an application this way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from dart.web.hostcheck import HostCheck

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 256
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0


def descriptor_cap(wanted: int) -> int:
    """``wanted`` connections, or a quarter of the descriptor limit if lower (after raising the
    soft limit to the hard one): the rest stays for the process's own files and sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return max(1, min(wanted, soft // 4)) if soft != resource.RLIM_INFINITY else wanted


def _hex_addr(addr: tuple[str, int]) -> str | None:
    try:
        return f"{socket.inet_aton(addr[0])[::-1].hex().upper()}:{addr[1]:04X}"
    except OSError:
        return None


class SocketOwners:
    """User ids owning this host's IPv4 TCP connections, by (local, remote) address
    (``/proc/net/tcp``), read again when a connection is not in it (at most every ``min_age_s``
    unless asked for ``fresh``): on loopback every client has the same address, its user tells
    clients apart (processes of one user are one client)."""

    def __init__(self, min_age_s: float = 0.2) -> None:
        self.min_age_s = min_age_s
        self._table: dict[tuple[str, str], int] = {}
        self._read_at = -1e9

    def _read(self) -> None:
        table = {}
        try:
            with open("/proc/net/tcp") as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 7 and parts[3] == "01":  # ESTABLISHED (a TIME_WAIT entry has no owner)
                        table[parts[1], parts[2]] = int(parts[7])
        except (OSError, ValueError):
            return
        self._table, self._read_at = table, time.monotonic()

    def uid(self, peer: tuple[str, int], ours: tuple[str, int], *, fresh: bool = False) -> int | None:
        """The owner of the client's socket of the connection ``peer`` -> ``ours``."""
        key = (_hex_addr(peer), _hex_addr(ours))
        if None in key:
            return None
        if key not in self._table and (fresh or time.monotonic() - self._read_at > self.min_age_s):
            self._read()
        return self._table.get(key)  # type: ignore[call-overload]


class _Guard(asyncio.Protocol):
    """Wraps one aiohttp request handler: counts the connection and times its request heads."""

    def __init__(self, site: LimitedSite, inner: Any) -> None:
        self.site = site
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.in_request = False
        self.busy = False
        """A handler holds or awaits work for it (``LimitedSite.busy``): never evicted."""
        self.partial_since: float | None = None
        self.idle_since = time.monotonic()
        self.since = self.idle_since
        """When it last changed state (opened, began a head, began a request, answered)."""
        self.peer: Any = None
        self.ours: Any = None
        self._client: Any = None

    def client_key(self, *, fresh: bool = False) -> Any:
        """``("uid", N)`` for a loopback peer whose socket owner is known, else ``("ip", address)``
        (a loopback owner not found yet is looked up again next time)."""
        if self._client is not None:
            return self._client
        if not self.peer:
            return ("ip", "?")
        if not str(self.peer[0]).startswith("127."):
            self._client = ("ip", self.peer[0])
            return self._client
        uid = self.site.owners.uid(self.peer, self.ours, fresh=fresh) if self.ours else None
        if uid is None:
            return ("ip", self.peer[0])
        self._client = ("uid", uid)
        return self._client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if len(self.site.guards) >= self.site.max_connections and not self.site.evict_one():
            self.site.refused += 1
            transport.abort()
            return
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.ours = transport.get_extra_info("sockname")
        self.site.guards[self.inner] = self
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        self.site.guards.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.in_request and self.partial_since is None:
            self.partial_since = self.since = time.monotonic()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def expired(self, now: float, limits: ConnectionLimits) -> str | None:
        if self.in_request:
            return None
        if self.partial_since is not None and now - self.partial_since > limits.header_timeout_s:
            return "request head not complete in time"
        if self.partial_since is None and now - self.idle_since > limits.idle_timeout_s:
            return "idle"
        return None


class LimitedSite:
    """Serve ``runner`` (set up, its app with ``self.middleware``) on ``sock`` within ``limits``,
    answering only requests ``hosts`` allows (default: ``HostCheck.from_env()``) and, with
    ``only_uid``, only connections from that user's sockets on loopback (a 403 otherwise)."""

    def __init__(self, limits: ConnectionLimits, *, hosts: HostCheck | None = None,
                 only_uid: int | None = None) -> None:
        self.limits = limits
        self.hosts = HostCheck.from_env() if hosts is None else hosts
        self.only_uid = only_uid
        self.max_connections = descriptor_cap(limits.max_connections)
        self.guards: dict[Any, _Guard] = {}
        self.refused = 0
        """Connections closed at once because ``max_connections`` were open and busy."""
        self.evicted = 0
        """Connections closed to make room for a new one."""
        self.owners = SocketOwners()
        self.expired = 0
        """Connections closed for a late request head or idleness."""
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        """The runner ``serve`` made (``stop`` cleans it up)."""

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        guard = self.guards.get(request.protocol)
        if guard is not None:
            guard.in_request, guard.partial_since, guard.since = True, None, time.monotonic()
        try:
            refusal = self.refusal(request)
            if refusal is not None:
                log.warning("refused %s %s: %s", request.method, request.path, refusal)
                return web.Response(status=403, text=refusal + "\n")
            return await handler(request)
        finally:
            if guard is not None:
                guard.in_request, guard.busy = False, False
                guard.idle_since = guard.since = time.monotonic()

    def refusal(self, request: web.Request) -> str | None:
        """Why ``request`` is not answered (its Host, its Origin, its user), None if it is."""
        why = self.hosts.refusal(request.headers.get("Host"), request.headers.get("Origin"))
        if why is not None or self.only_uid is None:
            return why
        kind, who = self.client(request) or ("ip", "?")
        if (kind, who) == ("uid", self.only_uid):
            return None
        return (f"this server has no credential to check and answers only processes of uid {self.only_uid} on "
                f"loopback; this connection is {f'uid {who}' if kind == 'uid' else f'from {who}, owner unknown'}")

    def busy(self, request: web.Request, busy: bool = True) -> None:
        """Mark ``request``'s connection as holding or awaiting bounded work (a query slot): it is
        then never evicted for a new connection (the work's own bounds limit how many are)."""
        guard = self.guards.get(request.protocol)
        if guard is not None:
            guard.busy = busy

    def client(self, request: web.Request) -> Any:
        """Who ``request`` comes from (see ``_Guard.client_key``); None once its connection is gone."""
        guard = self.guards.get(request.protocol)
        return guard.client_key(fresh=True) if guard is not None else None

    def evict_one(self) -> bool:
        """Close one connection of the client holding the most: the one that has waited longest
        without being busy (one whose request has not begun first); False if all are busy."""
        victims = [g for g in self.guards.values() if not g.busy and g.transport is not None]
        if not victims:
            return False
        keys = {g: g.client_key() for g in self.guards.values()}
        held = collections.Counter(keys.values())
        heaviest = max(held[keys[g]] for g in victims)
        victim = min((g for g in victims if held[keys[g]] == heaviest), key=lambda g: (g.in_request, g.since))
        self.evicted += 1
        self.guards.pop(victim.inner, None)
        assert victim.transport is not None
        victim.transport.abort()
        return True

    async def start(self, runner: web.AppRunner, sock: socket.socket) -> None:
        server = runner.server
        assert server is not None, "set the runner up first"
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Guard(self, server()), sock=sock,
                                                backlog=min(self.max_connections, 1024))
        self._sweeper = asyncio.create_task(self._sweep())

    async def serve(self, app: web.Application, host: str, port: int, **runner_kwargs: Any) -> int:
        """Serve ``app`` (not yet started: this site's middleware goes first in it) on ``host:port``
        (0: a free port); returns the bound port. ``stop`` stops it all."""
        app.middlewares.insert(0, self.middleware)
        # After a refusal (a 403, a late body) drain the unread body for at most a second, not
        # aiohttp's 10 s, then drop the connection.
        runner_kwargs.setdefault("lingering_time", 1.0)
        self._runner = web.AppRunner(app, access_log=None, **runner_kwargs)
        await self._runner.setup()
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            await self._runner.cleanup()
            raise
        await self.start(self._runner, sock)
        return int(sock.getsockname()[1])

    async def _sweep(self) -> None:
        period = min(self.limits.header_timeout_s, self.limits.idle_timeout_s, 1.0) / 2
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for guard in list(self.guards.values()):
                why = guard.expired(now, self.limits)
                if why is not None and guard.transport is not None:
                    self.expired += 1
                    log.debug("closing a connection: %s", why)
                    guard.transport.abort()

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            self._server.close()
            for guard in list(self.guards.values()):
                if guard.transport is not None:
                    guard.transport.abort()
            await self._server.wait_closed()
        if self._runner is not None:
            await self._runner.cleanup()
