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

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from dart.events import TrainStepCompleted, WeightsLoaded
from dart.web.httplimits import ConnectionLimits, LimitedSite

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


class MetricsServer:
    """/metrics of the default registry, served on an event loop of its own in a daemon thread
    within the limits every dart HTTP server has (:mod:`dart.web.httplimits`): at most
    ``max_connections`` open (a new one takes the place of the longest idle or half-sent one, so a
    scrape always gets in), a request head complete ``header_timeout_s`` after its first byte, an
    idle connection closed after ``idle_timeout_s``, and no foreign Host or Origin (a web page
    renaming itself to this address gets a 403). prometheus_client's own server starts a thread
    for every connection and keeps idle ones open for ever."""

    LIMITS = ConnectionLimits(max_connections=16, header_timeout_s=5.0, idle_timeout_s=10.0)

    def __init__(self, host: str, port: int, limits: ConnectionLimits | None = None) -> None:
        self.site = LimitedSite(limits or self.LIMITS)
        self.server_port = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self.server_port = self._loop.run_until_complete(self.site.serve(_metrics_app(), host, port))
            except OSError as exc:
                errors.append(exc)
                return
            finally:
                started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="dart-metrics-server", daemon=True)
        self._thread.start()
        started.wait(10)
        if errors:
            raise errors[0]

    @property
    def open_connections(self) -> int:
        return len(self.site.guards)

    def shutdown(self) -> None:
        """Close every connection and the port, and end the thread."""

        async def stop() -> None:
            await self.site.stop()
            self._loop.stop()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self._loop)
            self._thread.join(5)


def _metrics_app() -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(REGISTRY), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", metrics)
    return app


def serve_metrics(host: str, port: int, limits: ConnectionLimits | None = None) -> MetricsServer:
    """Serve the default registry on ``host:port`` (0: the OS chooses) from a daemon thread."""
    return MetricsServer(host, port, limits)


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
