"""The synthetic GUI as a pure state machine: a screen spec, a state, and ``apply``.

A *spec* is the JSON-able description of one task's screen (it rides inside the task's
``config`` step, so a task on the log stays valid when the generator changes):

    {"width": 112, "height": 112, "tolerance": 4, "background": [236, 236, 236],
     "widgets": [{"kind": "button", "name": "red", "label": "Red", "color": [220, 40, 40],
                  "box": [8, 8, 52, 52], "page": 0, "on_click": "submit"}, ...]}

Widget kinds: ``button`` (``on_click``: submit | next | back | stay), ``checkbox``, ``textfield``,
``list`` (``items``, ``visible`` rows, scrollable), ``label`` and ``panel`` (a filled
rectangle, ``color``, drawn where it stands in the list: a region's background). A *state* is a JSON-able
dict (what ``/synthetic/state.json`` holds). ``apply(spec, state, action)`` returns the next
state and never mutates its input; there is no clock and no randomness here.
"""

from __future__ import annotations

import copy
from typing import Any

from dart.agent.actions import Action, Click, Hotkey, LeftDouble, Scroll, Type
from dart.errors import ConfigError

WIDGET_KINDS = frozenset({"button", "checkbox", "textfield", "list", "label", "panel"})
BUTTON_EFFECTS = frozenset({"submit", "next", "back", "stay"})
"""What a click on a button does: ends the task, turns the page forward or back, or nothing
but being pressed (``stay``: a wrong choice that costs a step)."""
INTERACTIVE = frozenset({"button", "checkbox", "textfield", "list"})

Spec = dict[str, Any]
State = dict[str, Any]


def validate_spec(spec: Spec) -> Spec:
    """The spec itself if it is well formed; ConfigError naming the bad widget otherwise."""
    for key in ("width", "height", "widgets"):
        if key not in spec:
            raise ConfigError(f"synthetic screen spec lacks {key!r}")
    names: set[str] = set()
    for i, w in enumerate(spec["widgets"]):
        kind = w.get("kind")
        if kind not in WIDGET_KINDS:
            raise ConfigError(f"synthetic widget {i}: unknown kind {kind!r} (known: {sorted(WIDGET_KINDS)})")
        box = w.get("box")
        if not (isinstance(box, list | tuple) and len(box) == 4 and box[0] < box[2] and box[1] < box[3]):
            raise ConfigError(f"synthetic widget {i} ({w.get('name')}): box must be [x0, y0, x1, y1], got {box!r}")
        if kind in INTERACTIVE:
            name = w.get("name")
            if not name or name in names:
                raise ConfigError(f"synthetic widget {i}: missing or duplicate name {name!r}")
            names.add(name)
        if kind == "button" and w.get("on_click", "submit") not in BUTTON_EFFECTS:
            raise ConfigError(f"synthetic button {w.get('name')!r}: on_click must be one of {sorted(BUTTON_EFFECTS)}")
        if kind == "list" and not w.get("items"):
            raise ConfigError(f"synthetic list {w.get('name')!r} has no items")
    return spec


def initial_state(spec: Spec) -> State:
    """The state right after reset: page 0, nothing focused, pressed or filled."""
    values: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    for w in spec["widgets"]:
        match w["kind"]:
            case "checkbox":
                values[w["name"]] = bool(w.get("checked", False))
            case "textfield":
                values[w["name"]] = str(w.get("value", ""))
            case "list":
                values[w["name"]] = w.get("selected")
                offsets[w["name"]] = 0
    return {
        "page": 0,
        "focus": None,
        "select_all": False,
        "values": values,
        "list_offset": offsets,
        "pressed": [],
        "submitted": None,
        "done": False,
        "steps": 0,
    }


def widgets_on_page(spec: Spec, page: int) -> list[dict[str, Any]]:
    return [w for w in spec["widgets"] if w.get("page", 0) == page]


def widget(spec: Spec, name: str) -> dict[str, Any]:
    for w in spec["widgets"]:
        if w.get("name") == name:
            return w
    raise KeyError(name)


def center(w: dict[str, Any]) -> tuple[float, float]:
    x0, y0, x1, y1 = w["box"]
    return (x0 + x1) / 2, (y0 + y1) / 2


def hit_test(spec: Spec, state: State, x: float, y: float) -> dict[str, Any] | None:
    """The interactive widget of the current page under (x, y), hit boxes grown by the spec's
    ``tolerance``; the nearest centre wins when grown boxes overlap."""
    tol = float(spec.get("tolerance", 0))
    hits = []
    for w in widgets_on_page(spec, state["page"]):
        if w["kind"] not in INTERACTIVE:
            continue
        x0, y0, x1, y1 = w["box"]
        if x0 - tol <= x <= x1 + tol and y0 - tol <= y <= y1 + tol:
            cx, cy = center(w)
            hits.append(((cx - x) ** 2 + (cy - y) ** 2, w["name"], w))
    return min(hits)[2] if hits else None


def list_row_box(w: dict[str, Any], row: int) -> tuple[float, float, float, float]:
    """Box of visible row ``row`` (0 = top) of a list widget."""
    x0, y0, x1, y1 = w["box"]
    h = (y1 - y0) / _visible(w)
    return x0, y0 + row * h, x1, y0 + (row + 1) * h


def _visible(w: dict[str, Any]) -> int:
    return max(1, min(int(w.get("visible", len(w["items"]))), len(w["items"])))


def max_offset(w: dict[str, Any]) -> int:
    return len(w["items"]) - _visible(w)


def visible_items(w: dict[str, Any], offset: int) -> list[str]:
    return list(w["items"][offset : offset + _visible(w)])


def apply(spec: Spec, state: State, action: Action) -> State:
    """The state after one action. Actions that hit nothing still count as a step."""
    s = copy.deepcopy(state)
    s["steps"] = s.get("steps", 0) + 1
    if s["done"]:
        return s
    match action:
        case Click() | LeftDouble():
            _click(spec, s, action.x, action.y)
        case Type():
            _type(s, spec, action.content)
        case Hotkey():
            _hotkey(s, spec, action.keys)
        case Scroll():
            _scroll(spec, s, action)
        case _:
            pass  # right clicks, drags and waits change nothing on these screens
    return s


def _click(spec: Spec, s: State, x: float, y: float) -> None:
    w = hit_test(spec, s, x, y)
    s["select_all"] = False
    if w is None:
        s["focus"] = None
        return
    name = w["name"]
    match w["kind"]:
        case "button":
            s["pressed"].append(name)
            s["focus"] = None
            effect = w.get("on_click", "submit")
            if effect == "submit":
                s["submitted"] = name
                s["done"] = True
            elif effect == "next":
                s["page"] += 1
            elif effect == "back":
                s["page"] = max(0, s["page"] - 1)
        case "checkbox":
            s["values"][name] = not s["values"][name]
            s["focus"] = name
        case "textfield":
            s["focus"] = name
        case "list":
            _, y0, _, y1 = w["box"]
            row = min(_visible(w) - 1, max(0, int((y - y0) / ((y1 - y0) / _visible(w)))))
            s["values"][name] = visible_items(w, s["list_offset"][name])[row]
            s["focus"] = name


def _focused_field(spec: Spec, s: State) -> str | None:
    name = s["focus"]
    if name is None:
        return None
    return name if widget(spec, name)["kind"] == "textfield" else None


def _type(s: State, spec: Spec, content: str) -> None:
    name = _focused_field(spec, s)
    if name is None:
        return
    text = content[:-1] if content.endswith("\n") else content
    s["values"][name] = text if s["select_all"] else s["values"][name] + text
    s["select_all"] = False


def _hotkey(s: State, spec: Spec, keys: tuple[str, ...]) -> None:
    combo = tuple(k.lower() for k in keys)
    name = _focused_field(spec, s)
    if combo == ("ctrl", "a") and name is not None:
        s["select_all"] = True
    elif combo in (("backspace",), ("delete",)) and name is not None:
        s["values"][name] = "" if s["select_all"] else s["values"][name][:-1]
        s["select_all"] = False
    elif combo == ("tab",):
        fields = [w["name"] for w in widgets_on_page(spec, s["page"]) if w["kind"] in INTERACTIVE]
        if fields:
            i = fields.index(s["focus"]) + 1 if s["focus"] in fields else 0
            s["focus"] = fields[i % len(fields)]
        s["select_all"] = False


def _scroll(spec: Spec, s: State, action: Scroll) -> None:
    if action.direction not in ("up", "down"):
        return
    target = None
    if action.x is not None and action.y is not None:
        w = hit_test(spec, s, action.x, action.y)
        target = w if w is not None and w["kind"] == "list" else None
    if target is None:  # a scroll anywhere moves the page's only list, if it has one
        lists = [w for w in widgets_on_page(spec, s["page"]) if w["kind"] == "list"]
        target = lists[0] if len(lists) == 1 else None
    if target is None:
        return
    step = 1 if action.direction == "down" else -1
    name = target["name"]
    s["list_offset"][name] = min(max_offset(target), max(0, s["list_offset"][name] + step))
