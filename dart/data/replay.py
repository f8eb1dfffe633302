"""Replay: rebuild the projection from the log and prove it equal to the live one, table by table.

The projection is a pure function of the log (``rows.py`` maps each event to a row with no
clock and no database), so reading every topic from the earliest offset into a fresh store
must give the same tables. Equality is checked per table on the de-duplicated rows (``FINAL``):
the row count and an order-independent checksum, the wrapping sum of a 64-bit hash of each
row's exact bytes (``RowBinary``, so NULL and '' differ). A differing table is narrowed down
by hashing ``event_id`` into buckets, and only the rows of differing buckets are compared.

Queries go through ``Query`` callables (``sql -> rows``), so either side may be an in-process
chdb store, a data manager's HTTP endpoint or a ClickHouse server.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dart.bus import BusConfig, read_topic
from dart.config import progress
from dart.data import avroload, projection
from dart.data.store import Store
from dart.errors import DecodeError
from dart.events import Event, WeightsPublished, decode
from dart.log import ArchiveError, list_segments, read_partition

log = logging.getLogger(__name__)
T = TypeVar("T")

Query = Callable[[str], Sequence[Sequence[object]]]

ROW_HASH = "cityHash64(formatRowNoNewline('RowBinary', *))"
"""Hash of one row's exact bytes (every column, in table order)."""
BUCKETS = 256
"""Buckets of event_id a differing table is split into before rows are fetched."""


@dataclass(frozen=True, slots=True)
class TableCheck:
    table: str
    live_rows: int
    replayed_rows: int
    live_sum: int
    replayed_sum: int
    schema_equal: bool = True

    @property
    def equal(self) -> bool:
        return self.schema_equal and self.live_rows == self.replayed_rows and self.live_sum == self.replayed_sum


@dataclass(frozen=True, slots=True)
class RowDiff:
    table: str
    event_id: str
    kind: str
    """only live | only replayed | content differs"""


def _hashed(db: str, table: str) -> str:
    return f"(SELECT event_id, {ROW_HASH} AS h FROM {db}.{table} FINAL)"


def digest_sql(db: str, table: str) -> str:
    """Row count and checksum of one table's de-duplicated rows."""
    return f"SELECT count(), sum(h) FROM {_hashed(db, table)}"


def columns_sql(db: str, table: str) -> str:
    # DESCRIBE, not system.columns: a data manager's SQL endpoint shows analytics clients the
    # dart database's columns this way only (dart.data.sqlguard.ALLOWED_SYSTEM_TABLES).
    return f"DESCRIBE TABLE {db}.{table}"


def buckets_sql(db: str, table: str) -> str:
    return (f"SELECT cityHash64(event_id) % {BUCKETS} AS b, count(), sum(h) FROM {_hashed(db, table)} "
            f"GROUP BY b ORDER BY b")


def rows_sql(db: str, table: str, buckets: Sequence[int]) -> str:
    ids = ", ".join(str(int(b)) for b in buckets)
    return (f"SELECT event_id, h FROM {_hashed(db, table)} WHERE cityHash64(event_id) % {BUCKETS} IN ({ids}) "
            f"ORDER BY event_id")


def check_table(live: Query, live_db: str, fresh: Query, fresh_db: str, table: str) -> TableCheck:
    (ln, ls), = live(digest_sql(live_db, table))
    (fn, fs), = fresh(digest_sql(fresh_db, table))
    same_schema = [tuple(r) for r in live(columns_sql(live_db, table))] == \
        [tuple(r) for r in fresh(columns_sql(fresh_db, table))]
    return TableCheck(table, int(ln), int(fn), int(ls or 0), int(fs or 0), same_schema)


def diff_rows(table: str, live: dict[str, int], fresh: dict[str, int], limit: int) -> list[RowDiff]:
    """Rows (by event_id, sorted) present on one side only or hashed differently (pure)."""
    out: list[RowDiff] = []
    for eid in sorted(live.keys() | fresh.keys()):
        if eid not in fresh:
            out.append(RowDiff(table, eid, "only live"))
        elif eid not in live:
            out.append(RowDiff(table, eid, "only replayed"))
        elif live[eid] != fresh[eid]:
            out.append(RowDiff(table, eid, "content differs"))
        if len(out) >= limit:
            break
    return out


def first_differences(live: Query, live_db: str, fresh: Query, fresh_db: str, table: str,
                      limit: int = 5) -> list[RowDiff]:
    """The first differing rows of one table, reading only the buckets whose checksums differ."""
    lb = {int(b): (int(n), int(s)) for b, n, s in live(buckets_sql(live_db, table))}
    fb = {int(b): (int(n), int(s)) for b, n, s in fresh(buckets_sql(fresh_db, table))}
    bad = sorted(b for b in lb.keys() | fb.keys() if lb.get(b) != fb.get(b))
    if not bad:
        return []
    lrows = {str(e): int(h) for e, h in live(rows_sql(live_db, table, bad))}
    frows = {str(e): int(h) for e, h in fresh(rows_sql(fresh_db, table, bad))}
    return diff_rows(table, lrows, frows, limit)


def compare(live: Query, live_db: str, fresh: Query, fresh_db: str, tables: Sequence[str],
            limit: int = 5) -> tuple[list[TableCheck], list[RowDiff]]:
    """Every table's check, and the first differing rows of each differing table."""
    checks = [check_table(live, live_db, fresh, fresh_db, t) for t in tables]
    diffs = [d for c in checks if not c.equal
             for d in first_differences(live, live_db, fresh, fresh_db, c.table, limit)]
    return checks, diffs


def format_checks(checks: Sequence[TableCheck], diffs: Sequence[RowDiff] = ()) -> str:
    """The comparison as a text table (pure)."""
    lines = [f"{'table':<16} {'live rows':>12} {'replayed rows':>14}  equal"]
    for c in checks:
        note = "" if c.schema_equal else "  (columns differ)"
        lines.append(f"{c.table:<16} {c.live_rows:>12} {c.replayed_rows:>14}  {'yes' if c.equal else 'NO'}{note}")
    if diffs:
        lines.append("first differing rows:")
        lines += [f"  {d.table}: event_id {d.event_id} ({d.kind})" for d in diffs]
    return "\n".join(lines)


async def rebuild(bus: BusConfig, store: Store, *, chunk: int = 5000,
                  skip: Callable[[Event], bool] | None = None) -> dict[str, int]:
    """Read every topic from the earliest offset into ``store`` (migrated here); events per topic.

    ``skip`` leaves chosen events out (tests use it to prove a missing event is noticed).
    Records that do not decode are left out here as they were by the live consumer, which
    sent them to the DLQ topic: their DeadLetter events replay like any other.
    """
    store.migrate()
    counts: dict[str, int] = {}
    for topic in progress(bus.topics.all(), desc="replay", unit="topic"):
        buf: list[Event] = []
        n = 0
        async for d in read_topic(bus, topic, idle_timeout_s=2.0):
            if skip is not None and skip(d.event):
                continue
            buf.append(d.event)
            if len(buf) >= chunk:
                n += projection.write_events(store, buf)
                buf.clear()
        n += projection.write_events(store, buf)
        counts[topic] = n
        log.info("replayed %d events from %s", n, topic)
    return counts


def archived_events(log_dir: Path, *, until_ms: int | None = None) -> Iterator[tuple[str, Event]]:
    """(topic, event) of every archived record in partition order, with Kafka timestamp <= ``until_ms``.

    A value that does not decode is left out, as the live consumer left it out (it sent it to the
    DLQ, whose DeadLetter event replays like any other). A damaged archive file raises
    ArchiveError: a replay never builds a store from a log it could not read whole.
    """
    for (topic, _part), segs in sorted(list_segments(log_dir).items()):
        for rec in read_partition(segs):
            if until_ms is not None and rec["timestamp"] > until_ms:
                continue
            try:
                yield topic, decode(rec["value"])
            except DecodeError:
                continue


def version_time_ms(log_dir: Path, version: int) -> int:
    """Kafka timestamp of the record that published policy ``version`` (for ``--until-version``)."""
    for (topic, _part), segs in sorted(list_segments(log_dir).items()):
        if not topic.endswith(".weights"):
            continue
        for rec in read_partition(segs):
            if rec["event_type"] == "WeightsPublished":
                event = decode(rec["value"])
                if isinstance(event, WeightsPublished) and event.version == version:
                    return int(rec["timestamp"])
    raise ArchiveError(f"{log_dir}: no WeightsPublished event of version {version} in the archive")


def read_ahead(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """``items``, produced on a second thread up to ``depth`` ahead of the consumer.

    The archive's reader (fastavro, holding the GIL) and ClickHouse's insert (not holding it)
    then overlap. An exception of the producer is raised here, where the item it failed on
    would have come.
    """
    q: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():   # the consumer may have gone (an error, a break): never block on it
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((False, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((False, exc))

    worker = threading.Thread(target=produce, name="dart-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            more, item = q.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        worker.join()


class _Archived:
    """An archived record as ``avroload.project_records`` reads it (its value as it was on the
    wire), and the topic it came from."""

    __slots__ = ("topic", "value")

    def __init__(self, topic: str, value: bytes) -> None:
        self.topic = topic
        self.value = value


def archived_chunks(log_dir: Path, *, until_ms: int | None = None, chunk: int = 100_000) -> Iterator[list[_Archived]]:
    """The archived records, values undecoded, in chunks of ``chunk`` at most, with Kafka timestamp
    <= ``until_ms``. Partitions follow one another in the order of ``list_segments`` and each is in
    offset order, so a chunk may hold several topics and partitions (fewer, larger inserts: a
    run's archive is many small partitions). A damaged archive file raises ArchiveError."""
    buf: list[_Archived] = []
    for (topic, _part), segs in sorted(list_segments(log_dir).items()):
        for rec in read_partition(segs):
            if until_ms is not None and rec["timestamp"] > until_ms:
                continue
            buf.append(_Archived(topic, rec["value"]))
            if len(buf) >= chunk:
                yield buf
                buf = []
    if buf:
        yield buf


def rebuild_from_archive(log_dir: Path, store: Store, *, until_ms: int | None = None,
                         chunk: int = 100_000) -> dict[str, int]:
    """``rebuild`` with the archive as the log: no broker needed. Events per topic.

    The data manager's own projection path (``avroload.project_records``): ClickHouse decodes
    the bodies of a chunk and maps them to rows in one ``INSERT … SELECT`` per event type, and
    what it cannot show it renders exactly goes through Python, so the rows are those the live
    consumer wrote (records of one partition in log order, as the consumer inserts them).
    Records that do not decode are left out as the live consumer left them out (it sent them
    to the DLQ, whose DeadLetter events replay like any other). The archive is read on a second
    thread while ClickHouse projects the chunk before.
    """
    store.migrate()
    if not list_segments(log_dir):
        raise ArchiveError(f"{log_dir}: no archive files to replay")
    counts: dict[str, int] = {}
    total = sum(seg.records for segs in list_segments(log_dir).values() for seg in segs)
    bar = progress(None, total=total, desc="replay", unit="event")
    for records in read_ahead(archived_chunks(log_dir, until_ms=until_ms, chunk=chunk)):
        done = avroload.project_records(store, records, projection.write_events)
        for rec in records:
            counts[rec.topic] = counts.get(rec.topic, 0) + 1
        for rec, _exc in done.failed:
            counts[rec.topic] -= 1
        bar.update(len(records))
    bar.close()
    log.info("replayed %d archived events of %d topics from %s", sum(counts.values()), len(counts), log_dir)
    return counts
