"""The SQL endpoint's engine: runs a checked ``SqlRequest`` on a fresh chdb handle (blocking: the
server calls it from worker threads)."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

from dart.data import sqlguard
from dart.data.config import SqlLimits
from dart.data.sqlrequest import SqlRequest, trailing_format

log = logging.getLogger(__name__)
_INSERT_ANYWHERE = re.compile(r"\bINSERT\b", re.IGNORECASE)


def _params(req: SqlRequest) -> dict[str, Any]:
    return {"params": req.params} if req.params else {}


class Engine:
    """Runs SqlRequests on fresh chdb handles (blocking: call from a worker thread).

    Check what runs, run what was checked: the request's text reaches chdb only as an escaped
    string literal given to ClickHouse's own formatter (``canonical``); the canonical text it
    returns is what the rules of ``dart.data.sqlguard`` judge and what executes."""

    def __init__(self, path: Path, limits: SqlLimits | None = None, database: str = "dart") -> None:
        self.path = str(path)
        self.limits = limits or SqlLimits()
        self.database = database
        self.databases = sqlguard.OTHER_DATABASES
        """Lower-case names of the databases other than ours (``refresh_databases`` adds chdb's)."""

    def refresh_databases(self) -> None:
        """Create our database if it is not there yet (every session runs in it, never in chdb's
        ``default``) and learn every other database chdb has (blocking), so a dotted name in any
        of them is refused by name (``sqlguard.check_tables``)."""
        import chdb

        conn = chdb.connect(self.path)
        try:
            conn.query(f"CREATE DATABASE IF NOT EXISTS `{self.database}`", "TabSeparated")
            names = (conn.query("SELECT name FROM system.databases", "TabSeparatedRaw").bytes() or b"").decode()
        finally:
            conn.close()
        self.databases = sqlguard.OTHER_DATABASES | {n.lower() for n in names.split("\n")
                                                     if n and n.lower() != self.database.lower()}

    def kill(self, tag: str) -> None:
        """Stop the query run under ``tag`` (its client went away); blocking, best effort."""
        import chdb

        conn = chdb.connect(self.path)
        try:
            conn.query(f"KILL QUERY WHERE Settings['log_comment'] = {sqlguard.literal(tag)} ASYNC", "TabSeparated")
        except Exception:  # the query may have ended meanwhile
            log.debug("KILL QUERY %s failed", tag, exc_info=True)
        finally:
            conn.close()

    def _limit_settings(self, tag: str) -> str:
        lim = self.limits
        # Values expressions off: an INSERT's data is data, never a function call such as file().
        # log_comment tags the query so `kill` finds it (clients cannot set it: not in ALLOWED_SETTINGS).
        return (f"SET max_execution_time = {lim.max_execution_time_s:g}, max_result_rows = {lim.max_result_rows}, "
                f"max_result_bytes = {lim.max_result_bytes}, result_overflow_mode = 'throw', "
                f"max_memory_usage = {lim.max_memory_bytes}, input_format_values_interpret_expressions = 0, "
                f"input_format_values_deduce_templates_of_expressions = 0, log_comment = {sqlguard.literal(tag)}")

    @staticmethod
    def canonical(conn: Any, text: str) -> str:
        """ClickHouse's canonical text of the one statement in ``text`` (parsed, not executed):
        SqlRefused for several statements, BadSql for a syntax error or a canonical form that
        formats to something else again (then it cannot be trusted to be what was checked)."""

        def fmt(sql: str) -> str:
            try:
                res = conn.query(f"SELECT formatQuerySingleLine({sqlguard.literal(sql)})", "RawBLOB")
            except Exception as exc:
                msg = str(exc)
                # chdb quotes the whole statement after this: cut it (a find, not a regex over the text).
                msg = msg[:cut] if (cut := msg.find(": In scope SELECT formatQuerySingleLine(")) >= 0 else msg
                msg = msg.strip()
                if "Multi-statements are not allowed" in msg:
                    raise sqlguard.SqlRefused("one-statement", "send one statement per request: ClickHouse's parser "
                                              f"found more than one ({msg})", code=62, name="SYNTAX_ERROR") from None
                raise sqlguard.BadSql(msg) from None
            # A literal written '\xFF' comes back as the byte itself: keep it, written as an escape again.
            return (res.bytes() or b"").decode("utf-8", "surrogateescape")

        first = fmt(text)
        ascii_bytes = sqlguard.escape_bytes(first)
        if fmt(ascii_bytes) != first:
            raise sqlguard.BadSql("ClickHouse's canonical form of this query is not stable (formatting it again "
                                  "changes it), so it is not run; rewrite the query", "canonical-form")
        return ascii_bytes

    def precheck(self, req: SqlRequest) -> tuple[str, bytes | None, str | None]:
        """The checks on the request's text that need no chdb (so the server runs them before a
        query slot): the statement's size and bracket depth; returns (statement, INSERT data,
        data format) with the data of an ``INSERT ... VALUES`` split off."""
        head, data, data_format = req.sql, req.insert_data, req.insert_format
        # Only an INSERT's text may run past the size limit (its data after VALUES): skip lexing others.
        maybe_insert = len(req.sql) <= self.limits.max_query_chars or _INSERT_ANYWHERE.search(req.sql[:4096])
        # The head must fit the size limit anyway: only that much is lexed (linear), whatever the body's size.
        split = sqlguard.split_insert(req.sql, self.limits.max_query_chars + 1) if data is None and maybe_insert \
            else None
        if split is not None:
            head, text, data_format = split
            data = text.encode("utf-8")
        if len(head) > self.limits.max_query_chars:
            raise sqlguard.SqlRefused("query-size", f"the statement is {len(head)} characters, over the limit of "
                                      f"{self.limits.max_query_chars} (SqlLimits.max_query_chars)", code=62,
                                      name="SYNTAX_ERROR")
        if (depth := sqlguard.bracket_depth(head)) > self.limits.max_bracket_depth:
            raise sqlguard.SqlRefused("query-size", f"the statement nests brackets {depth} deep, over the limit of "
                                      f"{self.limits.max_bracket_depth} (SqlLimits.max_bracket_depth)", code=62,
                                      name="SYNTAX_ERROR")
        return head, data, data_format

    def run(self, req: SqlRequest, *, writer: bool = False, tag: str = "") -> tuple[bytes, str, dict[str, Any]]:
        """Run one request; SqlRefused / BadSql for a statement this role may not run (nothing ran).
        ``tag`` names the query for ``kill``."""
        import chdb

        sqlguard.check_text(req.sql)
        if req.database not in (None, self.database):
            raise sqlguard.SqlRefused("dart-database-only", f"database {req.database} is refused: clients of this "
                                      f"endpoint reach the database {self.database}", code=497, name="ACCESS_DENIED")
        head, data, data_format = self.precheck(req)
        conn = chdb.connect(self.path)
        try:
            # Always our database: chdb's `default` is a window on the host's files.
            conn.query(f"USE `{self.database}`", "TabSeparated")
            if req.settings:
                try:
                    conn.query("SET " + ", ".join(f"{k} = {sqlguard.literal(v)}" for k, v in req.settings.items()),
                               "TabSeparated")
                except Exception as exc:  # a value chdb cannot read for that setting: the client's error
                    raise sqlguard.BadSql(f"a URL setting's value: {str(exc).strip()}", "bad-setting-value") from None
            # After the client's settings, so its own values cannot raise the limits or lift readonly.
            conn.query(self._limit_settings(tag or f"dart-http-{uuid.uuid4()}"), "TabSeparated")
            if not writer:
                conn.query("SET readonly = 1", "TabSeparated")
            canonical = self.canonical(conn, head)
            statement = sqlguard.inspect(canonical)
            sqlguard.check_keyword(statement, writer=writer)
            if writer and statement.keyword in sqlguard.READ_KEYWORDS:
                conn.query("SET readonly = 1", "TabSeparated")  # the writer's reads are reads too
            # chdb runs every statement of the text it is given, EXPLAIN AST A; B included: the text
            # sent is itself ClickHouse's canonical one statement, not a prefix glued to a checked one.
            explain = self.canonical(conn, f"EXPLAIN AST {canonical}")
            ast = conn.query(explain, "TabSeparatedRaw", **_params(req)).bytes().decode("utf-8", "replace")
            sqlguard.check_ast(ast, writer=writer, database=self.database, statement=statement,
                               databases=self.databases)
            if writer:
                sqlguard.check_writer(statement, ast, self.database)
            inserts_data = statement.keyword == "INSERT" and statement.output_format is not None \
                and "SELECT" not in statement.words
            if data is not None or inserts_data:
                if data is None or not inserts_data:
                    raise sqlguard.BadSql("an INSERT's data goes after VALUES or FORMAT X (in the body, or the "
                                          "statement in ?query= and the data in the body)")
                fmt = statement.output_format or data_format or "TabSeparated"
                return self._insert(conn, canonical, fmt, data, req)
            fmt = statement.output_format or req.default_format
            res = conn.query(canonical, fmt, **_params(req))
            data = res.bytes() or b""
            return data, fmt, self._summary(res, len(data))
        finally:
            conn.close()

    def _insert(self, conn: Any, canonical: str, fmt: str, data: bytes,
                req: SqlRequest) -> tuple[bytes, str, dict[str, Any]]:
        fd, tmp = tempfile.mkstemp(prefix="dart-http-insert-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            head = found[0] if (found := trailing_format(canonical)) is not None else canonical
            # The checked canonical head, a file name of ours and a checked format name.
            sql = f"{head} FROM INFILE {sqlguard.literal(tmp)} FORMAT {fmt}"
            res = conn.query(sql, "TabSeparated", **_params(req))
            return b"", fmt, self._summary(res, 0)
        finally:
            os.unlink(tmp)

    @staticmethod
    def _summary(res: Any, result_bytes: int) -> dict[str, Any]:
        def num(name: str) -> int:
            fn = getattr(res, name, None)
            try:
                return int(fn()) if callable(fn) else 0
            except Exception:  # older chdb builds lack some counters
                return 0

        return {
            "read_rows": str(num("rows_read")), "read_bytes": str(num("bytes_read")),
            "written_rows": str(num("rows_written")), "written_bytes": str(num("bytes_written")),
            "total_rows_to_read": "0", "result_rows": "0", "result_bytes": str(result_bytes),
            "elapsed_ns": str(int(float(getattr(res, "elapsed", lambda: 0.0)()) * 1e9)),
        }
