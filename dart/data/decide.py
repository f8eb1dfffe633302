"""Snapshots for the scheduler and the batcher: projection queries + the pure rules.

Blocking (they query the store): the manager runs them on the store's thread. Everything
that decides is in ``curation``, ``scheduler`` and ``batcher``; this module only gathers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from dart.data import projection as q
from dart.data.config import DataConfig
from dart.data.coupled import RoundState
from dart.data.curation import (
    GroupProgress,
    is_complete,
    judge_group,
    max_steps_for,
    retries_due,
    success_rates,
)
from dart.data.scheduler import Beat, Load, Retry, TaskState, live_capacity
from dart.data.store import Store


@dataclass(frozen=True, slots=True)
class ScheduleInputs:
    tasks: list[TaskState]
    load: Load
    retries: list[Retry]


def schedule_inputs(store: Store, cfg: DataConfig, *, now_ms: int, pending_requests: set[str]) -> tuple[
        ScheduleInputs, set[str]]:
    """What the scheduler needs now, and which of ``pending_requests`` the projection already holds."""
    sched, cur = cfg.scheduler, cfg.curation
    current = q.current_version(store)
    rates = success_rates(
        q.recent_outcomes(store, mode=sched.mode, oldest_version=current - cur.window_versions, window=cur.window),
        current_version=current, cfg=cur,
    )
    lengths = q.success_lengths(store, threshold=cur.success_threshold)
    groups, requested, templates = q.open_groups(store, mode=sched.mode)
    timeout_s = cfg.batcher.group_timeout_s
    open_per_task: Counter[str] = Counter()
    ready = 0
    retries: list[Retry] = []
    for g in groups:
        if is_complete(g, max_attempts=sched.max_attempts, now_ms=now_ms, timeout_s=timeout_s):
            verdict = judge_group(g.group_id, g.task_id, g.outcomes, current_version=current, cfg=cur,
                                  min_group_size=cfg.batcher.min_group_size)
            ready += verdict.is_kept
            continue
        open_per_task[g.task_id] += 1
        t = templates[g.group_id]
        due = retries_due(g, max_attempts=sched.max_attempts, requested=requested[g.group_id])
        for index, attempt in due if sched.requeue_infra_errors else ():
            retries.append(Retry(g.task_id, g.group_id, index, g.group_size, t["max_steps"], attempt, t["backend"]))
    last = q.last_scheduled(store, mode=sched.mode)
    tasks = [
        TaskState(task_id, backend or cfg.backend, rates.get(task_id), max_steps_for(lengths.get(task_id, []), cur),
                  open_per_task[task_id], last.get(task_id, 0))
        for task_id, backend in q.train_tasks(store, split=sched.split)
    ]
    known = q.known_requests(store, sorted(pending_requests))
    capacity = sched.capacity if sched.capacity is not None else live_capacity(
        q.heartbeats(store), now_ms=now_ms, ttl_s=sched.heartbeat_ttl_s)
    in_flight = q.in_flight(store, mode=sched.mode, since_ms=now_ms - int(sched.request_timeout_s * 1000))
    load = Load(capacity=capacity, in_flight=in_flight + len(pending_requests - known),
                unconsumed_batches=q.unconsumed_batches(store), ready_groups=ready, current_version=current)
    return ScheduleInputs(tasks, load, retries), known


@dataclass(frozen=True, slots=True)
class BatchInputs:
    groups: list[GroupProgress]
    used: set[str]
    last_seq: int
    pool: dict
    current_version: int


def batch_inputs(store: Store, cfg: DataConfig) -> BatchInputs:
    groups, _, _ = q.open_groups(store, mode=cfg.scheduler.mode)
    used, last_seq = q.used_rollouts(store)
    pool = q.experience_pool(store, threshold=cfg.curation.success_threshold) if cfg.curation.inject_experience else {}
    return BatchInputs(groups, used, last_seq, pool, q.current_version(store))


def live_rollout_workers(beats: list[Beat], *, now_ms: int, ttl_s: float) -> list[str]:
    """Rollout workers heard from within ``ttl_s`` and not stopped (pure)."""
    return sorted(b.worker_id for b in beats if b.role == "rollout" and b.state not in ("stopped", "stopping")
                  and now_ms - b.time_ms <= ttl_s * 1000)


def round_inputs(store: Store, cfg: DataConfig, *, now_ms: int, pending_requests: set[str]) -> tuple[
        RoundState, list[TaskState], set[str]]:
    """What the coupled planner needs now (``dart.data.coupled``), the tasks, and the known requests."""
    inputs, known = schedule_inputs(store, cfg, now_ms=now_ms, pending_requests=pending_requests)
    last = q.last_batch(store)
    workers = live_rollout_workers(q.heartbeats(store), now_ms=now_ms, ttl_s=cfg.scheduler.heartbeat_ttl_s)
    state = RoundState(
        in_flight=inputs.load.in_flight, open_groups=sum(t.open_groups for t in inputs.tasks),
        ready_groups=inputs.load.ready_groups, capacity=inputs.load.capacity, last_batch_id=last,
        published_version=q.weights_from_batch(store, last) if last is not None else None,
        serving=q.serving_versions(store, workers), current_version=inputs.load.current_version,
    )
    return state, inputs.tasks, known
