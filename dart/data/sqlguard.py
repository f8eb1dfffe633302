"""What a client of the SQL endpoint may run: pure rules over a query and over ClickHouse's parse of it.

Three layers, each for what the one before it cannot see (``dart.data.http`` applies them):

1. **chdb settings** (not here): every analytics request runs with ``readonly = 1`` set by the
   server after the client's own settings, so neither a URL parameter nor a ``SET`` nor a
   ``SETTINGS`` clause can lift it. chdb then refuses DDL, DML, ``SYSTEM`` and the table
   functions that create storage (``url``, ``s3``, ``remote``, ``mysql``, ``executable``, ...).
   It does **not** refuse: the scalar ``file()`` function (reads any host file), ``INTO
   OUTFILE`` (writes one), ``KILL QUERY``, or a second statement after ``;`` (chdb runs every
   statement of a multi-statement query). Hence 2 and 3.
2. **A tokenizer** (:func:`scan`), which skips string literals, quoted identifiers, heredocs and
   comments the way ClickHouse's lexer does: exactly one statement, no ``INTO OUTFILE`` /
   ``FROM INFILE``. It runs before anything reaches chdb; what passes it is then only parsed
   (``EXPLAIN AST``, which runs nothing) before the rules below. :func:`check_keyword` holds
   the statement's leading keyword to the analytics allowlist.
3. **ClickHouse's own parser** (:func:`check_ast` over ``EXPLAIN AST`` output): the statement
   kind (an ``EXPLAIN`` of anything is judged by what it explains), every table function
   (``FROM f()``, ``INSERT INTO FUNCTION f()``, ``CREATE TABLE t AS f()``) and every table
   engine against allowlists that reach nothing outside this process, no dictionaries, and
   every scalar function against :data:`DENIED_FUNCTIONS`. A parse, not a substring match: ``'file('`` in a string
   or a comment is data, and ``FiLe(...)`` is the same function as ``file(...)``.

The writer role (credentials from the environment) skips 1 and the statement-kind rules, but
never the rules on reaching outside (2's OUTFILE/INFILE, 3's functions): no client of this
endpoint has a reason to read the host's files or make the data manager fetch a URL.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from dart.errors import DartError

READ_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "("})
"""Leading keywords of the statements an analytics client may run."""

SAFE_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generaterandom", "generate_series",
    "generateseries", "null", "view", "merge", "format", "viewifpermitted",
})
"""Table functions that only produce or read data inside this process. Every other one
(file, url, s3, hdfs, remote, remoteSecure, cluster, mysql, postgresql, jdbc, odbc,
executable, input, azureBlobStorage, iceberg, dictionary, ... and any added by a later
ClickHouse) is refused: an allowlist, so a new external source is refused by default."""

SAFE_ENGINES = frozenset({
    "mergetree", "replacingmergetree", "summingmergetree", "aggregatingmergetree", "collapsingmergetree",
    "versionedcollapsingmergetree", "coalescingmergetree", "memory", "log", "tinylog", "stripelog", "null",
    "set", "join", "buffer", "merge", "generaterandom",
})
"""Table engines a writer may create: storage in this process. File, URL, S3, HDFS, Kafka,
MySQL, PostgreSQL, ODBC, JDBC, Distributed, Executable, Dictionary, ... are refused."""

_TABLE_FUNCTION_PARENTS = frozenset({"TableExpression", "InsertQuery", "CreateQuery"})
"""AST nodes whose Function children are table functions (FROM f(), INSERT INTO FUNCTION f(),
CREATE TABLE t AS f())."""

DENIED_FUNCTIONS = frozenset({
    "file",                  # the scalar file(path) reads a host file even under readonly = 1
    "catboostevaluate", "evalmlmethod", "modelevaluate",   # load model files named by the query
    "dictget", "dictgetordefault", "dictgetornull", "dicthas", "dictgethierarchy", "dictisin",
    "dictgetchildren", "dictgetdescendants", "dictgetall",  # a dictionary may have an external source
    "getclientHTTPheader".lower(), "getserverport", "getmacro",
})
"""Scalar functions refused wherever they appear (lower case). Functions whose name starts
with ``dictget`` are refused too (typed variants such as dictGetString)."""

_READ_ROOTS = ("SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "DescribeQuery",
               "Explain", "Show", "Exists")


class SqlRefused(DartError, PermissionError):
    """A statement this endpoint does not run for this client (answered with HTTP 403)."""

    def __init__(self, rule: str, message: str, code: int = 164, name: str = "READONLY") -> None:
        super().__init__(f"{message} (rule: {rule})")
        self.rule = rule
        self.code = code
        self.name = name

    def clickhouse_text(self) -> str:
        """The error body the way ClickHouse writes one (clients parse ``Code: N``)."""
        return f"Code: {self.code}. DB::Exception: dart SQL endpoint: {self}. ({self.name})"


class BadSql(DartError, ValueError):
    """A query the tokenizer cannot read (an unterminated string, comment or identifier)."""


@dataclass(frozen=True, slots=True)
class Statement:
    keyword: str
    """Leading keyword in upper case (``(`` for a parenthesised query)."""
    text: str
    """The statement without a trailing ``;``."""


_WORD_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_WORD = _WORD_START | frozenset("0123456789$")


def _skip_quoted(sql: str, i: int, quote: str) -> int:
    """Index after the quoted run starting at ``sql[i]`` (backslash escapes and doubled quotes)."""
    j = i + 1
    n = len(sql)
    while j < n:
        c = sql[j]
        if c == "\\":
            j += 2
            continue
        if c == quote:
            if j + 1 < n and sql[j + 1] == quote:
                j += 2
                continue
            return j + 1
        j += 1
    raise BadSql(f"unterminated {quote} quote starting at offset {i}")


def _skip_heredoc(sql: str, i: int) -> int | None:
    """Index after a ``$tag$...$tag$`` string at ``sql[i]``, or None when ``$`` starts no heredoc."""
    end_tag = sql.find("$", i + 1)
    if end_tag < 0:
        return None
    tag = sql[i:end_tag + 1]
    if not all(c in _WORD for c in tag[1:-1]):
        return None
    close = sql.find(tag, end_tag + 1)
    if close < 0:
        raise BadSql(f"unterminated heredoc {tag} starting at offset {i}")
    return close + len(tag)


def tokens(sql: str) -> list[str]:
    """Words (upper case) and punctuation of ``sql`` outside literals, quoted identifiers and comments.

    Linear in ``len(sql)``; raises BadSql on an unterminated literal or comment.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c.isspace():
            i += 1
        elif c in "'\"`":
            i = _skip_quoted(sql, i, c)
            out.append("'" if c == "'" else "IDENT")
        elif sql.startswith(("--", "# ", "#!"), i):  # ClickHouse's lexer: a lone '#' is a syntax error
            nl = sql.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif sql.startswith("/*", i):
            # ClickHouse comments nest: /* a /* b */ c */ is one comment.
            depth, j = 1, i + 2
            while depth:
                nxt_open, nxt_close = sql.find("/*", j), sql.find("*/", j)
                if nxt_close < 0:
                    raise BadSql(f"unterminated /* comment starting at offset {i}")
                if 0 <= nxt_open < nxt_close:
                    depth, j = depth + 1, nxt_open + 2
                else:
                    depth, j = depth - 1, nxt_close + 2
            i = j
        elif c == "$" and (end := _skip_heredoc(sql, i)) is not None:
            out.append("'")
            i = end
        elif c in _WORD_START:
            j = i + 1
            while j < n and sql[j] in _WORD:
                j += 1
            out.append(sql[i:j].upper())
            i = j
        else:
            out.append(c)
            i += 1
    return out


def scan(sql: str) -> Statement:
    """The single statement in ``sql``, or SqlRefused / BadSql naming the rule it breaks."""
    toks = tokens(sql)
    if ";" in toks:
        first = toks.index(";")
        if any(t != ";" for t in toks[first:]):
            raise SqlRefused("one-statement", "send one statement per request: a second statement after ';' "
                             "is refused", code=62, name="SYNTAX_ERROR")
    words = [t for t in toks if t != ";"]
    if not words:
        raise BadSql("empty query")
    for a, b in itertools.pairwise(words):
        if (a, b) in (("INTO", "OUTFILE"), ("FROM", "INFILE")):
            raise SqlRefused("no-host-files", f"{a} {b} reads or writes files on the data manager's host",
                             code=497, name="ACCESS_DENIED")
    text = sql.rstrip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    return Statement(keyword=words[0], text=text)


def check_keyword(statement: Statement, *, writer: bool = False) -> None:
    """Refuse an analytics client's statement whose leading keyword is not a read."""
    if not writer and statement.keyword not in READ_KEYWORDS:
        raise SqlRefused("read-only", f"{statement.keyword} is refused: this endpoint is read-only for analytics "
                         "clients (SELECT, WITH, SHOW, DESCRIBE, EXISTS, EXPLAIN); DDL, DML, SET, SYSTEM and KILL "
                         "need the writer credentials, and SET is never needed (use URL parameters)")


@dataclass(frozen=True, slots=True)
class _Node:
    depth: int
    kind: str
    name: str


def _nodes(ast: str) -> list[_Node]:
    """``EXPLAIN AST`` lines as (indent, node type, first word after it)."""
    out = []
    for line in ast.splitlines():
        stripped = line.lstrip(" ")
        if not stripped:
            continue
        parts = stripped.split()
        out.append(_Node(len(line) - len(stripped), parts[0], parts[1] if len(parts) > 1 else ""))
    return out


def check_ast(ast: str, *, writer: bool = False) -> None:
    """Refuse what ClickHouse's parse of the statement shows: a non-read statement (analytics
    clients), a table function outside :data:`SAFE_TABLE_FUNCTIONS`, a :data:`DENIED_FUNCTIONS`
    call (everyone)."""
    nodes = _nodes(ast)
    if not nodes:
        raise BadSql("ClickHouse returned no parse for the query")
    if not writer:
        for node in nodes:
            # An EXPLAIN is judged by the statement it explains (its first child).
            if not node.kind.startswith(_READ_ROOTS):
                raise SqlRefused("read-only", f"{node.kind} is refused: this endpoint is read-only for analytics "
                                 "clients")
            if node.kind != "Explain":
                break
    for k, node in enumerate(nodes):
        if node.kind == "Dictionary":
            raise SqlRefused("no-external-dictionaries", "CREATE DICTIONARY is refused: a dictionary source may be a "
                             "file, a URL or another server", code=497, name="ACCESS_DENIED")
        if node.kind != "Function":
            continue
        name = node.name.lower()
        parent = next((p for p in reversed(nodes[:k]) if p.depth < node.depth), None)
        if parent is not None and parent.kind == "Storage" and name not in SAFE_ENGINES:
            raise SqlRefused("no-external-tables", f"table engine {node.name} is refused: it reaches outside the "
                             "projection (files, URLs, other servers, programs)", code=497, name="ACCESS_DENIED")
        if parent is not None and parent.kind in _TABLE_FUNCTION_PARENTS and name not in SAFE_TABLE_FUNCTIONS:
            raise SqlRefused("no-external-tables", f"table function {node.name}() is refused: it reaches outside "
                             "the projection (files, URLs, other servers, programs)", code=497, name="ACCESS_DENIED")
        if name in DENIED_FUNCTIONS or name.startswith("dictget"):
            raise SqlRefused("no-external-functions", f"function {node.name}() is refused: it reaches outside the "
                             "projection (host files, models, dictionaries)", code=497, name="ACCESS_DENIED")
