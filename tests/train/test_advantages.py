"""Step-wise GRPO advantages and the entropy step mask, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from dart.train.advantages import BatchError, group_advantages, length_weights


def test_group_statistics_are_over_trajectories_not_step_samples() -> None:
    # Group g: trajectory a (R=1, 3 steps), b (R=0, 1 step), c (R=0, 2 steps).
    # Over trajectories: mean 1/3, sample std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3).
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    groups = ["g"] * 6
    rollouts = ["a", "a", "a", "b", "c", "c"]
    adv = group_advantages(rewards, groups, rollouts)
    std = math.sqrt(1 / 3)
    a, b = (2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)
    assert adv.tolist() == pytest.approx([a, a, a, b, b, b], rel=1e-6)
    assert a == pytest.approx(1.1547, abs=1e-4)
    # Step-sample statistics (mean 0.5) would have given the long success a smaller advantage.
    assert a != pytest.approx(0.5 / torch.tensor(rewards).std().item(), abs=1e-3)


def test_groups_are_normalised_separately_and_broadcast_to_every_step() -> None:
    rewards = [2.0, 0.0, 5.0, 5.0, 1.0, 3.0, 3.0]
    groups = ["g1", "g1", "g2", "g2", "g3", "g3", "g3"]
    rollouts = ["x", "y", "p", "q", "u", "v", "v"]
    adv = group_advantages(rewards, groups, rollouts).tolist()
    s = math.sqrt(2.0)  # std of (2, 0) and of (1, 3) with n - 1
    assert adv[0:2] == pytest.approx([1 / (s + 1e-6), -1 / (s + 1e-6)], rel=1e-6)
    assert adv[2:4] == [0.0, 0.0]  # all-equal group: no signal
    assert adv[4:7] == pytest.approx([-1 / (s + 1e-6), 1 / (s + 1e-6), 1 / (s + 1e-6)], rel=1e-6)


def test_length_weights_give_every_trajectory_the_same_total_weight() -> None:
    # A success of 2 steps and a failure of 6 (it ran to the step cap): 8 samples, 2 trajectories,
    # mean length 4. Weights 4/2 = 2 on the success's steps, 4/6 = 2/3 on the failure's.
    rollouts = ["s", "s", "f", "f", "f", "f", "f", "f"]
    w = length_weights(rollouts).tolist()
    assert w == pytest.approx([2.0, 2.0] + [2 / 3] * 6)
    assert sum(w[:2]) == pytest.approx(sum(w[2:])) and sum(w) == pytest.approx(8.0)
    # With A = ±1/(√2 + ε), the step weighting sums +2·A on the success and −6·A on the failure;
    # the trajectory weighting sums +4·A and −4·A: balanced, as the group's baseline is.
    adv = group_advantages([1.0] * 2 + [0.0] * 6, ["g"] * 8, rollouts)
    weighted = adv * length_weights(rollouts)
    assert float(weighted[:2].sum()) == pytest.approx(-float(weighted[2:].sum()))
    assert float(adv[:2].sum()) == pytest.approx(-float(adv[2:].sum()) / 3)
    assert length_weights([]).tolist() == []


def test_a_group_of_one_trajectory_has_no_baseline_and_gets_zero() -> None:
    assert group_advantages([1.0, 1.0], ["g", "g"], ["a", "a"]).tolist() == [0.0, 0.0]


def test_inconsistent_batches_are_refused_with_the_culprit_named() -> None:
    with pytest.raises(BatchError, match="trajectory a has two rewards"):
        group_advantages([1.0, 0.0], ["g", "g"], ["a", "a"])
    with pytest.raises(BatchError, match="appears in groups"):
        group_advantages([1.0, 1.0], ["g", "h"], ["a", "a"])
    with pytest.raises(BatchError, match="ragged"):
        group_advantages([1.0], ["g", "h"], ["a", "a"])
    with pytest.raises(BatchError, match="non-finite"):
        group_advantages([math.nan], ["g"], ["a"])

