"""Snapshots for the scheduler and the batcher: projection queries + the pure rules.

Blocking (they query the store): the manager runs them on the store's thread. Everything
that decides is in ``curation``, ``scheduler`` and ``batcher``; this module only gathers.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

from dart.data import projection
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

RATE_WINDOW_MS = 30_000
"""The rate at which the slots finish rollouts (``Load.finished_per_s``) is taken over this window:
long enough to smooth the bursts of a group's rollouts ending together, short enough to follow a
policy whose episodes get shorter."""
LATE_MS = 300_000
"""How late (by its own time stamp) a trajectory or reward may reach the projection and still
count in ``Horizon.lengths``: rows are read again from this far back on every pass."""


HORIZON_KEY = "horizon"


@dataclass(slots=True)
class Horizon:
    """What the data manager carries from one pass to the next, so that a pass reads what is new
    or still open instead of the whole run (at 10M steps the whole run is 500k rollouts).

    A fresh Horizon reads everything (the first pass after a start); the data manager keeps one.
    """

    open_since_ms: int = 0
    """Every group requested before this time is batched or closed for good: complete and not
    kept (all success, too small, stale; all fail where no experience may be injected), or timed
    out. Only requests since are read."""
    lengths: dict[str, int] = field(default_factory=dict)
    """Longest successful trajectory per task seen so far."""
    lengths_read_ms: int | None = None
    """When ``lengths`` was last brought up to date (None: never: read the whole run)."""

    def copy(self) -> Horizon:
        return Horizon(self.open_since_ms, dict(self.lengths), self.lengths_read_ms)

    def save(self, store: Store, *, now_ms: int) -> None:
        """Keep it in the store (``manager_state``), so a restarted data manager starts from it.

        Any horizon once valid stays valid for the same store: the projection it was computed
        from is durable and only grows, and an older one only makes a pass read more."""
        store.insert_rows("manager_state", [{"key": HORIZON_KEY, "saved_ms": now_ms,
                                             "state": json.dumps(asdict(self), sort_keys=True)}])

    @staticmethod
    def load(store: Store) -> Horizon | None:
        """The newest saved horizon of this store, or None (a new or rebuilt store)."""
        rows = store.query(f"SELECT argMax(state, saved_ms) FROM {store.database}.manager_state "
                           "WHERE key = {k:String} HAVING count() > 0", {"k": HORIZON_KEY})
        if not rows:
            return None
        body = json.loads(rows[0][0])
        return Horizon(open_since_ms=int(body["open_since_ms"]),
                       lengths={str(k): int(v) for k, v in body["lengths"].items()},
                       lengths_read_ms=None if body["lengths_read_ms"] is None else int(body["lengths_read_ms"]))

    def success_lengths(self, store: Store, *, threshold: float, now_ms: int,
                        online_only: bool = False) -> dict[str, list[int]]:
        since = None if self.lengths_read_ms is None else self.lengths_read_ms - LATE_MS
        for task, (n,) in projection.success_lengths(store, threshold=threshold, since_ms=since,
                                            online_only=online_only).items():
            self.lengths[task] = max(n, self.lengths.get(task, 0))
        self.lengths_read_ms = now_ms
        return {task: [n] for task, n in self.lengths.items()}


@dataclass(slots=True)
class SlowStats:
    """Per-task numbers that move slowly, kept between passes and read again only every
    ``every_ms`` (or when the policy version moved): the success rates over the recent window,
    the longest successes (``Horizon.lengths``) and the experience pool. Late in a run they are
    most of a scheduler or batcher pass (`benchmarks/pass_cost.py` times a pass), and passes run
    far more often than they move: a rate a few seconds old picks the same group sizes and step
    caps.

    ``every_ms=0`` reads them on every pass (a fresh ``SlowStats`` always reads)."""

    every_ms: int = 0
    rates: dict[str, float] | None = None
    rates_ms: int = 0
    rates_version: int = -1
    pool: dict | None = None
    pool_ms: int = 0

    def rates_due(self, now_ms: int, version: int) -> bool:
        return (self.rates is None or version != self.rates_version
                or now_ms - self.rates_ms >= self.every_ms)

    def pool_due(self, now_ms: int) -> bool:
        return self.pool is None or now_ms - self.pool_ms >= self.every_ms


@dataclass(frozen=True, slots=True)
class ScheduleInputs:
    tasks: list[TaskState]
    load: Load
    retries: list[Retry]
    open_since_ms: int
    """The oldest request of a group still open or kept: the next pass's ``Horizon.open_since_ms``."""
    batchable: int = 0
    """Complete groups a batch could take (kept, or all-fail where experience may be injected):
    with fewer than ``groups_per_batch`` the batcher has nothing to do."""


def schedule_inputs(store: Store, cfg: DataConfig, *, now_ms: int, pending_requests: set[str],
                    horizon: Horizon | None = None, slow: SlowStats | None = None) -> tuple[ScheduleInputs, set[str]]:
    """What the scheduler needs now, and which of ``pending_requests`` the projection already holds.

    ``horizon``: what earlier passes learned (None: read the whole run). Updated in place, but for
    ``open_since_ms``, which the caller moves (it knows the requests sent and not projected yet).
    ``slow``: success rates and lengths kept from an earlier pass (None: read them now).
    """
    scheduler, curation = cfg.scheduler, cfg.curation
    horizon = horizon if horizon is not None else Horizon()
    slow = slow if slow is not None else SlowStats()
    current = projection.current_version(store)
    if slow.rates_due(now_ms, current) or horizon.lengths_read_ms is None:
        slow.rates = success_rates(
            projection.recent_outcomes(store, mode=scheduler.mode, oldest_version=current - curation.window_versions, window=curation.window),
            current_version=current, cfg=curation,
        )
        horizon.success_lengths(store, threshold=curation.success_threshold, now_ms=now_ms,
                                online_only=curation.lengths_from == "online")
        slow.rates_ms, slow.rates_version = now_ms, current
    rates = slow.rates
    lengths = {task: [n] for task, n in horizon.lengths.items()}
    since = horizon.open_since_ms
    groups, requested, templates = projection.open_groups(store, mode=scheduler.mode, since_ms=since)
    timeout_s = cfg.batcher.group_timeout_s
    open_per_task: Counter[str] = Counter()
    ready = batchable = 0
    retries: list[Retry] = []
    still_open = [now_ms]     # opened_ms of groups a later pass must see again
    for g in groups:
        if is_complete(g, max_attempts=scheduler.max_attempts, now_ms=now_ms, timeout_s=timeout_s):
            verdict = judge_group(g.group_id, g.task_id, g.outcomes, current_version=current, cfg=curation,
                                  min_group_size=cfg.batcher.min_group_size)
            ready += verdict.is_kept
            # The batcher may also keep an all-fail group, with an experience-pool success in it
            # (this pass does not read the pool): such a group stays in view until batched or stale.
            may_keep = verdict.is_kept or (verdict.reason == "all_fail" and curation.inject_experience)
            batchable += may_keep
            if may_keep:
                still_open.append(g.opened_ms)
            continue
        still_open.append(g.opened_ms)
        open_per_task[g.task_id] += 1
        t = templates[g.group_id]
        due = retries_due(g, max_attempts=scheduler.max_attempts, requested=requested[g.group_id])
        for index, attempt in due if scheduler.requeue_infra_errors else ():
            retries.append(Retry(g.task_id, g.group_id, index, g.group_size, t["max_steps"], attempt, t["backend"]))
    last = projection.last_scheduled(store, mode=scheduler.mode)
    tasks = [
        TaskState(task_id, backend or cfg.backend, rates.get(task_id), max_steps_for(lengths.get(task_id, []), curation),
                  open_per_task[task_id], last.get(task_id, 0))
        for task_id, backend in projection.train_tasks(store, split=scheduler.split)
    ]
    known = projection.known_requests(store, sorted(pending_requests))
    capacity = scheduler.capacity if scheduler.capacity is not None else live_capacity(
        projection.heartbeats(store), now_ms=now_ms, ttl_s=scheduler.heartbeat_ttl_s)
    # A request in flight belongs to a group that is not complete: requested since the horizon.
    in_flight = projection.in_flight(store, mode=scheduler.mode, since_ms=max(since, now_ms - int(scheduler.request_timeout_s * 1000)))
    finished = projection.finished_since(store, mode=scheduler.mode, since_ms=now_ms - RATE_WINDOW_MS)
    load = Load(capacity=capacity, in_flight=in_flight + len(pending_requests - known),
                unconsumed_batches=projection.unconsumed_batches(store), ready_groups=ready, current_version=current,
                finished_per_s=finished / (RATE_WINDOW_MS / 1000))
    return ScheduleInputs(tasks, load, retries, min(still_open), batchable), known


@dataclass(frozen=True, slots=True)
class BatchInputs:
    groups: list[GroupProgress]
    used: set[str]
    last_seq: int
    pool: dict
    current_version: int


def batch_inputs(store: Store, cfg: DataConfig, *, since_ms: int = 0, now_ms: int = 0,
                 slow: SlowStats | None = None) -> BatchInputs:
    """What the batcher needs now; ``since_ms``: ``Horizon.open_since_ms`` (0: the whole run);
    ``slow``: the experience pool kept from an earlier pass (None: read it now)."""
    groups, _, _ = projection.open_groups(store, mode=cfg.scheduler.mode, since_ms=since_ms)
    used, last_seq = projection.used_rollouts(store, since_ms)
    slow = slow if slow is not None else SlowStats()
    if not cfg.curation.inject_experience:
        pool: dict = {}
    elif slow.pool_due(now_ms):
        pool = slow.pool = projection.experience_pool(store, threshold=cfg.curation.success_threshold)
        slow.pool_ms = now_ms
    else:
        pool = slow.pool or {}
    return BatchInputs(groups, used, last_seq, pool, projection.current_version(store))


def live_rollout_workers(beats: list[Beat], *, now_ms: int, ttl_s: float) -> list[str]:
    """Rollout workers heard from within ``ttl_s`` and not stopped (pure)."""
    return sorted(b.worker_id for b in beats if b.role == "rollout" and b.state not in ("stopped", "stopping")
                  and now_ms - b.time_ms <= ttl_s * 1000)


def round_inputs(store: Store, cfg: DataConfig, *, now_ms: int, pending_requests: set[str],
                 horizon: Horizon | None = None,
                 slow: SlowStats | None = None) -> tuple[RoundState, list[TaskState], set[str], int]:
    """What the coupled planner needs now (``dart.data.coupled``), the tasks, the known requests
    and the next ``Horizon.open_since_ms``."""
    inputs, known = schedule_inputs(store, cfg, now_ms=now_ms, pending_requests=pending_requests, horizon=horizon,
                                    slow=slow)
    last = projection.last_batch(store)
    workers = live_rollout_workers(projection.heartbeats(store), now_ms=now_ms, ttl_s=cfg.scheduler.heartbeat_ttl_s)
    state = RoundState(
        in_flight=inputs.load.in_flight, open_groups=sum(t.open_groups for t in inputs.tasks),
        ready_groups=inputs.load.ready_groups, capacity=inputs.load.capacity, last_batch_id=last,
        published_version=projection.weights_from_batch(store, last) if last is not None else None,
        serving=projection.serving_versions(store, workers), current_version=inputs.load.current_version,
    )
    return state, inputs.tasks, known, inputs.open_since_ms
