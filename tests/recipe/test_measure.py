"""Held-out success with standard errors over tasks (dart.recipe.measure), against values worked
out by hand, and make run's held-out set: every held-out task of the preset, none trained on."""

from __future__ import annotations

import math

import pytest

from dart.errors import ConfigError
from dart.recipe.config import Recipe, make_tasks
from dart.recipe.measure import (
    Estimate,
    outcomes_from_json,
    outcomes_to_json,
    paired_gain,
    per_task,
    standard_error,
    success,
)
from dart.stack.up import held_out_lines


def ep(task: str, solved: bool) -> tuple[dict[str, str], bool]:
    return {"id": task}, solved


def test_standard_error_of_a_proportion_over_tasks_by_hand() -> None:
    # 3 of 4 tasks solved: mean 0.75; deviations 0.25 (x3) and 0.75: sum of squares 0.75,
    # sample variance 0.75 / 3 = 0.25, sd 0.5, standard error 0.5 / sqrt(4) = 0.25.
    est = success([ep("a", True), ep("b", False), ep("c", True), ep("d", True)])
    assert est == Estimate(value=0.75, se=pytest.approx(0.25), tasks=4)
    # the textbook form for 0/1 scores: sqrt(p (1 - p) / (n - 1))
    assert est.se == pytest.approx(math.sqrt(0.75 * 0.25 / 3))


def test_a_task_counts_once_however_many_episodes_it_had() -> None:
    # task a: 1 of 2 episodes (score 0.5), b: 0 of 1, c: 1 of 1 -> scores 0.5, 0, 1: mean 0.5,
    # sample variance (0 + 0.25 + 0.25) / 2 = 0.25, standard error 0.5 / sqrt(3).
    est = success([ep("a", True), ep("a", False), ep("b", False), ep("c", True)])
    assert per_task([ep("a", True), ep("a", False)]) == {"a": 0.5}
    assert est.value == pytest.approx(0.5)
    assert est.se == pytest.approx(0.5 / math.sqrt(3))
    assert est.tasks == 3


def test_paired_gain_uses_the_per_task_differences_on_the_tasks_both_have() -> None:
    before = [ep("a", True), ep("b", False), ep("c", True), ep("d", False), ep("only-before", True)]
    after = [ep("a", True), ep("b", True), ep("c", True), ep("d", True), ep("only-after", False)]
    # differences on a, b, c, d: 0, 1, 0, 1 -> mean 0.5, sample variance (4 x 0.25) / 3 = 1/3,
    # standard error sqrt(1/3) / 2
    gain = paired_gain(before, after)
    assert gain.value == pytest.approx(0.5)
    assert gain.se == pytest.approx(math.sqrt(1 / 3) / 2)
    assert gain.tasks == 4


def test_paired_gain_is_finer_than_two_independent_rates_when_policies_agree() -> None:
    # 100 tasks; the warm start solves 0-39, RL solves 0-49: RL changed 10 answers and no other.
    before = [ep(str(i), i < 40) for i in range(100)]
    after = [ep(str(i), i < 50) for i in range(100)]
    gain, a, b = paired_gain(before, after), success(before), success(after)
    assert gain.value == pytest.approx(0.10)
    # differences: ten 1s, ninety 0s -> sample sd sqrt(100/99 * 0.1 * 0.9) = 0.3015, se 0.03015
    assert gain.se == pytest.approx(math.sqrt(0.1 * 0.9 / 99))
    assert gain.se < math.hypot(a.se, b.se) / 1.5


def test_standard_error_of_one_value_is_zero_and_of_none_an_error() -> None:
    assert standard_error([0.3]) == 0.0
    with pytest.raises(ValueError, match="no values"):
        standard_error([])
    with pytest.raises(ValueError, match="no held-out"):
        success([])
    with pytest.raises(ValueError, match="share no task"):
        paired_gain([ep("a", True)], [ep("b", True)])


def test_outcomes_round_trip_through_json() -> None:
    outcomes = [ep("a", True), ep("b", False)]
    assert outcomes_from_json(outcomes_to_json(outcomes)) == outcomes


def test_estimate_in_points() -> None:
    assert Estimate(value=0.425, se=0.0164, tasks=899).points() == "42.5 % ± 1.6"
    assert Estimate(value=0.09, se=0.0141, tasks=899).points(signed=True) == "+9.0 ± 1.4"


def test_summary_lines_give_every_rate_and_the_gain_a_standard_error() -> None:
    text = held_out_lines({"warm_success": 0.425, "warm_se": 0.0164, "eval_tasks": 899, "rl_success": 0.515,
                           "rl_se": 0.0167, "delta": 0.09, "delta_se": 0.0141})
    assert "warm start 42.5 % ± 1.6 over 899 held-out tasks" in text
    assert "RL policy  51.5 % ± 1.7" in text
    assert "gain       +9.0 ± 1.4 points" in text
    # a summary written before standard errors existed still prints
    assert "RL policy  51.5 %\n" in held_out_lines({"warm_success": 0.425, "rl_success": 0.515, "delta": 0.09}) + "\n"


def test_make_runs_held_out_set_is_every_held_out_tiny_task_and_disjoint_from_training() -> None:
    recipe = Recipe()
    assert recipe.held_out_episodes == recipe.eval_tasks  # one greedy episode per task
    train, held_out = make_tasks(recipe)
    ids = {t["id"] for t in held_out}
    assert len(ids) == len(held_out) == recipe.eval_tasks
    assert not ids & {t["id"] for t in train}
    # the first 200 are the 200 that every figure before this measure used
    _, before = make_tasks(Recipe(eval_tasks=200))
    assert [t["id"] for t in held_out[:200]] == [t["id"] for t in before]
    # the standard error a rate near 50 % gets from them: under 1.7 points (200 tasks: 3.5)
    assert math.sqrt(0.25 / (recipe.eval_tasks - 1)) < 0.017


def test_eval_episodes_defaults_to_one_per_task_and_refuses_zero() -> None:
    assert Recipe(eval_tasks=30).held_out_episodes == 30
    assert Recipe(eval_tasks=30, eval_episodes=60).held_out_episodes == 60
    with pytest.raises(ConfigError, match="eval_episodes"):
        Recipe(eval_episodes=0)
