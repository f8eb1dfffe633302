"""The coupled baseline's round planner on hand-made states (pure, no I/O)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest

from dart.bus import BusConfig, read_topic
from dart.data.config import BatcherConfig, CurationConfig, SchedulerConfig
from dart.data.coupled import RoundState, lagging_workers, plan_round
from dart.data.manager import DataManager
from dart.data.rule_inputs import live_rollout_workers
from dart.data.scheduler import Beat, TaskState
from dart.data.store import Store
from dart.events import BatchAssembled, RolloutRequested
from tests.data.factories import Traj, heartbeat, loaded, task, weights
from tests.data.test_manager import config, send_all, until

CUR = CurationConfig()
TASKS = [TaskState("a", "synthetic", None, 30, last_scheduled_ms=5), TaskState("b", "synthetic", 1.0, 8),
         TaskState("c", "synthetic", 0.8, 12, last_scheduled_ms=9)]


def plan(state: RoundState, tasks=TASKS, gpb: int = 2):
    return plan_round(state, tasks, groups_per_batch=gpb, curation=CUR, rng=random.Random(0))


def idle(**kw) -> RoundState:
    return RoundState(**{"in_flight": 0, "open_groups": 0, "ready_groups": 0, "capacity": 4, **kw})


def test_first_round_requests_one_batch_of_groups_least_recent_tasks_first() -> None:
    p = plan(idle())
    assert p.step == "request" and p.waiting_for is None
    groups = Counter((r.task_id, r.group_id) for r in p.requests)
    # b (never scheduled, rate 1.0 -> n_min 2) then a (rate unknown -> 8); c waits for a later round
    assert sorted((t, n) for (t, _), n in groups.items()) == [("a", 8), ("b", 2)]
    assert {r.max_steps for r in p.requests if r.task_id == "b"} == {8}
    assert sorted(r.rollout_index for r in p.requests if r.task_id == "a") == list(range(8))
    assert len({r.seed for r in p.requests}) == len(p.requests) == 10
    assert len({r.request_id for r in p.requests}) == 10


def test_fewer_tasks_than_groups_per_batch_repeat_tasks_in_separate_groups() -> None:
    p = plan(idle(), tasks=TASKS[1:2], gpb=3)
    assert Counter(r.task_id for r in p.requests) == {"b": 6}
    assert len({r.group_id for r in p.requests}) == 3


def test_nothing_new_while_any_rollout_of_the_round_is_unfinished() -> None:
    p = plan(idle(in_flight=1))
    assert p.step == "wait" and not p.requests and "1 rollouts unfinished" in p.waiting_for
    # complete groups do not start the batch while another group of the round is still open
    p = plan(idle(open_groups=1, ready_groups=1))
    assert p.step == "wait" and "1 groups open" in p.waiting_for


def test_a_finished_round_is_assembled_before_anything_else() -> None:
    p = plan(idle(ready_groups=2, last_batch_id="b-old", published_version=None))
    assert p.step == "assemble" and not p.requests


def test_next_round_waits_for_the_weights_trained_on_the_last_batch() -> None:
    p = plan(idle(last_batch_id="b-1", published_version=None, serving={"r0": 0}))
    assert p.step == "wait" and p.waiting_for == "trainer has not published weights from batch b-1"


def test_next_round_waits_until_every_live_rollout_worker_serves_the_new_version() -> None:
    p = plan(idle(last_batch_id="b-1", published_version=3, serving={"r0": 3, "r1": 2, "r2": -1}))
    assert p.step == "wait" and p.waiting_for == "rollout workers not serving version 3 yet: r1, r2"
    p = plan(idle(last_batch_id="b-1", published_version=3, serving={"r0": 3, "r1": 4}))
    assert p.step == "request" and len(p.requests) == 10
    assert lagging_workers({"x": 1, "y": 5}, 2) == ["x"]


def test_the_first_round_waits_for_rollout_workers_to_load_a_warm_start_published_before_it() -> None:
    p = plan(idle(current_version=1, serving={"r0": 0, "r1": 1}))
    assert p.step == "wait" and p.waiting_for == "rollout workers not serving version 1 yet: r0"
    # a worker that reported no version at all does not block version 0 (nothing published yet)
    assert plan(idle(serving={"r0": -1})).step == "request"


def test_a_round_whose_groups_were_all_dropped_starts_the_next_round() -> None:
    # the previous round's groups were judged (e.g. all-success) and none is ready: the last
    # batch on the log is an older one whose weights every worker already serves
    p = plan(idle(last_batch_id="b-0", published_version=1, serving={"r0": 1}))
    assert p.step == "request"


def test_no_env_capacity_or_no_tasks_waits_with_the_reason() -> None:
    assert plan(idle(capacity=0)).waiting_for.startswith("no env capacity")
    assert plan(idle(), tasks=[]).waiting_for == "no tasks registered for this split"


def test_live_rollout_workers_are_recent_running_rollout_heartbeats() -> None:
    beats = [Beat("r0", "rollout", 4, 100_000), Beat("r1", "rollout", 4, 50_000), Beat("e0", "env", 4, 100_000),
             Beat("r2", "rollout", 4, 100_000, state="stopped")]
    assert live_rollout_workers(beats, now_ms=100_000, ttl_s=30) == ["r0"]


# ---------------------------------------------------------------- through the real broker


@pytest.mark.kafka
@pytest.mark.clickhouse
async def test_coupled_rounds_through_the_broker_with_a_scripted_env_and_fake_trainer_and_rollout(
        bus: BusConfig, store: Store, blobs) -> None:
    cfg = config(
        pipeline="coupled",
        scheduler=SchedulerConfig(interval_s=0.2, capacity=4),
        batcher=BatcherConfig(groups_per_batch=2),
        curation=CurationConfig(n_default=2, n_min=2, min_failed_steps=0, entropy_top_fraction=1.0),
    )
    now = int(time.time() * 1000)
    await send_all(bus, [task("a"), task("b"), task("c"), heartbeat("rollout-0", 1, t=now, role="rollout")])
    dm = DataManager(cfg, bus, store=store, blobs=blobs, seed=3)
    run = asyncio.create_task(dm.run())

    async def requests() -> list[RolloutRequested]:
        return [d.event async for d in read_topic(bus, bus.topics.requests, idle_timeout_s=0.5)]

    async def batches() -> list[BatchAssembled]:
        return [d.event async for d in read_topic(bus, bus.topics.batches, idle_timeout_s=0.5)]

    finished: list[str] = []

    async def finish(reqs) -> None:   # the scripted env worker: rollout 0 of each group wins
        t = int(time.time() * 1000)
        trajs = [Traj(r.task_id, r.group_id, index=r.rollout_index, reward=1.0 if r.rollout_index == 0 else 0.0,
                      steps=2, status="success" if r.rollout_index == 0 else "fail", request_id=r.request_id, t=t)
                 for r in reqs]
        finished.extend(tr.rollout_id for tr in trajs)
        await send_all(bus, [e for tr in trajs for e in tr.events()])

    try:
        await until(lambda: requests_at_least(requests, 4))
        await asyncio.sleep(1.0)
        first = await requests()
        assert len(first) == 4 and len({r.group_id for r in first}) == 2       # one batch worth, in lockstep
        assert {r.scheduled_at_version for r in first} == {0}
        await finish(first[:3])
        await asyncio.sleep(1.5)
        assert len(await requests()) == 4 and await batches() == []            # one rollout still out
        await finish(first[3:])
        (batch,) = await until(batches)
        assert batch.num_groups == 2 and sorted(batch.rollout_ids) == sorted(finished)
        await asyncio.sleep(1.0)
        assert len(await requests()) == 4                                      # waits for the trainer
        await send_all(bus, [weights(1, batch.batch_id)])                      # fake trainer
        await until(lambda: asyncio.sleep(0, dm.last_round and "rollout workers" in (dm.last_round.waiting_for or "")))
        assert len(await requests()) == 4                                      # waits for rollout-0
        await send_all(bus, [loaded("rollout-0", 1)])                          # fake rollout worker
        second = await until(lambda: requests_at_least(requests, 8))
        first_ids = {r.request_id for r in first}
        # The requests topic has several partitions: read order is not production order.
        assert {r.scheduled_at_version for r in second if r.request_id not in first_ids} == {1}
        assert dm.rounds_started == 2 and dm.batches_emitted == 1
    finally:
        dm.stop()
        await asyncio.wait_for(run, 15)


async def requests_at_least(fetch, n: int):
    got = await fetch()
    return got if len(got) >= n else None


def test_a_finished_coupled_round_is_batched_with_the_groups_that_survived_curation() -> None:
    from dart.data.batcher import plan_batch
    from dart.data.curation import GroupProgress, Outcome

    def grp(gid: str, rewards: list[float]) -> GroupProgress:
        outs = tuple(Outcome(f"{gid}-{i}", "t", gid, "success" if r else "fail", r, 2, 1, 1, 0, i, 0, "online")
                     for i, r in enumerate(rewards))
        return GroupProgress(gid, "t", len(rewards), 0, outs)

    groups = [grp("g1", [1.0, 1.0]), grp("g2", [1.0, 0.0])]      # g1 all-success: dropped
    kw = dict(used=set(), pool={}, current_version=1, curation=CurationConfig(min_failed_steps=0),
              batcher=BatcherConfig(groups_per_batch=2), max_attempts=3, now_ms=0)
    assert plan_batch(groups, **kw) is None                       # decoupled: waits for a second kept group
    p = plan_batch(groups, **kw, take_all=True)
    assert p is not None and [v.group_id for v in p.verdicts] == ["g2"] and p.dropped == {"all_success": 1}
    assert plan_batch(groups[:1], **kw, take_all=True) is None    # nothing kept: no batch
