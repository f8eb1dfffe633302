"""The archive of the log: Avro Object Container Files, one per offset range of a topic-partition.

Layout (the Kafka Connect S3/HDFS sink layout, on a local directory)::

    LOG_DIR/<topic>/<partition:04d>/<first:020d>-<last:020d>.avro

Each file is a standard Avro OCF: the writer schema (``ARCHIVE_SCHEMA``) is in its header,
so ``fastavro.reader`` or ClickHouse's ``file(..., 'Avro')`` read it with no dart code. A
record is one Kafka record with its coordinates (topic, partition, offset, timestamp, key,
headers) and its value exactly as it was on the wire (Avro single-object bytes), so a broker
rebuilt from the archive holds the same bytes at the same offsets. ``event_type`` is the
schema name the value's fingerprint names (or null when it names none), for SQL over files.

A file is written under a temporary name and renamed when complete (after fsync), so a
reader never sees half a file: a crash leaves only a ``.tmp`` that ``repair`` removes. The
offsets a file holds are in its name and in its metadata (``dart.first_offset``,
``dart.last_offset``), so listing the archive reads headers only.

Pure file I/O: no broker, no clock. Paths go through ``pathlib`` only, so an object-store
target later replaces ``write_segment``/``list_segments``/``read_segment`` and nothing else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro

from dart.blobs import fsync_dir
from dart.errors import DartError

ARCHIVE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "ArchivedRecord",
    "namespace": "dart.log",
    "doc": "One Kafka record of dart's event log, with its coordinates and its value as on the wire.",
    "fields": [
        {"name": "topic", "type": "string"},
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long"},
        {"name": "timestamp", "type": "long",
         "doc": "the record's Kafka timestamp, ms since the epoch (a plain long, so every reader gets "
                "the number Kafka clients produce with; SQL: fromUnixTimestamp64Milli(timestamp))"},
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {"name": "headers", "type": {"type": "array", "items": {
            "type": "record", "name": "Header",
            "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": "bytes"}]}},
         "default": []},
        {"name": "event_type", "type": ["null", "string"], "default": None,
         "doc": "the dart.v1 schema named by the value's fingerprint; null when it names none"},
        {"name": "value", "type": "bytes", "doc": "the record value exactly as it was on the wire"},
    ],
}
PARSED_SCHEMA = fastavro.parse_schema(ARCHIVE_SCHEMA)

SUFFIX = ".avro"
TMP_SUFFIX = ".tmp"
_NAME = re.compile(r"^(\d{20})-(\d{20})\.avro$")
CODEC = "deflate"
"""Block compression: events are small and repetitive (about 3x smaller), and zlib reads fast."""


class ArchiveError(DartError, ValueError):
    """The archive is not what it claims: a corrupt or truncated file, a gap or an overlap."""


@dataclass(frozen=True, slots=True, order=True)
class Segment:
    """One finished archive file: records ``first``..``last`` (inclusive) of a topic-partition."""

    topic: str
    partition: int
    first: int
    last: int
    path: Path

    @property
    def records(self) -> int:
        return self.last - self.first + 1

    def covers(self, other: Segment) -> bool:
        return self.first <= other.first and other.last <= self.last


def partition_dir(log_dir: Path, topic: str, partition: int) -> Path:
    return Path(log_dir) / topic / f"{partition:04d}"


def segment_name(first: int, last: int) -> str:
    return f"{first:020d}-{last:020d}{SUFFIX}"


def list_segments(log_dir: Path) -> dict[tuple[str, int], list[Segment]]:
    """Every finished file by (topic, partition), ordered by first offset; temp files are left out."""
    out: dict[tuple[str, int], list[Segment]] = {}
    root = Path(log_dir)
    if not root.is_dir():
        return out
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        for part_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
            segs = []
            for f in part_dir.iterdir():
                m = _NAME.match(f.name)
                if m:
                    segs.append(Segment(topic_dir.name, int(part_dir.name), int(m[1]), int(m[2]), f))
            if segs:
                out[(topic_dir.name, int(part_dir.name))] = sorted(segs, key=lambda s: (s.first, -s.last))
    return out


def repair(log_dir: Path) -> list[Path]:
    """Make the archive consistent after a crash; returns the files removed.

    Removes temp files (a write or a merge that did not finish) and files whose whole range is
    held by another file (a merge that renamed its result but died before removing its parts).
    Two files that overlap without one holding the other cannot come from a crash: that raises.
    """
    removed: list[Path] = []
    root = Path(log_dir)
    if not root.is_dir():
        return removed
    for tmp in root.glob(f"*/*/*{TMP_SUFFIX}"):
        tmp.unlink()
        removed.append(tmp)
    for segs in list_segments(root).values():
        kept: list[Segment] = []
        for seg in segs:  # by first offset, widest first
            if kept and kept[-1].covers(seg):
                seg.path.unlink()
                removed.append(seg.path)
                continue
            if kept and seg.first <= kept[-1].last:
                raise ArchiveError(f"{seg.path} overlaps {kept[-1].path} (offsets {seg.first}..{kept[-1].last} "
                                   f"in both): the archive was written by two archivers at once?")
            kept.append(seg)
    return removed


def write_segment(log_dir: Path, topic: str, partition: int, records: list[dict[str, Any]], *,
                  fsync: bool = True, codec: str = CODEC) -> Segment:
    """Write ``records`` (archive dicts of one partition, consecutive offsets) as one finished file."""
    if not records:
        raise ValueError("an archive segment needs at least one record")
    first, last = records[0]["offset"], records[-1]["offset"]
    if last - first + 1 != len(records):
        raise ArchiveError(f"{topic}[{partition}]: records {first}..{last} are not consecutive "
                           f"({len(records)} records)")
    directory = partition_dir(log_dir, topic, partition)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / segment_name(first, last)
    tmp = directory / f".{final.name}{TMP_SUFFIX}"
    meta = {"dart.topic": topic, "dart.partition": str(partition), "dart.first_offset": str(first),
            "dart.last_offset": str(last)}
    with open(tmp, "wb") as f:
        fastavro.writer(f, PARSED_SCHEMA, records, codec=codec, metadata=meta, sync_interval=64 * 1024)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    # Rename only a complete file: readers and a restarted archiver never see a partial one.
    os.replace(tmp, final)
    if fsync:
        fsync_dir(directory)
    return Segment(topic, partition, first, last, final)




def read_segment(seg: Segment) -> Iterator[dict[str, Any]]:
    """The records of one file, checked against its name: each offset the next one, none missing.

    Raises ArchiveError naming the file and the last good offset on a truncated or corrupt file.
    """
    expected = seg.first
    try:
        with open(seg.path, "rb") as f:
            for rec in fastavro.reader(f):
                if rec["offset"] != expected or rec["partition"] != seg.partition or rec["topic"] != seg.topic:
                    raise ArchiveError(f"{seg.path}: expected {seg.topic}[{seg.partition}]@{expected}, found "
                                       f"{rec['topic']}[{rec['partition']}]@{rec['offset']}")
                yield rec
                expected += 1
    except ArchiveError:
        raise
    except (OSError, ValueError, EOFError, StopIteration, KeyError, TypeError) as exc:
        raise ArchiveError(f"{seg.path}: unreadable after offset {expected - 1} "
                           f"({type(exc).__name__}: {exc})") from exc
    if expected != seg.last + 1:
        raise ArchiveError(f"{seg.path}: holds offsets {seg.first}..{expected - 1}, its name says "
                           f"{seg.first}..{seg.last} (truncated?)")


def read_partition(segs: Iterable[Segment]) -> Iterator[dict[str, Any]]:
    """The records of consecutive files of one partition; a gap or an overlap raises ArchiveError."""
    expected: int | None = None
    for seg in segs:
        if expected is not None and seg.first != expected:
            kind = "gap" if seg.first > expected else "overlap"
            raise ArchiveError(f"{seg.path}: {kind} in {seg.topic}[{seg.partition}]: expected offset {expected}, "
                               f"the file starts at {seg.first}")
        yield from read_segment(seg)
        expected = seg.last + 1


def archive_record(topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
                   headers: list[tuple[str, bytes]] | None, value: bytes | None,
                   event_type: str | None) -> dict[str, Any]:
    """The archive dict of one Kafka record."""
    return {"topic": topic, "partition": partition, "offset": offset, "timestamp": max(0, int(timestamp_ms)),
            "key": key, "headers": [{"key": k, "value": v or b""} for k, v in headers or ()],
            "event_type": event_type, "value": value or b""}


def event_type_of(value: bytes | None, names: dict[bytes, str]) -> str | None:
    """The schema name a single-object value's fingerprint names (``names``: fingerprint -> name)."""
    if value is None or len(value) < 10 or value[:2] != b"\xc3\x01":
        return None
    return names.get(bytes(value[2:10]))
