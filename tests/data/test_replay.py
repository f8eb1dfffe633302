"""Replay: the projection rebuilt from the log equals the live one table by table, and a
tampered live row or a missing event is named by its event_id."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from dart.bus import BusConfig
from dart.cli import build_parser
from dart.data.config import HttpConfig
from dart.data.manager import DataManager
from dart.data.replay import RowDiff, compare, diff_rows, format_checks, rebuild
from dart.data.rows import TABLES
from dart.data.store import Store
from dart.errors import ConfigError
from tests.data.factories import group, heartbeat, service_events, task
from tests.data.test_manager import config, send_all, until

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse]
REPO = Path(__file__).resolve().parents[2]


def test_diff_rows_names_missing_extra_and_changed_rows_in_event_id_order() -> None:
    live = {"a": 1, "b": 2, "c": 3}
    fresh = {"b": 2, "c": 4, "d": 5}
    assert diff_rows("t", live, fresh, limit=10) == [
        RowDiff("t", "a", "only live"), RowDiff("t", "c", "content differs"), RowDiff("t", "d", "only replayed")]
    assert len(diff_rows("t", live, fresh, limit=2)) == 2


def history() -> list:
    events, trajs = group("a", [1.0, 0.0, None], steps=3)
    more, _ = group("b", [0.0, 1.0], steps=2)
    return [task("a"), task("b"), heartbeat("env-1", 4), *events, *more,
            *service_events([t.rollout_id for t in trajs[:2]])]


def dart(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dart.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


async def test_replay_equals_live_and_names_a_tampered_row_and_a_missing_event(
        bus: BusConfig, store: Store, blobs, chdb_path: Path) -> None:
    events = history()
    await send_all(bus, events)
    dm = DataManager(config(http=HttpConfig(port=0)), bus, store=store, blobs=blobs)
    run = asyncio.create_task(dm.run())
    try:
        await until(lambda: asyncio.sleep(0, dm.projected >= len(events) and dm.sql is not None and dm.sql.port))
        # the CLI, from another process, reads the live side over the data manager's HTTP endpoint
        argv = ("replay", "--bootstrap", bus.bootstrap, "--prefix", bus.prefix, "--url", dm.sql.url,
                "--database", store.database)
        r = await asyncio.to_thread(dart, *argv)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[2:] if line.strip()}
        assert set(rows) == set(TABLES)
        assert rows["actions"] == ["13", "13", "yes"] and rows["dead_letters"] == ["1", "1", "yes"]
        assert all(v[2] == "yes" and v[0] == v[1] for v in rows.values())
        # tamper one live row: the replay no longer matches and names the row
        reward = next(e for e in events if type(e).__name__ == "RewardAssigned")
        store.command(f"ALTER TABLE {store.database}.rewards UPDATE reward = reward + 0.5 "
                      f"WHERE event_id = '{reward.event_id}' SETTINGS mutations_sync = 2")
        r = await asyncio.to_thread(dart, *argv, "--wait-s", "0")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "rewards                     4              4  NO" in r.stdout
        assert f"rewards: event_id {reward.event_id} (content differs)" in r.stdout
        assert "actions                    13             13  yes" in r.stdout
    finally:
        dm.stop()
        await asyncio.wait_for(run, 15)
    # no data manager serves the path now: the command opens it and replays into a new database there
    assert not (chdb_path.parent / (chdb_path.name + ".http")).exists()
    args = build_parser().parse_args(["replay", "--bootstrap", bus.bootstrap, "--prefix", bus.prefix,
                                      "--dsn", f"chdb://{chdb_path}", "--database", store.database, "--wait-s", "0"])
    assert await asyncio.to_thread(args.func, args) == 1
    assert not [r for r in store.query("SHOW DATABASES") if r[0].startswith(f"{store.database}_replay")]
    args = build_parser().parse_args(["replay", "--dsn", f"chdb://{chdb_path}", "--out", "chdb:///elsewhere"])
    with pytest.raises(ConfigError, match="drop --out"):
        args.func(args)
    # in-process: a fresh database (same chdb path) missing one event
    dropped = next(e for e in events if type(e).__name__ == "ActionChosen")
    fresh = Store.open_dsn(f"chdb://{chdb_path}", database=f"r{uuid.uuid4().hex[:8]}")
    try:
        counts = await rebuild(bus, fresh, skip=lambda e: e.event_id == dropped.event_id)
        assert sum(counts.values()) == len(events) - 1
        checks, diffs = compare(store.query, store.database, fresh.query, fresh.database, TABLES)
        bad = {c.table: (c.live_rows, c.replayed_rows) for c in checks if not c.equal}
        assert bad == {"actions": (13, 12), "rewards": (4, 4)}
        assert RowDiff("actions", dropped.event_id, "only live") in diffs
        assert RowDiff("rewards", reward.event_id, "content differs") in diffs
        assert "actions                    13             12  NO" in format_checks(checks, diffs)
    finally:
        fresh.command(f"DROP DATABASE {fresh.database}")
        fresh.close()


def _archive(log_dir: Path, topics: dict[tuple[str, int], list[bytes]]) -> None:
    from dart.log.segments import archive_record, write_segment

    for (topic, part), values in topics.items():
        half = len(values) // 2           # two files per partition: a chunk runs across files too
        for first, part_values in ((0, values[:half]), (half, values[half:])):
            if part_values:
                write_segment(log_dir, topic, part, [
                    archive_record(topic, part, first + i, 1_000 + first + i, None, [], v, None)
                    for i, v in enumerate(part_values)], fsync=False)


def test_replay_from_the_archive_takes_the_clickhouse_path_and_equals_the_python_projection(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dart.data import avroload, projection
    from dart.data.replay import archived_events, rebuild_from_archive
    from dart.events import ParsedAction, encode
    from dart.events.examples import action_chosen
    from dart.log import ArchiveError

    events = history()
    # json.dumps writes its action text differently from ClickHouse: this one takes the Python path
    odd = replace(action_chosen(tokens=3, seed=7), actions=[ParsedAction(kind="type", text="café")])
    values = [encode(e) for e in events]
    topics: dict[tuple[str, int], list[bytes]] = {
        ("t.events", 0): values[: len(values) // 3],
        ("t.events", 1): [*values[len(values) // 3:2 * len(values) // 3], b"\xc3\x01garbage"],
        ("t.other", 0): [*values[2 * len(values) // 3:], *values[:2], encode(odd)],   # two duplicates
    }
    log_dir = tmp_path / "log"
    _archive(log_dir, topics)
    by_python = Store(store.client, f"{store.database}_py", store.target)
    by_python.migrate()
    projection.write_events(by_python, [e for _, e in archived_events(log_dir)])
    done: list[avroload.Projected] = []
    real = avroload.project_records
    monkeypatch.setattr(avroload, "project_records", lambda *a, **kw: done.append(real(*a, **kw)) or done[-1])
    try:
        counts = rebuild_from_archive(log_dir, store, chunk=7)    # chunks across files, partitions, topics
        # ClickHouse decoded every record but the garbage and the odd action
        assert sum(d.by_sql for d in done) == sum(map(len, topics.values())) - 2
        checks, diffs = compare(by_python.query, by_python.database, store.query, store.database, TABLES)
        assert all(c.equal for c in checks), format_checks(checks, diffs)
        assert sum(c.live_rows for c in checks) > len(events) // 2
        # the record that does not decode is left out, as the live consumer left it out
        assert counts == {"t.events": len(topics["t.events", 0]) + len(topics["t.events", 1]) - 1,
                          "t.other": len(topics["t.other", 0])}
        # --until-ms: only records up to that Kafka time
        cut = Store(store.client, f"{store.database}_cut", store.target)
        assert sum(rebuild_from_archive(log_dir, cut, until_ms=1_002).values()) == 3 * 3
        cut.command(f"DROP DATABASE {cut.database}")
        # a damaged file: an error naming it, raised where the replay reads it, not a partial store
        victim = sorted((log_dir / "t.other" / "0000").glob("*.avro"))[-1]
        victim.write_bytes(victim.read_bytes()[:-40])
        with pytest.raises(ArchiveError, match=victim.name):
            rebuild_from_archive(log_dir, Store(store.client, f"{store.database}_bad", store.target))
    finally:
        for db in (by_python.database, f"{store.database}_bad"):
            store.command(f"DROP DATABASE IF EXISTS {db}")
