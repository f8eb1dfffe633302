"""`dart archiver` (the service) and `dart log ls|verify|export|import` (the archive as a file artifact).

A run directory or its ``log/`` folder may be named: ``dart log verify runs/local`` and
``dart log verify runs/local/log`` read the same archive.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dart.bus.cli import add_bus_args, bus_from_args, require_broker
from dart.config import add_config_args, build, config_from_args, progress
from dart.errors import ConfigError
from dart.log import list_segments
from dart.log.archiver import Archiver, ArchiverConfig, run_archiver
from dart.log.check import format_listing, listing, verify
from dart.log.restore import import_archive
from dart.rundir import RunMissing, add_run_arg

log = logging.getLogger(__name__)


def log_dir_of(path: str | Path) -> Path:
    """``RUN_DIR/log`` for a run directory, else the path itself."""
    p = Path(path)
    return p / "log" if (p / "log").is_dir() or (p / "summary.json").exists() or (p / "config").is_dir() else p


def existing_log_dir(path: str | Path) -> Path:
    """:func:`log_dir_of` of a path that must already hold an archive (ls, verify, import read it)."""
    where = log_dir_of(path)
    if not where.is_dir():
        raise RunMissing(f"no archive at {where}: name a run directory (runs/local) or its log/ folder; "
                         f"`dart up` and `dart archiver` write one")
    return where


def _path(args: argparse.Namespace) -> str:
    """PATH, or --run RUN_DIR (the same thing)."""
    run = getattr(args, "run", None)  # opened and checked by `dart` (rundir.add_run_arg)
    path = getattr(args, "path", None) or (run.workdir if run is not None else None)
    if path is None:
        raise ConfigError("give the run directory (PATH or --run RUN_DIR)")
    return path


def register(sub: Any) -> None:
    p = sub.add_parser("archiver", help="archive every topic of the prefix into Avro files (the durable log)")
    add_config_args(p, what=" (its `archiver:` and `bus:` sections)")
    add_bus_args(p, config=False)
    p.add_argument("--log-dir", type=Path, help="archive directory (RUN_DIR/log)")
    p.add_argument("--flush-interval-s", type=float, help="longest a record waits before it is in a file")
    p.set_defaults(func=cmd_archiver)

    p = sub.add_parser("log", help="the archived event log of a run: ls, verify, export, import")
    lsub = p.add_subparsers(dest="log_command", required=True)
    e = lsub.add_parser("ls", help="topics, records, offset ranges, bytes and gaps of an archive")
    e.add_argument("path", nargs="?", help="run directory or archive directory")
    add_run_arg(e)
    e.add_argument("--json", action="store_true", help="one JSON object per partition, in a list")
    e.set_defaults(func=cmd_ls)
    e = lsub.add_parser("verify", help="every file readable, offsets contiguous, every record decodes "
                                       "(exit 1 otherwise, naming the file and offset)")
    e.add_argument("path", nargs="?", help="run directory or archive directory")
    add_run_arg(e)
    e.set_defaults(func=cmd_verify)
    e = lsub.add_parser("export", help="copy a live broker's topics of the prefix into an archive (until caught up)")
    e.add_argument("path", help="run directory or archive directory")
    add_bus_args(e)
    e.set_defaults(func=cmd_export)
    e = lsub.add_parser("import", help="republish an archive into a fresh broker: same partitions, order, keys, "
                                       "offsets; consumer-group positions restored")
    e.add_argument("path", help="run directory or archive directory")
    add_bus_args(e)
    e.add_argument("--force", action="store_true", help="append to topics that already hold records")
    e.set_defaults(func=cmd_import)


def archiver_config(args: argparse.Namespace) -> Any:
    flags = {"archiver.log_dir": getattr(args, "log_dir", None),
             "archiver.flush_interval_s": getattr(args, "flush_interval_s", None) or None}
    return build(ArchiverConfig, config_from_args(args, flags=flags).get("archiver") or {}, path="archiver")


def cmd_archiver(args: argparse.Namespace) -> int:
    return run_archiver(archiver_config(args), bus_from_args(args))


def cmd_ls(args: argparse.Namespace) -> int:
    rows = listing(existing_log_dir(_path(args)))
    if not rows:
        print(f"dart log ls: no archived records in {existing_log_dir(_path(args))}", file=sys.stderr)
    print(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) if args.json else format_listing(rows))
    return 0 if rows else 1


def cmd_verify(args: argparse.Namespace) -> int:
    where = existing_log_dir(_path(args))
    verdict = verify(where)
    for line in verdict.dead_lettered:
        print(f"dead-lettered in the run (not a fault of the archive): {line}")
    for line in verdict.problems:
        print(f"PROBLEM {line}", file=sys.stderr)
    state = "ok" if verdict.ok else f"{len(verdict.problems)} problems"
    print(f"{where}: {verdict.records} records in {verdict.files} files: {state}")
    return 0 if verdict.ok else 1


@contextlib.contextmanager
def counting(count: Callable[[], int], *, desc: str, unit: str) -> Iterator[None]:
    """A progress bar (on a terminal) that shows ``count()`` every 0.2 s while the block runs."""
    bar = progress(desc=desc, unit=unit)
    done = threading.Event()

    def show() -> None:
        while not done.wait(0.2):
            bar.update(count() - bar.n)

    shower = threading.Thread(target=show, daemon=True)
    if not bar.disable:
        shower.start()
    try:
        yield
    finally:
        done.set()
        if shower.is_alive():
            shower.join()
        bar.close()


def cmd_export(args: argparse.Namespace) -> int:
    where = log_dir_of(args.path)
    bus = bus_from_args(args)
    require_broker(bus)
    archiver = Archiver(ArchiverConfig(log_dir=where), bus)
    with counting(lambda: archiver.archived, desc="export", unit="record"):
        per_topic = archiver.run(until_caught_up=True)
    print(f"exported {sum(per_topic.values())} records of {len(per_topic)} topics into {where}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    where = existing_log_dir(args.path)
    bus = bus_from_args(args)
    parts = list_segments(where)
    bar = progress(total=len(parts), desc="import", unit="partition")

    def imported(line: str) -> None:
        log.info("import %s", line)
        bar.update(1)

    done = import_archive(where, bus, force=args.force, progress=imported)
    bar.close()
    print(f"imported {sum(done.records.values())} records of {len(done.records)} topics into {bus.bootstrap} in "
          f"{done.seconds} s; consumer-group offsets restored for {len(done.groups)} groups")
    return 0
