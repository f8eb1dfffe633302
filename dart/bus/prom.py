"""Prometheus metrics of every long-lived service, with the standard client library.

The bus counts for every service that uses it (the hooks below are called from
``dart.bus.consumer`` and ``dart.bus.producer``): records in per topic and consumer group, records
out per topic, handler latency, records in hand, consumer lag per group and partition, dead
letters; and from the events a service produces, the trainer's step time and a rollout worker's
weight-sync time.

A service started by `dart` (``dart env-worker``, ``dart train``, ...) serves them on
``http://$DART_METRICS_HOST:PORT/metrics`` (127.0.0.1 unless told) when ``DART_METRICS_PORT`` or
``DART_METRICS_DIR`` is set; port 0 lets the OS choose, and the chosen port is written to
``$DART_METRICS_DIR/<service>.port`` (``<service>`` is ``$DART_SERVICE`` or the command and its
pid), where `dart up` and a scraper find it: several workers and replicas share one host.
`dart up` sets ``DART_METRICS_DIR=RUN_DIR/metrics`` for its services.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app

from dart.events import TrainStepCompleted, WeightsLoaded

log = logging.getLogger(__name__)

SERVICES = frozenset({"env-worker", "rollout-worker", "train", "data-manager", "archiver", "metrics", "serve"})
"""`dart` commands that run until stopped: they serve /metrics when asked to."""
LAG_INTERVAL_S = 1.0
"""Consumer lag is read from the client (no broker request) at most this often per consumer."""

RECORDS_IN = Counter("dart_records_consumed", "Records fetched by a consumer group, per topic",
                     ["group", "topic"])
RECORDS_OUT = Counter("dart_records_produced", "Records handed to the producer, per topic", ["topic"])
HANDLER_SECONDS = Histogram("dart_handler_seconds", "Time a consumer's handler took per call (a record or a batch)",
                            ["group"], buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
IN_FLIGHT = Gauge("dart_in_flight", "Handler calls of a consumer group in progress", ["group"])
LAG = Gauge("dart_consumer_lag", "Records on the broker the group has not yet read (high watermark - position)",
            ["group", "topic", "partition"])
DEAD_LETTERS = Counter("dart_dead_letters", "Records sent to the dead-letter topic", ["group", "stage"])
TRAIN_STEP_SECONDS = Histogram("dart_trainer_step_seconds", "Trainer update time (prepare + update) per step",
                               buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300))
WEIGHT_SYNC_SECONDS = Histogram("dart_weight_sync_seconds", "Weight fetch + swap time of a policy version",
                                ["worker"], buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))

_lag_read: dict[int, float] = {}


# ---------------------------------------------------------------- hooks (dart.bus)


def consumed(group: str, batches: dict[Any, list[Any]]) -> None:
    """A fetch: ``{TopicPartition: [records]}``."""
    for tp, records in batches.items():
        RECORDS_IN.labels(group, tp.topic).inc(len(records))


def produced(topic: str) -> None:
    RECORDS_OUT.labels(topic).inc()


def event_produced(event: Any) -> None:
    """Timings the produced events carry (the trainer's step, a worker's weight swap)."""
    if isinstance(event, TrainStepCompleted):
        TRAIN_STEP_SECONDS.observe(event.duration_s)
    elif isinstance(event, WeightsLoaded) and event.ok:
        WEIGHT_SYNC_SECONDS.labels(event.worker_id).observe(event.fetch_s + event.swap_s)


@contextlib.contextmanager
def handling(group: str) -> Iterator[None]:
    """Around one handler call: in flight while it runs, its duration into the histogram."""
    gauge = IN_FLIGHT.labels(group)
    gauge.inc()
    start = time.perf_counter()
    try:
        yield
    finally:
        HANDLER_SECONDS.labels(group).observe(time.perf_counter() - start)
        gauge.dec()


def dead_lettered(group: str, stage: str) -> None:
    DEAD_LETTERS.labels(group, stage).inc()


async def lag(consumer: Any, group: str) -> None:
    """Consumer lag of every assigned partition (aiokafka's last fetched high watermark minus its
    position; no broker request), at most every ``LAG_INTERVAL_S``."""
    now = time.monotonic()
    if now - _lag_read.get(id(consumer), 0.0) < LAG_INTERVAL_S:
        return
    _lag_read[id(consumer)] = now
    for tp in consumer.assignment():
        hw = consumer.highwater(tp)
        if hw is None:
            continue
        position = await consumer.position(tp)
        LAG.labels(group, tp.topic, str(tp.partition)).set(max(0, hw - position))


# ---------------------------------------------------------------- the exporter


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape is not worth a log line."""


class BoundedMetricsServer(WSGIServer):
    """The /metrics HTTP server with bounded connections: at most ``max_connections`` served at
    once (a thread each; past it a new one is closed at once), every socket read timing out after
    ``timeout_s``, and any connection still open ``deadline_s`` after it was accepted shut down (a
    client sending one byte at a time). prometheus_client's own server starts a thread for every
    connection and keeps idle ones open for ever."""

    max_connections = 16
    request_queue_size = 64  # listen backlog: accepted (and refused past the limit) rather than left in SYN retries
    timeout_s = 5.0
    deadline_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._open: dict[socket.socket, float] = {}
        self.refused = 0
        threading.Thread(target=self._reap, name="dart-metrics-reaper", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._open) >= self.max_connections:
                self.refused += 1
                self.shutdown_request(request)
                return
            self._open[request] = time.monotonic()
        request.settimeout(self.timeout_s)
        threading.Thread(target=self._serve, args=(request, client_address), name="dart-metrics",
                         daemon=True).start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # a client that timed out or went away
            log.debug("metrics request from %s failed", client_address, exc_info=True)
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._open.pop(request, None)

    def _reap(self) -> None:
        while True:
            time.sleep(min(1.0, self.deadline_s / 4))
            now = time.monotonic()
            with self._lock:
                late = [s for s, t in self._open.items() if now - t > self.deadline_s]
            for s in late:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)


def serve_metrics(host: str, port: int) -> BoundedMetricsServer:
    """Serve the default registry on ``host:port`` (0: the OS chooses) from a daemon thread."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("MetricsServer", (BoundedMetricsServer,), {"address_family": family})
    server = make_server(host, port, make_wsgi_app(), server_class, handler_class=_QuietHandler)
    assert isinstance(server, BoundedMetricsServer)
    threading.Thread(target=server.serve_forever, name="dart-metrics-server", daemon=True).start()
    return server


def service_name(command: str) -> str:
    return os.environ.get("DART_SERVICE") or f"{command}-{os.getpid()}"


def start_exporter(name: str, *, port: int | None = None, host: str | None = None,
                   port_dir: Path | None = None) -> int:
    """Serve /metrics on ``host:port`` (port 0: the OS chooses) and write the chosen port to
    ``port_dir/<name>.port`` (atomically: a reader never sees half a number). Returns the port."""
    host = host or os.environ.get("DART_METRICS_HOST", "127.0.0.1")
    port = int(os.environ.get("DART_METRICS_PORT", "0")) if port is None else port
    server = serve_metrics(host, port)
    chosen = int(server.server_port)
    if port_dir is not None:
        port_dir.mkdir(parents=True, exist_ok=True)
        tmp = port_dir / f".{name}.port.tmp"
        tmp.write_text(f"{chosen}\n")
        os.replace(tmp, port_dir / f"{name}.port")
    log.info("prometheus metrics on http://%s:%d/metrics", host, chosen)
    return chosen


def maybe_start_exporter(command: str) -> int | None:
    """For a long-lived `dart` command, when ``DART_METRICS_PORT`` or ``DART_METRICS_DIR`` asks for it."""
    port_dir = os.environ.get("DART_METRICS_DIR")
    if command not in SERVICES or not (port_dir or os.environ.get("DART_METRICS_PORT")):
        return None
    return start_exporter(service_name(command), port_dir=Path(port_dir) if port_dir else None)


def read_ports(port_dir: Path) -> dict[str, int]:
    """service name -> port, from the port files a run's services wrote."""
    out = {}
    for path in sorted(Path(port_dir).glob("*.port")):
        text = path.read_text().strip()
        if text.isdigit():
            out[path.stem] = int(text)
    return out
