"""Scheduling rules on crafted loads, against hand-computed values (pure, no I/O)."""

from __future__ import annotations

import random
from collections import Counter

from dart.data.config import CurationConfig, SchedulerConfig
from dart.data.scheduler import (
    Beat,
    Load,
    Retry,
    TaskState,
    in_flight_limit,
    live_capacity,
    plan_requests,
    refill_time,
    trainer_lag,
)

SCHED = SchedulerConfig(capacity_factor=1.5)
CUR = CurationConfig(staleness_bound=2)


def plan(tasks, load, retries=(), scheduler=SCHED, curation=CUR, gpb=2, seed=0):
    return plan_requests(tasks, load, retries, scheduler=scheduler, curation=curation, groups_per_batch=gpb, rng=random.Random(seed))


def test_capacity_sums_slots_of_live_env_workers() -> None:
    beats = [Beat("e1", "env", 4, 100_000), Beat("e2", "env", 2, 95_000), Beat("old", "env", 8, 60_000),
             Beat("r1", "rollout", 1, 100_000), Beat("e3", "env", 3, 100_000, state="stopped")]
    assert live_capacity(beats, now_ms=100_000, ttl_s=30) == 6   # e1 + e2; old is 40 s silent
    assert in_flight_limit(6, 1.5) == 9
    assert in_flight_limit(5, 1.5) == 7


def test_trainer_lag_counts_unconsumed_batches_and_waiting_groups() -> None:
    assert trainer_lag(unconsumed_batches=1, ready_groups=5, groups_per_batch=2) == 3
    assert trainer_lag(unconsumed_batches=0, ready_groups=1, groups_per_batch=2) == 0


def test_groups_of_n_per_task_with_per_task_max_steps_and_fresh_seeds() -> None:
    tasks = [TaskState("hard", "synthetic", None, 30), TaskState("easy", "xdesktop", 1.0, 7),
             TaskState("mid", "synthetic", 0.8, 12)]
    p = plan(tasks, Load(capacity=10, in_flight=0))        # limit 15
    sizes = Counter(r.task_id for r in p.requests)
    # order easy, hard, mid (never scheduled, by id): 2 + 8 = 10; mid needs 4 -> 14 <= 15
    assert sizes == {"easy": 2, "hard": 8, "mid": 4}
    assert {r.max_steps for r in p.requests if r.task_id == "easy"} == {7}
    assert {r.backend for r in p.requests if r.task_id == "easy"} == {"xdesktop"}
    hard = [r for r in p.requests if r.task_id == "hard"]
    assert [r.rollout_index for r in hard] == list(range(8)) and {r.group_size for r in hard} == {8}
    assert len({r.group_id for r in hard}) == 1
    assert len({r.seed for r in p.requests}) == len(p.requests)          # a fresh seed per request
    assert len({r.request_id for r in p.requests}) == len(p.requests)
    assert p.paused is None and p.limit == 15


def test_in_flight_stays_within_capacity_times_factor() -> None:
    tasks = [TaskState(f"t{i}", "synthetic", None, 30) for i in range(5)]
    p = plan(tasks, Load(capacity=4, in_flight=0))             # limit 6: one group of 8 alone
    assert len(p.requests) == 8                                 # an oversize group runs alone...
    assert plan(tasks, Load(capacity=4, in_flight=1)).requests == ()  # ...but only when nothing runs
    p = plan(tasks, Load(capacity=12, in_flight=3))             # limit 18: 3 + 8 = 11, +8 = 19 > 18
    assert len(p.requests) == 8


def test_the_queue_lasts_until_the_next_pass_where_the_factor_would_run_dry() -> None:
    # 64 slots x 3 = 192; at 40 rollouts/s over a 4.2 s refill the slots finish 168: 64 + 168 = 232
    assert in_flight_limit(64, 3.0, finished_per_s=40.0, refill_s=4.2) == 232
    # at 20/s they finish 84 (64 + 84 = 148 < 192): the factor's limit stands
    assert in_flight_limit(64, 3.0, finished_per_s=20.0, refill_s=4.2) == 192
    # 10 slots x 1.5 = 15; 2.5/s x 3 s = 7.5 -> 8: 10 + 8 = 18 (rounded up: a rollout short is a slot idle)
    assert in_flight_limit(10, 1.5, finished_per_s=2.5, refill_s=3.0) == 18
    # no refill time or no rate: the factor alone, as before
    assert in_flight_limit(64, 3.0, finished_per_s=40.0) == 192
    assert in_flight_limit(64, 3.0, refill_s=4.2) == 192
    # no env capacity stays no requests, whatever finished lately
    assert in_flight_limit(0, 3.0, finished_per_s=40.0, refill_s=4.2) == 0


def test_the_refill_time_is_cycles_of_the_median_pass_gap_never_under_the_interval() -> None:
    assert refill_time([], interval_s=1.5, refill_cycles=2.0) == 3.0                  # nothing measured yet
    assert refill_time([2.1, 1.9, 2.0], interval_s=1.5, refill_cycles=2.0) == 4.0     # median 2.0
    assert refill_time([2.0, 30.0, 2.2], interval_s=1.5, refill_cycles=2.0) == 4.4    # one stall: median 2.2
    assert refill_time([1.0, 1.2], interval_s=1.5, refill_cycles=2.0) == 3.0          # faster than the interval
    assert refill_time([2.0], interval_s=1.5, refill_cycles=0.0) == 0.0               # off: the factor alone


def test_plans_to_the_refill_limit_when_the_slots_finish_fast() -> None:
    tasks = [TaskState(f"t{i}", "synthetic", None, 30) for i in range(40)]
    busy = Load(capacity=64, in_flight=150, finished_per_s=40.0)
    slow = plan(tasks, busy, scheduler=SchedulerConfig(capacity_factor=3.0))     # limit 192: 150 + 5 x 8 = 190
    assert slow.limit == 192 and len(slow.requests) == 40
    # refill 4.2 s: limit 232, 150 + 10 x 8 = 230
    fast = plan_requests(tasks, busy, scheduler=SchedulerConfig(capacity_factor=3.0), curation=CUR,
                         groups_per_batch=2, rng=random.Random(0), refill_s=4.2)
    assert fast.limit == 232 and len(fast.requests) == 80


def test_tasks_with_an_open_group_wait_and_least_recent_goes_first() -> None:
    tasks = [TaskState("a", "s", 1.0, 30, open_groups=1), TaskState("b", "s", 1.0, 30, last_scheduled_ms=50),
             TaskState("c", "s", 1.0, 30, last_scheduled_ms=10)]
    p = plan(tasks, Load(capacity=2, in_flight=0))              # limit 3: one group of 2
    assert {r.task_id for r in p.requests} == {"c"}


def test_pauses_when_the_trainer_lags_beyond_the_staleness_budget() -> None:
    tasks = [TaskState("a", "s", None, 30)]
    retry = Retry("a", "g", 3, 8, 30, 1, "s")
    p = plan(tasks, Load(capacity=10, in_flight=0, unconsumed_batches=1, ready_groups=2), [retry])
    # lag = 1 + 2 // 2 = 2 >= staleness_bound 2: no new group, the retry still goes
    assert p.paused and "lags 2" in p.paused
    assert [(r.group_id, r.rollout_index, r.attempt) for r in p.requests] == [("g", 3, 1)]
    assert plan(tasks, Load(capacity=10, in_flight=0, unconsumed_batches=1, ready_groups=1)).paused is None


def test_no_capacity_means_no_requests() -> None:
    p = plan([TaskState("a", "s", None, 30)], Load(capacity=0, in_flight=0))
    assert p.requests == () and p.paused and "capacity" in p.paused


def test_several_groups_per_task_when_allowed() -> None:
    p = plan([TaskState("a", "s", 1.0, 30)], Load(capacity=10, in_flight=0),
             scheduler=SchedulerConfig(groups_per_task=3))
    assert len({r.group_id for r in p.requests}) == 3 and len(p.requests) == 6
