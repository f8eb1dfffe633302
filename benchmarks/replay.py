"""Replay from the archive: ClickHouse decoding the Avro (``rebuild_from_archive``) against the
Python decode path (every value decoded into its typed event, rows by ``rows.py``).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replay.py [--events 60000] [--log-dir RUN/log] [--passes 5]

The archive is ``--log-dir`` (a run's ``log/``) or, by default, ``--events`` events of
``ingest.py``'s mix written as archive files. Each pass rebuilds the projection into a fresh
database of one chdb (migrations included), the two sides interleaved pass by pass
(``benchmarks/passes.py``); the first passes' databases must be equal table by table.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas  # noqa: F401  (imported before the clock: the first client insert imports it once per process)
import passes
from ingest import log_of

from dart.data import projection, replay
from dart.data.rows import TABLES
from dart.data.store import Store
from dart.events import encode
from dart.log.segments import archive_record, write_segment


def synthetic_archive(log_dir: Path, n: int) -> None:
    """``n`` events, a topic per event type, one partition each."""
    by_topic: dict[str, list[bytes]] = {}
    for e in log_of(n):
        by_topic.setdefault(f"bench.{type(e).__name__}", []).append(encode(e))
    for topic, values in by_topic.items():
        write_segment(log_dir, topic, 0, [archive_record(topic, 0, i, 1_000 + i, None, [], v, None)
                                          for i, v in enumerate(values)], fsync=False)


def python_path(log_dir: Path, store: Store, chunk: int = 20_000) -> int:
    """The rebuild as it was: decode every record, map it to rows in Python, insert the rows."""
    store.migrate()
    buf, n = [], 0
    for _topic, event in replay.archived_events(log_dir):
        buf.append(event)
        n += 1
        if len(buf) >= chunk:
            projection.write_events(store, buf)
            buf.clear()
    projection.write_events(store, buf)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--log-dir", type=Path, help="a run's archive instead of the synthetic one")
    ap.add_argument("--passes", type=int, default=passes.MIN_PASSES)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        log_dir = args.log_dir or work / "log"
        if args.log_dir is None:
            synthetic_archive(log_dir, args.events)
        store = Store.open_dsn(f"chdb://{work / 'chdb'}", database="bench")

        def timed(name: str, rebuild) -> float:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            n = rebuild(log_dir, Store(store.client, name, store.target))
            return n / (time.perf_counter() - t0)

        rates = passes.interleave(
            {"python": lambda i: timed(f"py{i}", python_path),
             "clickhouse": lambda i: timed(f"ch{i}", lambda ld, s: sum(replay.rebuild_from_archive(ld, s).values()))},
            args.passes, on_pass=passes.pass_line("events/s"))
        checks, diffs = replay.compare(store.query, "py0", store.query, "ch0", TABLES)
        assert all(c.equal for c in checks), replay.format_checks(checks, diffs)
        print(f"replay of {log_dir} into a fresh chdb database, {args.passes} passes per side, interleaved; "
              f"{sum(c.live_rows for c in checks)} rows, 12/12 tables equal:")
        print(passes.report({"Python decode path (before)": rates["python"],
                             "ClickHouse decodes (rebuild_from_archive)": rates["clickhouse"]}, "events/s"))
        print(passes.ratio_line(rates, "clickhouse", "python"))
        store.close()


if __name__ == "__main__":
    main()
