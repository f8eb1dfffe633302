"""Held-out success with its standard error, over tasks.

A held-out success rate is a sample of tasks: greedy decoding gives the same answer to the same
task every time, so more episodes of the same tasks change nothing (`dart eval --episodes 2000`
over 200 tasks gave the 200-episode rate again), and the uncertainty is which tasks were drawn.
So every standard error here is over tasks: a task's score is the mean of its episodes (one
greedy episode each, normally), and the standard error of a rate is the sample standard
deviation of those scores over the square root of the number of tasks. A gain between two
policies measured on the same tasks is paired: its standard error comes from the per-task
differences, which is smaller than the two rates' errors combined when the policies agree on
most tasks (they do: RL changes a policy's answer on a minority of tasks).

The run-to-run spread (training itself: which groups land in which batch) is another thing and
is not in these numbers; it comes from repeated runs (``benchmarks/learning.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Outcomes = Sequence[tuple[Mapping[str, Any], bool]]
"""Held-out episodes as (task, solved) (what :func:`dart.recipe.episodes.evaluate` gives)."""


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A mean over tasks and its standard error (both as fractions: 0.425 is 42.5 %)."""

    value: float
    se: float
    tasks: int

    def points(self, *, signed: bool = False) -> str:
        """``42.5 % ± 1.6`` (``+9.0 ± 1.4`` points when ``signed``)."""
        if signed:
            return f"{100 * self.value:+.1f} ± {100 * self.se:.1f}"
        return f"{100 * self.value:.1f} % ± {100 * self.se:.1f}"


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of ``values``: sample standard deviation / sqrt(n) (0 for one value)."""
    if not values:
        raise ValueError("no values")
    if len(values) == 1:
        return 0.0
    return statistics.stdev(values) / math.sqrt(len(values))


def per_task(outcomes: Outcomes) -> dict[str, float]:
    """Each task's score: the fraction of its episodes solved, keyed by task id."""
    episodes: dict[str, list[bool]] = {}
    for task, solved in outcomes:
        episodes.setdefault(str(task["id"]), []).append(bool(solved))
    return {task: sum(runs) / len(runs) for task, runs in episodes.items()}


def success(outcomes: Outcomes) -> Estimate:
    """Success rate over tasks with its standard error (every task weighs the same)."""
    scores = list(per_task(outcomes).values())
    if not scores:
        raise ValueError("no held-out episodes")
    return Estimate(value=statistics.fmean(scores), se=standard_error(scores), tasks=len(scores))


def paired_gain(before: Outcomes, after: Outcomes) -> Estimate:
    """``after``'s success minus ``before``'s over the tasks both were measured on, with the
    standard error of the per-task differences."""
    a, b = per_task(before), per_task(after)
    common = [t for t in a if t in b]
    if not common:
        raise ValueError("the two evaluations share no task")
    diffs = [b[t] - a[t] for t in common]
    return Estimate(value=statistics.fmean(diffs), se=standard_error(diffs), tasks=len(common))


def outcomes_from_json(rows: Iterable[Mapping[str, Any]]) -> list[tuple[dict[str, Any], bool]]:
    """(task, solved) pairs back from ``summary.json``'s ``{"task": id, "solved": bool}`` rows."""
    return [({"id": str(r["task"])}, bool(r["solved"])) for r in rows]


def outcomes_to_json(outcomes: Outcomes) -> list[dict[str, Any]]:
    """One ``{"task": id, "solved": bool}`` row per episode (what a later paired comparison needs)."""
    return [{"task": str(task["id"]), "solved": bool(solved)} for task, solved in outcomes]
