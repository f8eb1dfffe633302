"""The coupled (synchronous) baseline, planned from projection state (pure: state in, decision out).

DART compares its decoupled loop against the usual batch-wise one; ``DataConfig.pipeline =
"coupled"`` runs that baseline with the same env workers, rollout workers and trainer. One
round:

1. request one batch worth of groups at once (``groups_per_batch`` tasks, ``n`` rollouts each,
   ``n`` from the same curation rule as the decoupled scheduler);
2. wait until every rollout of the round finished (nothing new is requested meanwhile);
3. assemble the batch from the round's kept groups (however many survived curation);
4. wait until the trainer published the weights made from that batch (``WeightsPublished``
   with its ``batch_id``) and every live rollout worker serves them (or a newer version);
5. next round.

Everything here is derived from the log (via the projection), so a restarted data manager
picks the round up where it was: it needs no memory of its own beyond requests it sent that
the projection has not shown yet (counted in ``RoundState.in_flight``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dart.data.config import CurationConfig
from dart.data.curation import rollouts_for
from dart.data.scheduler import PlannedRequest, TaskState, request_seed, request_uuid

Step = Literal["request", "assemble", "wait"]


@dataclass(frozen=True, slots=True)
class RoundState:
    """What the coupled planner looks at (one snapshot of the projection)."""

    in_flight: int
    """Rollouts requested with no trajectory yet (projected requests + ones sent and not projected)."""
    open_groups: int
    """Groups requested and not complete yet."""
    ready_groups: int
    """Complete groups that survive curation and are in no batch yet."""
    capacity: int
    """Env slots (0: no env worker is alive, so nothing is requested)."""
    last_batch_id: str | None = None
    """The newest batch on the log (None: no batch yet, i.e. the first round)."""
    published_version: int | None = None
    """Policy version the trainer published from ``last_batch_id`` (None: not yet)."""
    serving: Mapping[str, int] = field(default_factory=dict)
    """Live rollout worker -> the newest policy version it reported serving."""
    current_version: int = 0
    """Newest policy version on the log (any WeightsPublished, e.g. a warm start's too)."""


@dataclass(frozen=True, slots=True)
class RoundPlan:
    step: Step
    """request: start a round; assemble: the round is done, batch it; wait: see ``waiting_for``."""
    requests: tuple[PlannedRequest, ...] = ()
    waiting_for: str | None = None
    """Why nothing moves now (None unless ``step == 'wait'``)."""


def lagging_workers(serving: Mapping[str, int], version: int) -> list[str]:
    """Rollout workers that do not serve ``version`` (or newer) yet, sorted."""
    return sorted(w for w, v in serving.items() if v < version)


def round_requests(tasks: Sequence[TaskState], *, groups: int, curation: CurationConfig,
                   rng: random.Random) -> tuple[PlannedRequest, ...]:
    """``groups`` groups, least recently scheduled task first; tasks repeat when there are fewer."""
    order = sorted(tasks, key=lambda t: (t.last_scheduled_ms, t.task_id))
    out: list[PlannedRequest] = []
    for g in range(groups):
        t = order[g % len(order)]
        n = rollouts_for(t.success_rate, n_min=curation.n_min, n_default=curation.n_default, threshold=curation.rate_threshold)
        group_id = request_uuid(rng)
        out += [PlannedRequest(t.task_id, group_id, i, n, t.max_steps, 0, request_seed(rng), t.backend,
                               request_uuid(rng)) for i in range(n)]
    return tuple(out)


def plan_round(state: RoundState, tasks: Sequence[TaskState], *, groups_per_batch: int,
               curation: CurationConfig, rng: random.Random) -> RoundPlan:
    """The next move of the coupled loop (see the module docstring for the round)."""
    if state.in_flight > 0 or state.open_groups > 0:
        return RoundPlan("wait", waiting_for=f"round in flight: {state.open_groups} groups open, "
                                             f"{state.in_flight} rollouts unfinished")
    if state.ready_groups > 0:
        return RoundPlan("assemble")
    if state.last_batch_id is not None and state.published_version is None:
        return RoundPlan("wait", waiting_for=f"trainer has not published weights from batch {state.last_batch_id}")
    # Every round runs on the newest weights: the ones trained on the last batch (or a newer
    # publication, such as a warm start before the first round).
    target = max(state.current_version, state.published_version or 0)
    behind = lagging_workers(state.serving, target) if target > 0 else []
    if behind:
        return RoundPlan("wait", waiting_for=f"rollout workers not serving version {target} yet: {', '.join(behind)}")
    if state.capacity <= 0:
        return RoundPlan("wait", waiting_for="no env capacity (no live env worker heartbeats and no "
                                             "scheduler.capacity)")
    if not tasks:
        return RoundPlan("wait", waiting_for="no tasks registered for this split")
    return RoundPlan("request", round_requests(tasks, groups=groups_per_batch, curation=curation, rng=rng))
