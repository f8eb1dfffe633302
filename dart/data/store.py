"""One client for both stores: chdb embedded (default) or a ClickHouse server over HTTP.

clickhouse-connect drives both (``get_client(dsn="chdb:///abs/path")`` or
``get_client(host=..., port=...)``). Its chdb client is synchronous: async code goes through
:class:`AsyncStore`, which runs every call on one dedicated thread, so calls never interleave
on the engine handle and the event loop never blocks on a query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from dart.data.config import StoreConfig
from dart.data.rows import Row
from dart.data.schema import MIGRATIONS, SCHEMA_VERSION_DDL, Migration, pending, render
from dart.data.sqlguard import literal
from dart.errors import DartError

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreError(DartError, RuntimeError):
    """The projection store refused a connection, a query or an insert."""


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed DSN: an embedded chdb path or a server URL."""

    kind: str
    """chdb | http"""
    path: Path | None = None
    host: str = ""
    port: int = 0
    secure: bool = False


def parse_dsn(dsn: str) -> Target:
    """chdb:///abs/path, chdb://relative/path, http(s)://host[:port] (pure)."""
    if dsn.startswith("chdb://"):
        raw = dsn[len("chdb://"):]
        if not raw:
            raise StoreError(f"dsn {dsn!r} names no path: use chdb:///abs/path")
        return Target("chdb", path=Path(os.path.abspath(os.path.expanduser(raw))))
    url = urlparse(dsn)
    if url.scheme in ("http", "https") and url.hostname:
        secure = url.scheme == "https"
        return Target("http", host=url.hostname, port=url.port or (8443 if secure else 8123), secure=secure)
    raise StoreError(f"dsn {dsn!r} is neither chdb:///path nor http(s)://host:port")


def http_file(path: Path) -> Path:
    """Where a data manager serving the chdb database at ``path`` writes its HTTP URL."""
    return path.with_name(path.name + ".http")


CHDB_CONFIG = Path(__file__).with_name("chdb.xml")
"""The configuration every chdb engine of dart runs with: no user scripts, SQL functions,
dictionaries or user files from inside a store (or from a ``config.xml`` in the current
directory, which chdb reads when it is given none)."""


def chdb_client(path: Path, database: str | None = None) -> Any:
    """A clickhouse-connect client on the embedded chdb store at ``path`` (created if missing),
    its engine started with :data:`CHDB_CONFIG`."""
    import clickhouse_connect

    return clickhouse_connect.get_client(dsn=f"chdb://{path}", database=database,
                                         chdb_options={"config-file": str(CHDB_CONFIG)})


def _client(target: Target, username: str = "default", password: str = "") -> Any:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    try:
        if target.kind == "chdb":
            assert target.path is not None
            target.path.parent.mkdir(parents=True, exist_ok=True)
            return chdb_client(target.path)
        return clickhouse_connect.get_client(
            host=target.host, port=target.port, secure=target.secure, username=username, password=password
        )
    except (ClickHouseError, OSError) as exc:
        if target.kind == "chdb":
            hint = http_file(target.path) if target.path else None
            raise StoreError(
                f"cannot open chdb database {target.path}: {exc}. chdb allows one process per database "
                f"path (and one path per process); if a data manager serves it, query it with "
                f"`dart sql --url $(cat {hint})` instead"
            ) from exc
        raise StoreError(f"cannot reach ClickHouse at {target.host}:{target.port}: {exc}") from exc


class Store:
    """Synchronous projection store (use from one thread at a time, or through AsyncStore)."""

    def __init__(self, client: Any, database: str, target: Target) -> None:
        self.client = client
        self.database = database
        self.target = target

    @classmethod
    def open(cls, cfg: StoreConfig) -> Store:
        target = parse_dsn(cfg.dsn)
        client = _client(target, cfg.username, cfg.password)
        return cls(client, cfg.database, target)

    @classmethod
    def open_dsn(cls, dsn: str, database: str = "dart") -> Store:
        return cls.open(StoreConfig(dsn=dsn, database=database))

    # ---------------------------------------------------------------- schema

    def applied_versions(self) -> set[int]:
        rows = self.query(f"SELECT version FROM {self.database}.schema_version FINAL")
        return {int(r[0]) for r in rows}

    def migrate(self, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
        """Create the database and apply pending migrations in order; returns the versions applied."""
        self.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
        self.command(render(SCHEMA_VERSION_DDL, self.database))
        done: list[int] = []
        for m in pending(self.applied_versions(), migrations):
            for statement in m.statements:
                self.command(render(statement, self.database))
            # SQL, not insert_rows: the client's insert imports pandas (a second of start-up for
            # a command such as `dart replay` that may never insert a row through the client).
            # Literal values, not query parameters: a parameter in VALUES is an expression, which
            # the SQL endpoint's writer refuses (its inserted data must be data).
            self.command(f"INSERT INTO {self.database}.schema_version (version, name) "
                         f"VALUES ({int(m.version)}, {literal(m.name)})")
            log.info("projection schema: applied migration %d (%s)", m.version, m.name)
            done.append(m.version)
        return done

    # ---------------------------------------------------------------- I/O

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        from clickhouse_connect.driver.exceptions import ClickHouseError

        try:
            return fn(*args, **kwargs)
        except ClickHouseError as exc:
            raise StoreError(f"ClickHouse ({self.target.kind}) refused: {exc}") from exc

    def command(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        return self._call(self.client.command, sql, parameters=params)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        return list(self._call(self.client.query, sql, parameters=params).result_rows)

    def query_dicts(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return list(self._call(self.client.query, sql, parameters=params).named_results())

    def raw(self, sql: str, fmt: str = "TabSeparatedWithNames") -> bytes:
        return bytes(self._call(self.client.raw_query, sql, fmt=fmt))

    def insert_rows(self, table: str, rows: Sequence[Row]) -> int:
        """Insert rows (dicts with the same keys) into ``database.table``; returns the count."""
        if not rows:
            return 0
        columns = list(rows[0])
        data = [[row[c] for c in columns] for row in rows]
        with _rows_not_a_dataframe():
            self._call(self.client.insert, f"{self.database}.{table}", data, column_names=columns)
        return len(rows)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # closing is best effort
            log.debug("closing the store client failed", exc_info=True)


@contextlib.contextmanager
def _rows_not_a_dataframe() -> Iterator[None]:
    """clickhouse-connect's insert asks whether its rows are a pandas DataFrame, and imports pandas
    to ask (chdb depends on pandas, so it is installed): most of a second, in a process that never
    uses pandas otherwise (`dart replay`, the data manager). Rows here are lists of lists: until
    something else has imported pandas, the answer is given for this call, then taken back."""
    from clickhouse_connect.driver import options

    if "pandas" in sys.modules or "pd" in vars(options):
        yield
        return
    options.pd = None
    try:
        yield
    finally:
        vars(options).pop("pd", None)


class AsyncStore:
    """Runs a Store's calls on one dedicated thread (chdb's client is sync only)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dart-store")
        self.usage: dict[str, list[float]] = {}
        """Per kind of call (``run``'s ``kind``, else the function's name): [calls, seconds waiting
        for the store thread, seconds running on it]; ``take_usage`` reads and resets it."""

    @property
    def database(self) -> str:
        return self.store.database

    async def run(self, fn: Callable[..., T], *args: Any, kind: str | None = None) -> T:
        queued = time.perf_counter()
        started = queued

        def timed() -> T:
            nonlocal started
            started = time.perf_counter()
            return fn(*args)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, timed)
        finally:
            u = self.usage.setdefault(kind or getattr(fn, "__name__", "call"), [0, 0.0, 0.0])
            u[0] += 1
            u[1] += started - queued
            u[2] += time.perf_counter() - started

    def take_usage(self) -> dict[str, list[float]]:
        usage, self.usage = self.usage, {}
        return usage

    async def query(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        return await self.run(self.store.query, sql, params)

    async def insert_rows(self, table: str, rows: Sequence[Row]) -> int:
        return await self.run(self.store.insert_rows, table, rows)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
