"""The ClickHouse HTTP interface over chdb: request parsing (pure) and real requests."""

from __future__ import annotations

import gzip

import aiohttp
import pytest

from dart.data.http import SqlServer, Writer, decompress, parse_request, split_format
from dart.data.store import Store

pytestmark = pytest.mark.clickhouse
WRITER = Writer.from_secret("dart_writer", "writer-password")
PASSWORD = "writer-password"


def test_parse_request_follows_clickhouse_semantics() -> None:
    r = parse_request({"query": "SELECT {x:UInt8}", "param_x": "1", "max_threads": "2", "database": "d",
                       "default_format": "JSON", "query_id": "q", "wait_end_of_query": "1"}, b"")
    assert (r.sql, r.params, r.settings, r.database, r.default_format) == (
        "SELECT {x:UInt8}", {"x": "1"}, {"max_threads": "2"}, "d", "JSON")
    ins = parse_request({"query": "INSERT INTO t (a) FORMAT Native"}, b"\x01\x02")
    assert (ins.insert_data, ins.insert_format) == (b"\x01\x02", "Native")
    assert parse_request({"query": "INSERT INTO t VALUES"}, b"(1)").sql == "INSERT INTO t VALUES\n(1)"
    # statement and binary data in one body (clickhouse-connect's insert); 9 columns = a \t byte
    both = parse_request({}, b"INSERT INTO `t` (`a`, `format`) FORMAT Native\n\t\xff\x00")
    assert (both.sql, both.insert_format, both.insert_data) == (
        "INSERT INTO `t` (`a`, `format`) FORMAT Native", "Native", b"\t\xff\x00")
    assert parse_request({}, b"SELECT 1").sql == "SELECT 1"
    for bad in ({}, {"database": "x; DROP"}, {"query": "SELECT 1", "bad-setting": "1"}):
        with pytest.raises(ValueError):
            parse_request(bad, b"")
    assert split_format("SELECT 1 FORMAT CSV") == ("SELECT 1", "CSV")
    assert split_format("SELECT 'FORMAT'") == ("SELECT 'FORMAT'", None)
    assert decompress(gzip.compress(b"abc"), "gzip") == b"abc"
    with pytest.raises(ValueError, match="Content-Encoding"):
        decompress(b"", "snappy")


async def test_ping_query_insert_and_errors_over_http(store: Store, chdb_path) -> None:
    server = SqlServer(chdb_path, writer=WRITER, database=store.database)
    port = await server.start()
    url = f"http://127.0.0.1:{port}/"
    db = store.database
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}ping") as r:
                assert r.status == 200 and await r.text() == "Ok.\n"
            body = gzip.compress(b"7\tseven\n8\teight\n")
            async with http.post(url, params={"query": "INSERT INTO schema_version (version, name) FORMAT TSV",
                                              "database": db}, data=body, auth=aiohttp.BasicAuth("dart_writer", "writer-password"),
                                 headers={"Content-Encoding": "gzip"}) as r:
                assert r.status == 200, await r.text()
            async with http.post(url, params={"database": db, "param_v": "7"},
                                 data=b"SELECT name FROM schema_version WHERE version >= {v:UInt32} ORDER BY version") as r:
                assert r.status == 200 and await r.text() == "seven\neight\n"
                assert r.headers["X-ClickHouse-Format"] == "TabSeparated"
            async with http.get(url, params={"query": "SELECT 1 AS a FORMAT JSONEachRow"}) as r:
                assert await r.text() == '{"a":1}\n' and r.headers["X-ClickHouse-Format"] == "JSONEachRow"
            async with http.get(url, params={"query": "SELECT * FROM no_such_table"}) as r:
                assert r.status == 500 and r.headers["X-ClickHouse-Exception-Code"] == "60"
                assert "no_such_table" in await r.text()
    finally:
        await server.stop()


def test_decompress_every_encoding_clickhouse_connect_may_send() -> None:
    import zlib

    import lz4.frame
    from backports import zstd

    data = b"1\tone\n" * 100
    assert decompress(lz4.frame.compress(data), "lz4") == data
    assert decompress(zstd.compress(data), "zstd") == data
    assert decompress(zlib.compress(data), "deflate") == data
    assert decompress(data, "gzip") == data          # already inflated by aiohttp


async def test_clickhouse_connect_queries_and_inserts_through_the_endpoint(store: Store, chdb_path) -> None:
    import asyncio

    import clickhouse_connect

    server = SqlServer(chdb_path, writer=WRITER, database=store.database)
    port = await server.start()

    def session() -> tuple:
        results = []
        for compress in (False, "lz4", "zstd", "gzip"):
            c = clickhouse_connect.get_client(host="127.0.0.1", port=port, database=store.database, compress=compress,
                                              username=WRITER.user, password=PASSWORD)
            v = len(results) + 10
            # bytes that are not UTF-8 in the Native body
            c.insert("schema_version", [[v, f"via {compress}".encode() + b"\xff"]], column_names=["version", "name"])
            c.close()
            reader = clickhouse_connect.get_client(host="127.0.0.1", port=port, database=store.database, compress=compress)
            results.append(reader.query("SELECT replaceAll(name, '\\xFF', '') AS n FROM schema_version WHERE version = {v:UInt32}",
                                        parameters={"v": v}).result_rows)
            reader.close()
        return tuple(results)

    try:
        got = await asyncio.to_thread(session)
    finally:
        await server.stop()
    assert got == ([("via False",)], [("via lz4",)], [("via zstd",)], [("via gzip",)])


async def test_the_projection_and_curation_sql_run_unchanged_on_a_clickhouse_server(store: Store, chdb_path,
                                                                                     monkeypatch) -> None:
    """The data manager on a ClickHouse server (clickhouse-connect over HTTP, here the project's
    own endpoint, as its writer: the endpoint is read-only for everyone else) writes and reads
    with the same SQL as on chdb, with the same answers."""
    import asyncio

    from dart.data import projection as q
    from dart.data.config import StoreConfig
    from tests.data.factories import T0, group, heartbeat, task

    e1, _ = group("a", [1.0, 0.0, 1.0], version=2, t=T0)
    e2, _ = group("b", [0.0, 0.0], version=2, t=T0 + 10_000, steps=5)
    server = SqlServer(chdb_path, writer=WRITER, database=store.database)
    port = await server.start()
    monkeypatch.setenv("DART_TEST_WRITER_PASSWORD", PASSWORD)

    def over_http() -> tuple:
        remote = Store.open(StoreConfig(dsn=f"http://127.0.0.1:{port}", database=store.database,
                                        username=WRITER.user, password_env="DART_TEST_WRITER_PASSWORD"))
        assert remote.target.kind == "http"
        q.write_events(remote, [task("a"), task("b"), *e1, *e2, heartbeat("env-0", 8, t=T0)])
        out = (q.table_counts(remote, ["actions", "trajectories"]), q.success_lengths(remote, threshold=0.5),
               len(q.recent_outcomes(remote, mode="train", oldest_version=0, window=8)),
               sorted(len(g.outcomes) for g in q.open_groups(remote, mode="train")[0]))
        remote.close()
        return out

    try:
        remote = await asyncio.to_thread(over_http)
    finally:
        await server.stop()
    local = (q.table_counts(store, ["actions", "trajectories"]), q.success_lengths(store, threshold=0.5),
             len(q.recent_outcomes(store, mode="train", oldest_version=0, window=8)),
             sorted(len(g.outcomes) for g in q.open_groups(store, mode="train")[0]))
    assert remote == local
    assert local[0] == {"actions": 3 * 4 + 2 * 5, "trajectories": 5}


async def test_the_writer_runs_dart_migrations_over_the_endpoint(chdb_path, monkeypatch) -> None:
    """The writer's allow-list holds what dart's own migrations need: a fresh database migrated
    through the endpoint (CREATE DATABASE, CREATE TABLE ... SETTINGS index_granularity, CREATE
    VIEW over dart tables, INSERT INTO schema_version), then read back."""
    import asyncio
    import uuid

    from dart.data import projection as q
    from dart.data.config import StoreConfig
    from dart.data.schema import MIGRATIONS
    from tests.data.factories import T0, group, task

    database = f"m{uuid.uuid4().hex[:10]}"
    server = SqlServer(chdb_path, writer=WRITER, database=database)
    port = await server.start()
    monkeypatch.setenv("DART_TEST_WRITER_PASSWORD", PASSWORD)
    events, _ = group("a", [1.0, 0.0], version=1, t=T0)

    def over_http() -> tuple:
        remote = Store.open(StoreConfig(dsn=f"http://127.0.0.1:{port}", database=database,
                                        username=WRITER.user, password_env="DART_TEST_WRITER_PASSWORD"))
        applied = remote.migrate()
        q.write_events(remote, [task("a"), *events])
        out = (applied, remote.migrate(), remote.query("SELECT count() FROM trajectory_rewards")[0][0])
        remote.close()
        return out

    try:
        applied, again, rewarded = await asyncio.to_thread(over_http)
    finally:
        await server.stop()
    assert applied == [m.version for m in MIGRATIONS] and again == []
    assert rewarded == 2
