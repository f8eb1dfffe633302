"""What an archive holds (`dart log ls`) and whether it is whole (`dart log verify`).

``verify`` reads every file to its end: each must be a readable Avro container whose records
are the offsets its name says, files of a partition must follow each other with no gap and
no overlap, and every value must decode against ``schemas/`` — except a record the live run
already sent to the dead-letter topic (a DeadLetter event naming its topic, partition and
offset is in the archive), which is reported, not failed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dart.errors import DecodeError
from dart.events import DeadLetter, decode
from dart.log.segments import ArchiveError, Segment, list_segments, read_segment


@dataclass(frozen=True, slots=True)
class PartitionListing:
    topic: str
    partition: int
    files: int
    records: int
    first: int
    last: int
    bytes: int
    gaps: list[tuple[int, int]]
    """Missing offset ranges (inclusive) between files."""


def listing(log_dir: Path) -> list[PartitionListing]:
    """Per partition: files, records, offset range, bytes and gaps (file names only; fast)."""
    out = []
    for (topic, part), segs in sorted(list_segments(log_dir).items()):
        gaps = [(a.last + 1, b.first - 1) for a, b in itertools.pairwise(segs) if b.first > a.last + 1]
        out.append(PartitionListing(topic, part, len(segs), sum(s.records for s in segs), segs[0].first,
                                    segs[-1].last, sum(s.path.stat().st_size for s in segs), gaps))
    return out


def format_listing(rows: list[PartitionListing]) -> str:
    lines = [f"{'topic':<40} {'part':>4} {'files':>5} {'records':>9} {'offsets':>17} {'bytes':>11}  gaps"]
    for r in rows:
        gaps = ", ".join(f"{a}..{b}" for a, b in r.gaps) or "-"
        lines.append(f"{r.topic:<40} {r.partition:>4} {r.files:>5} {r.records:>9} {f'{r.first}..{r.last}':>17} "
                     f"{r.bytes:>11}  {gaps}")
    lines.append(f"{'total':<40} {'':>4} {sum(r.files for r in rows):>5} {sum(r.records for r in rows):>9} "
                 f"{'':>17} {sum(r.bytes for r in rows):>11}")
    return "\n".join(lines)


@dataclass
class Verdict:
    records: int = 0
    files: int = 0
    problems: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    """Undecodable records the live run had already dead-lettered (reported, not failed)."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _records_of(segs: list[Segment], verdict: Verdict) -> Iterator[dict]:
    """Records of a partition's files; a gap, overlap or unreadable file is a problem, and reading
    goes on with the next file (so one bad file does not hide the others)."""
    expected: int | None = None
    for seg in segs:
        verdict.files += 1
        if expected is not None and seg.first != expected:
            kind = "gap" if seg.first > expected else "overlap"
            verdict.problems.append(f"{seg.path}: {kind}: expected offset {expected}, the file starts at {seg.first}")
        try:
            yield from read_segment(seg)
        except ArchiveError as exc:
            verdict.problems.append(str(exc))
        expected = seg.last + 1


def verify(log_dir: Path, *, max_problems: int = 50) -> Verdict:
    verdict = Verdict()
    segments = list_segments(log_dir)
    if not segments:
        verdict.problems.append(f"{log_dir}: no archive files")
        return verdict
    letters: set[tuple[str, int, int]] = set()
    undecodable: list[tuple[tuple[str, int, int], str]] = []
    for (topic, part), segs in sorted(segments.items()):
        for rec in _records_of(segs, verdict):
            verdict.records += 1
            try:
                event = decode(rec["value"])
            except DecodeError as exc:
                undecodable.append(((topic, part, rec["offset"]), f"{segs[0].path.parent}: {topic}[{part}]@"
                                    f"{rec['offset']}: does not decode: {exc}"))
                continue
            if isinstance(event, DeadLetter):
                letters.add((event.source_topic, event.partition, event.offset))
        if len(verdict.problems) >= max_problems:
            break
    for where, message in undecodable:
        (verdict.dead_lettered if where in letters else verdict.problems).append(message)
    return verdict
