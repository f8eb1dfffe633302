"""`dart metrics`: TensorBoard event files rebuilt from the log, live or from a finished run's archive.

The sink is one more consumer of the log. It follows the task, observation, action, trajectory,
reward, batch, weight, train-metrics, heartbeat and dead-letter topics and folds them into
TensorBoard records: the step of every record is a policy version, its wall time the ``event_time``
of the event that made it.

The fold is a pure function of the events in one canonical order, ``(event_time, event_id)``. After
the fact the archive is read whole and sorted; live, each event waits ``lateness_s`` in a buffer
before it is folded in that order (an event that arrives later than that is folded at once and
counted as late). So a sink that ran during `dart up` and one pointed at the run's archive
afterwards write the same records: same tags, steps, values and wall times.

What the records are and how they are computed: `dart.metrics.fold` (pure). This module reads
the events (the archive, or the live log through the fold's reorder buffer) and writes the records.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dart.blobs import open_store
from dart.config import require
from dart.events import Event
from dart.metrics.fold import Fold, Record, Reorder, Scalar, order_key

log = logging.getLogger(__name__)

FOLLOWED = ("tasks", "env.observations", "rollout.actions", "trajectories", "rewards", "train.batches", "weights",
            "train.metrics", "heartbeats", "dlq")
"""Topic suffixes the sink reads (not rollout.requests: nothing on it is a metric)."""

@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    out_dir: Path
    """Directory of the TensorBoard event files (``RUN_DIR/tensorboard`` under `dart up`)."""
    blobs: str = ""
    """Blob store of the screenshots (``RUN_DIR/blobs``); empty: no pictures."""
    image_every_versions: int = 1
    """Pictures at every this many policy versions."""
    images_per_version: int = 2
    """Trajectories drawn at such a version."""
    lateness_s: float = 30.0
    """Live: how long an event waits before it is folded in event-time order (the display trails
    the run by this much; an event that reaches the sink later than this is late)."""
    stop_timeout_s: float = 15.0
    """On SIGTERM: longest the sink reads on towards the log's end before it writes what it has."""

    def __post_init__(self) -> None:
        require(self.image_every_versions >= 1, "metrics.image_every_versions", "must be >= 1")
        require(self.images_per_version >= 0, "metrics.images_per_version", "must be >= 0")
        require(self.lateness_s >= 0, "metrics.lateness_s", "must be >= 0")


def blob_loader(root: str) -> Callable[[str], bytes | None] | None:
    """Screenshot bytes by digest from the blob store at ``root`` (None: no store, no pictures)."""
    if not root:
        return None

    store = open_store(root)

    def load(digest: str) -> bytes | None:
        try:
            return store.get(digest)
        except Exception:  # a missing or damaged screenshot is drawn as a placeholder
            return None

    return load


def fold_of(cfg: MetricsConfig) -> Fold:
    """The fold ``cfg`` asks for, its screenshots read from the run's blob store."""
    return Fold(load_png=blob_loader(cfg.blobs), image_every_versions=cfg.image_every_versions,
                images_per_version=cfg.images_per_version)


# ---------------------------------------------------------------- the writer


class TensorBoardOut:
    """Records into TensorBoard event files with TensorBoard's own writer."""

    def __init__(self, out_dir: Path, *, fresh: bool = True) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        out_dir.mkdir(parents=True, exist_ok=True)
        if fresh:  # the sink's output is a function of the log: a restart writes it again from offset 0
            for old in out_dir.glob("events.out.tfevents.*"):
                old.unlink()
        self._writer = EventFileWriter(str(out_dir), max_queue_size=1000, flush_secs=5)
        self.written = 0

    def write(self, records: Iterable[Record]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event as TbEvent
        from tensorboard.compat.proto.summary_pb2 import Summary

        for r in records:
            if isinstance(r, Scalar):
                value = Summary.Value(tag=r.tag, simple_value=r.value)
            else:
                value = Summary.Value(tag=r.tag, image=Summary.Image(
                    height=r.height, width=r.width, colorspace=3, encoded_image_string=r.png))
            self._writer.add_event(TbEvent(wall_time=r.wall_ms / 1000, step=r.step, summary=Summary(value=[value])))
            self.written += 1

    def close(self) -> None:
        self._writer.close()


# ---------------------------------------------------------------- after the fact


def archive_events(log_dir: Path) -> list[Event]:
    """The followed topics' events of an archive, in the fold's canonical order."""
    # Deferred: loads the Kafka clients and fastavro, needed only here.
    from dart.data.replay import archived_events

    events = [event for topic, event in archived_events(log_dir) if topic.endswith(tuple(f".{s}" for s in FOLLOWED))]
    events.sort(key=order_key)
    return events


def from_archive(log_dir: Path, cfg: MetricsConfig) -> dict[str, int]:
    """Write the run's TensorBoard records from its archive (no broker needed)."""
    # Deferred: loads fastavro, needed only here.
    from dart.log import ArchiveError, list_segments

    if not list_segments(log_dir):
        raise ArchiveError(f"{log_dir}: no archive files to read")
    fold = fold_of(cfg)
    out = TensorBoardOut(Path(cfg.out_dir))
    try:
        for event in archive_events(log_dir):
            out.write(fold.feed(event))
        out.write(fold.finish())
    finally:
        out.close()
    log.info("metrics: %d events of %s folded into %d TensorBoard records in %s", fold.folded, log_dir,
             out.written, cfg.out_dir)
    return {"events": fold.folded, "records": out.written}


# ---------------------------------------------------------------- live


class LiveSink:
    """Follows the followed topics of ``bus`` from their first offsets (no consumer group position:
    a restarted sink rebuilds its files from the log) until ``stop()``; then reads on to the log's end."""

    def __init__(self, cfg: MetricsConfig, bus: Any) -> None:
        self.cfg = cfg
        self.bus = bus
        self._stop = threading.Event()
        self.fold = fold_of(cfg)
        self.reorder = Reorder(int(cfg.lateness_s * 1000))

    def stop(self) -> None:
        self._stop.set()

    def run(self, *, on_record: Callable[[str, int], None] | None = None) -> dict[str, int]:
        # Deferred: loads the Kafka clients and fastavro, needed only here.
        from dart.bus import SLOW_FETCH_WAIT_MS, read_topic

        topics = [self.bus.topics.name(s) for s in FOLLOWED]
        out = TensorBoardOut(Path(self.cfg.out_dir))

        def due() -> None:  # after each fetch, records or none: what is late enough is written on time
            for event in self.reorder.due(int(time.time() * 1000)):
                out.write(self.fold.feed(event))

        async def follow() -> None:
            async for d in read_topic(self.bus, topics, follow=lambda: not self._stop.is_set(),
                                      end_timeout_s=self.cfg.stop_timeout_s, after_fetch=due,
                                      fetch_max_wait_ms=SLOW_FETCH_WAIT_MS):
                if on_record is not None:
                    on_record(d.topic, 1)
                for late in self.reorder.push(d.event):
                    log.warning("metrics: %s %s reached the sink %d ms after its time; folded out of order",
                                type(late).__name__, late.event_id, int(time.time() * 1000) - late.event_time)
                    out.write(self.fold.feed(late))

        try:
            asyncio.run(follow())
            for event in self.reorder.drain():
                out.write(self.fold.feed(event))
            out.write(self.fold.finish())
        finally:
            out.close()
        log.info("metrics: stopped; %d events folded into %d records (%d late)", self.fold.folded, out.written,
                 self.reorder.late)
        return {"events": self.fold.folded, "records": out.written, "late": self.reorder.late}


def run_live(cfg: MetricsConfig, bus: Any) -> int:
    """The `dart metrics` service: SIGTERM/SIGINT read on to the log's end, write, exit 0."""
    # Deferred: loads the Kafka clients and fastavro, needed only here.
    from dart.bus.prom import RECORDS_IN

    sink = LiveSink(cfg, bus)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sink.stop())
    log.info("metrics: TensorBoard files of %s.* into %s (pid %d)", bus.prefix, cfg.out_dir, os.getpid())
    group = f"{bus.prefix}-metrics"
    sink.run(on_record=lambda topic, n: RECORDS_IN.labels(group, topic).inc(n))
    return 0
