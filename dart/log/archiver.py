"""The archiver: every topic of a prefix, continuously, into Avro files under ``LOG_DIR``.

Kafka Connect's sink pattern, exactly-once by construction: the archive itself is the
archiver's position (the next offset of a partition is its last archived offset + 1), so a
restart after ``kill -9`` resumes where the files end and never writes an offset twice. No
consumer-group commit is involved.

Records are buffered per partition and written as one finished file when the oldest buffered
record is ``flush_interval_s`` old or the buffer holds ``segment_records``: what the broker
acknowledged but the archiver has not yet written is the window a broker crash can lose, and
``flush_interval_s`` bounds it. Small files are merged in tiers (``merge_count`` files of one
size class into one of the next), so a partition holds tens of files, not one per second,
and each record is rewritten only a few times.

One line per file written, and ``LOG_DIR/_archiver.json`` (positions, lag, counts) after each.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as _KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dart.bus.config import BusConfig
from dart.config import require
from dart.events import registry
from dart.log.segments import (
    ArchiveError,
    Segment,
    archive_record,
    event_type_of,
    list_segments,
    read_partition,
    repair,
    write_segment,
)

log = logging.getLogger(__name__)

PARTITION_EOF = getattr(KafkaError, "_PARTITION_EOF")  # noqa: B009 - librdkafka names its local codes with "_"

STATUS_FILE = "_archiver.json"
GROUPS_FILE = "_groups.json"
"""Committed offsets of every consumer group on the prefix's topics, as last seen: a broker
rebuilt from the archive gets them back, so services resume where they were, not at 0."""


@dataclass(frozen=True, kw_only=True)
class ArchiverConfig:
    log_dir: Path
    """Directory of the archive (``RUN_DIR/log`` under ``dart up``)."""
    flush_interval_s: float = 1.0
    """Longest a fetched record waits in memory before it is in a finished file: the bound on
    what a broker crash can lose beyond what the archiver had fetched."""
    segment_records: int = 200_000
    """Most records in one file; merges stop growing a file past this."""
    merge_count: int = 10
    """This many trailing files of one size class are merged into one."""
    fsync: bool = True
    """fsync each file and its directory before it counts as archived (survives power loss,
    not only a killed process)."""
    metadata_interval_s: float = 2.0
    """How often new topics and partitions of the prefix are looked for."""
    groups_interval_s: float = 2.0
    """How often the consumer groups' committed offsets are saved (``_groups.json``)."""
    drain_s: float = 5.0
    """On stop, fetch on until every partition's end is archived, for at most this long: stopped
    after the services that write (as compose stops it), the archiver leaves out nothing the
    broker held (a dev broker's log lives in memory). 0: stop at once."""

    def __post_init__(self) -> None:
        require(self.flush_interval_s > 0, "archiver.flush_interval_s", "must be > 0")
        require(self.segment_records >= 1, "archiver.segment_records", "must be >= 1")
        require(self.merge_count >= 2, "archiver.merge_count", "must be >= 2")
        require(self.drain_s >= 0, "archiver.drain_s", "must be >= 0")


def size_class(records: int, merge_count: int) -> int:
    """0 for 1..m-1 records, 1 for m..m²-1, ... (m = merge_count): files of one class merge together."""
    return int(math.log(max(1, records), merge_count) + 1e-9)


def merge_plan(records: list[int], merge_count: int, limit: int) -> int:
    """How many trailing files (sizes ``records``, oldest first) to merge into one: 0 for none.

    The trailing run of files of the smallest class merges once it is ``merge_count`` long and
    the result stays within ``limit`` records (pure; the archiver repeats it until it says 0).
    """
    if len(records) < merge_count:
        return 0
    tail = records[-merge_count:]
    classes = {size_class(n, merge_count) for n in tail}
    if len(classes) != 1 or sum(tail) > limit:
        return 0
    return merge_count


@dataclass
class _Partition:
    next_offset: int
    buffer: list[dict[str, Any]] = field(default_factory=list)
    oldest_at: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    high_watermark: int = 0
    assigned: bool = False
    probe: bytes | None = None
    """The last archived value, until the broker has shown it holds the same record there."""
    probe_since: float = 0.0


class Archiver:
    """Archives every topic named ``<prefix>.*`` on the broker of ``bus``."""

    def __init__(self, cfg: ArchiverConfig, bus: BusConfig) -> None:
        self.cfg = cfg
        self.bus = bus
        self.log_dir = Path(cfg.log_dir)
        self._stop = threading.Event()
        self._names = registry().names_by_fingerprint()
        self.parts: dict[tuple[str, int], _Partition] = {}
        self.archived = 0
        self.files_written = 0
        self.max_lag = 0
        """Most records fetched but not yet in a finished file at any moment."""

    def stop(self) -> None:
        """Write what is buffered and return from ``run``. Safe from a signal handler."""
        self._stop.set()

    # ------------------------------------------------------------------ positions

    def _load_positions(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for path in repair(self.log_dir):
            log.info("archive repair: removed %s (left by an interrupted write or merge)", path)
        for (topic, part), segs in list_segments(self.log_dir).items():
            self.parts[(topic, part)] = _Partition(next_offset=segs[-1].last + 1, segments=list(segs))

    def _assign_new(self, consumer: _KafkaConsumer) -> None:
        meta = consumer.list_topics(timeout=5.0)
        new = []
        for name, topic in meta.topics.items():
            if not name.startswith(f"{self.bus.prefix}.") or topic.error is not None:
                continue
            for p in topic.partitions:
                state = self.parts.get((name, p))
                if state is None:
                    state = self.parts[(name, p)] = _Partition(next_offset=0)
                if not state.assigned:
                    # Start one record early: the broker must serve the last archived record, with
                    # the same bytes, before anything after it is archived (see _take).
                    start = state.next_offset
                    if state.segments:
                        state.probe = _last_value(state.segments[-1])
                        state.probe_since = time.monotonic()
                        start -= 1
                    new.append(TopicPartition(name, p, start))
                    state.assigned = True
        if new:
            consumer.incremental_assign(new)
            log.info("archiving %d more partitions (%d in all)", len(new), len(self.parts))

    # ------------------------------------------------------------------ the loop

    def run(self, *, until_caught_up: bool = False, idle_exit_s: float = 2.0) -> dict[str, int]:
        """Archive until ``stop()``; with ``until_caught_up``, until every partition's end was
        reached and written (``dart log export``). Returns records archived per topic."""
        self._load_positions()
        consumer = _KafkaConsumer(self.bus.librdkafka(**{
            # A group id is required by the client; positions come from the archive, never from it.
            "group.id": self.bus.group_id("archiver"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 500,   # the durable copy may trail by half a second; a short wait polls the broker
            "fetch.message.max.bytes": self.bus.max_message_bytes,
            "logger": logging.getLogger("dart.bus.rdkafka"),
        }))
        at_end: set[tuple[str, int]] = set()
        per_topic: dict[str, int] = {}
        next_meta = next_groups = 0.0
        last_record = time.monotonic()
        drain_until: float | None = None
        try:
            while True:
                now = time.monotonic()
                if self._stop.is_set() and drain_until is None:
                    # Stopped: archive up to every partition's end first (bounded by drain_s).
                    drain_until = now + self.cfg.drain_s
                if drain_until is not None and now >= drain_until:
                    break
                if now >= next_meta:
                    self._assign_new(consumer)
                    next_meta = now + self.cfg.metadata_interval_s
                if now >= next_groups:
                    self._save_groups()
                    next_groups = now + self.cfg.groups_interval_s
                for msg in consumer.consume(num_messages=2000, timeout=0.1):
                    err = msg.error()
                    key = (msg.topic(), msg.partition())
                    if err is not None:
                        if err.code() == PARTITION_EOF:
                            self._check_end(key, msg.offset())
                            at_end.add(key)
                            continue
                        raise ArchiveError(f"archiver: fetch from {key[0]}[{key[1]}] failed: {err}")
                    at_end.discard(key)
                    last_record = time.monotonic()
                    if self._take(key, msg):
                        per_topic[key[0]] = per_topic.get(key[0], 0) + 1
                self._roll_due(time.monotonic())
                self._check_probes(time.monotonic())
                probing = any(st.probe is not None for st in self.parts.values())
                at_every_end = not probing and bool(at_end) and all(k in at_end for k in self._assigned())
                if at_every_end and drain_until is not None:
                    break
                if until_caught_up and not probing and (
                    at_every_end or time.monotonic() - last_record > idle_exit_s
                ):
                    break
        finally:
            self._roll_due(math.inf)
            consumer.close()
            self._compact_tails()
            self._save_groups()
            self._write_status()
            log.info("archiver stopped: %d records in %d files written this run", self.archived,
                     self.files_written)
        return per_topic

    def _assigned(self) -> list[tuple[str, int]]:
        return [k for k, s in self.parts.items() if s.assigned]

    def _check_end(self, key: tuple[str, int], end: int) -> None:
        self.parts[key].high_watermark = end

    def _check_probes(self, now: float, *, wait_s: float = 5.0) -> None:
        for (topic, part), state in self.parts.items():
            if state.probe is not None and now - state.probe_since > wait_s:
                # The broker does not serve the last archived offset: it was restarted empty (or is
                # another broker). Archiving on would file different records under offsets the
                # archive already has.
                raise ArchiveError(f"{topic}[{part}]: the broker does not hold offset {state.next_offset - 1}, "
                                   f"which the archive does: restore the broker from the archive first "
                                   f"(`dart log import {self.log_dir}`)")

    def _take(self, key: tuple[str, int], msg: Any) -> bool:
        """Buffer one fetched record; False when it is not new (archived, buffered or the probe)."""
        state = self.parts[key]
        offset = msg.offset()
        expected = state.next_offset + len(state.buffer)
        if offset < expected:
            if state.probe is not None and offset == state.next_offset - 1:
                if msg.value() != state.probe:
                    raise ArchiveError(f"{key[0]}[{key[1]}]@{offset} differs on the broker from the archive: "
                                       f"this broker's log is not the one archived in {self.log_dir}")
                state.probe = None
            return False  # already archived or buffered (a re-fetch after a rebalance): never twice
        if offset > expected:
            # Offsets the broker no longer serves (retention, compaction, transaction markers):
            # close the file before the hole, so every file stays contiguous and `ls` shows it.
            log.warning("%s[%d]: offsets %d..%d are not on the broker; the archive has a gap there",
                        key[0], key[1], expected, offset - 1)
            self._roll(key, state)
            state.next_offset = offset
        if not state.buffer:
            state.oldest_at = time.monotonic()
        ts_type, ts = msg.timestamp()
        value = msg.value()
        state.buffer.append(archive_record(key[0], key[1], offset, ts if ts_type else 0, msg.key(),
                                           msg.headers(), value, event_type_of(value, self._names)))
        if len(state.buffer) >= self.cfg.segment_records:
            self._roll(key, state)
        return True

    def _roll_due(self, now: float) -> None:
        # Fetched (so acknowledged by the broker) but not yet in a finished file: what a crash of
        # the broker *and* the archiver together would lose on top of what was never fetched.
        self.max_lag = max(self.max_lag, sum(len(st.buffer) for st in self.parts.values()))
        wrote = False
        for key, state in self.parts.items():
            if state.buffer and now - state.oldest_at >= self.cfg.flush_interval_s:
                self._roll(key, state)
                wrote = True
        if wrote:
            self._write_status()

    def _roll(self, key: tuple[str, int], state: _Partition) -> None:
        if not state.buffer:
            return
        records, state.buffer = state.buffer, []
        seg = write_segment(self.log_dir, key[0], key[1], records, fsync=self.cfg.fsync)
        state.segments.append(seg)
        state.next_offset = seg.last + 1
        self.archived += seg.records
        self.files_written += 1
        log.info("archived %s[%d] %d..%d (%d records, %d bytes)", key[0], key[1], seg.first, seg.last,
                 seg.records, seg.path.stat().st_size)
        self._merge(key, state)

    def _merge(self, key: tuple[str, int], state: _Partition) -> None:
        while n := merge_plan([s.records for s in state.segments], self.cfg.merge_count, self.cfg.segment_records):
            self._merge_last(key, state, n)

    def _compact_tails(self) -> None:
        """On stop: merge each partition's trailing small files into one (up to ``segment_records``),
        so a finished run leaves a few files per partition instead of one per flush interval."""
        for key, state in self.parts.items():
            n, total = 0, 0
            for seg in reversed(state.segments):
                if total + seg.records > self.cfg.segment_records:
                    break
                n, total = n + 1, total + seg.records
            if n >= 2:
                self._merge_last(key, state, n)

    def _merge_last(self, key: tuple[str, int], state: _Partition, n: int) -> None:
        parts = state.segments[-n:]
        merged = write_segment(self.log_dir, key[0], key[1], list(read_partition(parts)), fsync=self.cfg.fsync)
        # The merged file is in place before its parts go: a crash here leaves files that
        # `repair` recognises as held by the merged one.
        for seg in parts:
            seg.path.unlink()
        state.segments[-n:] = [merged]
        log.debug("merged %d files of %s[%d] into %s", n, key[0], key[1], merged.path.name)

    def _save_groups(self) -> None:
        try:
            groups = committed_offsets(self.bus)
        except KafkaException as exc:
            log.warning("archiver: cannot read consumer-group offsets (%s); keeping the last snapshot", exc)
            return
        tmp = self.log_dir / f".{GROUPS_FILE}.tmp"
        tmp.write_text(json.dumps({"saved_ms": int(time.time() * 1000), "groups": groups}, indent=1))
        os.replace(tmp, self.log_dir / GROUPS_FILE)

    def _write_status(self) -> None:
        status = {
            "updated_ms": int(time.time() * 1000),
            "archived_this_run": self.archived,
            "files_written_this_run": self.files_written,
            "max_unwritten_records": self.max_lag,
            "partitions": {f"{t}[{p}]": {"next_offset": s.next_offset, "high_watermark": s.high_watermark,
                                         "files": len(s.segments)} for (t, p), s in sorted(self.parts.items())},
        }
        tmp = self.log_dir / f".{STATUS_FILE}.tmp"
        tmp.write_text(json.dumps(status, indent=1))
        os.replace(tmp, self.log_dir / STATUS_FILE)


def _last_value(seg: Segment) -> bytes:
    last = b""
    for rec in read_partition([seg]):
        last = rec["value"]
    return last


def committed_offsets(bus: BusConfig, timeout_s: float = 5.0) -> dict[str, dict[str, dict[str, int]]]:
    """group -> topic -> partition (as a string, for JSON) -> committed offset, for topics of the prefix."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(bus.librdkafka(logger=logging.getLogger("dart.bus.rdkafka")))
    listing = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout=timeout_s)
    out: dict[str, dict[str, dict[str, int]]] = {}
    for g in listing.valid:
        futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g.group_id)],
                                                    request_timeout=timeout_s)
        for fut in futures.values():
            for tp in fut.result(timeout=timeout_s).topic_partitions or []:
                if tp.topic.startswith(f"{bus.prefix}.") and tp.offset >= 0 and tp.error is None:
                    out.setdefault(g.group_id, {}).setdefault(tp.topic, {})[str(tp.partition)] = tp.offset
    return out


def run_archiver(cfg: ArchiverConfig, bus: BusConfig) -> int:
    """The `dart archiver` process: SIGTERM/SIGINT write what is buffered, then exit 0."""
    archiver = Archiver(cfg, bus)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: archiver.stop())
    try:
        archiver.run()
    except KafkaException as exc:
        log.error("archiver: %s", exc)
        return 1
    return 0
