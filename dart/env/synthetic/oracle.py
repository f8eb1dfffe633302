"""A scripted oracle that solves every synthetic task (experience pool, SFT data, tests).

``oracle_action(task, state)`` is the next action from any state (so it also recovers from a
policy's detours); ``oracle_plan(task)`` is the whole action list from the start state. A task
ends when a submit button is pressed (the env reports ``done``), so plans hold no Finished.
"""

from __future__ import annotations

from typing import Any

from dart.agent.actions import Action, Click, Finished, Hotkey, Scroll, Type
from dart.env.synthetic.generator import SETUP_TYPE
from dart.env.synthetic.screen import (
    Spec,
    State,
    apply,
    center,
    initial_state,
    list_row_box,
    validate_spec,
    visible_items,
    widget,
    widgets_on_page,
)
from dart.errors import ConfigError

MAX_PLAN_STEPS = 64


def task_dict(task: Any) -> dict[str, Any]:
    """The OSWorld dict of a task given as a dict or as a ``dart.env.tasks.Task`` (its ``raw``)."""
    if isinstance(task, dict):
        return task
    raw = getattr(task, "raw", None)
    if isinstance(raw, dict):
        return raw
    raise ConfigError(f"not a synthetic task: {task!r}")


def screen_of(task: Any) -> Spec:
    """The screen spec inside a synthetic task's setup step."""
    d = task_dict(task)
    for step in d.get("config", ()):
        if step.get("type") == SETUP_TYPE:
            screen = step.get("parameters", {}).get("screen")
            if isinstance(screen, dict):
                return validate_spec(screen)
    raise ConfigError(f"task {d.get('id')!r} has no {SETUP_TYPE!r} setup step with a 'screen'")


def goal_of(task: Any) -> dict[str, Any]:
    """The expected state (``evaluator.expected.rules``) of a synthetic task."""
    d = task_dict(task)
    try:
        rules = d["evaluator"]["expected"]["rules"]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"task {d.get('id')!r}: evaluator.expected.rules is missing") from exc
    if not isinstance(rules, dict):
        raise ConfigError(f"task {d.get('id')!r}: evaluator.expected.rules must be a mapping")
    return rules


def oracle_action(task: Any, state: State) -> Action:
    """The next action that brings ``state`` closer to the task's goal."""
    spec, goal = screen_of(task), goal_of(task)
    if state["done"]:
        return Finished()
    values: dict[str, Any] = goal.get("values", {})
    page = state["page"]
    for w in widgets_on_page(spec, page):
        name = w.get("name")
        if name in values and state["values"].get(name) != values[name]:
            return _fix(w, values[name], state)
    if any(widget(spec, n).get("page", 0) < page and state["values"].get(n) != v for n, v in values.items()):
        return _click(_nav(spec, page, "back"))
    submit = goal.get("submitted")
    if submit is None:
        return Finished()
    target = widget(spec, submit)
    target_page = target.get("page", 0)
    if target_page == page:
        return _click(target)
    return _click(_nav(spec, page, "next" if target_page > page else "back"))


def oracle_plan(task: Any, *, max_steps: int = MAX_PLAN_STEPS) -> list[Action]:
    """Every action from the start state until the task is done (simulated, deterministic)."""
    return [a for _, a in oracle_trace(task, max_steps=max_steps)]


def oracle_trace(task: Any, *, max_steps: int = MAX_PLAN_STEPS) -> list[tuple[State, Action]]:
    """(state before, action) pairs of the oracle's solution: SFT warm-start material."""
    spec = screen_of(task)
    state = initial_state(spec)
    trace: list[tuple[State, Action]] = []
    while not state["done"]:
        if len(trace) >= max_steps:
            raise ConfigError(f"oracle did not finish task {task_dict(task).get('id')!r} in {max_steps} steps")
        action = oracle_action(task, state)
        if isinstance(action, Finished):
            break
        trace.append((state, action))
        state = apply(spec, state, action)
    return trace


def _fix(w: dict[str, Any], want: Any, state: State) -> Action:
    name = w["name"]
    have = state["values"].get(name)
    match w["kind"]:
        case "checkbox":
            return _click(w)
        case "textfield":
            if state["focus"] != name:
                return _click(w)
            if have and not state.get("select_all"):
                return Hotkey(keys=("ctrl", "a"))
            return Type(content=str(want))
        case "list":
            offset = state["list_offset"][name]
            shown = visible_items(w, offset)
            if want in shown:
                x0, y0, x1, y1 = list_row_box(w, shown.index(want))
                return Click(x=(x0 + x1) / 2, y=(y0 + y1) / 2)
            x, y = center(w)
            down = w["items"].index(want) >= offset + len(shown)
            return Scroll(x=x, y=y, direction="down" if down else "up")
    raise ConfigError(f"the oracle cannot set a {w['kind']} widget ({name!r})")


def _nav(spec: Spec, page: int, effect: str) -> dict[str, Any]:
    for w in widgets_on_page(spec, page):
        if w["kind"] == "button" and w.get("on_click") == effect:
            return w
    raise ConfigError(f"page {page} has no {effect!r} button, the task cannot be solved")


def _click(w: dict[str, Any]) -> Click:
    x, y = center(w)
    return Click(x=x, y=y)
