"""Property-based suite over SQL-like text built from every quote, comment, heredoc, escape and
Unicode quote ClickHouse's lexer knows, against chdb's own parser (hypothesis; `make test` runs
the "default" profile, `make fuzz` the long one).

- What reaches chdb for a request is only: the endpoint's own fixed statements, the request
  text inside an escaped literal given to ``formatQuerySingleLine``, ``EXPLAIN AST`` of the
  canonical text, and the canonical text itself. The raw text never (unless it is already
  canonical).
- The canonical text parses to the same AST as the request, and formatting it again gives it
  back. (A bare expression such as ``0``, which ``EXPLAIN AST`` does not parse, is canonical
  ``SELECT 0``: formatQuery reads it as ClickHouse's implicit SELECT.)
- On canonical text the tokenizer agrees with ClickHouse's parser: one statement, and INTO
  OUTFILE where the parse has an output file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import chdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dart.data import sqlguard
from dart.data.config import SqlLimits
from dart.data.http import Engine, SqlRequest

pytestmark = pytest.mark.clickhouse

FRAGMENTS = [
    # quotes ClickHouse reads: ASCII, backquote, double, and the Unicode ones its lexer accepts
    "'", '"', "`", "‘", "’", "“", "”", "''", '""', "``", "\\", "\\'", "\\\\", "\\x27", "\\u2019", "\\n", "\\0",
    # comments and heredocs
    "--", "-- ", "#", "# ", "#!", "/*", "*/", "/* /* */ */", "\n", "\r\n", "\t", "$$", "$a$", "$a", "$1$",
    # statement structure and the things a hidden statement would want
    ";", " ; ", "SELECT ", "SELECT 1", " 1", "(", ")", ",", " AS x", " FROM ", "numbers(2)", "system.one",
    "system.processes", "file(", "'/etc/hostname'", "‘/etc/hostname’", " INTO OUTFILE ", "'out.txt'",
    " FORMAT ", "JSON", "TSV", " SETTINGS ", "max_threads = 1", "format_schema = 'x'", " x", "é", "\u00a0",
    "{p:UInt8}", "=", "+", "1e3", "-", "*", ".", " WHERE ", " IN ", "NULL", "[", "]", "x'41'", "0x1F",
]
SQLISH = st.lists(st.sampled_from(FRAGMENTS), max_size=24).map("".join)
PREFIXES = st.sampled_from(["", "SELECT ", "SELECT 1", "WITH 1 AS a SELECT ", "EXPLAIN SELECT ", "SELECT '", "SELECT ‘"])
REQUESTS = st.one_of(st.tuples(PREFIXES, SQLISH).map("".join), st.text(max_size=80))


class Recorder:
    """A chdb connection that records the text of every query it is given."""

    def __init__(self, conn, seen: list[str]) -> None:
        self.conn, self.seen = conn, seen

    def query(self, sql: str, *args, **kwargs):
        self.seen.append(sql)
        return self.conn.query(sql, *args, **kwargs)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def engine(chdb_path: Path, tmp_path_factory) -> Iterator[Engine]:
    # Held open for the module: with no connection open, chdb shuts its engine down and every
    # example's connect starts it again, which costs more the more the session's path holds
    # (after the other data tests in the process, ~2 s per example instead of a few ms).
    conn = chdb.connect(str(chdb_path))
    conn.query("CREATE DATABASE IF NOT EXISTS fuzz")
    try:
        yield Engine(chdb_path, SqlLimits(max_execution_time_s=1, max_result_rows=1000), database="fuzz")
    finally:
        conn.close()


def _ast(conn, sql: str) -> str:
    return conn.query(f"EXPLAIN AST {sql}", "TabSeparatedRaw", params={"p": "1"}).bytes().decode("utf-8", "replace")


def _parse(conn, sql: str) -> str:
    """EXPLAIN AST's answer, or ``Code: N.`` of its error (EXPLAIN AST also checks a SETTINGS
    clause's names: ``SETTINGS FORMAT`` is an unknown setting, raw and canonical alike)."""
    try:
        return _ast(conn, sql)
    except Exception as exc:
        m = re.search(r"Code: (\d+)\.", str(exc))
        return f"Code: {m.group(1) if m else '?'}."


@given(REQUESTS)
def test_only_the_canonical_text_runs_and_it_parses_like_the_request(engine: Engine, tmp_path_factory, sql: str):
    seen: list[str] = []
    real_connect = chdb.connect
    cwd = os.getcwd()
    work = tmp_path_factory.mktemp("fuzz-cwd")
    os.chdir(work)  # a file an INTO OUTFILE slipping through would write lands here
    try:
        chdb.connect = lambda path: Recorder(real_connect(path), seen)
        try:
            engine.run(SqlRequest(sql, "TabSeparated", None, {"p": "1"}, {}))
        except (sqlguard.SqlRefused, sqlguard.BadSql):
            pass
        except Exception as exc:  # chdb's error running a checked statement (unknown table, types...)
            assert "Code:" in str(exc), exc
    finally:
        chdb.connect = real_connect
    try:
        _check_what_ran(engine, sql, seen)
    finally:
        os.chdir(cwd)
    assert not list(work.iterdir()), "a file was written"


def _check_what_ran(engine: Engine, sql: str, seen: list[str]) -> None:
    canonical = [s[len("EXPLAIN AST "):] for s in seen if s.startswith("EXPLAIN AST ")]
    for text in seen:
        ours = text.startswith(("USE `", "SET ", "SELECT formatQuerySingleLine('", "EXPLAIN AST "))
        assert ours or text in canonical, f"chdb was given text that is not canonical: {text!r}"
        if sql.strip() and text.strip() == sql.strip():
            assert text in canonical  # the raw text reached chdb only because it is canonical already
    if not canonical:
        return
    (text,) = canonical
    conn = chdb.connect(str(engine.path))
    try:
        conn.query("SET readonly = 1")
        with contextlib.suppress(sqlguard.SqlRefused):  # the raw text is one statement: formatQuery said so
            assert engine.canonical(conn, text) == text  # a fixpoint
            assert _parse(conn, text) == _parse(conn, sql) or (
                # a bare expression: formatQuery reads it as an implicit SELECT, EXPLAIN AST does not
                text.startswith("SELECT ") and _parse(conn, sql).startswith("Code: 62."))
            assert not _parse(conn, text).startswith("Code: 62."), "the canonical text is not even parsed"
    finally:
        conn.close()


@given(REQUESTS)
def test_the_tokenizer_agrees_with_clickhouse_on_canonical_text(engine: Engine, sql: str):
    conn = chdb.connect(str(engine.path))
    try:
        conn.query("SET readonly = 1")
        try:
            text = engine.canonical(conn, sql)
        except (sqlguard.SqlRefused, sqlguard.BadSql):
            return
        words = sqlguard.tokens(text)  # never raises on canonical text
        assert ";" not in words
        outfile = any(a == "INTO" and b == "OUTFILE" for a, b in itertools.pairwise(words))
        if outfile:
            return  # the parse is not needed: the endpoint refuses it before EXPLAIN AST
        parse = _parse(conn, text)
        if parse.startswith("Code: "):  # EXPLAIN AST also checks SETTINGS names: SETTINGS FORMAT is unknown
            assert parse != "Code: 62.", f"ClickHouse cannot parse its own canonical text: {text}"
            return
        nodes = sqlguard._nodes(parse)
        root_literals = [n for n in sqlguard._children(nodes, 0) if n.kind == "Literal" and n.name.startswith("'")]
        assert not (nodes[0].kind.startswith("Select") and root_literals), f"an output file the tokenizer missed: {text}"
        try:
            statement = sqlguard.inspect(text)
        except sqlguard.SqlRefused:
            return
        # every SETTINGS clause of the parse is one whose names the tokenizer read
        assert statement.settings_clauses >= sum(n.kind == "Set" for n in nodes), text
    finally:
        conn.close()
