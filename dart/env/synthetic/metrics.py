"""How synthetic tasks are scored: the ``synthetic_state`` getter and ``synthetic_state_match``.

The getter reads ``/synthetic/state.json`` through :class:`dart.env.backend.EnvAccess` (the
same path any backend's evaluator would use); the metric compares that state with the
task's ``evaluator.expected.rules``: ``{"submitted": <button>, "values": {<widget>: value}}``.
"""

from __future__ import annotations

import json
from typing import Any

from dart.env.synthetic.generator import GETTER, METRIC, STATE_PATH
from dart.errors import EnvError


def state_match(state: dict[str, Any], expected: dict[str, Any], *, partial: bool = False) -> float:
    """1.0 when every expected item holds in ``state`` (else 0.0, or the fraction if ``partial``).

    Expected items: ``submitted`` (the submit button that was pressed; None = none) and each
    entry of ``values`` (a widget's final value).
    """
    checks: list[bool] = []
    if "submitted" in expected:
        checks.append(state.get("submitted") == expected["submitted"])
    have = state.get("values", {})
    for name, want in expected.get("values", {}).items():
        checks.append(name in have and have[name] == want)
    if not checks:
        return 0.0
    if partial:
        return sum(checks) / len(checks)
    return 1.0 if all(checks) else 0.0


async def read_state(env: Any, path: str = STATE_PATH) -> dict[str, Any]:
    """The synthetic state of ``env`` (any EnvAccess)."""
    raw = await env.read_file(path)
    try:
        state = json.loads(raw)
    except ValueError as exc:
        raise EnvError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(state, dict):
        raise EnvError(f"{path} must hold a JSON object")
    return state


_registered = False


def register() -> None:
    """Register the getter and the metric with ``dart.env.evaluators`` (idempotent)."""
    global _registered
    if _registered:
        return
    # Deferred: loads numpy, needed only here.
    from dart.env.evaluators import register_getter, register_metric

    @register_getter(GETTER)
    async def _synthetic_state(env: Any, params: dict[str, Any], ctx: Any = None) -> dict[str, Any]:
        return await read_state(env, str(params.get("path", STATE_PATH)))

    @register_metric(METRIC)
    def _synthetic_state_match(result: Any, expected: Any, **options: Any) -> float:
        if not isinstance(result, dict) or not isinstance(expected, dict):
            return 0.0
        return state_match(result, expected, partial=bool(options.get("partial", False)))

    _registered = True
