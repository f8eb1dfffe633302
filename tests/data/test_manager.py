"""The data manager against the real broker and chdb: idempotent projection, resume after a
kill, and the schedule -> rollouts -> batch loop with a scripted env."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter

import pytest

from dart.blobs import LocalBlobStore
from dart.bus import BusConfig, Producer, read_topic
from dart.data import projection
from dart.data.config import (
    BatcherConfig,
    CurationConfig,
    DataConfig,
    HttpConfig,
    ProjectionConfig,
    SchedulerConfig,
)
from dart.data.manager import DataManager
from dart.data.rows import TABLES
from dart.data.store import Store
from dart.events import BatchAssembled, RolloutRequested, decode, encode
from dart.events.manifest import BatchManifest
from tests.data.factories import Traj, group, heartbeat, task

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse]


def config(**kw) -> DataConfig:
    base = dict(http=HttpConfig(enabled=False), scheduler=SchedulerConfig(enabled=False),
                batcher=BatcherConfig(enabled=False), projection=ProjectionConfig(group=f"dm-{uuid.uuid4().hex[:8]}"))
    return DataConfig(**{**base, **kw})


def snapshot(store: Store) -> dict[str, list]:
    return {t: store.query(f"SELECT * FROM {store.database}.{t} FINAL ORDER BY event_id") for t in TABLES}


async def send_all(bus: BusConfig, events) -> None:
    producer = Producer(bus)
    try:
        for e in events:
            producer.send_nowait(e)
        await producer.aflush()
    finally:
        producer.close()


async def until(cond, timeout_s: float = 30.0, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(every_s)
    raise AssertionError("condition not met in time")


async def projected(dm: DataManager, n: int) -> bool:
    return dm.projected >= n


async def run_until(dm: DataManager, cond, timeout_s: float = 30.0):
    task = asyncio.create_task(dm.run())
    try:
        return await until(cond, timeout_s)
    finally:
        dm.stop()
        await asyncio.wait_for(task, 15)


async def test_events_delivered_twice_leave_identical_tables(bus: BusConfig, store: Store, blobs, chdb_path) -> None:
    events, _ = group("a", [1.0, 0.0, None])
    events += [task("a"), heartbeat("env-1", 4)]
    direct = Store.open_dsn(f"chdb://{chdb_path}", database=f"d{uuid.uuid4().hex[:8]}")
    direct.migrate()
    projection.write_events(direct, events)
    await send_all(bus, events + events)          # every event delivered twice
    dm = DataManager(config(), bus, store=store, blobs=blobs)
    await run_until(dm, lambda: projected(dm, 2 * len(events)))
    once = snapshot(direct)
    assert snapshot(store) == once
    # a replay of the whole log by a new consumer group changes nothing either
    dm2 = DataManager(config(), bus, store=store, blobs=blobs)
    await run_until(dm2, lambda: projected(dm2, 2 * len(events)))
    assert snapshot(store) == once
    direct.command(f"DROP DATABASE {direct.database}")


async def test_cancelled_manager_resumes_with_nothing_lost_or_doubled(bus: BusConfig, store: Store, blobs) -> None:
    history = []
    for i in range(60):
        events, _ = group(f"t{i % 7}", [1.0, 0.0, 0.0, 1.0], steps=5)
        history += events
    cfg = config(projection=ProjectionConfig(group="dm-resume", batch_rows=50))
    await send_all(bus, history)
    dm = DataManager(cfg, bus, store=store, blobs=blobs)
    task_ = asyncio.create_task(dm.run())
    await until(lambda: projected(dm, 400), timeout_s=90)   # generous: a loaded machine projects slowly
    task_.cancel()                                   # killed mid-stream: no clean stop, no final commit
    with contextlib.suppress(asyncio.CancelledError, BaseExceptionGroup):
        await task_
    assert dm.projected < len(history)
    dm2 = DataManager(cfg, bus, store=store, blobs=blobs)

    expected = {"requests": 240, "observations": 1200, "actions": 1200, "trajectories": 240, "rewards": 240}

    async def complete() -> bool:
        return await dm2.store_thread.run(projection.table_counts, store, list(expected)) == expected

    await run_until(dm2, complete, timeout_s=90)
    await asyncio.sleep(0.5)
    assert projection.table_counts(store, list(expected)) == expected
    # the restart resumed from committed offsets: it did not replay the whole log
    assert dm2.projected < len(history)


async def test_schedules_groups_and_assembles_a_batch_from_their_rollouts(
        bus: BusConfig, store: Store, blobs: LocalBlobStore) -> None:
    cfg = config(
        scheduler=SchedulerConfig(interval_s=0.2, capacity=None, capacity_factor=1.0),
        batcher=BatcherConfig(interval_s=0.2, groups_per_batch=2),
        curation=CurationConfig(entropy_top_fraction=1.0, min_failed_steps=0),
    )
    # "solved" already has a success history (rate 1.0 -> groups of 2, shorter step cap)
    solved_history, _ = group("solved", [1.0, 1.0], steps=4)
    await send_all(bus, [task("hard"), task("solved"), task("other", split="test"),
                         heartbeat("env-1", 10, t=int(time.time() * 1000)), *solved_history])
    dm = DataManager(cfg, bus, store=store, blobs=blobs, seed=1)
    run = asyncio.create_task(dm.run())
    try:
        requests: list[RolloutRequested] = []

        async def got_requests() -> bool:
            requests[:] = [d.event async for d in read_topic(bus, bus.topics.requests, idle_timeout_s=0.5)
                           if d.event.producer == cfg.worker_id]
            return len(requests) >= 10

        await until(got_requests)
        await asyncio.sleep(0.5)
        await got_requests()
        sizes = Counter(r.task_id for r in requests)
        assert sizes == {"hard": 8, "solved": 2}      # limit 10 slots: nothing more until they finish
        assert {r.max_steps for r in requests if r.task_id == "solved"} == {6}   # ceil(4 * 1.5)
        assert {r.max_steps for r in requests if r.task_id == "hard"} == {30}
        assert len({r.sampling.seed for r in requests}) == 10
        # the scripted env: hard gets 3 successes of 8, solved 1 of 2
        env_events = []
        for r in requests:
            win = r.rollout_index < (3 if r.task_id == "hard" else 1)
            env_events += Traj(r.task_id, r.group_id, index=r.rollout_index, reward=1.0 if win else 0.0,
                               steps=3, status="success" if win else "fail", request_id=r.request_id,
                               t=int(time.time() * 1000)).events()
        await send_all(bus, env_events)
        batches = []

        async def got_batch() -> bool:
            batches[:] = [d.event async for d in read_topic(bus, bus.topics.batches, idle_timeout_s=0.5)]
            return bool(batches)

        await until(got_batch)
    finally:
        dm.stop()
        await asyncio.wait_for(run, 15)
    (b,) = batches
    assert isinstance(b, BatchAssembled) and b.num_groups == 2 and b.num_trajectories == 10 and b.seq == 0
    assert sorted(b.task_ids) == ["hard", "solved"]
    m = BatchManifest.from_bytes(blobs.get(b.manifest_digest))
    assert m.batch_id == b.batch_id and len(m.samples) == b.num_samples == 30   # 10 rollouts x 3 steps
    assert sorted(Counter(s.reward for s in m.samples).items()) == [(0.0, 18), (1.0, 12)]
    s = next(s for s in m.samples if s.step_index == 2)
    assert [h.step_index for h in s.context.history] == [0, 1] and s.response_token_ids == [102, 103, 104]
    assert s.prompt_hash == "ph-2" and s.entropies == pytest.approx([0.3] * 3)
    # the batch is on the log, so it is in the projection and those rollouts are used
    used, last_seq = projection.used_rollouts(store)
    assert used == set(b.rollout_ids) and last_seq == 0


async def test_crash_between_manifest_and_event_neither_loses_nor_repeats(
        bus: BusConfig, store: Store, blobs: LocalBlobStore, chdb_path) -> None:
    from dart.errors import BusError

    now = int(time.time() * 1000)
    history = []
    for i in range(2):
        events, _ = group(f"t{i}", [1.0, 0.0, 0.0], t=now)
        history += events
    projection.write_events(store, history)                       # the projection the batcher reads
    cfg = config(batcher=BatcherConfig(groups_per_batch=2),
                 curation=CurationConfig(min_failed_steps=0, entropy_top_fraction=0.5))
    crashed = DataManager(cfg, bus, store=store, blobs=blobs)

    async def crash(event, **kw):
        raise BusError("broker gone (simulated crash after the manifest was written)")

    crashed.producer.send = crash
    with pytest.raises(BusError):
        await crashed.batch_once()
    orphan = {p.name for p in blobs.root.rglob("*") if p.is_file()}
    assert len(orphan) == 1                              # the manifest is written, no event
    crashed.producer.close()
    restarted = DataManager(cfg, bus, store=store, blobs=blobs)
    await restarted.scan_batches()
    event = await restarted.batch_once()
    assert event is not None and event.manifest_digest in "".join(str(p) for p in blobs.root.rglob("*"))
    assert {p.name for p in blobs.root.rglob("*") if p.is_file()} == orphan   # same content, same blob
    # a third process whose projection has not seen that BatchAssembled yet (fresh database):
    # the log scan knows the rollouts are used, so nothing is emitted twice
    fresh = Store.open_dsn(f"chdb://{chdb_path}", database=f"f{uuid.uuid4().hex[:8]}")
    fresh.migrate()
    projection.write_events(fresh, history)
    late = DataManager(cfg, bus, store=fresh, blobs=blobs)
    await late.scan_batches()
    assert await late.batch_once() is None
    on_log = [d.event async for d in read_topic(bus, bus.topics.batches, idle_timeout_s=0.5)]
    assert [e.batch_id for e in on_log] == [event.batch_id]
    for dm in (restarted, late):
        dm.producer.close()
        dm.store_thread.close()
    fresh.command(f"DROP DATABASE {fresh.database}")


async def test_experience_on_the_log_rescues_an_all_fail_group(
        bus: BusConfig, store: Store, blobs: LocalBlobStore, tmp_path) -> None:
    import json

    from dart.data.experience import load_experience

    now = int(time.time() * 1000)
    all_fail, _ = group("hard", [0.0, 0.0, 0.0], t=now, version=3)
    mixed, _ = group("easy", [1.0, 0.0], t=now + 1, version=3)
    xp_file = tmp_path / "xp.jsonl"
    xp_file.write_text(json.dumps({"task_id": "hard", "instruction": "do hard", "steps": [
        {"screenshot_digest": "a" * 64, "response_text": "Action: finished()", "response_token_ids": [9]}]}))
    xp = load_experience(xp_file, run_id="r")
    await send_all(bus, [*all_fail, *mixed, *xp])
    cfg = config(batcher=BatcherConfig(interval_s=0.2, groups_per_batch=2),
                 curation=CurationConfig(min_failed_steps=0, entropy_top_fraction=1.0))
    dm = DataManager(cfg, bus, store=store, blobs=blobs)

    async def second_round() -> bool:
        # once the first batch is in the projection, a second all-fail group of the same task
        # arrives: the pool's only success goes into it again (a replay, not a second use)
        await until(lambda: dm.store_thread.run(lambda: projection.table_counts(store, ["batches"])["batches"] == 1))
        all_fail2, _ = group("hard", [0.0, 0.0, 0.0], t=now + 2)
        mixed2, _ = group("easy", [1.0, 0.0], t=now + 3)
        await send_all(bus, [*all_fail2, *mixed2])
        await until(lambda: asyncio.sleep(0, dm.batches_emitted >= 2))
        return True

    await run_until(dm, second_round, timeout_s=60.0)
    b, b2 = [d.event async for d in read_topic(bus, bus.topics.batches, idle_timeout_s=0.5)]
    assert b2.injected == 1 and set(b.rollout_ids) & set(b2.rollout_ids) == {xp[-2].rollout_id}
    assert b.injected == 1 and b.num_trajectories == 5 and sorted(b.task_ids) == ["easy", "hard"]
    m = BatchManifest.from_bytes(blobs.get(b.manifest_digest))
    injected = [s for s in m.samples if s.origin == "experience"]
    assert len(injected) == 1 and injected[0].sft and injected[0].reward == 1.0
    assert injected[0].group_id == all_fail[0].group_id       # trained as part of the failing group
    assert injected[0].context.screenshot_digest == "a" * 64
    # the batch's staleness is its policy samples': the pool's sample has no policy version (0)
    assert injected[0].policy_version == 0 and (b.min_policy_version, b.max_policy_version) == (3, 3)


async def test_clickhouse_projects_the_log_and_malformed_records_still_reach_the_dlq(
        bus: BusConfig, store: Store, blobs, chdb_path) -> None:
    events, _ = group("a", [1.0, 0.0, 1.0], steps=3)
    events += [task("a"), heartbeat("env-1", 4)]
    await send_all(bus, events)
    producer = Producer(bus)
    try:
        garbage = await producer.send_raw(b"\xc3\x01garbage!", bus.topics.rewards, b"k", partition=0)
        cut = await producer.send_raw(encode(events[1])[:-4], bus.topics.observations, b"c", partition=0)
    finally:
        producer.close()
    dm = DataManager(config(), bus, store=store, blobs=blobs)
    await run_until(dm, lambda: projected(dm, len(events)))
    assert dm.consumer.dead_lettered == 2 and dm.projected_by_clickhouse > len(events) // 2
    letters = {(d.event.source_topic, d.event.offset): d.event async for d in read_topic(bus, bus.topics.dlq)}
    assert set(letters) == {(bus.topics.rewards, garbage.offset), (bus.topics.observations, cut.offset)}
    assert "unknown schema fingerprint" in letters[bus.topics.rewards, garbage.offset].error
    assert letters[bus.topics.observations, cut.offset].error_type == "DecodeError"
    direct = Store.open_dsn(f"chdb://{chdb_path}", database=f"d{uuid.uuid4().hex[:8]}")
    direct.migrate()
    projection.write_events(direct, [decode(encode(e)) for e in events])     # the Python path, as the consumer decoded
    tables = {t: rows for t, rows in snapshot(store).items() if t != "dead_letters"}   # it projects its own DLQ
    assert tables == {t: rows for t, rows in snapshot(direct).items() if t != "dead_letters"}
    direct.command(f"DROP DATABASE {direct.database}")


async def test_the_horizon_is_kept_only_once_the_projection_holds_the_log(bus: BusConfig, store: Store,
                                                                          blobs: LocalBlobStore) -> None:
    """Before the consumer reached the end of the log, rows with old time stamps may still come:
    every pass reads the whole run. After, the horizon moves, never past a request sent and not
    seen projected."""
    from dart.data.rule_inputs import Horizon

    dm = DataManager(config(scheduler=SchedulerConfig()), bus, store=store, blobs=blobs)
    try:
        fresh = dm._horizon()
        assert fresh is not dm.horizon and fresh.open_since_ms == 0
        dm._move_horizon(fresh, 5_000, {})
        assert dm.horizon.open_since_ms == 0
        dm.consumer.reached_end.set()
        assert dm._horizon() is dm.horizon
        dm._move_horizon(dm.horizon, 5_000, {"sent-not-projected": 3_000})
        assert dm.horizon.open_since_ms == 3_000
        dm._move_horizon(dm.horizon, 9_000, {})
        assert dm.horizon.open_since_ms == 9_000
        dm._move_horizon(Horizon(), 20_000, {})     # a pass on a whole read moves nothing
        assert dm.horizon.open_since_ms == 9_000
        # the batcher skips its pass while the scheduler saw fewer complete groups than a batch takes
        dm.batchable = dm.cfg.batcher.groups_per_batch - 1
        assert await dm.batch_when_ready() is None and dm.batch_passes_skipped == 1
        dm.batchable = dm.cfg.batcher.groups_per_batch
        assert await dm.batch_when_ready() is None and dm.batch_passes_skipped == 1   # it ran: nothing there
    finally:
        dm.producer.close()


async def test_a_restarted_data_manager_starts_from_the_horizon_the_store_kept(bus: BusConfig, store: Store,
                                                                                blobs: LocalBlobStore) -> None:
    """At 10M steps a pass over the whole run takes ~2 s: a restart's first pass reads from the
    horizon the last process saved in the store (every 30 s), on a copy it does not move until its
    own consumer has read the log to the end."""
    from dart.data.manager import HORIZON_SAVE_MS

    first = DataManager(config(scheduler=SchedulerConfig()), bus, store=store, blobs=blobs)
    second = DataManager(config(scheduler=SchedulerConfig()), bus, store=store, blobs=blobs)
    try:
        await first.restore_horizon()
        assert first._restored is None                       # a new store keeps none
        await first._save_horizon(HORIZON_SAVE_MS + 1)       # not before its own projection holds the log
        assert store.query(f"SELECT count() FROM {store.database}.manager_state")[0][0] == 0
        first.consumer.reached_end.set()
        first.horizon.open_since_ms, first.horizon.lengths, first.horizon.lengths_read_ms = 7_000, {"a": 4}, 8_000
        await first._save_horizon(HORIZON_SAVE_MS + 1)
        first.horizon.open_since_ms = 9_000
        await first._save_horizon(HORIZON_SAVE_MS + 2)       # within 30 s of the last save: not written
        await first._save_horizon(2 * HORIZON_SAVE_MS + 2)
        assert store.query(f"SELECT count() FROM {store.database}.manager_state")[0][0] == 2

        await second.restore_horizon()
        early = second._horizon()
        assert (early.open_since_ms, early.lengths, early.lengths_read_ms) == (9_000, {"a": 4}, 8_000)
        early.lengths["b"], early.open_since_ms = 1, 99_000   # a pass during the catch-up moves a copy
        again = second._horizon()
        assert (again.open_since_ms, again.lengths) == (9_000, {"a": 4}) and again is not second.horizon
        second.consumer.reached_end.set()
        assert second._horizon() is second.horizon and second.horizon.open_since_ms == 9_000
    finally:
        first.producer.close()
        second.producer.close()


async def test_a_pass_queues_what_the_slots_finish_until_the_next_pass(bus: BusConfig, store: Store,
                                                                       blobs: LocalBlobStore) -> None:
    """60 rollouts finished in the last 30 s (2 a second) and passes 1 s apart: the requests of a
    pass must last 3 cycles, so the limit is 10 slots + 2/s x 3 s = 16 (two groups of 8), where
    10 slots x factor 1.0 alone allow one group."""
    now = int(time.time() * 1000)
    finished = [e for i in range(60) for e in Traj("done", "g-done", index=i, steps=1, t=now - 20_000).events()]
    projection.write_events(store, [task("a"), task("b"), task("c"), *finished])
    sizes = {}
    for cycles in (3.0, 0.0):
        dm = DataManager(config(scheduler=SchedulerConfig(capacity=10, capacity_factor=1.0, interval_s=1.0,
                                                          refill_cycles=cycles)), bus, store=store, blobs=blobs)
        try:
            plan = await dm.schedule_once()
        finally:
            dm.producer.close()
        sizes[cycles] = (plan.limit, len(plan.requests))
    assert sizes == {3.0: (16, 16), 0.0: (10, 8)}
