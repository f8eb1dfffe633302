"""Step-wise GRPO advantages and the entropy step mask: which samples learn, and how much.

Pure functions, no I/O. ``_B`` is the sample axis (one sample = one step of one trajectory),
``_T`` the response-token axis.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

from dart.errors import DartError

ADV_EPS = 1e-6
"""Added to the group's reward std: A_i = (R_i - mean_g R) / (std_g R + ADV_EPS)."""


class BatchError(DartError, ValueError):
    """A batch is inconsistent (a trajectory with two rewards, one in two groups, ragged tensors)."""


def trajectory_rewards(
    rewards_B: Sequence[float], group_ids_B: Sequence[str], rollout_ids_B: Sequence[str]
) -> dict[str, dict[str, float]]:
    """{group_id: {rollout_id: R}}: one reward per distinct trajectory, however many steps it has."""
    if not len(rewards_B) == len(group_ids_B) == len(rollout_ids_B):
        raise BatchError(f"ragged batch: {len(rewards_B)} rewards, {len(group_ids_B)} group ids, "
                         f"{len(rollout_ids_B)} rollout ids")
    groups: dict[str, dict[str, float]] = {}
    group_of: dict[str, str] = {}
    for reward, group_id, rollout_id in zip(rewards_B, group_ids_B, rollout_ids_B, strict=True):
        if not math.isfinite(reward):
            raise BatchError(f"trajectory {rollout_id} has a non-finite reward {reward!r}")
        if group_of.setdefault(rollout_id, group_id) != group_id:
            raise BatchError(f"trajectory {rollout_id} appears in groups {group_of[rollout_id]} and {group_id}")
        known = groups.setdefault(group_id, {}).setdefault(rollout_id, reward)
        if known != reward:
            raise BatchError(f"trajectory {rollout_id} has two rewards, {known} and {reward}: "
                             "every step of a trajectory must carry the trajectory's reward")
    return groups


def group_advantages(
    rewards_B: Sequence[float], group_ids_B: Sequence[str], rollout_ids_B: Sequence[str]
) -> torch.Tensor:
    """Step-wise GRPO advantage of every sample: ``A_i = (R_i - mean_g R) / (std_g R + 1e-6)``.

    The statistics are over the distinct trajectories (rollout_id) of each group (group_id), not
    over step samples, so a long trajectory does not weigh more in its group's baseline; then
    A_i is broadcast to every step sample of trajectory i. ``std`` is the sample standard
    deviation (n - 1, as torch.std). A group with a single trajectory has no baseline: A = 0.
    """
    groups = trajectory_rewards(rewards_B, group_ids_B, rollout_ids_B)
    adv_of: dict[str, float] = {}
    for trajectories in groups.values():
        rewards = list(trajectories.values())
        if len(rewards) < 2:
            adv_of.update(dict.fromkeys(trajectories, 0.0))
            continue
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        adv_of.update({rid: (r - mean) / (std + ADV_EPS) for rid, r in trajectories.items()})
    return torch.tensor([adv_of[rid] for rid in rollout_ids_B], dtype=torch.float32)


def length_weights(rollout_ids_B: Sequence[str]) -> torch.Tensor:
    """``n̄ / n_i`` for every sample: n_i the samples of its trajectory in the batch, n̄ the mean
    over the batch's trajectories. Each trajectory's weights sum to n̄, and all of them to B."""
    counts: dict[str, int] = {}
    for rid in rollout_ids_B:
        counts[rid] = counts.get(rid, 0) + 1
    if not counts:
        return torch.zeros(0, dtype=torch.float32)
    mean = len(rollout_ids_B) / len(counts)
    return torch.tensor([mean / counts[rid] for rid in rollout_ids_B], dtype=torch.float32)

