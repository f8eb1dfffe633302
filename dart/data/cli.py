"""`dart data-manager`, `dart sql`, `dart report`, `dart trace`, `dart experience import`, and the
store side of `dart replay` (registered by dart.stack.cli, which also re-runs logged decisions).

Config comes from flags, then a config file's ``data:`` section (and ``bus:`` for the log),
then defaults. ``dart sql`` and ``dart report`` speak the ClickHouse protocol through
clickhouse-connect to either store: ``--url`` (a ClickHouse server, or a running data
manager's SQL endpoint) or ``--dsn chdb:///path`` (embedded; if a data manager holds that
path, its endpoint is found from ``<path>.http``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from dart.blobs import open_store
from dart.bus import Producer, stop_on_signals
from dart.bus.cli import add_bus_args, bus_from_args
from dart.config import add_config_args, build, config_from_args
from dart.data.config import DataConfig, StoreConfig
from dart.data.experience import load_experience
from dart.data.replay import compare, format_checks, rebuild, rebuild_from_archive, version_time_ms
from dart.data.report import build_report, write_plots
from dart.data.rows import TABLES
from dart.data.store import Store, chdb_client, http_file, parse_dsn
from dart.errors import BlobError, ConfigError, DartError
from dart.rundir import (
    RunMissing,
    UntrustedRun,
    add_run_arg,
    fill_from_run,
    is_loopback,
    require_store,
    run_of,
)

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("data-manager", help="project every topic into ClickHouse, schedule rollouts, assemble batches")
    add_config_args(p, what=" (its `data:` and `bus:` sections)")
    add_bus_args(p, config=False)
    p.add_argument("--dsn", help="chdb:///abs/path (embedded) or http://host:8123 (ClickHouse server)")
    p.add_argument("--database", help="database of the projection tables (default dart)")
    p.add_argument("--blobs", help="blob store directory (batch manifests)")
    p.add_argument("--http-port", type=int, help="port of the SQL endpoint (0: any free port)")
    p.add_argument("--run-id", help="run id stamped on produced events")
    p.add_argument("--no-scheduler", action="store_true", help="do not emit rollout requests")
    p.add_argument("--no-batcher", action="store_true", help="do not assemble batches")
    p.set_defaults(func=cmd_data_manager)

    p = sub.add_parser("sql", help="run SQL against the projection (embedded or server, same syntax)")
    p.add_argument("query", help="SQL; a trailing FORMAT clause wins over --format")
    _add_target_args(p)
    p.add_argument("--format", default="PrettyCompactMonoBlock", help="ClickHouse output format (default %(default)s)")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("report", help="success, difficulty, utilisation and staleness: text + PNG plots")
    _add_target_args(p)
    p.add_argument("--out", type=Path, help="directory for report.txt and the PNG plots")
    p.add_argument("--json", action="store_true", help="the report's tables as one JSON object on stdout")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("trace", help="one trajectory as pictures: each step's screenshot with its action drawn "
                                     "on it, thought, policy version, log-prob, entropy (HTML + PNG strip)")
    p.add_argument("rollout_id", help="the trajectory (rollout_id of its TrajectoryFinished)")
    _add_target_args(p)
    p.add_argument("--config", help="YAML config file; its `data:` section names the store and the blobs")
    p.add_argument("--blobs", help="blob store directory or URL holding the screenshots")
    p.add_argument("--out", type=Path, default=Path("traces"), help="directory; files go to OUT/ROLLOUT_ID/")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("experience", help="the experience pool of successful trajectories")
    esub = p.add_subparsers(dest="experience_command", required=True)
    e = esub.add_parser("import", help="write trajectories from a JSONL file to the log (origin=experience)")
    e.add_argument("file", type=Path, help="JSON lines, one trajectory each (see dart.data.experience)")
    add_bus_args(e)
    e.add_argument("--blobs", help="blob store directory (screenshots given as files are put there)")
    e.add_argument("--run-id", help="run id stamped on the events")
    e.add_argument("--origin", default="experience", choices=["experience", "oracle"],
                   help="origin stamped on the trajectories (default %(default)s)")
    e.set_defaults(func=cmd_experience_import)


def add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="*",
                   help="RUN_DIR: replay its archived log (RUN_DIR/log, no broker needed) against its store "
                        "(RUN_DIR/chdb); none: the live broker's topics (--run RUN_DIR is the same as RUN_DIR)")
    add_run_arg(p, positional=_replay_target)
    add_bus_args(p, run=False)  # --config: its `bus:` and `data:` sections name the log and the live store
    until = p.add_mutually_exclusive_group()
    until.add_argument("--until-ms", type=int, help="with RUN_DIR: only records with a Kafka timestamp <= this "
                                                    "(ms since the epoch); the state as of that moment")
    until.add_argument("--until-version", type=int, help="with RUN_DIR: the state when policy version N was "
                                                         "published (what the data manager held then)")
    p.add_argument("--url", help="SQL endpoint of the live projection (a data manager's or a ClickHouse server)")
    p.add_argument("--dsn", help="live store: chdb:///abs/path (its running data manager is found from "
                                 "<path>.http) or http://host:8123")
    p.add_argument("--database", help="database of the live projection (default: the config's, else dart)")
    p.add_argument("--out", help="fresh store, chdb:///abs/path (default: a temporary one, removed after; "
                                 "when no data manager serves the live path: a new database in that path)")
    p.add_argument("--keep", action="store_true", help="keep the fresh store (or database) after the check")
    p.add_argument("--wait-s", type=float, default=10.0,
                   help="re-check a differing live side for this long (a running data manager may lag the log)")
    p.add_argument("--show", type=int, default=5, help="differing rows to name per table")


def _replay_target(args: argparse.Namespace) -> str | None:
    if len(args.target) + (args.run is not None) > 1:
        raise ConfigError(f"replay: expected at most one RUN_DIR, got {args.target}")
    return args.target[0] if args.target else None


def _add_target_args(p: argparse.ArgumentParser) -> None:
    add_run_arg(p)
    p.add_argument("--url", help="http://host:port of a ClickHouse server or a data manager's SQL endpoint "
                                 "(credentials: $CLICKHOUSE_USER, $CLICKHOUSE_PASSWORD)")
    p.add_argument("--dsn", help="chdb:///abs/path (default: the data manager's default store)")
    p.add_argument("--database", default="dart", help="database of the projection tables")


def apply_run(args: argparse.Namespace) -> None:
    """``--run RUN_DIR``: the run's store (and blobs) where no flag names them."""
    run = run_of(args)
    if run is not None and getattr(args, "url", None) is None:
        fill_from_run(args, run, dsn="store_dsn")
    if run is not None and hasattr(args, "blobs"):
        fill_from_run(args, run, blobs="blobs")


def data_config(args: argparse.Namespace) -> Any:
    """The data manager's config: the file's ``data:`` section, then flags, then dotted overrides."""
    def off(flag: str) -> bool | None:
        return False if getattr(args, flag, False) else None

    flags = {"data.store.dsn": getattr(args, "dsn", None) or None,
             "data.store.database": getattr(args, "database", None) or None,
             "data.http.port": getattr(args, "http_port", None), "data.blobs": getattr(args, "blobs", None) or None,
             "data.run_id": getattr(args, "run_id", None) or None,
             "data.scheduler.enabled": off("no_scheduler"), "data.batcher.enabled": off("no_batcher")}
    return build(DataConfig, config_from_args(args, flags=flags).get("data") or {}, path="data")


def cmd_data_manager(args: argparse.Namespace) -> int:
    # Deferred: loads aiohttp, and every `dart` command imports this module.
    from dart.data.manager import DataManager

    cfg = data_config(args)
    bus = bus_from_args(args)
    store = Store.open(cfg.store)

    async def main() -> None:
        dm = DataManager(cfg, bus, store=store, blobs=open_store(cfg.blobs))
        stop_on_signals(dm)
        await dm.run()

    try:
        asyncio.run(main())
    except ExceptionGroup as group:
        # A supervised part failed and the others were stopped: say why, exit non-zero.
        dart_errors, other = group.split(DartError)
        if other is not None:
            raise
        for exc in dart_errors.exceptions if dart_errors else ():
            log.error("data manager stopped: %s", exc)
        return 1
    finally:
        store.close()
    return 0


def served_url(path: Path) -> str | None:
    """The SQL endpoint of a data manager serving the chdb store at ``path`` (chdb opens a path in one
    process only), from the ``<path>.http`` file it writes, if it answers; else None. That file may
    be part of someone else's run directory: only a loopback address is followed, and the address
    is said on stderr before it is contacted."""
    marker = http_file(path)
    if not marker.exists():
        return None
    url = marker.read_text().strip()
    target = parse_dsn(url) if url.startswith(("http://", "https://")) else None
    if target is None or not is_loopback(f"{target.host}:{target.port}"):
        raise UntrustedRun(f"{marker} names the SQL endpoint {url!r}, not one on this machine: not contacted "
                           f"(a data manager writes its loopback address there); to read a server, name it with --url")
    print(f"dart: the store {path} is served by a data manager: asking {url} (from {marker})", file=sys.stderr)
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
            return url if r.status == 200 else None
    except OSError:
        return None


def sql_client(url: str | None, dsn: str | None, database: str) -> Any:
    """A clickhouse-connect client on a server URL or an embedded chdb path (same API either way).
    ``url`` and ``dsn`` are the user's (flags, config); an endpoint found from a store's ``.http``
    file gets $CLICKHOUSE_USER / $CLICKHOUSE_PASSWORD only when it is $CLICKHOUSE_URL."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    if url is not None:
        return server_client(url, database, named=True)
    target = parse_dsn(dsn or StoreConfig().dsn)
    if target.kind == "http":
        return server_client(dsn or "", database, named=True)
    assert target.path is not None
    if (served := served_url(target.path)) is not None:
        return server_client(served, database, named=served == os.environ.get("CLICKHOUSE_URL"))
    require_store(target.path)
    try:
        return chdb_client(target.path, database)
    except ClickHouseError as exc:
        raise DartError(f"cannot open {target.path}: {exc}") from exc


def server_client(url: str, database: str, *, named: bool) -> Any:
    """A client of the ClickHouse server or SQL endpoint at ``url``; with $CLICKHOUSE_USER and
    $CLICKHOUSE_PASSWORD only if the user ``named`` it (else as user default, no password)."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    t = parse_dsn(url)
    # Credentials come from the environment, never from files or flags that end up in shell history.
    user, password = ((os.environ.get("CLICKHOUSE_USER", "default"), os.environ.get("CLICKHOUSE_PASSWORD", ""))
                      if named else ("default", ""))
    try:
        return clickhouse_connect.get_client(host=t.host, port=t.port, secure=t.secure, database=database,
                                             username=user, password=password)
    except (ClickHouseError, OSError) as exc:
        raise DartError(f"cannot reach the SQL endpoint {url}: {exc} (is the data manager running?)") from exc


def cmd_sql(args: argparse.Namespace) -> int:
    from clickhouse_connect.driver.exceptions import ClickHouseError

    # Deferred: loads aiohttp, and every `dart` command imports this module.
    from dart.data.http import split_format

    sql, fmt = split_format(args.query)  # clickhouse-connect appends its own FORMAT clause
    apply_run(args)
    client = sql_client(args.url, args.dsn, args.database)
    try:
        out = client.raw_query(sql, fmt=fmt or args.format)
    except ClickHouseError as exc:
        print(f"dart sql: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    sys.stdout.buffer.write(bytes(out))
    sys.stdout.flush()
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    apply_run(args)
    client = sql_client(args.url, args.dsn, args.database)
    try:
        report = build_report(lambda sql: client.query(sql).result_rows)
    finally:
        client.close()
    print(json.dumps(dataclasses.asdict(report), indent=1) if args.json else report.text())
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.txt").write_text(report.text() + "\n")
        for path in write_plots(report, args.out):
            print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_experience_import(args: argparse.Namespace) -> int:
    defaults = DataConfig()
    run_id = args.run_id or defaults.run_id
    blobs = open_store(args.blobs or defaults.blobs)
    try:
        events = load_experience(args.file, run_id=run_id, origin=args.origin, put_file=blobs.put_file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{args.file}: {exc}") from exc
    bus = bus_from_args(args)
    producer = Producer(bus, client_id="experience-import")
    try:
        for event in events:
            producer.send_nowait(event)
        producer.flush()
    finally:
        producer.close()
    print(f"imported {sum(type(e).__name__ == 'TrajectoryFinished' for e in events)} trajectories "
          f"({len(events)} events) to {bus.prefix}.*")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    import shutil
    import tempfile
    import time

    run = run_of(args)
    args.run = None  # the archive and store of RUN_DIR are read; its broker is not needed
    if run is not None:
        if not run.log.is_dir() or not run.store.is_dir():
            raise RunMissing(f"{run.workdir} is not a run directory with an archive and a store (no "
                             f"{run.log} or {run.store}): `dart up` writes both")
        if args.config is None and (run.root / "config" / "data-manager.yaml").exists():
            args.config = str(run.root / "config" / "data-manager.yaml")
        if args.dsn is None and args.url is None:
            args.dsn = run.store_dsn
    elif args.until_ms is not None or args.until_version is not None:
        raise ConfigError("replay: --until-ms/--until-version need RUN_DIR (they cut the archived log)")
    cfg = data_config(argparse.Namespace(config=args.config, dsn=args.dsn, database=args.database))
    bus = bus_from_args(args)
    live_db = cfg.store.database
    url = args.url
    live_store: Store | None = None
    served: str | None = None
    target = parse_dsn(cfg.store.dsn)
    if url is None and target.kind == "http":
        url = cfg.store.dsn
    elif url is None and target.path is not None:
        served = served_url(target.path)   # a data manager holds the path: ask it over HTTP
    tmp: Path | None = None
    if url is not None or served is not None:
        client = (sql_client(url, None, live_db) if url is not None
                  else server_client(served, live_db, named=served == os.environ.get("CLICKHOUSE_URL")))
        url = url or served
        live_query = lambda sql: client.query(sql).result_rows  # noqa: E731
        if args.out:
            fresh = Store.open_dsn(args.out, database=live_db)
        else:
            tmp = Path(tempfile.mkdtemp(prefix="dart-replay-"))
            fresh = Store.open_dsn(f"chdb://{tmp / 'chdb'}", database=live_db)
    else:
        # chdb opens one path per process: the fresh database goes into the live path.
        if args.out and parse_dsn(args.out).path != target.path:
            raise ConfigError(f"replay: no data manager serves {target.path}, and this process can open only "
                              f"that chdb path: drop --out (a new database in that path is used) or start the "
                              f"data manager so the live side is read over HTTP")
        if target.path is not None:
            require_store(target.path)  # replay reads the live store: never create one
        live_store = Store.open(cfg.store)
        live_query = live_store.query
        fresh = Store.open_dsn(cfg.store.dsn, database=f"{live_db}_replay_{int(time.time())}")
    try:
        if run is not None:
            log_dir = run.log
            until = (version_time_ms(log_dir, args.until_version) if args.until_version is not None
                     else args.until_ms)
            t0 = time.monotonic()
            counts = rebuild_from_archive(log_dir, fresh, until_ms=until)
            n = sum(counts.values())
            print(f"replayed {n} archived events from {len(counts)} topics of {log_dir} into "
                  f"{fresh.target.path}:{fresh.database} ({n / max(1e-9, time.monotonic() - t0):,.0f} events/s)")
            if until is not None:
                args.keep = True  # a past state is for looking at, not for comparing with today's store
                print(f"the state as of {until} ms (Kafka time) is kept in database {fresh.database}: query it with "
                      f"`dart sql --dsn chdb://{fresh.target.path} --database {fresh.database} ...`")
                return 0
        else:
            counts = asyncio.run(rebuild(bus, fresh))
            print(f"replayed {sum(counts.values())} events from {len(counts)} topics of {bus.prefix}.* "
                  f"into {fresh.target.path}:{fresh.database}")
        # A finished run's store does not lag its log: no point in waiting for it to catch up.
        deadline = time.monotonic() + (0.0 if run is not None and url is None else args.wait_s)
        while True:
            checks, diffs = compare(live_query, live_db, fresh.query, fresh.database, TABLES, args.show)
            if all(c.equal for c in checks) or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        print(format_checks(checks, diffs))
        return 0 if all(c.equal for c in checks) else 1
    finally:
        if live_store is not None and not args.keep:
            fresh.command(f"DROP DATABASE IF EXISTS {fresh.database}")
        fresh.close()
        if live_store is not None:
            live_store.close()
        if url is not None:
            client.close()
        if tmp is not None and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def cmd_trace(args: argparse.Namespace) -> int:
    # Deferred: loads Pillow, and every `dart` command imports this module.
    from dart.data.trace import load_trace, render_trace

    apply_run(args)
    cfg = data_config(argparse.Namespace(config=args.config, dsn=args.dsn, blobs=args.blobs))
    client = sql_client(args.url, cfg.store.dsn, args.database)
    try:
        view = load_trace(lambda sql, params: client.query(sql, parameters=params).result_rows, args.database,
                          args.rollout_id)
    finally:
        client.close()
    blobs = open_store(cfg.blobs)

    def load_png(digest: str) -> bytes | None:
        try:
            return blobs.get(digest)
        except BlobError as exc:
            log.warning("step screenshot %s: %s", digest[:12], exc)
            return None

    path = render_trace(view, load_png, args.out / args.rollout_id)
    print(f"wrote {path} and {path.with_name('strip.png')} ({len(view.steps)} steps, {view.status}, "
          f"reward {view.reward})")
    return 0
