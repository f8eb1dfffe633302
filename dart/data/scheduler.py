"""Which rollouts to request next (pure: the shell feeds it projection statistics).

Keeps env slots busy but bounded: in-flight rollouts <= capacity * factor, or what the slots
finish before the next pass's requests arrive where that is more. New work comes in
groups of ``n`` per task (the curation rule), with the task's step cap and a fresh sampling
seed per request. When the trainer lags (batches assembled but not trained, plus complete
groups waiting for a batch) by the staleness budget or more, new groups pause: anything
collected now would be too old by the time it is trained on.
"""

from __future__ import annotations

import math
import random
import statistics
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from dart.data.config import CurationConfig, SchedulerConfig
from dart.data.curation import rollouts_for


@dataclass(frozen=True, slots=True)
class Beat:
    """The latest heartbeat of one worker."""

    worker_id: str
    role: str
    slots: int
    time_ms: int
    state: str = "running"


def live_capacity(beats: Sequence[Beat], *, now_ms: int, ttl_s: float) -> int:
    """Sum of env slots of env workers heard from within ``ttl_s`` and not stopped."""
    return sum(
        b.slots for b in beats
        if b.role == "env" and b.state not in ("stopped", "stopping") and now_ms - b.time_ms <= ttl_s * 1000
    )


def in_flight_limit(capacity: int, factor: float, *, finished_per_s: float = 0.0, refill_s: float = 0.0) -> int:
    """Most rollouts requested and not finished at once: floor(capacity * factor), or more where
    the slots finish faster than that queue lasts: capacity + ceil(finished_per_s * refill_s).

    ``refill_s``: how long the requests queued now must last, i.e. until the next scheduling
    pass's requests reach the env workers (0: the factor alone). A finished trajectory counts as
    in flight until the projection holds it, so the queue the factor leaves drains by the
    rollouts finished in one pass cycle plus the projection's lag: a fixed factor runs dry
    before each pass wherever the slots finish faster than it lasts (short synthetic episodes)."""
    if capacity <= 0:
        return 0
    need = capacity + math.ceil(max(0.0, finished_per_s) * max(0.0, refill_s))
    return max(math.floor(capacity * factor), need)


def refill_time(cycles_s: Sequence[float], *, interval_s: float, refill_cycles: float) -> float:
    """Seconds the requests of a pass must last (``in_flight_limit``'s ``refill_s``):
    ``refill_cycles`` scheduler cycles, a cycle being the median of the latest measured times
    between two passes (slow passes make it longer than ``interval_s``; one stalled pass does
    not), and never shorter than ``interval_s``."""
    cycle_s = statistics.median(cycles_s) if cycles_s else interval_s
    return refill_cycles * max(interval_s, cycle_s)


def trainer_lag(*, unconsumed_batches: int, ready_groups: int, groups_per_batch: int) -> int:
    """Policy updates between now and the training of a sample collected now (one batch = one update)."""
    return unconsumed_batches + ready_groups // groups_per_batch


@dataclass(frozen=True, slots=True)
class TaskState:
    task_id: str
    backend: str
    success_rate: float | None
    max_steps: int
    open_groups: int = 0
    """Groups requested and not complete yet."""
    last_scheduled_ms: int = 0
    """When a group of this task was last requested (0: never); the least recent goes first."""


@dataclass(frozen=True, slots=True)
class Load:
    capacity: int
    """Env slots (heartbeats or config)."""
    in_flight: int
    """Rollouts requested with no trajectory yet."""
    unconsumed_batches: int = 0
    ready_groups: int = 0
    current_version: int = 0
    finished_per_s: float = 0.0
    """Rollouts finished per second lately (the rate at which the slots empty the queue)."""


@dataclass(frozen=True, slots=True)
class Retry:
    """An infra_error rollout to request again."""

    task_id: str
    group_id: str
    rollout_index: int
    group_size: int
    max_steps: int
    attempt: int
    backend: str


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    task_id: str
    group_id: str
    rollout_index: int
    group_size: int
    max_steps: int
    attempt: int
    seed: int
    backend: str
    request_id: str


@dataclass(frozen=True, slots=True)
class Plan:
    requests: tuple[PlannedRequest, ...]
    paused: str | None
    """Why no new group was started (None: not paused)."""
    limit: int
    lag: int


def request_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def request_seed(rng: random.Random) -> int:
    # Fresh per request (never one fixed seed); kept within int32 for every engine.
    return rng.randrange(1, 2**31 - 1)


def plan_requests(
    tasks: Sequence[TaskState],
    load: Load,
    retries: Sequence[Retry] = (),
    *,
    scheduler: SchedulerConfig,
    curation: CurationConfig,
    groups_per_batch: int,
    rng: random.Random,
    refill_s: float = 0.0,
) -> Plan:
    """Retries first, then new groups (least recently scheduled task first) while they fit.

    ``refill_s``: how long until the next pass's requests reach the slots (see
    :func:`in_flight_limit`; 0: the capacity factor alone bounds the queue)."""
    limit = in_flight_limit(load.capacity, scheduler.capacity_factor, finished_per_s=load.finished_per_s,
                            refill_s=refill_s)
    lag = trainer_lag(unconsumed_batches=load.unconsumed_batches, ready_groups=load.ready_groups,
                      groups_per_batch=groups_per_batch)
    in_flight = load.in_flight
    out: list[PlannedRequest] = []
    for r in retries:
        if in_flight >= limit:
            break
        out.append(PlannedRequest(r.task_id, r.group_id, r.rollout_index, r.group_size, r.max_steps,
                                  r.attempt, request_seed(rng), r.backend, request_uuid(rng)))
        in_flight += 1
    paused = None
    if limit <= 0:
        paused = "no env capacity (no live env worker heartbeats and no scheduler.capacity)"
    elif lag >= curation.staleness_bound and lag > 0:
        paused = f"trainer lags {lag} updates >= staleness_bound {curation.staleness_bound}"
    if paused:
        return Plan(tuple(out), paused, limit, lag)
    order = sorted(tasks, key=lambda t: (t.open_groups, t.last_scheduled_ms, t.task_id))
    opened = {t.task_id: t.open_groups for t in tasks}
    for _ in range(scheduler.groups_per_task):
        for t in order:
            if opened[t.task_id] >= scheduler.groups_per_task:
                continue
            n = rollouts_for(t.success_rate, n_min=curation.n_min, n_default=curation.n_default, threshold=curation.rate_threshold)
            # A group larger than the whole limit still runs, alone, when nothing else is in flight.
            if in_flight + n > limit and in_flight > 0:
                continue
            group_id = request_uuid(rng)
            for i in range(n):
                out.append(PlannedRequest(t.task_id, group_id, i, n, t.max_steps, 0, request_seed(rng), t.backend,
                                          request_uuid(rng)))
            in_flight += n
            opened[t.task_id] += 1
    if not out and not tasks:
        paused = "no tasks registered for this split"
    return Plan(tuple(out), paused, limit, lag)
