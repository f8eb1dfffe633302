"""Opening a run is reading data: a chdb store someone else made is checked before it is opened.

chdb keeps every database, table and view as a definition (``ATTACH ...`` text) in the store's
own folder and loads them when it opens the path. A shared or downloaded run directory could
hold a view that calls ``executable()`` (a script run as you), reads ``url()`` (sends data to
a listener), an engine that connects out when it loads (Kafka, a refreshable materialized
view), or a dictionary with an external source — and ``readonly = 1`` stops none of these.

So before a reader opens a run's store, :func:`check_store` reads every definition file in it
and applies the SQL endpoint's writer rules (:func:`dart.data.sqlguard.check_writer`: the
allow-lists of engines, table functions and scalar functions, plain views of their own
database, the table settings dart uses) to ClickHouse's own parse of each. The parse runs in a
throwaway in-memory chdb engine that never opens the store (``formatQuerySingleLine`` and
``EXPLAIN AST`` execute nothing), and every engine dart starts uses
:data:`dart.data.store.CHDB_CONFIG`, which points the scripts folder outside any store. A store
that fails is refused with one line naming the object; ``--trust-run`` is the only way past.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

from dart.data.sqlguard import (
    OTHER_DATABASES,
    BadSql,
    SqlRefused,
    check_ast,
    check_writer,
    escape_bytes,
    inspect,
    literal,
)
from dart.data.store import CHDB_CONFIG
from dart.rundir import RunInfo, UntrustedRun, open_run

STORE_ENTRIES = frozenset({"metadata", "metadata_dropped", "store", "data", "tmp", "flags", "status", "uuid"})
"""What chdb keeps at the top of a store. Anything else (``user_scripts``, ``user_defined``,
``access``, ``named_collections``, a ``config.xml``) is not part of a dart store: refused."""

DATABASE_ENGINES = frozenset({"Atomic", "Ordinary"})
"""Engines of a database whose tables are in the store itself (not MySQL, PostgreSQL, SQLite,
Filesystem, S3, Replicated, ...)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UUID = r"'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'"
_DATABASE = re.compile(rf"ATTACH DATABASE _ (?:UUID ({_UUID}) )?ENGINE = (\w+)")
_OBJECT = re.compile(rf"ATTACH (TABLE|VIEW) _ (?:UUID {_UUID} )?(.*)", re.DOTALL)


Parse = Callable[[str], tuple[str, str]]
"""SQL text -> (ClickHouse's canonical one-statement text, its ``EXPLAIN AST``)."""


def open_checked_run(path: str, *, trust: bool = False) -> RunInfo:
    """The run in ``path``, its store checked (``trust``: not checked); where ``dart`` parses the
    command line of every command that reads a run, before the command runs."""
    run = open_run(path, trust=trust)
    if not trust and run.store.is_dir():
        check_store(run.store)
    return run


def check_store(store: Path) -> None:
    """:class:`UntrustedRun` naming the first object of the chdb store at ``store`` that is not
    data dart makes (a table of an in-process engine, a plain view of its own database);
    nothing in the store is loaded or run to find out."""
    _check_layout(store)
    with _parser() as parse:
        databases = {}  # database folder (resolved) -> name
        for path in sorted((store / "metadata").glob("*.sql")):
            name = _checked_name(store, path, unquote(path.stem), "database")
            uuid = _check_database(store, path, parse)
            folder = store / "store" / uuid[1:4] / uuid[1:-1] if uuid else store / "metadata" / path.stem
            databases[folder.resolve()] = name
        for path in _definitions(store):
            if path.parent == store / "metadata":
                continue
            database = (unquote(path.name.split(".")[0]) if path.parent.name == "metadata_dropped"
                        else databases.get(path.parent.resolve()))
            if database is None:
                raise _refused(store, path, "a definition of no database in the store")
            table = unquote(path.name.split(".")[1] if path.parent.name == "metadata_dropped" else path.stem)
            _check_object(store, path, parse, _checked_name(store, path, database, "database"),
                          _checked_name(store, path, table, "table"), frozenset(databases.values()))


def _refused(store: Path, path: Path, why: str) -> UntrustedRun:
    return UntrustedRun(f"the store {store} is refused: {path.relative_to(store)}: {why} (it would run or reach "
                        f"out when read; --trust-run opens it anyway, only for a run whose maker you trust)")


def _check_layout(store: Path) -> None:
    """Only chdb's own folders at the top; no link leads out of the store."""
    for entry in sorted(store.iterdir()):
        if entry.name not in STORE_ENTRIES:
            raise _refused(store, entry, "not part of a chdb store (user scripts, functions, users or a "
                                         "config are not data)")
    root = store.resolve()
    for top, dirs, files in os.walk(store):
        for name in [*dirs, *files]:
            path = Path(top) / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise _refused(store, path, f"a link out of the store (to {path.resolve()})")


def _definitions(store: Path) -> Iterator[Path]:
    """Every ``*.sql`` file of the store, wherever chdb might load one from."""
    for top in ("metadata", "metadata_dropped", "store"):
        for folder, _, files in os.walk(store / top):
            yield from (Path(folder) / f for f in sorted(files) if f.endswith(".sql"))


def _checked_name(store: Path, path: Path, name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        raise _refused(store, path, f"{what} name {name!r} is not one dart makes")
    return name


def _read(path: Path) -> str | None:
    """The file's text; None if it went away meanwhile (a data manager may be writing the store:
    chdb writes a definition beside it and renames it, and removes a dropped one)."""
    try:
        return path.read_text(errors="surrogateescape")
    except FileNotFoundError:
        return None


def _check_database(store: Path, path: Path, parse: Parse) -> str | None:
    """The database's UUID (quoted), None for an Ordinary one (or one dropped meanwhile)."""
    text = _read(path)
    if text is None:
        return None
    canonical, _ = _parsed(store, path, parse, text)
    m = _DATABASE.fullmatch(canonical)
    if m is None or m.group(2) not in DATABASE_ENGINES:
        raise _refused(store, path, f"{canonical[:120]!r}: a database whose tables are elsewhere (engines "
                                    f"allowed: {', '.join(sorted(DATABASE_ENGINES))})")
    return m.group(1)


def _check_object(store: Path, path: Path, parse: Parse, database: str, name: str, others: frozenset[str]) -> None:
    text = _read(path)
    if text is None:
        return
    canonical, _ = _parsed(store, path, parse, text)
    m = _OBJECT.fullmatch(canonical)
    if m is None:
        raise _refused(store, path, f"{canonical[:120]!r}: not a table or a plain view (dictionaries, "
                                    f"materialized, live and window views run or reach out on their own)")
    # The same definition as the writer's CREATE of the SQL endpoint would state it, judged by its rules.
    create, ast = _parsed(store, path, parse, f"CREATE {m.group(1)} {database}.{name} {m.group(2)}")
    try:
        statement = inspect(create)
        check_ast(ast, writer=True, database=database, statement=statement,
                  databases=OTHER_DATABASES | {d.lower() for d in others})
        check_writer(statement, ast, database)
    except (SqlRefused, BadSql) as exc:
        raise _refused(store, path, f"{database}.{name}: {exc}") from exc


def _parsed(store: Path, path: Path, parse: Parse, text: str) -> tuple[str, str]:
    try:
        return parse(text)
    except RuntimeError as exc:
        raise _refused(store, path, f"not one statement ClickHouse reads ({str(exc).splitlines()[0][:200]})") from exc


class _parser:
    """A parse-only chdb engine: in memory, with :data:`CHDB_CONFIG`, closed on exit. Where this
    process already runs chdb on some path (one engine per process), that engine parses: the two
    statements used execute nothing."""

    def __enter__(self) -> Parse:
        import chdb

        self.shared = False
        try:
            self.conn = chdb.connect(f":memory:?config-file={CHDB_CONFIG}")
        except RuntimeError as exc:
            running = re.search(r"initialized with path '([^']*)'", str(exc))
            if running is None:
                raise
            self.conn, self.shared = chdb.connect(running.group(1)), True
        return self.parse

    def canonical(self, text: str) -> str:
        """ClickHouse's one-line text of one statement (it parses and runs nothing; several are refused)."""
        out = self.conn.query(f"SELECT formatQuerySingleLine({literal(text)})", "TSVRaw")
        return escape_bytes(out.bytes().decode("utf-8", "surrogateescape").rstrip("\n"))

    def parse(self, text: str) -> tuple[str, str]:
        canonical = self.canonical(text)
        # The text chdb is given is itself one canonical statement: chdb runs every statement of
        # EXPLAIN AST A; B, so nothing may be glued to a checked one.
        ast = self.conn.query(self.canonical(f"EXPLAIN AST {canonical}"), "TSVRaw")
        return canonical, ast.bytes().decode("utf-8", "surrogateescape")

    def __exit__(self, *exc: object) -> None:
        if not self.shared:  # the engine another client of this process uses stays open
            self.conn.close()
