"""The SQL endpoint as a stranger would try it: what reaches outside, changes the projection or
lifts read-only is refused with nothing read or created, and the endpoint keeps serving."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from dart.data.config import SqlLimits
from dart.data.http import SqlServer, Writer
from dart.data.store import Store

pytestmark = pytest.mark.clickhouse
WRITER = Writer.from_secret("dart_writer", "writer-password")
PASSWORD = "writer-password"


@pytest.fixture
async def endpoint(store: Store, chdb_path) -> AsyncIterator[tuple[str, str]]:
    server = SqlServer(chdb_path, writer=WRITER, limits=SqlLimits(max_execution_time_s=0.5, max_result_rows=1000,
                                                                  max_body_bytes=32 * 1024**2, max_concurrent=2),
                       database=store.database)
    port = await server.start()
    try:
        yield f"http://127.0.0.1:{port}/", store.database
    finally:
        await server.stop()


async def ask(url: str, sql: str | None = None, *, params: dict | None = None, **kw) -> tuple[int, str, dict]:
    async with aiohttp.ClientSession() as http, http.post(url, params=params or {}, data=sql, **kw) as r:
        return r.status, await r.text(), dict(r.headers)


def count(store: Store, table: str) -> int:
    return store.query(f"SELECT count() FROM {store.database}.{table}")[0][0]


async def test_reaching_outside_the_projection_is_refused_and_nothing_is_read(endpoint, store) -> None:
    url, db = endpoint
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    payloads = [
        "SELECT * FROM file('/etc/passwd','LineAsString')",
        "SELECT * FROM url('http://127.0.0.1:1/')",
        f"SELECT * FROM url('http://127.0.0.1:{port}/', 'LineAsString')",
        "SELECT file('/etc/passwd')",                       # the scalar function: readonly=1 allows it
        "select * from FiLe('/etc/passwd', 'LineAsString')",
        "SELECT 1 FROM system.one WHERE 1 IN (SELECT 1 FROM file('/etc/passwd', 'LineAsString'))",
        "DESCRIBE file('/etc/passwd', 'LineAsString')",
        "EXPLAIN PIPELINE SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT * FROM s3('http://127.0.0.1:1/x.csv')",
        "SELECT * FROM remote('127.0.0.1:1', system.one)",
        "SELECT * FROM executable('id', 'TSV', 'x String')",
        "SELECT * FROM mysql('127.0.0.1:1', 'a', 'b', 'c', 'd')",
        "SELECT dictGet('d', 'x', 1)",
        "SELECT 1 INTO OUTFILE '/tmp/dart-outfile-test'",
    ]
    try:
        for sql in payloads:
            status, text, headers = await ask(url, sql, params={"database": db})
            assert status == 403, (sql, status, text)
            assert text.startswith("Code: ") and "rule: " in text and headers["X-ClickHouse-Exception-Code"]
            assert "root:" not in text
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected to the URL
    finally:
        listener.close()
    # the same words inside a string or a comment are data, not calls
    status, text, _ = await ask(url, "SELECT 'file(''/etc/passwd'')' -- url('x')\n", params={"database": db})
    assert (status, text) == (200, "file(\\'/etc/passwd\\')\n")  # TSV escapes the quotes


async def test_writes_ddl_and_lifting_readonly_are_refused_with_nothing_changed(endpoint, store) -> None:
    url, db = endpoint
    before = count(store, "trajectories")
    payloads = [
        "CREATE TABLE zz (x UInt8) ENGINE = Memory",
        "DROP TABLE trajectories",
        "ALTER TABLE trajectories DELETE WHERE 1",
        "TRUNCATE TABLE trajectories",
        "INSERT INTO trajectories (rollout_id) VALUES ('pwned')",
        "SET readonly=0",
        "SYSTEM DROP DNS CACHE",
        "KILL QUERY WHERE 1",
        "SELECT 1; DROP TABLE trajectories",
        "SELECT 1 /* ; */ ; CREATE TABLE zz (x UInt8) ENGINE = Memory",
        "SELECT 1 SETTINGS readonly = 0",
    ]
    for sql in payloads:
        status, text, _ = await ask(url, sql, params={"database": db})
        assert status == 403, (sql, status, text)
        assert "DB::Exception" in text and "rule: " in text
    for params in ({"readonly": "0"}, {"allow_ddl": "1"}):
        status, text, _ = await ask(url, "CREATE TABLE zz (x UInt8) ENGINE = Memory", params={"database": db, **params})
        assert status == 400 and f"URL parameter {next(iter(params))!r}" in text and "settings-allow-list" in text
    status, text, _ = await ask(url, params={"query": "INSERT INTO trajectories (rollout_id) FORMAT TSV", "database": db},
                                sql="pwned\n")
    assert status == 403, text
    tables = {r[0] for r in store.query(f"SHOW TABLES FROM {db}")}
    assert "zz" not in tables and "trajectories" in tables
    assert count(store, "trajectories") == before


async def test_credentials_decide_the_role(endpoint, store) -> None:
    url, db = endpoint
    create = "CREATE TABLE made_by_writer (x UInt8) ENGINE = MergeTree ORDER BY x"
    for auth in (aiohttp.BasicAuth("dart_writer", "wrong"), aiohttp.BasicAuth("mallory", "x")):
        status, text, _ = await ask(url, create, params={"database": db}, auth=auth)
        assert status == 401 and "AUTHENTICATION_FAILED" in text
    status, _, _ = await ask(url, create, params={"database": db, "user": "dart_writer", "password": "nope"})
    assert status == 401
    status, _, _ = await ask(url, "SELECT 1", headers={"X-ClickHouse-User": "default"})
    assert status == 200  # the analytics role needs no password
    status, text, _ = await ask(url, create, params={"database": db},
                                headers={"X-ClickHouse-User": "dart_writer", "X-ClickHouse-Key": "writer-password"})
    assert status == 200, text
    assert "made_by_writer" in {r[0] for r in store.query(f"SHOW TABLES FROM {db}")}
    # even the writer cannot reach outside
    for sql in ("SELECT * FROM file('/etc/passwd','LineAsString')",
                "INSERT INTO FUNCTION url('http://127.0.0.1:1/', 'CSV', 'a UInt8') VALUES (1)",
                "CREATE TABLE out_url (a UInt8) ENGINE = URL('http://127.0.0.1:1/', CSV)",
                "CREATE TABLE out_s3 AS s3('http://127.0.0.1:1/a.csv')"):
        status, text, _ = await ask(url, sql, params={"database": db},
                                    auth=aiohttp.BasicAuth("dart_writer", "writer-password"))
        assert status == 403 and "no-external" in text, (sql, text)
    assert not {"out_url", "out_s3"} & {r[0] for r in store.query(f"SHOW TABLES FROM {db}")}


async def test_limits_fail_the_request_and_the_endpoint_keeps_serving(endpoint) -> None:
    url, _ = endpoint
    status, text, headers = await ask(url, "SELECT count() FROM system.numbers")
    assert status == 500 and headers["X-ClickHouse-Exception-Code"] == "159" and "Timeout" in text
    status, text, _ = await ask(url, "SELECT number FROM numbers(100000)")
    assert status == 500 and "TOO_MANY_ROWS" in text  # not a silently truncated result
    status, text, _ = await ask(url, b"SELECT 1 -- " + b"x" * (100 * 1024**2))  # a 100 MB body
    assert status == 413 and "max_body_bytes" in text
    status, text, _ = await ask(url, "SELECT 42")
    assert (status, text) == (200, "42\n")


async def test_queries_past_max_concurrent_get_503_instead_of_a_queue_without_end(store, chdb_path) -> None:
    server = SqlServer(chdb_path, limits=SqlLimits(max_concurrent=1, queue_timeout_s=0.05, max_execution_time_s=2),
                       database=store.database)
    port = await server.start()
    url = f"http://127.0.0.1:{port}/"
    try:
        slow = asyncio.create_task(ask(url, "SELECT sleep(1)"))
        await asyncio.sleep(0.3)
        status, text, _ = await ask(url, "SELECT 1")
        assert status == 503 and "TOO_MANY_SIMULTANEOUS_QUERIES" in text
        assert (await slow)[0] == 200
        assert (await ask(url, "SELECT 1"))[:2] == (200, "1\n")
    finally:
        await server.stop()
