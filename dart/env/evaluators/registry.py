"""Open registries of metrics and getters, by the names OSWorld task files use.

A **metric** is ``fn(result, expected, **options) -> float`` in [0, 1]: pure, given the values
the getters fetched. A **getter** is ``async fn(env, params, ctx) -> value``: the only place
that reaches into an environment, and only through :class:`~dart.env.backend.EnvAccess`.
Backends register their own (a synthetic state metric, a browser getter) next to the built-ins;
what is registered is what :func:`capabilities` reports as runnable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dart.env.tasks import Capabilities, OptionCheck
from dart.errors import ConfigError

if TYPE_CHECKING:
    from dart.agent.actions import Action
    from dart.env.backend import EnvAccess
    from dart.env.tasks import Task

Metric = Callable[..., float]


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalContext:
    """What a getter may know besides its params."""

    task: Task
    final_action: Action | None
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific handles (a cache folder, a browser endpoint), by name."""


Getter = Callable[["EnvAccess", dict[str, Any], EvalContext], Awaitable[Any]]

_METRICS: dict[str, Metric] = {}
_GETTERS: dict[str, Getter] = {}
_OPTION_CHECKS: dict[str, OptionCheck] = {}
_WANTS_FINAL_ACTION: set[str] = set()

SUPPORTED_METRICS = _METRICS.keys()
"""Live view of the registered metric names (grows as backends register theirs)."""
SUPPORTED_GETTERS = _GETTERS.keys()
"""Live view of the registered getter types."""


def register_metric(
    name: str,
    *,
    check_options: OptionCheck | None = None,
    uses_final_action: bool = False,
    replace: bool = False,
) -> Callable[[Metric], Metric]:
    """Decorator: ``fn(result, expected, **options) -> float in [0, 1]`` under ``name``.

    ``check_options(options) -> [unsupported parts]`` lets a pool refuse options at load time.
    ``uses_final_action``: the metric's ``result`` is the agent's last action, not a getter's value
    (OSWorld's ``infeasible``).
    """

    def deco(fn: Metric) -> Metric:
        if name in _METRICS and _METRICS[name] is not fn and not replace:
            raise ConfigError(f"metric {name!r} is already registered; pass replace=True to override it")
        _METRICS[name] = fn
        if check_options is not None:
            _OPTION_CHECKS[name] = check_options
        if uses_final_action:
            _WANTS_FINAL_ACTION.add(name)
        return fn

    return deco


def register_getter(type_: str, *, replace: bool = False) -> Callable[[Getter], Getter]:
    """Decorator: ``async fn(env, params, ctx) -> value`` for getters of ``type_``."""

    def deco(fn: Getter) -> Getter:
        if type_ in _GETTERS and _GETTERS[type_] is not fn and not replace:
            raise ConfigError(f"getter {type_!r} is already registered; pass replace=True to override it")
        _GETTERS[type_] = fn
        return fn

    return deco


def get_metric(name: str) -> Metric:
    try:
        return _METRICS[name]
    except KeyError:
        raise ConfigError(f"no metric {name!r}; registered: {', '.join(sorted(_METRICS))}") from None


def uses_final_action(name: str) -> bool:
    """True if metric ``name`` scores the agent's last action rather than a getter's value."""
    return name in _WANTS_FINAL_ACTION


def get_getter(type_: str) -> Getter:
    try:
        return _GETTERS[type_]
    except KeyError:
        raise ConfigError(f"no getter {type_!r}; registered: {', '.join(sorted(_GETTERS))}") from None


def capabilities(setup_types: Iterable[str], unavailable_programs: Mapping[str, str] | None = None) -> Capabilities:
    """What a backend that runs ``setup_types`` can run, with every registered metric and getter
    (``unavailable_programs``: programs it cannot start, with the reason)."""
    return Capabilities(
        frozenset(setup_types), frozenset(_GETTERS), frozenset(_METRICS), option_checks=dict(_OPTION_CHECKS),
        unavailable_programs=dict(unavailable_programs or {}),
    )
