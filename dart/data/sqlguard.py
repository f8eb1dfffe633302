"""What a client of the SQL endpoint may run: pure rules over ClickHouse's canonical text of a
query and over ClickHouse's parse of it.

The endpoint (``dart.data.http``) never hands the request's own text to chdb as SQL. Each layer
below exists for what the one before it cannot see:

1. **Canonicalisation by ClickHouse's own parser.** The request text goes to chdb only inside a
   string literal this module escapes (:func:`literal`): ``SELECT formatQuerySingleLine('...')``.
   That parses the text and executes nothing; it refuses several statements ("Multi-statements
   are not allowed") and returns the statement re-written with ASCII quotes, no comments, no
   heredocs. Only that canonical text is checked and only that canonical text is executed, so a
   lexer difference between this module and ClickHouse (``‘…’`` is a string to ClickHouse)
   cannot hide a second statement or a function call from the checks: what is checked is
   exactly what runs. The canonical text must be a fixpoint (formatting it again gives it
   back), which also proves it is one statement before ``EXPLAIN AST`` sees it (chdb runs every
   statement of ``EXPLAIN AST A; B``).
2. **chdb settings** (applied by the endpoint): every analytics request runs with ``readonly =
   1``, set after the client's own (allow-listed) settings and after the server's limits. chdb
   then refuses DDL, DML, ``SYSTEM``, setting changes and the table functions that create
   storage. It does **not** refuse the scalar ``file()``, ``INTO OUTFILE``, ``KILL QUERY``,
   system tables or ``merge('system', ...)``. Hence 3 and 4.
3. **A tokenizer over the canonical text** (:func:`inspect`): canonical text has only ASCII
   quotes, backquoted identifiers and no comments, so this small lexer reads it the way
   ClickHouse does (the fuzz suite checks that on every case). It sees what ``EXPLAIN AST``
   prints no names for: ``INTO OUTFILE`` / ``FROM INFILE``, the names in a ``SETTINGS`` clause
   (held to :data:`ALLOWED_SETTINGS`), the output ``FORMAT`` (no format that reads a schema
   or template file), the leading keyword and the kind of ``SHOW``.
4. **ClickHouse's parse** (:func:`check_ast` over ``EXPLAIN AST`` of the canonical text): the
   statement kind (an ``EXPLAIN`` is judged by what it explains), every table function and table
   engine against allow-lists that reach nothing outside this process, no dictionaries, every
   scalar function against :data:`DENIED_FUNCTIONS`, and for analytics clients every table
   reference, however reached (``FROM``, ``JOIN``, ``IN``, subqueries, ``merge(db, ...)``,
   ``DESCRIBE``, ``EXISTS``, ``SHOW CREATE``), against the dart database plus
   :data:`ALLOWED_SYSTEM_TABLES`. A parse, not a substring match: ``'file('`` in a string is
   data, and ``FiLe(...)`` is the same function as ``file(...)``.

The writer role skips 2 and the statement-kind and table rules, but never the rules on
reaching outside (files, URLs, programs, file-naming settings and formats): no client of this
endpoint has a reason to read the host's files or make the data manager fetch a URL.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from dart.errors import DartError

READ_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})
"""Leading keywords of the statements an analytics client may run (of the canonical text)."""

SAFE_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generaterandom", "generate_series",
    "generateseries", "null", "view", "merge", "format", "viewifpermitted",
})
"""Table functions that only produce or read data inside this process. Every other one
(file, url, s3, hdfs, remote, remoteSecure, cluster, mysql, postgresql, jdbc, odbc,
executable, input, azureBlobStorage, iceberg, dictionary, loop, ... and any added by a later
ClickHouse) is refused: an allowlist, so a new external source is refused by default.
``merge(db, ...)`` reads other tables: analytics clients may name only the dart database."""

SAFE_ENGINES = frozenset({
    "mergetree", "replacingmergetree", "summingmergetree", "aggregatingmergetree", "collapsingmergetree",
    "versionedcollapsingmergetree", "coalescingmergetree", "log", "tinylog", "stripelog", "null", "generaterandom",
})
"""Table engines a writer may create: storage on disk in this process, naming no other table. File,
URL, S3, HDFS, Kafka, MySQL, PostgreSQL, ODBC, JDBC, Distributed, Executable, Dictionary, ... are
refused, and so are Merge and Buffer (they read or write a table of another database) and Memory,
Set and Join (they keep every row in the data manager's memory, with no bound)."""

_TABLE_FUNCTION_PARENTS = frozenset({"TableExpression", "InsertQuery", "CreateQuery"})
"""AST nodes whose Function children are table functions (FROM f(), INSERT INTO FUNCTION f(),
CREATE TABLE t AS f())."""

DENIED_FUNCTIONS = frozenset({
    "file",                  # the scalar file(path) reads a host file even under readonly = 1
    "catboostevaluate", "evalmlmethod", "modelevaluate",   # load model files named by the query
    "dictget", "dictgetordefault", "dictgetornull", "dicthas", "dictgethierarchy", "dictisin",
    "dictgetchildren", "dictgetdescendants", "dictgetall",  # a dictionary may have an external source
    "getclienthttpheader", "getserverport", "getmacro",
    "getserversetting", "getmergetreesetting",              # the server's paths and configuration
})
"""Scalar functions refused wherever they appear (lower case). Functions whose name starts
with ``dictget`` are refused too (typed variants such as dictGetString)."""

ANALYTICS_DENIED_FUNCTIONS = frozenset({"joinget", "joingetornull", "hascolumnintable"})
"""Scalar functions that name a table in a string (so the table rule cannot see it): refused to
every client."""

ALLOWED_SYSTEM_TABLES = frozenset({
    "settings", "one", "numbers", "numbers_mt", "zeros", "zeros_mt", "functions", "table_functions", "formats",
    "data_type_families", "time_zones", "collations", "table_engines", "aggregate_function_combinators", "keywords",
})
"""System tables an analytics client may read: catalogues of this ClickHouse build (clickhouse-connect
reads ``system.settings`` when it connects). Not ``processes``, ``query_log`` (other clients'
queries), ``disks``, ``tables``, ``databases``, ``parts`` (host paths), nor anything else. The dart
database's own tables and columns: ``SHOW TABLES``, ``DESCRIBE t``, ``EXISTS t``, ``SHOW CREATE TABLE t``."""

OTHER_DATABASES = frozenset({"system", "information_schema", "default", "_temporary_and_external_tables"})
"""Databases other than dart that chdb has (lower case; the endpoint adds what ``system.databases``
lists when it starts). chdb's ``default`` is an Overlay whose Filesystem part makes every host
path a table (``default.`/etc/passwd```): the endpoint keeps every session in the dart database
and refuses every name in another database, whatever the construct (``FROM``, ``JOIN``, ``IN
db.t``, ``SHOW TABLES FROM``, ``?database=``) and whether or not the object exists, before
anything runs: one refusal, no oracle."""

TABLE_SETTINGS = frozenset({"index_granularity"})
"""MergeTree settings a writer's ``CREATE TABLE`` may set (dart's migrations set this one). Not
``disk``, ``storage_policy`` or anything else that may name a path."""

ALLOWED_SETTINGS = frozenset({
    # what clickhouse-connect sends when it connects, queries and inserts
    "date_time_input_format", "date_time_output_format", "cast_string_to_dynamic_use_inference",
    "cancel_http_readonly_queries_on_client_close",
    "output_format_json_quote_64bit_integers", "output_format_json_quote_denormals",
    "output_format_arrow_string_as_string", "output_format_arrow_low_cardinality_as_dictionary",
    "output_format_native_write_json_as_string", "input_format_binary_read_json_as_string",
    "output_format_binary_write_json_as_string", "input_format_null_as_default", "session_timezone",
    "insert_deduplicate", "input_format_skip_unknown_fields", "output_format_json_named_tuples_as_objects",
    # output and input options that name no path
    "output_format_json_quote_decimals", "output_format_json_escape_forward_slashes", "output_format_json_array_of_rows",
    "output_format_write_statistics", "output_format_pretty_max_rows", "output_format_pretty_color",
    "output_format_pretty_row_numbers", "output_format_tsv_crlf_end_of_line", "output_format_csv_crlf_end_of_line",
    "format_csv_delimiter", "format_csv_allow_single_quotes", "format_csv_allow_double_quotes",
    "format_tsv_null_representation", "format_csv_null_representation", "output_format_decimal_trailing_zeros",
    "output_format_parquet_compression_method", "output_format_arrow_compression_method", "extremes",
    "join_use_nulls", "max_block_size", "max_threads", "use_query_cache", "enable_json_type",
    "allow_experimental_json_type", "allow_experimental_dynamic_type", "allow_experimental_variant_type",
    "allow_experimental_object_type", "allow_suspicious_low_cardinality_types",
    # limits: accepted as URL parameters, but the server's own values are applied after them
    "max_execution_time", "max_result_rows", "max_result_bytes", "result_overflow_mode", "max_memory_usage",
})
"""Settings a client may pass (URL parameters or a ``SETTINGS`` clause). Anything else is
refused (HTTP 400 naming it): an allow-list, because settings such as ``format_schema``,
``format_template_resultset`` or ``output_format_schema`` name files on the host, and a
deny-list misses the next one."""

LIMIT_SETTINGS = frozenset({"max_execution_time", "max_result_rows", "max_result_bytes", "result_overflow_mode",
                            "max_memory_usage"})
"""The server's limits (``SqlLimits``): a URL parameter may name them (the server's values are
set after it), a query's own ``SETTINGS`` clause may not (it would apply after the server's)."""

DENIED_FORMATS = frozenset({
    "template", "templateignorespaces", "protobuf", "protobufsingle", "protobuflist", "capnproto",
})
"""Formats that read a schema or template file named by a setting (or write one): refused in
``FORMAT``, ``default_format`` and inserts even though no file-naming setting can be set."""

_FILE_WORDS = re.compile(r"schema|template|path|file|dir", re.IGNORECASE)


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
    """A query or parameter the endpoint cannot read (answered with HTTP 400)."""

    def __init__(self, message: str, rule: str = "syntax") -> None:
        super().__init__(f"{message} (rule: {rule})")
        self.rule = rule


@dataclass(frozen=True, slots=True)
class Statement:
    """What the tokenizer reads in a canonical statement."""

    keyword: str
    """Leading keyword in upper case."""
    text: str
    """The canonical text (what runs)."""
    words: tuple[str, ...] = ()
    """Its tokens outside literals (words upper case; ``'`` a string, ``IDENT`` a quoted name)."""
    settings: tuple[str, ...] = ()
    """Names in its SETTINGS clauses (or in a SET statement)."""
    settings_clauses: int = 0
    """SETTINGS clauses (and a SET statement) whose names were read: the parse may show no more."""
    output_format: str | None = None
    """The name after a trailing ``FORMAT`` (for an INSERT: the format of its data)."""


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_text(text: str, what: str = "the query") -> None:
    """BadSql for text no client sends: control characters (NUL included) or lone surrogates."""
    if m := _CONTROL.search(text):
        raise BadSql(f"{what} holds the control character {m.group()!r} at offset {m.start()}", "malformed-request")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadSql(f"{what} is not UTF-8: {exc}", "malformed-request") from exc


def bracket_depth(text: str) -> int:
    """Deepest nesting of ``( [ {`` in ``text``, counted naively (inside literals too): a bound on
    it is a bound on ClickHouse's parse time, which grows with unclosed nesting."""
    depth = deepest = 0
    for m in re.finditer(r"[(\[{]|[)\]}]", text):
        depth = depth + 1 if m.group() in "([{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    return deepest


def literal(text: str) -> str:
    """``text`` as a ClickHouse string literal: inside ``'...'`` only ``\\`` and ``'`` are special,
    so escaping those two keeps every other character (``‘``, ``;``, ``--``, a newline) data."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def escape_bytes(canonical: str) -> str:
    """ClickHouse's formatter turns a ``'\\xFF'`` escape into the byte itself; decoded with
    ``surrogateescape`` such a byte is a lone surrogate, written back here as ``\\xFF`` (it can only
    stand inside a quoted literal or name, where ClickHouse reads that escape as the same byte)."""
    return re.sub("[\udc80-\udcff]", lambda m: f"\\x{ord(m.group()) - 0xDC00:02X}", canonical)


def check_setting(name: str) -> None:
    """SqlRefused unless ``name`` is in :data:`ALLOWED_SETTINGS`, naming the rule it breaks."""
    if name in ALLOWED_SETTINGS:
        return
    if _FILE_WORDS.search(name):
        raise SqlRefused("no-file-settings", f"setting {name} is refused: settings that name a file, a schema or a "
                         "template are never accepted", code=497, name="ACCESS_DENIED")
    raise SqlRefused("settings-allow-list", f"setting {name} is not one this endpoint accepts (see "
                     "dart.data.sqlguard.ALLOWED_SETTINGS)", code=115, name="UNKNOWN_SETTING")


def check_format(name: str) -> None:
    if name.lower() in DENIED_FORMATS:
        raise SqlRefused("no-file-formats", f"format {name} is refused: it reads or writes a schema or template "
                         "file on the data manager's host", code=497, name="ACCESS_DENIED")


_WORD_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_WORD = _WORD_START | frozenset("0123456789$")


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    """Upper-case word, ``'`` (string), ``IDENT`` (quoted name) or one punctuation character."""
    text: str
    start: int
    end: int


_QUOTE_STOPS = {q: re.compile(r"[\\" + q + "]") for q in "'\"`"}


def _skip_quoted(sql: str, i: int, quote: str) -> int:
    """Index after the quoted run starting at ``sql[i]`` (backslash escapes and doubled quotes);
    jumps from one backslash or quote to the next (a long literal costs C time, not a Python step
    a character)."""
    stops = _QUOTE_STOPS[quote]
    j = i + 1
    while (m := stops.search(sql, j)) is not None:
        j = m.start()
        if sql[j] == "\\" or sql[j + 1:j + 2] == quote:  # an escape, or a doubled quote
            j += 2
        else:
            return j + 1
    raise BadSql(f"unterminated {quote} quote starting at offset {i}")


_COMMENT_MARK = re.compile(r"/\*|\*/")


def _skip_comment(sql: str, i: int) -> int:
    """Index after the ``/* ... */`` comment starting at ``sql[i]`` (ClickHouse comments nest).

    Linear: one search from each mark to the next (looking up both the next ``/*`` and the next
    ``*/`` from every mark made ``/* /* /* ... */`` quadratic: 180 KB of it took a pre-check
    thread for seconds to minutes)."""
    depth, j = 1, i + 2
    while depth:
        mark = _COMMENT_MARK.search(sql, j)
        if mark is None:
            raise BadSql(f"unterminated /* comment starting at offset {i}")
        depth += 1 if mark.group() == "/*" else -1
        j = mark.end()
    return j


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


def _iter_tokens(sql: str) -> Iterator[_Tok]:
    """Tokens of ``sql`` outside literals, quoted identifiers and comments, in order (linear; BadSql
    on an unterminated literal or comment, when the lexer gets there). ASCII quoting only: exact
    on ClickHouse's canonical text."""
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c.isspace():
            i += 1
        elif c in "'\"`":
            j = _skip_quoted(sql, i, c)
            yield _Tok("'" if c == "'" else "IDENT", sql[i:j], i, j)
            i = j
        elif sql.startswith(("--", "# ", "#!"), i):
            nl = sql.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif sql.startswith("/*", i):
            i = _skip_comment(sql, i)
        elif c == "$" and (end := _skip_heredoc(sql, i)) is not None:
            yield _Tok("'", sql[i:end], i, end)
            i = end
        elif c in _WORD_START:
            j = i + 1
            while j < n and sql[j] in _WORD:
                j += 1
            yield _Tok(sql[i:j].upper(), sql[i:j], i, j)
            i = j
        else:
            yield _Tok(c, c, i, i + 1)
            i += 1


def _lex(sql: str) -> list[_Tok]:
    return list(_iter_tokens(sql))


def tokens(sql: str) -> list[str]:
    """Words (upper case) and punctuation of ``sql`` outside literals, quoted identifiers and comments."""
    return [t.kind for t in _lex(sql)]


def _name(tok: _Tok) -> str:
    return tok.text[1:-1] if tok.kind == "IDENT" else tok.text


def _settings_after(toks: list[_Tok], k: int) -> list[str]:
    """Names of ``name = value, name, name = value`` starting at ``toks[k]`` (ClickHouse takes a
    bare ``name`` as ``name = 1``; values are one literal, word or signed number)."""
    names: list[str] = []
    while k < len(toks) and (toks[k].kind == "IDENT" or toks[k].kind[:1] in _WORD_START):
        after = toks[k + 1].kind if k + 1 < len(toks) else None
        if after not in ("=", ",", None, "FORMAT", "SETTINGS", ")"):
            break
        names.append(_name(toks[k]))
        k += 1
        while k < len(toks) and toks[k].kind not in (",", "FORMAT", "SETTINGS", ")"):
            k += 1
        if k >= len(toks) or toks[k].kind != ",":
            break
        k += 1
    return names


def inspect(canonical: str) -> Statement:
    """Read a canonical statement (ClickHouse's ``formatQuerySingleLine`` output); SqlRefused
    for a second statement, ``INTO OUTFILE`` / ``FROM INFILE``, a setting outside
    :data:`ALLOWED_SETTINGS` or a format in :data:`DENIED_FORMATS`."""
    toks = _lex(canonical)
    if not toks:
        raise BadSql("empty query")
    if any(t.kind == ";" for t in toks):
        raise SqlRefused("one-statement", "send one statement per request: a second statement after ';' "
                         "is refused", code=62, name="SYNTAX_ERROR")
    kinds = [t.kind for t in toks]
    for a, b in itertools.pairwise(kinds):
        if (a, b) in (("INTO", "OUTFILE"), ("FROM", "INFILE")):
            raise SqlRefused("no-host-files", f"{a} {b} reads or writes files on the data manager's host",
                             code=497, name="ACCESS_DENIED")
    settings: list[str] = []
    clauses = 0
    for k, t in enumerate(toks):
        if t.kind == "SETTINGS" or (k == 0 and t.kind == "SET"):
            found = _settings_after(toks, k + 1)
            clauses += bool(found)
            settings += found
    for name in settings:
        if kinds[0] == "CREATE" and name in TABLE_SETTINGS:
            continue  # a table's own setting (the writer's CREATE TABLE); check_writer reads the rest
        check_setting(name)
        if name in LIMIT_SETTINGS:
            raise SqlRefused("server-limits", f"setting {name} in the query is refused: the server's limits apply "
                             "to every request (a URL parameter may name it; the server's value wins)")
    output = None
    for k in range(len(toks) - 1):
        after = toks[k + 2].kind if k + 2 < len(toks) else None
        if toks[k].kind == "FORMAT" and toks[k + 1].kind[:1] in _WORD_START and after in (None, "SETTINGS"):
            output = toks[k + 1].text
    if output is not None:
        check_format(output)
    return Statement(keyword=kinds[0], text=canonical, words=tuple(kinds), settings=tuple(settings),
                     settings_clauses=clauses, output_format=output)


def split_insert(sql: str, max_head: int | None = None) -> tuple[str, str, str] | None:
    """``INSERT ... VALUES data`` or ``INSERT ... FORMAT X data`` -> (head, data, format), the head
    ending in ``FORMAT X``; None for anything else (an INSERT ... SELECT, no data, not an INSERT,
    or no ``VALUES`` / ``FORMAT X`` within the first ``max_head`` characters).

    Only the first ``max_head`` characters are lexed: a head longer than that is refused anyway,
    so the data (up to the body limit) never costs the lexer anything.

    Where the data starts only decides what goes to the data file: the head is then
    canonicalised and checked like any statement, and the data is parsed as data (format X,
    with ``Values`` expressions off), never as SQL. A split this lexer gets wrong fails there."""
    window = sql if max_head is None else sql[:max_head]
    cut = len(window) < len(sql)
    stream = _iter_tokens(window)
    toks: list[_Tok] = []

    def more() -> bool:
        """Lex one more token (stop at the window's end, and at a token the window may have cut)."""
        t = next(stream, None)
        if t is None or (cut and t.end >= len(window)):
            return False
        toks.append(t)
        return True

    try:
        if not more() or toks[0].kind != "INSERT":
            return None
        depth, k = 0, 0
        while k < len(toks) or more():
            t = toks[k]
            k += 1
            depth += (t.kind == "(") - (t.kind == ")")
            if depth or t.kind in ("SELECT", "WITH"):
                if t.kind in ("SELECT", "WITH") and not depth:
                    return None
                continue
            if t.kind == "VALUES":
                return sql[:t.start].rstrip() + " FORMAT Values", sql[t.end:], "Values"
            if t.kind == "FORMAT" and (k < len(toks) or more()) and toks[k].kind[:1] in _WORD_START:
                end = toks[k].end
                data = sql[end:]
                data = data[1:] if data[:1] in (" ", "\t") else data
                data = data[2:] if data.startswith("\r\n") else data[1:] if data.startswith("\n") else data
                return (sql[:end], data, toks[k].text) if data.strip() else None
    except BadSql:
        return None
    return None


@dataclass(frozen=True, slots=True)
class _Node:
    depth: int
    kind: str
    name: str
    line: str


def _nodes(ast: str) -> list[_Node]:
    """``EXPLAIN AST`` lines as (indent, node type, first word after it, the line)."""
    out = []
    for line in ast.splitlines():
        stripped = line.lstrip(" ")
        parts = stripped.split()
        if not parts:
            continue
        out.append(_Node(len(line) - len(stripped), parts[0], parts[1] if len(parts) > 1 else "", stripped))
    return out


_ANALYTICS_ROOTS = ("SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "DescribeQuery",
                    "ShowTables", "ShowCreateTableQuery", "ExistsTableQuery")
_SHOW_PREFIXES = (("SHOW", "TABLES"), ("SHOW", "FULL", "TABLES"), ("SHOW", "CREATE", "TABLE"))


def _children(nodes: list[_Node], k: int) -> list[_Node]:
    out = []
    for node in nodes[k + 1:]:
        if node.depth <= nodes[k].depth:
            break
        if not out or node.depth <= out[0].depth:
            out.append(node)
    return out


def _refuse_table(name: str) -> SqlRefused:
    return SqlRefused("dart-database-only", f"{name} is refused: clients of this endpoint reach the dart database and "
                      f"the catalogue tables system.{{{', '.join(sorted(ALLOWED_SYSTEM_TABLES))}}}", code=497,
                      name="ACCESS_DENIED")


def _check_table(db: str, table: str, database: str | None, shown: str | None = None) -> None:
    if db == "" or db == database or (db == "system" and table.lower() in ALLOWED_SYSTEM_TABLES):
        return
    raise _refuse_table(shown or (f"{db}.{table}" if table else f"database {db}"))


def check_tables(nodes: list[_Node], statement: Statement | None, database: str | None,
                 databases: frozenset[str] = OTHER_DATABASES) -> None:
    """The table rule (every client): every table named in the parse is in ``database``
    (unqualified names are: the endpoint makes it the current database) or an allowed system
    table; a dotted name whose first part is one of ``databases`` (lower case) is a table there."""
    root = nodes[0]
    while root.kind == "Explain" and len(nodes) > 1:
        nodes = nodes[1:]
        root = nodes[0]
    if root.kind == "ShowTables" and statement is not None:
        words = statement.words
        if words[:1] != ("EXPLAIN",) and not any(words[:len(p)] == p for p in _SHOW_PREFIXES):
            raise SqlRefused("read-only", f"{' '.join(words[:2])} is refused: analytics clients may run SHOW TABLES "
                             "and SHOW CREATE TABLE of the dart database", code=497, name="ACCESS_DENIED")
        for child in _children(nodes, 0):
            if child.kind == "Identifier" and child.name != statement.output_format:  # not FORMAT X
                _check_table(child.name, "", database)
    if root.kind in ("ShowCreateTableQuery", "ExistsTableQuery"):
        parts = root.line.split(" ")
        _check_table(parts[1] if len(parts) > 2 else "", parts[2] if len(parts) > 2 else "", database)
    for k, node in enumerate(nodes):
        if node.kind == "TableIdentifier" or (node.kind == "Identifier" and "." in node.name
                                             and node.name.split(".")[0].lower() in databases):
            db, _, table = node.name.partition(".")
            if table:
                _check_table(db, table.split(".")[0], database, node.name)
        elif node.kind == "Function" and node.name.lower() == "merge":
            args = _children(nodes, k)
            first = _children(nodes, k + 1)[:1] if args and args[0].kind == "ExpressionList" else []
            named = first[0].name.strip("'") if first and first[0].kind in ("Literal", "Identifier") else None
            if named != database:
                raise _refuse_table(f"merge({first[0].name if first else ''}, ...)")
        elif node.kind == "Function" and node.name.lower() in ANALYTICS_DENIED_FUNCTIONS:
            raise _refuse_table(f"function {node.name}() (it names a table in a string)")


def check_ast(ast: str, *, writer: bool = False, database: str | None = None,
              statement: Statement | None = None, databases: frozenset[str] = OTHER_DATABASES) -> None:
    """Refuse what ClickHouse's parse of the statement shows: a non-read statement or a table
    outside ``database`` (analytics clients), a table function outside
    :data:`SAFE_TABLE_FUNCTIONS`, a :data:`DENIED_FUNCTIONS` call, a denied format, a
    ``SETTINGS`` clause the tokenizer did not read (everyone)."""
    nodes = _nodes(ast)
    if not nodes:
        raise BadSql("ClickHouse returned no parse for the query")
    if not writer:
        for node in nodes:
            # An EXPLAIN is judged by the statement it explains (its first child).
            if node.kind == "Explain":
                continue
            if not node.kind.startswith(_ANALYTICS_ROOTS):
                raise SqlRefused("read-only", f"{node.kind} is refused: this endpoint is read-only for analytics "
                                 "clients")
            break
    check_tables(nodes, statement, database, databases)
    if statement is not None and sum(n.kind == "Set" for n in nodes) > statement.settings_clauses:
        raise SqlRefused("settings-allow-list", "a SETTINGS clause this endpoint cannot read is refused",
                         code=115, name="UNKNOWN_SETTING")
    root_children = _children(nodes, 0)
    for child in root_children:
        if child.kind == "Identifier":
            check_format(child.name)  # SELECT ... FORMAT X
        if child.kind == "Literal" and child.name.startswith("'") and nodes[0].kind.startswith("Select"):
            raise SqlRefused("no-host-files", "INTO OUTFILE writes a file on the data manager's host",
                             code=497, name="ACCESS_DENIED")
    for k, node in enumerate(nodes):
        if node.kind == "Dictionary":
            raise SqlRefused("no-external-dictionaries", "CREATE DICTIONARY is refused: a dictionary source may be a "
                             "file, a URL or another server", code=497, name="ACCESS_DENIED")
        if node.kind != "Function":
            continue
        name = node.name.lower()
        pk = next((j for j in range(k - 1, -1, -1) if nodes[j].depth < node.depth), None)
        parent = nodes[pk] if pk is not None else None
        # The engine is the storage definition's first child (ORDER BY (a, b) is a tuple() after it).
        is_engine = parent is not None and parent.kind == "Storage" and pk == k - 1
        if is_engine and name not in SAFE_ENGINES:
            raise SqlRefused("no-external-tables", f"table engine {node.name} is refused: it reaches outside the "
                             "projection (files, URLs, other servers, programs) or keeps its rows in the data "
                             "manager's memory (see sqlguard.SAFE_ENGINES)", code=497, name="ACCESS_DENIED")
        if parent is not None and parent.kind in _TABLE_FUNCTION_PARENTS and name not in SAFE_TABLE_FUNCTIONS:
            raise SqlRefused("no-external-tables", f"table function {node.name}() is refused: it reaches outside "
                             "the projection (files, URLs, other servers, programs)", code=497, name="ACCESS_DENIED")
        if name in DENIED_FUNCTIONS or name.startswith("dictget"):
            raise SqlRefused("no-external-functions", f"function {node.name}() is refused: it reaches outside the "
                             "projection (host files, models, dictionaries, server configuration)", code=497,
                             name="ACCESS_DENIED")


def check_keyword(statement: Statement, *, writer: bool = False) -> None:
    """Refuse an analytics client's statement whose leading keyword is not a read."""
    if not writer and statement.keyword not in READ_KEYWORDS:
        raise SqlRefused("read-only", f"{statement.keyword} is refused: this endpoint is read-only for analytics "
                         "clients (SELECT, WITH, SHOW, DESCRIBE, EXISTS, EXPLAIN); DDL, DML, SET, SYSTEM and KILL "
                         "need the writer credentials, and SET is never needed (use URL parameters)")


def _refuse_write(what: str) -> SqlRefused:
    return SqlRefused("writer-allow-list", f"{what} is refused: the writer ingests: it runs INSERT INTO a dart table "
                      "with a data format (VALUES or FORMAT X), CREATE TABLE / CREATE VIEW / CREATE DATABASE of the dart "
                      "database (what dart's migrations run), and the reads every client may run; nothing else (no "
                      "DROP, TRUNCATE, ALTER, CREATE OR REPLACE, BACKUP, RESTORE, SYSTEM, ATTACH, KILL, RENAME, named "
                      "collections, users or other databases)", code=497, name="ACCESS_DENIED")


_WRITER_ROOTS = {"INSERT": "InsertQuery", "CREATE": "CreateQuery"}


def _target(toks: list[_Tok], k: int, database: str) -> int:
    """Read ``name`` or ``db.name`` at ``toks[k]``; refuse a database other than ``database``.
    Returns the index after it."""
    if k >= len(toks) or not (toks[k].kind == "IDENT" or toks[k].kind[:1] in _WORD_START):
        raise _refuse_write("a statement without a table name where one belongs")
    if k + 2 < len(toks) and toks[k + 1].kind == ".":
        if _name(toks[k]) != database:
            raise _refuse_table(f"{_name(toks[k])}.{_name(toks[k + 2])}")
        return k + 3
    return k + 1


def _skip_parens(toks: list[_Tok], k: int) -> int:
    """Index after the parenthesised run starting at ``toks[k]`` (``(``), or ``k`` when none starts there."""
    if k >= len(toks) or toks[k].kind != "(":
        return k
    depth = 0
    for j in range(k, len(toks)):
        depth += (toks[j].kind == "(") - (toks[j].kind == ")")
        if not depth:
            return j + 1
    raise BadSql("unbalanced parentheses")


def _optional(words: tuple[str, ...], k: int, *seq: str) -> int:
    return k + len(seq) if words[k:k + len(seq)] == seq else k


def check_writer(statement: Statement, ast: str, database: str) -> None:
    """The writer's allow-list, over the canonical tokens and ClickHouse's parse (``check_ast``
    runs too: functions, engines, table functions, every table reference). Reads are judged as
    an analytics client's are (the caller keeps them read-only); every other statement must be
    one of the shapes below, on a table of ``database``."""
    if statement.keyword in READ_KEYWORDS:
        check_ast(ast, writer=False, database=database, statement=statement)
        return
    nodes = _nodes(ast)
    root = _WRITER_ROOTS.get(statement.keyword)
    if root is None or not nodes or nodes[0].kind != root:
        raise _refuse_write(" ".join(statement.words[:2]) or "an empty statement")
    toks = _lex(statement.text)
    words = statement.words
    if statement.keyword == "INSERT":
        # INSERT INTO [TABLE] [db.]t [(columns)] [SETTINGS ...] FORMAT X: the data is the body's
        k = _optional(words, _optional(words, 1, "INTO"), "TABLE")
        if k == 1 or words[k:k + 1] == ("FUNCTION",):
            raise _refuse_write("INSERT INTO FUNCTION")
        _target(toks, k, database)
        if statement.output_format is None or "SELECT" in words or "WITH" in words:
            raise _refuse_write("an INSERT without a data format (INSERT ... SELECT)")
        return
    if statement.keyword == "CREATE":
        # Not OR REPLACE: replacing a table drops the one it replaces.
        kind = words[1:2]
        k = _optional(words, 2, "IF", "NOT", "EXISTS")
        if kind == ("DATABASE",):
            if len(toks) != k + 1 or _name(toks[k]) != database:
                raise _refuse_write("CREATE DATABASE of another database, or with an engine or settings")
            return
        if kind not in (("TABLE",), ("VIEW",)):
            raise _refuse_write(f"CREATE {' '.join(words[1:max(k, 3)])}")
        k = _target(toks, k, database)
        after = _skip_parens(toks, k)
        if kind == ("TABLE",):
            if after == k:
                raise _refuse_write("CREATE TABLE without a column list (AS another table, a table function or "
                                    "CLONE)")
            depth = 0
            for t in toks[after:]:
                depth += (t.kind == "(") - (t.kind == ")")
                if not depth and t.kind in ("AS", "TTL", "CLONE", "EMPTY"):
                    raise _refuse_write(f"CREATE TABLE ... {t.kind}")
            for name in statement.settings:
                if name not in TABLE_SETTINGS:
                    raise _refuse_write(f"table setting {name}")
            return
        # a plain view: its query is checked by check_ast like any read (tables, table functions)
        if words[after:after + 1] != ("AS",) or words[after + 1:after + 2] not in (("SELECT",), ("WITH",), ("(",)):
            raise _refuse_write("CREATE VIEW other than CREATE VIEW v AS SELECT ... (no TO, DEFINER, REFRESH)")
        return
