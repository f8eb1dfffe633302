"""Complete groups -> a training batch manifest (pure; the shell does the I/O).

Which rollouts were already trained on is derived from the log (the ``batches`` table built
from BatchAssembled events), never from local state, and a batch's id is a hash of its
content: a crash between writing the manifest and emitting the event leads to the same batch
(or to a batch of other groups) after a restart, never to a lost or repeated sample.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from dart.data.config import BatcherConfig, CurationConfig
from dart.data.curation import (
    GroupProgress,
    GroupVerdict,
    Outcome,
    entropy_cutoff,
    is_complete,
    judge_group,
    select_high_entropy,
)
from dart.events.manifest import BatchManifest, Sample


@dataclass(frozen=True, slots=True)
class BatchPlan:
    verdicts: tuple[GroupVerdict, ...]
    """Kept groups, oldest first."""
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Groups judged and left out, by reason (all_success, all_fail, too_small)."""

    @property
    def rollout_ids(self) -> list[str]:
        return sorted({o.rollout_id for v in self.verdicts for o in v.kept})

    @property
    def outcomes(self) -> list[tuple[GroupVerdict, Outcome]]:
        return [(v, o) for v in self.verdicts for o in v.kept]


def batch_id_for(run_id: str, rollout_ids: Iterable[str]) -> str:
    """Deterministic id from the batch's content (run + the sorted rollout ids)."""
    h = hashlib.sha256(run_id.encode())
    for rid in sorted(rollout_ids):
        h.update(b"\n" + rid.encode())
    return "b-" + h.hexdigest()[:32]


def plan_batch(
    groups: Sequence[GroupProgress],
    *,
    used: set[str],
    pool: Mapping[str, Sequence[Outcome]],
    current_version: int,
    curation: CurationConfig,
    batcher: BatcherConfig,
    max_attempts: int,
    now_ms: int,
    take_all: bool = False,
) -> BatchPlan | None:
    """The next batch: the oldest complete, unused groups that survive curation; None until enough.

    ``take_all`` (the coupled pipeline, whose round is over): whatever kept groups there are,
    up to ``groups_per_batch``, instead of waiting for ``groups_per_batch`` of them.
    """
    ready = (g for g in sorted(groups, key=lambda g: (g.opened_ms, g.group_id))
             if not any(o.rollout_id in used for o in g.outcomes)
             and is_complete(g, max_attempts=max_attempts, now_ms=now_ms, timeout_s=batcher.group_timeout_s))
    plan = judge_groups(ready, pool=pool, current_version=current_version, curation=curation, batcher=batcher,
                        limit=batcher.groups_per_batch)
    return plan if len(plan.verdicts) == batcher.groups_per_batch or (take_all and plan.verdicts) else None


def judge_groups(
    groups: Iterable[GroupProgress],
    *,
    pool: Mapping[str, Sequence[Outcome]],
    current_version: int,
    curation: CurationConfig,
    batcher: BatcherConfig,
    limit: int | None = None,
) -> BatchPlan:
    """The groups, in the order given, judged by curation (``pool``: experience by task id, to inject
    into an all-fail group): the kept ones, up to ``limit``, and the dropped ones counted by reason.
    The one judging of batch assembly: the data manager's (:func:`plan_batch`) and the in-process
    recipe's (`dart.recipe.learn.batch_of`)."""
    kept: list[GroupVerdict] = []
    dropped: Counter[str] = Counter()
    for g in groups:
        verdict = judge_group(g.group_id, g.task_id, g.outcomes, pool=pool.get(g.task_id, ()),
                              current_version=current_version, cfg=curation, min_group_size=batcher.min_group_size)
        if verdict.is_kept:
            kept.append(verdict)
            if len(kept) == limit:
                break
        else:
            dropped[verdict.reason] += 1
    return BatchPlan(tuple(kept), dict(dropped))


def build_manifest(
    plan: BatchPlan,
    steps: Mapping[str, Sequence[Sample]],
    *,
    run_id: str,
    seq: int,
    curation: CurationConfig,
) -> BatchManifest:
    """One Sample per selected step of every kept trajectory; experience steps are all kept.

    ``steps`` maps rollout_id -> its recorded steps (a step missing its observation or its
    action is simply absent); each is taken as it is, with what curation decided set on it.
    """
    online = {
        (o.rollout_id, s.step_index): s.mean_entropy
        for v, o in plan.outcomes if o.origin == "online"
        for s in steps.get(o.rollout_id, ())
    }
    selected = select_high_entropy(online, curation.entropy_top_fraction) if online else set()
    samples: list[Sample] = []
    for v, o in plan.outcomes:
        experience = o.origin != "online"
        for s in steps.get(o.rollout_id, ()):
            if not experience and (o.rollout_id, s.step_index) not in selected:
                continue
            samples.append(replace(
                s, rollout_id=o.rollout_id, task_id=v.task_id,
                # An injected trajectory joins the group it was injected into.
                group_id=v.group_id, reward=float(o.reward or 0.0), origin=o.origin,
                sft=experience and curation.experience_sft,
            ))
    versions = [s.policy_version for s in samples] or [0]
    rewards = [float(o.reward or 0.0) for _, o in plan.outcomes]
    stats = {
        "groups": float(len(plan.verdicts)),
        "trajectories": float(len(plan.outcomes)),
        "samples": float(len(samples)),
        "steps_online": float(len(online)),
        "steps_selected": float(len(selected)),
        "entropy_cutoff": entropy_cutoff(online, selected),
        "injected": float(sum(v.injected is not None for v in plan.verdicts)),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "min_policy_version": float(min(versions)),
        "max_policy_version": float(max(versions)),
        **{f"dropped_groups/{k}": float(n) for k, n in sorted(plan.dropped.items())},
        **{f"dropped_rollouts/{k}": float(sum(len(v.dropped.get(k, ())) for v in plan.verdicts))
           for k in ("infra_error", "stale", "short_fail", "replaced", "unscored")},
    }
    return BatchManifest(batch_id=batch_id_for(run_id, plan.rollout_ids), seq=seq, run_id=run_id,
                         samples=samples, stats=stats)

