"""The SQL endpoint against the requests that got through before (issue 35, as written) and a
corpus of our own, live: a separate process serving the endpoint the way the data manager does,
with the writer's password file and a bus password in its environment and a canary file on disk.

Nothing any request gets back (success or error) holds the canary, the writer password or the
bus password; no file appears; no loopback listener is contacted; no table is created or
dropped; the endpoint keeps serving; and ``dart sql``, ``dart report`` and clickhouse-connect
(query, query_df; insert refused) still work against it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.clickhouse
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Live:
    url: str
    database: str
    tmp: Path
    canary: Path
    canary_text: str
    writer_password: str
    secrets: tuple[str, ...]
    listener: socket.socket
    proc: subprocess.Popen
    port_file: Path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("attacks")
    canary_text = f"CANARY-{uuid.uuid4().hex}"
    canary = tmp / "canary.txt"
    canary.write_text(canary_text + "\n")
    writer_password = f"writer-{uuid.uuid4().hex}"
    bus_password = f"bus-{uuid.uuid4().hex}"
    secret_file = tmp / "writer-password"
    secret_file.write_text(writer_password + "\n")
    secret_file.chmod(0o600)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DART_SQL_WRITER_PASSWORD_FILE": str(secret_file),
           "DART_KAFKA_PASSWORD": bus_password}
    env.pop("DART_SQL_WRITER_PASSWORD", None)
    port_file = tmp / "port"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/data/live_endpoint.py"), str(tmp / "chdb"), "dart",
                             str(port_file)], env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    try:
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the endpoint did not start"
            time.sleep(0.1)
        yield Live(f"http://127.0.0.1:{int(port_file.read_text())}/", "dart", tmp, canary, canary_text,
                   writer_password, (canary_text, writer_password, bus_password), listener, proc, port_file)
    finally:
        listener.close()
        proc.terminate()
        proc.wait(20)


def ask(live: Live, sql: str | bytes | None = None, params: dict | None = None,
        headers: dict | None = None) -> tuple[int, str]:
    url = live.url + ("?" + urllib.parse.urlencode(params) if params else "")
    data = sql.encode() if isinstance(sql, str) else sql
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def ask_raw(live: Live, query_string: str) -> tuple[int, str]:
    """A GET with the query string as given (percent-escapes that are not UTF-8 included)."""
    try:
        with urllib.request.urlopen(f"{live.url}?{query_string}", timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def as_writer(live: Live) -> dict:
    return {"X-ClickHouse-User": "dart_writer", "X-ClickHouse-Key": live.writer_password}


def tables(live: Live) -> str:
    """Every database and table chdb has, read inside the endpoint's process (not through it)."""
    snapshot = live.port_file.with_name(live.port_file.name + ".tables")
    snapshot.unlink(missing_ok=True)
    live.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not snapshot.exists():
        assert time.monotonic() < deadline and live.proc.poll() is None, "no table snapshot"
        time.sleep(0.05)
    return snapshot.read_text()


def files(live: Live) -> set[str]:
    return {str(p) for p in live.tmp.rglob("*") if "chdb" not in p.relative_to(live.tmp).parts[:1]}


def issue_reproducers(live: Live, port: int) -> list[tuple[str, dict]]:
    """The requests of issue 35 as written, then the same shapes aimed at the canary."""
    c, out = str(live.canary), str(live.tmp / "written-by-outfile")
    return [
        ("SELECT ‘'’; SELECT file(‘/etc/hostname’) --'", {}),
        ("SELECT ‘'’; SELECT file(‘/proc/self/environ’) --'", {}),
        (f"SELECT ‘'’; SELECT file(‘{c}’) --'", {}),
        (f"SELECT ‘'’; SELECT 1 INTO OUTFILE ‘{out}’ --'", {}),
        ("SELECT 1 FORMAT Template", {"format_template_resultset": "/etc/passwd"}),
        ("SELECT 1 FORMAT Template", {"format_template_resultset": c}),
        ("SELECT 1 FORMAT Protobuf", {"output_format_schema": str(live.tmp / "schema.proto")}),
        ("SELECT * FROM system.processes", {}),
        ("SELECT getServerSetting('path')", {}),
        ("SELECT * FROM system.disks", {}),
        (f"SELECT * FROM url('http://127.0.0.1:{port}/', 'LineAsString')", {}),
    ]


def corpus(live: Live, port: int) -> tuple[list[str], list[dict]]:
    c, out = str(live.canary), str(live.tmp / "written")
    return [
        # lexer differences: every quote, comment and heredoc ClickHouse knows, hiding a second statement
        f"SELECT ‘a’; SELECT file('{c}')", f"SELECT “a”; SELECT file('{c}')", f"SELECT 1 -- ‘\n; SELECT file('{c}')",
        f"SELECT $$'$$; SELECT file('{c}') --'", f"SELECT $t$‘$t$; SELECT file('{c}')", f"SELECT '\\''; SELECT file('{c}')",
        f"SELECT `‘`; SELECT file('{c}')", f"SELECT 1 /* ‘ */; SELECT file('{c}') /* ’ */", f"SELECT 1 #! ‘\n; SELECT file('{c}')",
        f"SELECT ‘\\’’; SELECT file(‘{c}’)", f"SELECT 'x' ‘; SELECT file(‘{c}’) --’",
        f"EXPLAIN AST SELECT 1; SELECT file('{c}')", f"SELECT file(‘{c}’)", f"SELECT * FROM file(‘{c}’, ‘LineAsString’)",
        f"SELECT 1 INTO OUTFILE ‘{out}’", f"SELECT 1 INTO OUTFILE '{out}' TRUNCATE", f"SELECT 1 INTO OUTFILE $${out}$$",
        f"WITH (SELECT file('{c}')) AS x SELECT x", f"SELECT * FROM view(SELECT file('{c}'))",
        "SELECT * FROM input('x String')", f"SELECT * FROM format(LineAsString, (SELECT file('{c}')))",
        # settings and formats that name files, from the query
        f"SELECT 1 SETTINGS format_template_resultset = '{c}' FORMAT Template",
        f"SELECT 1 FORMAT Template SETTINGS format_template_row = '{c}'",
        f"SELECT 1 SETTINGS output_format_schema = '{out}' FORMAT Protobuf",
        f"SELECT 1 SETTINGS format_schema = '{c}:M' FORMAT CapnProto",
        "SELECT 1 SETTINGS max_execution_time = 1000000", "SELECT 1 SETTINGS readonly = 0",
        # system tables however reached
        "SELECT * FROM merge('system', '^proc')", "SELECT * FROM merge(REGEXP('sys'), '^proc')",
        "SELECT * FROM INFORMATION_SCHEMA.tables", "SELECT * FROM information_schema.columns",
        "SELECT 1 WHERE 'x' IN (SELECT query FROM system.processes)", "SELECT 1 WHERE 'x' IN system.processes",
        "SELECT * FROM (SELECT 1) AS a, system.disks AS b", "SELECT * FROM system.query_log",
        "SELECT * FROM system.tables", "SELECT * FROM system.databases", "DESCRIBE system.processes",
        "SHOW PROCESSLIST", "SHOW TABLES FROM system", "SHOW CREATE TABLE system.processes", "EXISTS system.disks",
        "SHOW DATABASES", "SHOW COLUMNS FROM processes FROM system", "SELECT hasColumnInTable('system', 'processes', 'query')",
        "SELECT * FROM viewIfPermitted(SELECT * FROM system.processes ELSE null('x UInt8'))",
        "SELECT getServerSetting('user_files_path')", "SELECT getMergeTreeSetting('index_granularity')",
        # writes, external sources, programs
        f"SELECT * FROM url('http://127.0.0.1:{port}/', 'LineAsString')",
        f"SELECT * FROM s3('http://127.0.0.1:{port}/x.csv')", f"SELECT * FROM remote('127.0.0.1:{port}', system.one)",
        "SELECT * FROM executable('id', 'TSV', 'x String')", "CREATE TABLE pwned (x UInt8) ENGINE = Memory",
        "DROP TABLE trajectories", "INSERT INTO trajectories (rollout_id) VALUES ('pwned')", "KILL QUERY WHERE 1",
        "SYSTEM DROP DNS CACHE", "SET readonly = 0",
    ], [
        {"database": "system"}, {"database": "INFORMATION_SCHEMA"}, {"format_schema": c}, {"readonly": "0"},
        {"max_threads": "1\x00"}, {"default_format": "Template"}, {"output_format_schema": out},
    ]


def test_each_reproducer_and_the_corpus_is_refused_with_nothing_read_written_or_contacted(live: Live) -> None:
    port = live.listener.getsockname()[1]
    before_tables, before_files = tables(live), files(live)
    seen = []
    for sql, params in issue_reproducers(live, port):
        status, text = ask(live, sql, params)
        seen.append((sql, status, text))
        assert status in (400, 403), (sql, params, status, text)
        assert text.startswith("Code: ") and "rule: " in text, (sql, text)
    statements, url_cases = corpus(live, port)
    for sql in statements:
        status, text = ask(live, sql)
        seen.append((sql, status, text))
        assert status in (400, 403), (sql, status, text)
        assert "rule: " in text, (sql, text)
    for params in url_cases:
        status, text = ask(live, "SELECT count() FROM trajectories", params)
        seen.append((str(params), status, text))
        assert status in (400, 403) and "rule: " in text, (params, status, text)
        name = next(iter(params))
        assert name in text, (params, text)  # the refusal names the parameter
    # the writer is trusted with its database, never with the host
    for sql in (f"SELECT file('{live.canary}')", f"SELECT ‘'’; SELECT file(‘{live.canary}’) --'",
                f"INSERT INTO trajectories (rollout_id) VALUES (file('{live.canary}'))",
                f"SELECT 1 INTO OUTFILE '{live.tmp / 'w'}'", f"SELECT 1 SETTINGS format_schema = '{live.canary}:M'",
                "SELECT count() FROM system.numbers SETTINGS max_execution_time = 1000000"):
        status, text = ask(live, sql, headers=as_writer(live))
        seen.append((sql, status, text))
        assert status in (400, 403), (sql, status, text)
    for sql, status, text in seen:
        for secret in live.secrets:
            assert secret not in text, (sql, status, "leaks a secret")
    with pytest.raises(BlockingIOError):
        live.listener.accept()  # nobody connected to the loopback listener
    assert tables(live) == before_tables
    assert files(live) == before_files
    # malformed requests are a 400, and the endpoint keeps serving
    assert ask(live, b"SELECT '\xff\xfe'")[0] == 400
    assert ask(live, "SELECT 1\x00")[0] == 400
    assert ask(live, params={"query": "SELECT 1", "param_x": "\x07"})[0] == 400
    for raw in ("query=SELECT%20%27%ff%27", "query=SELECT%201&%ff=1", "query=SELECT%201&database=%c3%28"):
        status, text = ask_raw(live, raw)
        assert status == 400 and "malformed-request" in text, (raw, text)
    status, text = ask(live, params={"query": "SELECT 1", "max_threads": "many"})
    assert status == 400 and "bad-setting-value" in text, text
    assert ask(live, "SELECT 42") == (200, "42\n")
    # a limit a client may name is applied, but the server's own value wins
    from dart.data.config import SqlLimits

    got = ask(live, "SELECT getSetting('max_execution_time')", {"max_execution_time": "1e9"})
    assert got == (200, f"{SqlLimits().max_execution_time_s:g}\n")


def test_clients_still_work_against_the_guarded_endpoint(live: Live, tmp_path: Path) -> None:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import DatabaseError

    host, port = "127.0.0.1", int(live.url.rsplit(":", 1)[1].strip("/"))
    client = clickhouse_connect.get_client(host=host, port=port, database=live.database)
    assert client.query("SELECT count() FROM trajectories").result_rows == [(3,)]
    assert client.query("SELECT {n:UInt8} + 1 AS x", parameters={"n": 1}).result_rows == [(2,)]
    df = client.query_df("SELECT rollout_id, reward FROM rewards FINAL ORDER BY rollout_id")
    assert len(df) == 3 and sorted(df["reward"].tolist()) == [0.0, 1.0, 1.0]
    assert client.query("SELECT name FROM system.settings WHERE name = 'max_threads'").result_rows == [("max_threads",)]
    assert {r[0] for r in client.query("SHOW TABLES").result_rows} >= {"trajectories", "actions"}
    assert client.query("SELECT ‘it’ AS a, 'it' = a AS same").result_rows == [("it", 1)]
    with pytest.raises(DatabaseError, match="read-only"):
        client.insert("trajectories", [["x"]], column_names=["rollout_id"])
    client.close()
    writer = clickhouse_connect.get_client(host=host, port=port, database=live.database, username="dart_writer",
                                           password=live.writer_password)
    writer.command("CREATE TABLE IF NOT EXISTS scratch (x UInt32, s String) ENGINE = MergeTree ORDER BY x")
    writer.insert("scratch", [[1, "a"], [2, "b"]], column_names=["x", "s"])
    assert writer.query("SELECT sum(x) FROM scratch").result_rows == [(3,)]
    writer.command("INSERT INTO scratch VALUES (3, 'c;d')")
    assert writer.query("SELECT groupArray(s) FROM (SELECT s FROM scratch ORDER BY x)").result_rows == [(["a", "b", "c;d"],)]
    with pytest.raises(DatabaseError, match="writer-allow-list"):  # the writer ingests: no DROP (issue 54)
        writer.command("DROP TABLE scratch")
    writer.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sql = subprocess.run([sys.executable, "-m", "dart.cli", "sql", "--url", live.url.rstrip("/"), "--database",
                          live.database, "SELECT count() AS n FROM trajectories FORMAT TSV"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert (sql.returncode, sql.stdout) == (0, "3\n"), sql.stderr
    refused = subprocess.run([sys.executable, "-m", "dart.cli", "sql", "--url", live.url.rstrip("/"), "--database",
                              live.database, "SELECT * FROM system.processes"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "dart-database-only" in refused.stderr
    report = subprocess.run([sys.executable, "-m", "dart.cli", "report", "--url", live.url.rstrip("/"), "--database",
                             live.database, "--out", str(tmp_path / "report")],
                            env=env, capture_output=True, text=True, timeout=180)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "report" / "report.txt").read_text().strip()


def writer_reproducers(live: Live, port: int) -> list[str]:
    """Issue 44's requests as the writer (it has the password) and the same shapes beside them."""
    c, tmp, target = live.canary, live.tmp, live.tmp / "target.csv"
    s3 = f"S3('http://127.0.0.1:{port}/bucket/x', 'a', 'b')"
    azure = (f"AzureBlobStorage('DefaultEndpointsProtocol=http;AccountName=a;AccountKey=Yg==;"
             f"BlobEndpoint=http://127.0.0.1:{port}/a', 'c', 'x')")
    return [
        # chdb's `default` database: a Filesystem overlay of the host
        "SELECT * FROM default.`/etc/passwd`", f"SELECT * FROM default.`{c}`", f"SELECT _path, * FROM default.`{tmp}/*`",
        f"SELECT * FROM default.`{tmp}/writer-password`", f"INSERT INTO default.`{target}` VALUES (7, 8)",
        f"INSERT INTO default.`{target}` FORMAT CSV\n7,8\n", f"DESCRIBE default.`{c}`", f"EXISTS default.`{c}`",
        "SHOW TABLES FROM default", "SELECT * FROM merge('default', '.*')", f"SELECT 'x' IN default.`{c}`",
        f"CREATE TABLE copy AS default.`{c}`", f"CREATE VIEW v AS SELECT * FROM default.`{c}`",
        f"INSERT INTO trajectories (rollout_id) SELECT * FROM default.`{c}`", "USE default",
        f"RENAME TABLE trajectories TO default.`{tmp}/renamed.csv`", "EXCHANGE TABLES trajectories AND default.x",
        "CREATE TABLE m (x String) ENGINE = Merge('default', '.*')",
        "CREATE TABLE b (x UInt8) ENGINE = Buffer('default', 'x', 1, 1, 1, 1, 1, 1, 1)",
        # backups, restores, the server, other clients
        f"BACKUP TABLE dart.trajectories TO {s3}", f"RESTORE TABLE dart.trajectories FROM {s3}",
        f"BACKUP TABLE dart.trajectories TO {azure}", f"BACKUP TABLE trajectories TO File('{tmp}/b.zip')",
        "SYSTEM SHUTDOWN", "SYSTEM FLUSH LOGS", "KILL QUERY WHERE 1", "KILL QUERY WHERE 1 SYNC",
        # views over files, attached files, named collections, engines and settings that touch files
        f"CREATE VIEW fv AS SELECT * FROM file('{c}', 'LineAsString')",
        f"ATTACH TABLE att FROM '{tmp}/att' (x String) ENGINE = File(CSV)",
        f"CREATE NAMED COLLECTION nc AS url = 'http://127.0.0.1:{port}/'",
        f"CREATE TABLE ft (x String) ENGINE = File(CSV, '{tmp}/ft.csv')",
        f"CREATE TABLE d (x UInt8) ENGINE = MergeTree ORDER BY x SETTINGS disk = disk(type = local, path = '{tmp}/d/')",
        "CREATE TABLE mv_target (x UInt8) ENGINE = Memory AS SELECT 1",
        "CREATE MATERIALIZED VIEW mv TO trajectories AS SELECT * FROM trajectories",
        "CREATE DATABASE other", f"CREATE DATABASE fs ENGINE = Filesystem('{tmp}')", "DROP DATABASE dart",
        "CREATE DICTIONARY dct (x UInt8) PRIMARY KEY x SOURCE(FILE(path '/etc/passwd' format 'CSV')) "
        "LAYOUT(FLAT()) LIFETIME(0)",
        "ALTER TABLE trajectories FREEZE", "ALTER TABLE trajectories MODIFY SETTING storage_policy = 'x'",
        "DETACH TABLE trajectories", "UNDROP TABLE x", "CREATE USER u", "GRANT ALL ON *.* TO dart_writer",
        "CREATE FUNCTION f AS x -> x", "SET readonly = 0", "OPTIMIZE TABLE trajectories FINAL",
        f"INSERT INTO FUNCTION file('{tmp}/w.csv') VALUES (1)", "SELECT * FROM system.tables",
    ]


def test_issue44_writer_writes_dart_tables_and_nothing_else(live: Live) -> None:
    """Issue 44, live, as the writer: every request refused (403 naming the rule); the host file
    is unchanged, no file appears, no listener is contacted, no table or database appears, the
    endpoint's process is still there and serving."""
    port = live.listener.getsockname()[1]
    target = live.tmp / "target.csv"
    target.write_text("1,2\n")
    before_tables, before_files = tables(live), files(live)
    seen = []
    for sql in writer_reproducers(live, port):
        for params in ({}, {"database": "default"}):
            status, text = ask(live, sql, params, headers=as_writer(live))
            seen.append((sql, params, status, text))
            assert status == 403 or (status == 400 and "rule: " in text and params), (sql, params, status, text)
            assert "rule: " in text, (sql, text)
            assert ("Stack trace" not in text and "DB::Exception: dart SQL endpoint" in text) or params, (sql, text)
    for sql, params, status, text in seen:
        for secret in (*live.secrets, "root:x:0:0"):
            assert secret not in text, (sql, params, status, "leaks a secret")
    with pytest.raises(BlockingIOError):
        live.listener.accept()
    assert target.read_text() == "1,2\n"
    assert tables(live) == before_tables
    assert files(live) == before_files
    assert live.proc.poll() is None
    assert ask(live, "SELECT 42", headers=as_writer(live)) == (200, "42\n")
    assert ask(live, "SELECT 42") == (200, "42\n")


def test_issue44_no_oracle_about_host_files(live: Live) -> None:
    """A name in another database is refused by name, before anything runs: the same answer for a
    path that exists and one that does not, for every construct and both roles (also after the
    writer tried to open the path)."""
    missing = live.tmp / f"missing-{uuid.uuid4().hex}.txt"
    shapes = ["SELECT 'x' IN default.`{p}`", "SELECT * FROM default.`{p}`", "SELECT 1 FROM numbers(1) WHERE 1 IN "
              "(SELECT 1 FROM default.`{p}`)", "SELECT * FROM numbers(1) AS n JOIN default.`{p}` AS f ON 1",
              "DESCRIBE default.`{p}`", "EXISTS default.`{p}`", "SHOW CREATE TABLE default.`{p}`",
              "SELECT * FROM system.`{p}`", "SELECT 'x' IN INFORMATION_SCHEMA.`{p}`"]
    for headers in (as_writer(live), {}):
        ask(live, f"SELECT * FROM default.`{live.canary}`", headers=as_writer(live))  # the issue's first step
        for shape in shapes:
            there = ask(live, shape.format(p=live.canary), headers=headers)
            not_there = ask(live, shape.format(p=missing), headers=headers)
            assert there[0] == not_there[0] == 403, (shape, there, not_there)
            assert there[1].replace(str(live.canary), "P") == not_there[1].replace(str(missing), "P"), shape
            assert "dart-database-only" in there[1]


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024


def test_issue54_the_writer_ingests_and_cannot_drop_truncate_alter_or_grow_memory(live: Live) -> None:
    """Issue 54, live, as the writer: its password (an ingest credential) empties, drops, alters or
    replaces no table; the three ~90-byte ALTER ... UPDATEs that grew the process by 195 MB are
    refused, and so are tables that keep their rows in memory; INSERT and CREATE still work."""
    count = "SELECT count() FROM trajectories"
    before_rows, before_rss = ask(live, count), rss_bytes(live.proc.pid)
    grow = "ALTER TABLE tasks UPDATE instruction = repeat(repeat('x', 1000000), 60) WHERE 1"  # 79 bytes, +265 MB before
    refused = [grow, grow, grow, "DROP TABLE trajectories", "DROP TABLE IF EXISTS trajectories SYNC",
               "TRUNCATE TABLE trajectories", "TRUNCATE trajectories", "ALTER TABLE trajectories DELETE WHERE 1",
               "ALTER TABLE trajectories ADD COLUMN pwned UInt8", "ALTER TABLE trajectories DROP COLUMN rollout_id",
               "ALTER TABLE trajectories MODIFY COLUMN reward String", "DELETE FROM trajectories WHERE 1",
               "CREATE OR REPLACE TABLE trajectories (x UInt8) ENGINE = MergeTree ORDER BY x",
               "CREATE OR REPLACE VIEW trajectory_rewards AS SELECT 1", "RENAME TABLE trajectories TO gone",
               "CREATE TABLE mem (x String) ENGINE = Memory", "CREATE TABLE st (x String) ENGINE = Set",
               "CREATE TABLE jn (x String) ENGINE = Join(ANY, LEFT, x)", "OPTIMIZE TABLE trajectories FINAL"]
    for sql in refused:
        status, text = ask(live, sql, headers=as_writer(live))
        assert status == 403 and ("writer-allow-list" in text or "no-external-tables" in text), (sql, status, text)
    assert ask(live, count) == before_rows
    assert rss_bytes(live.proc.pid) - before_rss < 50 * 1024**2, (before_rss, rss_bytes(live.proc.pid))
    # what it is for: migrations' CREATE and inserts
    assert ask(live, "CREATE TABLE IF NOT EXISTS ingest54 (x UInt32) ENGINE = MergeTree ORDER BY x",
               headers=as_writer(live))[0] == 200
    assert ask(live, "INSERT INTO ingest54 FORMAT TSV\n1\n2\n", headers=as_writer(live))[0] == 200
    assert ask(live, "SELECT sum(x) FROM ingest54") == (200, "3\n")
