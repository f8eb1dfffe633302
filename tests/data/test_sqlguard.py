"""The SQL endpoint's rules as pure functions, and its request parsers on arbitrary input
(hypothesis: examples from the profile in tests/conftest.py)."""

from __future__ import annotations

import contextlib
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dart.data import sqlguard
from dart.data.http import Unauthorized, Writer, credentials, hash_password, parse_request, role_of
from dart.errors import DartError


def test_tokens_skip_literals_comments_and_heredocs_like_clickhouse() -> None:
    assert sqlguard.tokens("SELECT 'a;b' -- ; DROP\n, `x;y`, $t$;$t$ /* /* ; */ ; */ # ;\n FROM t;") == [
        "SELECT", "'", ",", "IDENT", ",", "'", "FROM", "T", ";"]
    for sql in ("SELECT 1; DROP TABLE t", "SELECT ';' ; SELECT 2"):
        with pytest.raises(sqlguard.SqlRefused, match="one-statement"):
            sqlguard.inspect(sql)
    for sql in ("SELECT 1 INTO OUTFILE '/tmp/x'", "INSERT INTO t FROM INFILE '/etc/passwd' FORMAT TSV"):
        with pytest.raises(sqlguard.SqlRefused, match="no-host-files"):
            sqlguard.inspect(sql)
    for sql in ("SELECT 'unterminated", "SELECT `x", "SELECT $a$ x", ""):
        with pytest.raises(sqlguard.BadSql):
            sqlguard.inspect(sql)


def test_settings_and_formats_in_the_canonical_text() -> None:
    s = sqlguard.inspect("SELECT 1 SETTINGS max_threads = 2, join_use_nulls = 1 FORMAT JSON")
    assert (s.settings, s.settings_clauses, s.output_format) == (("max_threads", "join_use_nulls"), 1, "JSON")
    assert sqlguard.inspect("SELECT 1 FORMAT JSON SETTINGS max_threads = 2").output_format == "JSON"
    assert sqlguard.inspect("SELECT format, settings FROM t").output_format is None
    # a bare name is name = 1 (found by the fuzz suite: SETTINGS FORMAT is a setting named FORMAT)
    assert sqlguard.inspect("SELECT 1 SETTINGS join_use_nulls, max_threads = 2").settings == ("join_use_nulls",
                                                                                             "max_threads")
    with pytest.raises(sqlguard.SqlRefused, match="settings-allow-list"):
        sqlguard.inspect("SELECT 1 SETTINGS FORMAT")
    for sql, rule in (("SELECT 1 SETTINGS format_template_resultset = '/etc/passwd' FORMAT Template", "no-file-settings"),
                      ("SELECT 1 SETTINGS max_threads = 1, output_format_schema = '/x'", "no-file-settings"),
                      ("SELECT 1 SETTINGS readonly = 0", "settings-allow-list"),
                      ("SELECT 1 SETTINGS allow_ddl", "settings-allow-list"),
                      ("SELECT 1 SETTINGS max_execution_time = 1e9", "server-limits"),
                      ("SELECT 1 SETTINGS max_threads = 1, allow_introspection_functions FORMAT JSON",
                       "settings-allow-list"),
                      ("SELECT 1 FORMAT Protobuf", "no-file-formats"), ("SELECT 1 FORMAT Template", "no-file-formats"),
                      ("SET format_schema = 'x'", "no-file-settings")):
        with pytest.raises(sqlguard.SqlRefused, match=rule):
            sqlguard.inspect(sql)
    assert sqlguard.split_insert("INSERT INTO t (a) VALUES (1), ('x;y')") == (
        "INSERT INTO t (a) FORMAT Values", " (1), ('x;y')", "Values")
    assert sqlguard.split_insert("INSERT INTO t FORMAT TSV\n1\n") == ("INSERT INTO t FORMAT TSV", "1\n", "TSV")
    assert sqlguard.split_insert("INSERT INTO t SELECT 1") is None
    assert sqlguard.literal("a'b\\c") == "'a\\'b\\\\c'"
    assert sqlguard.escape_bytes("SELECT '\udcff'") == "SELECT '\\xFF'"


def test_keywords_and_the_parse_decide_the_statement_kind() -> None:
    sqlguard.check_keyword(sqlguard.inspect("WITH 1 AS a SELECT a"))
    sqlguard.check_keyword(sqlguard.inspect("CREATE TABLE t (x UInt8) ENGINE = Memory"), writer=True)
    for sql in ("CREATE TABLE t (x UInt8) ENGINE = Memory", "SET readonly = 0", "KILL QUERY WHERE 1", "SYSTEM FLUSH LOGS"):
        with pytest.raises(sqlguard.SqlRefused, match=r"read-only|settings-allow-list"):
            sqlguard.check_keyword(sqlguard.inspect(sql))
    explain_insert = "Explain EXPLAIN AST (children 1)\n InsertQuery (children 1)\n  Identifier t\n"
    with pytest.raises(sqlguard.SqlRefused, match="InsertQuery"):
        sqlguard.check_ast(explain_insert)
    sqlguard.check_ast(explain_insert, writer=True)


SELECT_FROM = """SelectWithUnionQuery (children 1)
 ExpressionList (children 1)
  SelectQuery (children 2)
   ExpressionList (children 1)
    Function {scalar} (children 1)
     ExpressionList (children 1)
      Literal UInt64_1
   TablesInSelectQuery (children 1)
    TablesInSelectQueryElement (children 1)
     TableExpression (children 1)
      Function {table} (children 1)
       ExpressionList (children 1)
        Literal UInt64_3
"""


def test_table_functions_are_allowlisted_and_external_functions_refused() -> None:
    sqlguard.check_ast(SELECT_FROM.format(scalar="plus", table="numbers"))
    for table in ("file", "URL", "s3", "hdfs", "remote", "remoteSecure", "cluster", "mysql", "postgresql", "jdbc",
                  "odbc", "executable", "input", "azureBlobStorage", "dictionary", "iceberg", "some_future_one"):
        with pytest.raises(sqlguard.SqlRefused, match="no-external-tables"):
            sqlguard.check_ast(SELECT_FROM.format(scalar="plus", table=table), writer=True)
    for scalar in ("file", "FILE", "dictGet", "dictGetString", "catboostEvaluate"):
        with pytest.raises(sqlguard.SqlRefused, match="no-external-functions"):
            sqlguard.check_ast(SELECT_FROM.format(scalar=scalar, table="numbers"))
    insert_url = "InsertQuery   (children 1)\n Function url (children 1)\n  ExpressionList (children 1)\n"
    create_as = "CreateQuery t (children 2)\n Identifier t\n Function s3 (children 1)\n"
    engine = "CreateQuery t (children 2)\n Identifier t\n Storage definition (children 1)\n  Function {} (children 1)\n"
    dictionary = "CreateQuery d (children 2)\n Identifier d\n Dictionary definition (children 4)\n"
    for ast in (insert_url, create_as, engine.format("URL"), engine.format("Kafka"), dictionary):
        with pytest.raises(sqlguard.SqlRefused, match="no-external"):
            sqlguard.check_ast(ast, writer=True)
    sqlguard.check_ast(engine.format("ReplacingMergeTree"), writer=True)
    assert sqlguard.SqlRefused("r", "m").clickhouse_text().startswith("Code: 164. DB::Exception: ")


SQLISH = st.lists(st.sampled_from(["SELECT", "INSERT", "FROM", "INTO", "OUTFILE", "INFILE", "file(", "'", '"', "`",
                                   "''", "\\'", "--", "\n", "/*", "*/", "#", "# ", "$$", "$a$", ";", " ", "(", ")",
                                   "1", "x", "é", "\x00"]), max_size=40).map("".join)


@given(st.one_of(st.text(max_size=400), SQLISH))
def test_the_tokenizer_refuses_or_passes_any_text_quickly(sql):
    t0 = time.perf_counter()
    try:
        statement = sqlguard.inspect(sql)
        sqlguard.check_keyword(statement)
    except (sqlguard.SqlRefused, sqlguard.BadSql) as exc:
        assert isinstance(exc, DartError) and str(exc)
    else:
        assert ";" not in sqlguard.tokens(statement.text)
    assert time.perf_counter() - t0 < 0.5


@given(st.one_of(st.text(max_size=300), SQLISH))
def test_check_ast_on_any_text_refuses_or_passes(ast):
    with contextlib.suppress(sqlguard.SqlRefused, sqlguard.BadSql):
        sqlguard.check_ast(ast)


PARAMS = st.dictionaries(st.sampled_from(["query", "database", "default_format", "param_x", "max_threads", "user",
                                          "password", "bad-name", "readonly", "query_id"]) | st.text(max_size=12),
                         st.text(max_size=60) | SQLISH, max_size=5)


@given(PARAMS, st.one_of(st.binary(max_size=300), SQLISH.map(str.encode)))
def test_request_parser_gives_a_request_or_a_typed_error(query, body):
    try:
        req = parse_request(query, body)
    except DartError as exc:
        assert isinstance(exc, ValueError) and str(exc)
        return
    assert req.sql.strip() or req.insert_data is not None


@given(st.dictionaries(st.sampled_from(["Authorization", "X-ClickHouse-User", "X-ClickHouse-Key"]),
                       st.text(max_size=40) | st.sampled_from(["Basic ", "Basic !!", "Basic ZGFydDp4", "basic Og==", "Basic é", "Basic /w=="]),
                       max_size=3), PARAMS)
def test_credentials_are_a_role_or_unauthorized(headers, query):
    writer = Writer("dart_writer", hash_password("pw", iterations=10))
    try:
        is_writer = role_of(*credentials(headers, query), writer)
    except Unauthorized:
        return
    assert is_writer in (True, False)


def test_the_writer_allow_list_reads_the_canonical_shape() -> None:
    ins = "InsertQuery   (children 2)\n Identifier dart\n Identifier t\n"
    create = "CreateQuery dart t (children 3)\n Identifier dart\n Identifier t\n Columns definition (children 1)\n"
    view = "CreateQuery v (children 2)\n Identifier v\n SelectWithUnionQuery (children 1)\n"
    alter = "AlterQuery  t (children 2)\n ExpressionList (children 1)\n  AlterCommand {} (children 1)\n Identifier t\n"
    ok = [("INSERT INTO dart.t (a) FORMAT TSV", ins), ("INSERT INTO t FORMAT Values", ins),
          ("CREATE TABLE IF NOT EXISTS dart.t (`x` UInt8) ENGINE = ReplacingMergeTree ORDER BY x "
           "SETTINGS index_granularity = 8192", create),
          ("CREATE VIEW IF NOT EXISTS dart.v AS SELECT 1", view), ("CREATE DATABASE IF NOT EXISTS dart", create)]
    for sql, ast in ok:
        sqlguard.check_writer(sqlguard.inspect(sql), ast, "dart")
    refused = [("INSERT INTO default.t FORMAT TSV", ins), ("INSERT INTO t SELECT 1", ins),
               ("INSERT INTO FUNCTION file('x') FORMAT TSV", ins), ("CREATE DATABASE other", create),
               ("CREATE TABLE t AS default.x", create), ("CREATE TABLE t (`x` UInt8) ENGINE = Memory AS SELECT 1", create),
               ("CREATE TABLE t (`x` UInt8) ENGINE = MergeTree ORDER BY x SETTINGS disk = 'd'", create),
               ("CREATE MATERIALIZED VIEW v TO t AS SELECT 1", view), ("CREATE TEMPORARY TABLE t (`x` UInt8)", create),
               ("DROP DATABASE dart", "DropQuery dart\n"), ("ALTER TABLE t FREEZE", alter.format("FREEZE_ALL")),
               # the writer ingests: it never drops, empties, alters or replaces a table (issue 54)
               ("DROP TABLE IF EXISTS t", "DropQuery  t (children 1)\n"), ("TRUNCATE TABLE t", "TruncateQuery  t\n"),
               ("ALTER TABLE t (ADD COLUMN `y` UInt8)", alter.format("ADD_COLUMN")),
               ("ALTER TABLE t (UPDATE x = 1 WHERE 1)", alter.format("UPDATE")),
               ("ALTER TABLE t (DELETE WHERE 1)", alter.format("DELETE")),
               ("CREATE OR REPLACE TABLE dart.t (`x` UInt8) ENGINE = MergeTree ORDER BY x", create),
               ("CREATE OR REPLACE VIEW dart.v AS SELECT 1", view),
               ("SYSTEM SHUTDOWN", "SYSTEM query\n"), ("KILL QUERY WHERE 1", "KillQueryQuery\n"),
               ("BACKUP TABLE t TO Disk('a', 'b')", "BackupQuery (children 1)\n"), ("RENAME TABLE t TO u", "Rename\n")]
    for sql, ast in refused:
        with pytest.raises(sqlguard.SqlRefused, match=r"writer-allow-list|dart-database-only|settings-allow-list"):
            sqlguard.check_writer(sqlguard.inspect(sql), ast, "dart")
