"""Procedural synthetic tasks in OSWorld format, seeded and split into train / eval.

Presets:

- ``tiny``: 112x112 screens, 2-4 big coloured targets on a 2x2 grid, 1-2 step tasks
  ("Click the red button.", "Check the box, then press OK."). Made for a ~0.4 M-parameter
  model trained from pixels on a CPU in minutes. Each quadrant has its own grey shade
  (:data:`TINY_SHADES`): Qwen2.5-VL's vision tower has no absolute position embedding, so a
  from-scratch model can only tell where a patch is through rotary attention, which it learns
  slowly; with the shade inside every patch a button's place is part of what it looks like
  (held-out SFT grounding 1.00 after 2,500 steps, 0.68 without; see benchmarks/learnability.py).
- ``buttons``: 224x224, 3-6 grey buttons labelled with words on a 3x3 grid; one click, but the
  policy must read.
- ``pages``: 5-10 ``tiny`` screens in a row (quadrant shades, 2-4 coloured buttons each). "Click
  the red button on each page.": the named colour turns the page (on the last page it submits);
  any other button sends the agent one page back. 5-10 steps when every click is right, each
  readable from the current screen alone, so a from-scratch model learns it as fast as ``tiny``
  while a mistake costs steps: step-wise advantages, per-task trajectory length and
  high-entropy step selection have long trajectories to work on.
- ``forms``: 448x336, text fields (click, type), checkboxes, a scrollable list and one or two
  pages (Next, then Submit); 6-15 steps.

Every task carries its whole screen spec in ``config[0].parameters.screen``, so replaying a
task from the log never depends on this generator's code. The split is a function of the
task's *content* (its signature), not of the seed: a held-out screen + goal never shows up in
training, whatever seeds either side used.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from typing import Any, Literal

from dart.env.synthetic.screen import Spec, validate_spec
from dart.errors import ConfigError

Split = Literal["train", "eval"]
PRESETS = ("tiny", "buttons", "forms", "pages", "chain")
SETUP_TYPE = "synthetic_screen"
STATE_PATH = "/synthetic/state.json"
METRIC = "synthetic_state_match"
GETTER = "synthetic_state"
MAX_MISSES = 5000
"""Consecutive seeds without a new task after which a preset counts as exhausted."""

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (30, 160, 60),
    "blue": (40, 80, 225),
    "yellow": (245, 205, 30),
}
_NEUTRAL = (190, 190, 190)
_TINY_SLOTS = ((6, 6, 52, 52), (60, 6, 106, 52), (6, 60, 52, 106), (60, 60, 106, 106))
_TINY_QUADRANTS = ((0, 0, 56, 56), (56, 0, 112, 56), (0, 56, 56, 112), (56, 56, 112, 112))
TINY_SHADES = ((250, 250, 250), (170, 170, 170), (90, 90, 90), (10, 10, 10))
"""Background of the top-left, top-right, bottom-left and bottom-right quadrant of a tiny screen."""
_WORDS = ("Save", "Open", "Close", "Print", "Help", "Edit", "Copy", "Paste", "Undo", "Share", "Send", "Quit")
_FIRST = ("Ada", "Alan", "Grace", "Linus", "Edsger", "Barbara", "Ken", "Donald")
_LAST = ("Lovelace", "Turing", "Hopper", "Torvalds", "Dijkstra", "Liskov", "Thompson", "Knuth")
_CITIES = ("Paris", "Berlin", "Lisbon", "Oslo", "Madrid", "Vienna", "Prague", "Dublin")


def generate_tasks(
    n: int, *, preset: str = "tiny", seed: int = 0, split: Split = "train", eval_fraction: float = 0.2
) -> list[dict[str, Any]]:
    """``n`` distinct OSWorld-format task dicts of ``preset`` that belong to ``split``.

    Candidate seeds run ``seed, seed + 1, ...``; a candidate is kept when its content hashes
    into ``split`` (see :func:`split_of`) and its id is new. Deterministic in its arguments.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown synthetic preset {preset!r} (known: {', '.join(PRESETS)})")
    if split not in ("train", "eval"):
        raise ConfigError(f"split must be 'train' or 'eval', got {split!r}")
    if not 0.0 < eval_fraction < 1.0:
        raise ConfigError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    s, misses = seed, 0
    while len(tasks) < n:
        if misses > MAX_MISSES:
            raise ConfigError(
                f"preset {preset!r} has too few distinct {split} tasks for n={n} (found {len(tasks)} in "
                f"{s - seed} seeds); ask for fewer or use a richer preset"
            )
        task = make_task(preset, s, eval_fraction=eval_fraction)
        s += 1
        if task["config"][0]["parameters"]["split"] == split and task["id"] not in seen:
            seen.add(task["id"])
            tasks.append(task)
            misses = 0
        else:
            misses += 1
    return tasks


def make_task(preset: str, seed: int, *, eval_fraction: float = 0.2) -> dict[str, Any]:
    """The task of one seed (in whichever split its content falls)."""
    rng = random.Random(f"dart.synthetic:{preset}:{seed}")
    template, spec, instruction, expected = _BUILDERS[preset](rng)
    validate_spec(spec)
    sig = signature(spec, expected)
    return {
        "id": f"synthetic-{preset}-{sig[:12]}",
        "snapshot": "synthetic",
        "instruction": instruction,
        "source": f"dart.synthetic:{preset}:{seed}",
        "domain": "synthetic",
        "related_apps": ["synthetic"],
        "config": [
            {
                "type": SETUP_TYPE,
                "parameters": {
                    "generator": preset,
                    "seed": seed,
                    "template": template,
                    "split": split_of(sig, eval_fraction),
                    "screen": spec,
                },
            }
        ],
        "evaluator": {
            "func": METRIC,
            "result": {"type": GETTER, "path": STATE_PATH},
            "expected": {"type": "rule", "rules": expected},
        },
    }


def signature(spec: Spec, expected: dict[str, Any]) -> str:
    """sha256 of what makes a task what it is: the screen and the goal."""
    return hashlib.sha256(json.dumps([spec, expected], sort_keys=True).encode()).hexdigest()


def split_of(sig: str, eval_fraction: float = 0.2) -> Split:
    """'eval' for about ``eval_fraction`` of all signatures, fixed per signature."""
    return "eval" if int(sig[:8], 16) / 0xFFFFFFFF < eval_fraction else "train"


# ---------------------------------------------------------------- presets

Built = tuple[str, Spec, str, dict[str, Any]]


def _tiny(rng: random.Random) -> Built:
    slots = list(_TINY_SLOTS)
    rng.shuffle(slots)
    base: Spec = {"width": 112, "height": 112, "tolerance": 4, "font_size": 10, "widgets": []}
    panels = [{"kind": "panel", "color": list(c), "box": list(q), "page": 0}
              for q, c in zip(_TINY_QUADRANTS, TINY_SHADES, strict=True)]
    if rng.random() < 0.6:
        k = rng.choice((2, 3, 4))
        colors = rng.sample(sorted(COLORS), k)
        target = rng.choice(colors)
        base["widgets"] = panels + [
            _button(c, c.capitalize(), COLORS[c], slots[i], "submit") for i, c in enumerate(colors)
        ]
        return "click_color", base, f"Click the {target} button.", {"submitted": target}
    widgets = [
        {"kind": "checkbox", "name": "box", "label": "", "box": list(slots[0]), "page": 0},
        _button("ok", "OK", COLORS["green"], slots[1], "submit"),
    ]
    if rng.random() < 0.5:
        widgets.append(_button("cancel", "No", COLORS["red"], slots[2], "submit"))
    base["widgets"] = panels + widgets
    return "check_then_ok", base, "Check the box, then press OK.", {"submitted": "ok", "values": {"box": True}}


def _buttons(rng: random.Random) -> Built:
    cells = [(8 + 72 * c, 8 + 72 * r, 72 * c + 72, 72 * r + 72) for r in range(3) for c in range(3)]
    k = rng.randint(3, 6)
    words = rng.sample(_WORDS, k)
    places = rng.sample(cells, k)
    target = rng.choice(words)
    spec: Spec = {
        "width": 224,
        "height": 224,
        "tolerance": 3,
        "font_size": 12,
        "widgets": [_button(w.lower(), w, _NEUTRAL, places[i], "submit") for i, w in enumerate(words)],
    }
    return "click_label", spec, f"Click the '{target}' button.", {"submitted": target.lower()}


def _forms(rng: random.Random) -> Built:
    widgets: list[dict[str, Any]] = [{"kind": "label", "text": "Sign-up form", "box": [16, 8, 200, 24], "page": 0}]
    goals: dict[str, Any] = {}
    steps: list[str] = []
    y = 36
    for name, label, pool in rng.sample((("first", "First name", _FIRST), ("last", "Last name", _LAST)), 2)[
        : rng.randint(1, 2)
    ]:
        widgets.append({"kind": "textfield", "name": name, "label": label, "box": [16, y, 216, y + 24], "page": 0})
        goals[name] = rng.choice(pool)
        steps.append(f"set {label} to '{goals[name]}'")
        y += 34
    if rng.random() < 0.7:
        widgets.append({"kind": "checkbox", "name": "subscribe", "label": "Subscribe", "box": [16, y, 216, y + 20], "page": 0})
        goals["subscribe"] = True
        steps.append("check 'Subscribe'")
        y += 30
    items = rng.sample(_CITIES, 6)
    city = rng.choice(items)
    widgets.append({"kind": "label", "text": "City", "box": [240, 36, 420, 50], "page": 0})
    widgets.append({"kind": "list", "name": "city", "items": items, "visible": 3, "box": [240, 54, 420, 126], "page": 0})
    goals["city"] = city
    steps.append(f"pick '{city}' in City")
    two_pages = rng.random() < 0.5
    submit_page = 1 if two_pages else 0
    if two_pages:
        widgets.append(_button("next", "Next", _NEUTRAL, (330, 290, 430, 322), "next"))
        widgets.append({"kind": "label", "text": "Almost done", "box": [16, 8, 200, 24], "page": 1})
        widgets.append({"kind": "checkbox", "name": "agree", "label": "I agree", "box": [16, 40, 216, 60], "page": 1})
        widgets.append(_button("back", "Back", _NEUTRAL, (16, 290, 116, 322), "back", page=1))
        goals["agree"] = True
        steps.append("press Next, check 'I agree'")
    widgets.append(_button("submit", "Submit", COLORS["blue"], (330, 290, 430, 322), "submit", page=submit_page))
    widgets.append(_button("cancel", "Cancel", _NEUTRAL, (220, 290, 320, 322), "submit", page=submit_page))
    instruction = "In the form, " + ", ".join(steps) + ", then press Submit."
    spec: Spec = {"width": 448, "height": 336, "tolerance": 2, "font_size": 12, "widgets": widgets}
    return ("form_two_pages" if two_pages else "form"), spec, instruction, {"submitted": "submit", "values": goals}


def _pages(rng: random.Random, *, wrong: str = "back") -> Built:
    """5-10 tiny screens in a row; the named colour turns the page (the last one submits), any
    other colour does ``wrong`` (``back``: a page back; ``stay``: nothing but a lost step)."""
    n = rng.randint(5, 10)
    target = rng.choice(sorted(COLORS))
    widgets: list[dict[str, Any]] = []
    for page in range(n):
        widgets += [{"kind": "panel", "color": list(c), "box": list(q), "page": page}
                    for q, c in zip(_TINY_QUADRANTS, TINY_SHADES, strict=True)]
        slots = list(_TINY_SLOTS)
        rng.shuffle(slots)
        others = rng.sample([c for c in sorted(COLORS) if c != target], rng.choice((1, 2, 3)))
        for i, c in enumerate([target, *others]):
            turn = "submit" if page == n - 1 else "next"
            widgets.append(_button(f"{c}{page}", c.capitalize(), COLORS[c], slots[i],
                                   turn if c == target else wrong, page=page))
    spec: Spec = {"width": 112, "height": 112, "tolerance": 4, "font_size": 10, "widgets": widgets}
    template = "pages" if wrong == "back" else "chain"
    return template, spec, f"Click the {target} button on each page.", {"submitted": f"{target}{n - 1}"}


def _button(
    name: str, label: str, color: tuple[int, int, int], box: tuple[int, int, int, int], on_click: str, *, page: int = 0
) -> dict[str, Any]:
    return {"kind": "button", "name": name, "label": label, "color": list(color), "box": list(box), "page": page, "on_click": on_click}


def _chain(rng: random.Random) -> Built:
    """``pages`` where a wrong colour costs a step instead of a page: a policy that is right on
    half of its clicks still finishes many tasks within the step limit, and each step it gets
    right more often shortens its trajectories (the preset on which multi-step RL has room)."""
    return _pages(rng, wrong="stay")


_BUILDERS: dict[str, Callable[[random.Random], Built]] = {"tiny": _tiny, "buttons": _buttons, "forms": _forms,
                                                          "pages": _pages, "chain": _chain}
