"""The dev broker's TLS (``DevBroker(tls=...)``, ``DART_DEV_BROKER_TLS=1``): a throwaway CA
with server and client certificates, and the front that terminates TLS for tansu (whose CLI
cannot take ``--cert`` and ``--key`` together) and forwards to it byte for byte; why it is there
and what it stops: :mod:`dart.bus.broker`."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dart.bus.private_broker import splice
from dart.errors import BusError, ToolMissing
from dart.web.httplimits import ConnectionLimits, descriptor_cap


@dataclass(frozen=True)
class BrokerTls:
    """A server certificate and key for the dev broker, the CA clients trust it with, and (for
    mutual TLS) a client certificate and key signed by that CA: the front then refuses clients
    without one."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_cert_file: Path | None = None
    client_key_file: Path | None = None


def throwaway_tls(directory: Path, *, name: str = "dart-dev") -> BrokerTls:
    """A fresh CA and a server certificate for 127.0.0.1/localhost signed by it (``openssl``,
    one day; keys mode 0600). For tests and the dev broker only."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    ext = d / f"{name}-ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    client_ext = d / f"{name}-client-ext.cnf"
    client_ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                          "extendedKeyUsage=clientAuth\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem",
         "-days", "1", "-subj", f"/CN={name} throwaway CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.pem", "-CAkey", f"{name}-ca.key", "-CAcreateserial",
         "-out", f"{name}.pem", "-days", "1", "-extfile", ext.name],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-client.key", "-out", f"{name}-client.csr",
         "-subj", "/CN=dart client"],
        ["x509", "-req", "-in", f"{name}-client.csr", "-CA", f"{name}-ca.pem", "-CAkey", f"{name}-ca.key",
         "-CAcreateserial", "-out", f"{name}-client.pem", "-days", "1", "-extfile", client_ext.name],
    ]
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ToolMissing("openssl is needed to make the dev broker's throwaway certificate (apt-get install openssl)")
    for argv in steps:
        done = subprocess.run([openssl, *argv], cwd=d, capture_output=True, text=True, check=False)
        if done.returncode:
            raise BusError(f"openssl {argv[0]} failed: {done.stderr.strip()}")
    for key in (d / f"{name}-ca.key", d / f"{name}.key", d / f"{name}-client.key"):
        key.chmod(0o600)
    return BrokerTls(d / f"{name}.pem", d / f"{name}.key", d / f"{name}-ca.pem", d / f"{name}-client.pem",
                     d / f"{name}-client.key")


class TlsFront:
    """TLS on ``port`` (loopback), forwarded byte for byte to the broker: the Unix socket
    ``target`` (a path) or a plaintext loopback port (an int). With a client certificate in
    ``tls``, a client must present one signed by the same CA (see the module docstring). Runs its
    own event loop in a thread.

    Bounded like dart's HTTP servers (``limits``, :mod:`dart.web.httplimits`): a handshake must end
    ``header_timeout_s`` after the connection opened, and at most ``max_connections`` are open (never
    more than a quarter of the descriptor limit); past it a new connection takes the place of the one
    that has waited longest for its handshake, or is closed when every one has finished its
    handshake. A client's established connections are never closed for another's (a Kafka client
    keeps its connections for the life of the process)."""

    def __init__(self, port: int, target: int | Path, tls: BrokerTls, limits: ConnectionLimits | None = None) -> None:
        self.port, self.target, self.tls = port, target, tls
        self.limits = limits or ConnectionLimits()
        self.max_connections = descriptor_cap(self.limits.max_connections)
        self.open = 0
        self._evicted: set[asyncio.Transport] = set()
        self.refused = self.evicted = self.timed_out = 0
        """Connections closed at once (all past their handshake), for a newer one, for a late handshake."""
        self._handshaking: dict[asyncio.Transport, float] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        """One per open connection."""
        self._context: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> TlsFront:
        context = self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        if self.tls.client_cert_file is not None:
            context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the CA's client certificate or nothing
            context.load_verify_locations(cafile=str(self.tls.ca_file))
        started = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                # Plain TCP here, TLS in _serve: a connection is counted from its accept, not from
                # the end of a handshake it may never begin.
                server = loop.run_until_complete(loop.create_server(lambda: _Accepted(self), "127.0.0.1", self.port,
                                                                    backlog=min(self.max_connections, 1024)))
            except OSError as exc:
                errors.append(exc)
                started.set()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close(server))
                loop.close()

        self._thread = threading.Thread(target=run, name="dart-tls-front", daemon=True)
        self._thread.start()
        started.wait(10)
        if errors:
            raise BusError(f"TLS front on port {self.port}: {errors[0]}")
        return self

    @staticmethod
    async def _close(server: asyncio.Server) -> None:
        server.close()
        tasks = asyncio.all_tasks() - {asyncio.current_task()}  # the connections' own
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    def _make_room(self) -> bool:
        """Close the connection waiting longest for its handshake; False if none is."""
        if not self._handshaking:
            return False
        oldest = min(self._handshaking, key=self._handshaking.__getitem__)
        self._handshaking.pop(oldest)
        oldest.abort()
        # Its place is free now, not when its task next runs: under load several newcomers can be
        # accepted before the evicted tasks wake, and each must find the count already down.
        self._evicted.add(oldest)
        self.open -= 1
        self.evicted += 1
        return True

    async def serve_accepted(self, transport: asyncio.Transport) -> None:
        if self.open >= self.max_connections and not self._make_room():
            self.refused += 1
            transport.abort()
            return
        self.open += 1
        try:
            streams = await self._handshake(transport)
            if streams is not None:
                await self._forward(*streams)
        finally:
            if transport in self._evicted:  # already uncounted by _make_room
                self._evicted.discard(transport)
            else:
                self.open -= 1

    async def _handshake(self, transport: asyncio.Transport) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """TLS over the accepted ``transport`` within ``header_timeout_s``: the client's streams, or
        None (a late or failed handshake, or one closed for a newer connection)."""
        assert self._context is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = _TlsStream(reader)
        self._handshaking[transport] = time.monotonic()
        try:
            tls = await asyncio.wait_for(loop.start_tls(transport, protocol, self._context, server_side=True),
                                         self.limits.header_timeout_s)
        except TimeoutError:
            self.timed_out += 1
            tls = None
        except (OSError, ssl.SSLError, EOFError):  # refused certificate, plaintext client, evicted
            tls = None
        finally:
            self._handshaking.pop(transport, None)
        if tls is None:
            transport.abort()
            return None
        protocol.connection_made(tls)  # start_tls hands the protocol its transport without this call
        return reader, asyncio.StreamWriter(tls, protocol, reader, loop)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if isinstance(self.target, Path):
                up_reader, up_writer = await asyncio.open_unix_connection(str(self.target))
            else:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await splice(reader, writer, up_reader, up_writer)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._loop = self._thread = None


class _TlsStream(asyncio.StreamReaderProtocol):
    """A stream over TLS from its first byte: the end of the stream closes the connection (a
    plain stream's protocol would ask to keep it half open, which TLS cannot)."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False


class _Accepted(asyncio.Protocol):
    """A connection the TLS front accepted, not yet read: reading waits for the TLS handshake (its
    ClientHello must reach ``start_tls``, not a stream reader's buffer)."""

    def __init__(self, front: TlsFront) -> None:
        self.front = front

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        task = asyncio.get_running_loop().create_task(self.front.serve_accepted(transport))
        self.front.tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self.front.tasks.discard)
