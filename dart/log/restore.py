"""A broker rebuilt from the archive: every record back at its offset, and the groups' positions.

``import_archive`` republishes each archived partition in order, to the same partition, with
its key, headers, timestamp and exact value bytes, through an idempotent producer (so a retry
never doubles or reorders a record). Into an empty partition of a fresh broker that gives
every record its archived offset; the delivery reports are checked against the archive, and
a mismatch raises instead of leaving consumers on shifted offsets. ``restore_groups`` then
commits each consumer group's last saved offsets (never past what the archive holds), so the
services resume where they were.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as _KafkaConsumer
from confluent_kafka import Producer as _KafkaProducer
from confluent_kafka import TopicPartition

from dart.bus.broker import ensure_topics
from dart.bus.config import BusConfig
from dart.log.archiver import GROUPS_FILE, PARTITION_EOF
from dart.log.segments import ArchiveError, list_segments, read_partition

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Imported:
    records: dict[str, int]
    """Records republished per topic."""
    groups: dict[str, int]
    """Partitions whose committed offset was restored, per group."""
    seconds: float


def end_offsets(bus: BusConfig, partitions: list[tuple[str, int]], timeout_s: float = 10.0) -> dict[tuple[str, int], int]:
    """The offset after the last record of each partition, from the fetch path (Tansu's ListOffsets
    "latest" answer is not reliable; the end-of-partition event is)."""
    if not partitions:
        return {}
    c = _KafkaConsumer(bus.librdkafka(**{"group.id": bus.group_id("probe"), "enable.auto.commit": False,
                                         "enable.partition.eof": True,
                                         "logger": logging.getLogger("dart.bus.rdkafka")}))
    try:
        c.assign([TopicPartition(t, p, 0) for t, p in partitions])
        ends: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + timeout_s
        last_seen: dict[tuple[str, int], int] = {}
        while len(ends) < len(partitions) and time.monotonic() < deadline:
            for msg in c.consume(num_messages=10_000, timeout=0.2):
                key = (msg.topic(), msg.partition())
                err = msg.error()
                if err is not None and err.code() == PARTITION_EOF:
                    ends[key] = msg.offset()
                elif err is None:
                    last_seen[key] = msg.offset() + 1
        missing = [k for k in partitions if k not in ends]
        if missing:
            raise ArchiveError(f"no end of partition seen for {missing[:3]} within {timeout_s} s "
                               f"(largest offsets read: {[last_seen.get(k) for k in missing[:3]]})")
        return ends
    finally:
        c.close()


def import_archive(log_dir: Path, bus: BusConfig, *, force: bool = False,
                   progress: Callable[[str], None] | None = None) -> Imported:
    """Republish every archived record of ``log_dir`` into the broker of ``bus``.

    Refuses a partition that already holds records unless ``force`` (then the records are
    appended and their offsets shift: said in the log and in the error of the offset check).
    """
    t0 = time.monotonic()
    segments = list_segments(log_dir)
    if not segments:
        return Imported({}, {}, 0.0)
    partitions_of: dict[str, int] = {}
    for topic, part in segments:
        partitions_of[topic] = max(partitions_of.get(topic, 0), part + 1)
    # Catalogue topics keep their configured partitions; anything else the archive holds is
    # created with as many partitions as it archived.
    ensure_topics(bus, extra={t: n for t, n in partitions_of.items() if t not in set(bus.topics.all())})
    ends = end_offsets(bus, sorted(segments))
    busy = {k: v for k, v in ends.items() if v > 0}
    if busy and not force:
        (t, p), n = next(iter(sorted(busy.items())))
        raise ArchiveError(f"{t}[{p}] already holds {n} records on {bus.bootstrap}: import into a fresh broker, "
                           f"or pass --force to append (offsets then differ from the archive)")
    producer = _KafkaProducer(bus.librdkafka(**{
        "enable.idempotence": True, "acks": "all",
        "linger.ms": 5, "batch.num.messages": 10_000, "message.max.bytes": bus.max_message_bytes,
        "queue.buffering.max.messages": 200_000, "logger": logging.getLogger("dart.bus.rdkafka"),
    }))
    mismatches: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()

    def delivered(expected: int) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            with lock:
                if err is not None:
                    failures.append(f"{msg.topic()}[{msg.partition()}]@{expected}: {err}")
                elif msg.offset() != expected and len(mismatches) < 5:
                    mismatches.append(f"{msg.topic()}[{msg.partition()}]: archived offset {expected} landed at "
                                      f"{msg.offset()}")
        return done

    counts: dict[str, int] = {}
    for (topic, part), segs in sorted(segments.items()):
        shift = ends.get((topic, part), 0) - segs[0].first
        n = 0
        for rec in read_partition(segs):
            kwargs = {"value": rec["value"], "key": rec["key"], "partition": part,
                      "headers": [(h["key"], h["value"]) for h in rec["headers"]] or None,
                      "on_delivery": delivered(rec["offset"] + shift)}
            if rec["timestamp"] > 0:
                kwargs["timestamp"] = rec["timestamp"]
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
            if n % 10_000 == 0:
                producer.poll(0)
        counts[topic] = counts.get(topic, 0) + n
        if progress:
            progress(f"{topic}[{part}]: {n} records")
    remaining = producer.flush(60.0)
    if remaining or failures:
        raise ArchiveError(f"import: {remaining} records unacknowledged, {len(failures)} failed "
                           f"({failures[:1]})")
    if mismatches and not force:
        raise ArchiveError("import: records did not land at their archived offsets: " + "; ".join(mismatches)
                           + " (does the archive start after offset 0, or has the partition a gap?)")
    groups = restore_groups(log_dir, bus, ends={k: segs[-1].last + 1 for k, segs in segments.items()})
    out = Imported(counts, groups, round(time.monotonic() - t0, 2))
    log.info("imported %d records of %d topics from %s in %.1f s; restored offsets of %d groups",
             sum(counts.values()), len(counts), log_dir, out.seconds, len(groups))
    return out


def restore_groups(log_dir: Path, bus: BusConfig, *, ends: dict[tuple[str, int], int]) -> dict[str, int]:
    """Commit each group's saved offsets (clamped to what the archive holds); partitions per group."""
    path = Path(log_dir) / GROUPS_FILE
    if not path.exists():
        return {}
    try:
        saved = json.loads(path.read_text())["groups"]
    except (ValueError, KeyError) as exc:
        raise ArchiveError(f"{path}: not a groups snapshot ({exc})") from exc
    done: dict[str, int] = {}
    for group, topics in sorted(saved.items()):
        offsets = []
        for topic, parts in topics.items():
            for part, offset in parts.items():
                end = ends.get((topic, int(part)), 0)
                # A group may have committed past what was archived (the loss window): resume at the
                # archive's end, never beyond it, or the consumer would jump to the start on an
                # out-of-range offset.
                offsets.append(TopicPartition(topic, int(part), min(int(offset), end)))
        if not offsets:
            continue
        c = _KafkaConsumer(bus.librdkafka(**{"group.id": group, "enable.auto.commit": False,
                                             "logger": logging.getLogger("dart.bus.rdkafka")}))
        try:
            c.commit(offsets=offsets, asynchronous=False)
        finally:
            c.close()
        done[group] = len(offsets)
    return done
