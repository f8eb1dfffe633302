"""Score one finished task: fetch each metric's inputs through its getters, apply the metric,
combine by ``conj``. The backend runs the evaluator's ``postconfig`` steps before calling this.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dart.agent.actions import Action, CallUser
from dart.env.evaluators.registry import EvalContext, get_getter, get_metric, uses_final_action

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dart.env.backend import EnvAccess
    from dart.env.tasks import Getter, Task


def clamp_score(value: Any) -> float:
    """A metric's value as a score in [0, 1] (NaN is 0)."""
    v = float(value)
    return 0.0 if math.isnan(v) else min(1.0, max(0.0, v))


def combine(scores: list[float], conj: str) -> float:
    """and: 0 if any metric is 0, else their mean; or: their max."""
    if not scores:
        return 0.0
    if conj == "or":
        return max(scores)
    return 0.0 if min(scores) == 0.0 else sum(scores) / len(scores)


async def fetch(getter: Getter | None, env: EnvAccess, ctx: EvalContext) -> Any:
    """A getter's value; ``None`` for no getter."""
    if getter is None:
        return None
    return await get_getter(getter.type)(env, dict(getter.params), ctx)


async def evaluate_task(
    task: Task,
    env: EnvAccess,
    *,
    final_action: Action | None,
    extras: Mapping[str, Any] | None = None,
) -> tuple[float, dict[str, Any]]:
    """(score in [0, 1], details). ``final_action`` is the agent's last action; None when the
    trajectory ended without one (step limit).

    As in OSWorld: an agent that calls the user on a feasible task scores 0 without running
    any getter; metrics are scored in order and stop early once the result is decided (a 0
    under ``and``, a 1 under ``or``). Exceptions from getters (the environment failed) pass
    through: they are infra errors, not scores.
    """
    ev = task.evaluator
    ctx = EvalContext(task=task, final_action=final_action, extras=dict(extras or {}))
    details: dict[str, Any] = {"conj": ev.conj, "metrics": []}
    feasible = not any(uses_final_action(f) for f in ev.funcs)
    if feasible and isinstance(final_action, CallUser):
        details["reason"] = "the agent declared a feasible task infeasible (call_user)"
        return 0.0, details
    scores: list[float] = []
    for func, result_g, expected_g, options in zip(
        ev.funcs, ev.results, ev.expected, ev.options, strict=True
    ):
        metric = get_metric(func)
        result = final_action if uses_final_action(func) else await fetch(result_g, env, ctx)
        expected = await fetch(expected_g, env, ctx)
        score = clamp_score(metric(result, expected, **options))
        scores.append(score)
        details["metrics"].append({"func": func, "score": score})
        if (ev.conj == "and" and score == 0.0) or (ev.conj == "or" and score == 1.0):
            details["decided_early"] = len(scores) < len(ev.funcs)
            break
    total = combine(scores, ev.conj)
    details["score"] = total
    return total, details
