"""Synthetic GUI: generator, state machine, renderer, oracle, latency (pure, milliseconds)."""

from __future__ import annotations

import io
import random
import statistics

import pytest
from PIL import Image

from dart.agent.actions import Click, Hotkey, Scroll, Type, Wait
from dart.env.synthetic import (
    PRESETS,
    LatencyConfig,
    apply,
    generate_tasks,
    goal_of,
    initial_state,
    make_task,
    oracle_action,
    oracle_plan,
    render_png,
    sample_latency,
    screen_of,
    signature,
    state_match,
)
from dart.errors import ConfigError


def _run(task, actions):
    spec = screen_of(task)
    state = initial_state(spec)
    for a in actions:
        state = apply(spec, state, a)
    return state


def test_generate_tasks_is_deterministic_and_distinct():
    a = generate_tasks(40, preset="tiny", seed=7)
    b = generate_tasks(40, preset="tiny", seed=7)
    assert a == b
    assert len({t["id"] for t in a}) == 40
    assert generate_tasks(5, preset="tiny", seed=8)[0] != a[0] or len(a) == 40


@pytest.mark.parametrize("preset", PRESETS)
def test_eval_tasks_never_appear_in_training(preset):
    train = generate_tasks(150, preset=preset, seed=0, split="train")
    held = generate_tasks(30, preset=preset, seed=0, split="eval")
    train_sigs = {signature(screen_of(t), goal_of(t)) for t in train}
    assert all(signature(screen_of(t), goal_of(t)) not in train_sigs for t in held)
    assert {t["config"][0]["parameters"]["split"] for t in train} == {"train"}
    assert {t["config"][0]["parameters"]["split"] for t in held} == {"eval"}
    # other seeds cannot smuggle a held-out task into training either
    more = generate_tasks(150, preset=preset, seed=10_000, split="train")
    assert not {t["id"] for t in more} & {t["id"] for t in held}


def test_tasks_are_osworld_shaped():
    t = generate_tasks(1, preset="forms", seed=1)[0]
    assert {"id", "snapshot", "instruction", "source", "config", "evaluator", "related_apps"} <= set(t)
    assert t["domain"] == "synthetic"
    assert t["config"][0]["type"] == "synthetic_screen"
    assert t["evaluator"]["func"] == "synthetic_state_match"
    assert t["evaluator"]["result"] == {"type": "synthetic_state", "path": "/synthetic/state.json"}
    assert t["evaluator"]["expected"]["type"] == "rule"


@pytest.mark.parametrize("preset", PRESETS)
def test_oracle_solves_every_task(preset):
    for task in generate_tasks(80, preset=preset, seed=3) + generate_tasks(
        20, preset=preset, seed=3, split="eval"
    ):
        state = _run(task, oracle_plan(task))
        assert state["done"]
        assert state_match(state, goal_of(task)) == 1.0, task["instruction"]


def test_tiny_preset_fits_a_tiny_model():
    tasks = generate_tasks(200, preset="tiny", seed=0)
    templates = {t["config"][0]["parameters"]["template"] for t in tasks}
    assert templates == {"click_color", "check_then_ok"}
    for t in tasks:
        spec = screen_of(t)
        assert (spec["width"], spec["height"]) == (112, 112)
        targets = [w for w in spec["widgets"] if w["kind"] in ("button", "checkbox")]
        assert 2 <= len(targets) <= 4
        assert all((w["box"][2] - w["box"][0]) * (w["box"][3] - w["box"][1]) >= 40 * 40 for w in targets)
        assert 1 <= len(oracle_plan(t)) <= 2


def test_tiny_quadrants_have_their_own_shade_under_the_widgets_and_are_not_clickable():
    from dart.env.synthetic.generator import TINY_SHADES

    for task in generate_tasks(20, preset="tiny", seed=0):
        spec = screen_of(task)
        img = Image.open(io.BytesIO(render_png(spec, initial_state(spec)))).convert("RGB")
        # (2, 2) lies in the margin of each quadrant, outside every slot (slots start 6 px in).
        for (x, y), shade in zip(((2, 2), (58, 2), (2, 58), (58, 58)), TINY_SHADES, strict=True):
            assert img.getpixel((x, y)) == shade, (task["id"], x, y)
        from dart.env.synthetic.screen import hit_test

        assert hit_test(spec, initial_state(spec), 1.0, 1.0) is None  # under (1, 1) lies only a panel
    # The shades are part of the task: the same screen without them would be another task.
    assert all(sum(w["kind"] == "panel" for w in screen_of(t)["widgets"]) == 4
               for t in generate_tasks(20, preset="tiny", seed=0))


def test_clicks_count_inside_the_grown_hit_box_only():
    task = next(t for t in generate_tasks(50, preset="tiny", seed=0) if "red" in t["instruction"])
    red = next(w for w in screen_of(task)["widgets"] if w.get("name") == "red")
    _x0, y0, x1, y1 = red["box"]
    tol = screen_of(task)["tolerance"]
    assert _run(task, [Click(x=x1 + tol - 0.5, y=(y0 + y1) / 2)])["submitted"] == "red"
    assert _run(task, [Click(x=x1 + tol + 1, y=(y0 + y1) / 2)])["submitted"] != "red"
    # the screen's corner is outside every grown box: nothing happens
    state = _run(task, [Click(x=0, y=0)])
    assert state["submitted"] is None and not state["done"]


def test_wrong_button_ends_the_task_with_score_zero():
    task = next(t for t in generate_tasks(50, preset="tiny", seed=0) if "red" in t["instruction"])
    other = next(w for w in screen_of(task)["widgets"] if w.get("name") not in ("red", None))
    x0, y0, x1, y1 = other["box"]
    state = _run(task, [Click(x=(x0 + x1) / 2, y=(y0 + y1) / 2)])
    assert state["done"] and state_match(state, goal_of(task)) == 0.0
    assert (
        _run(task, [Click(x=(x0 + x1) / 2, y=(y0 + y1) / 2), *oracle_plan(task)])["submitted"]
        == other["name"]
    )


def _center(w):
    x0, y0, x1, y1 = w["box"]
    return Click(x=(x0 + x1) / 2, y=(y0 + y1) / 2)


def _paged(preset: str, seed: int):
    """A ``pages``/``chain`` task, its screen, goal, named colour, page count, and ``on(page,
    right)``: the button of that page with (right) or without the named colour."""
    task = make_task(preset, seed)
    spec, goal = screen_of(task), goal_of(task)
    colour = task["instruction"].split()[2]
    pages = 1 + max(w["page"] for w in spec["widgets"])
    assert 5 <= pages <= 10 and len(oracle_plan(task)) == pages
    assert task["instruction"] == f"Click the {colour} button on each page."

    def on(page, right):
        return next(w for w in spec["widgets"] if w["kind"] == "button" and w["page"] == page
                    and w["name"].startswith(colour) == right)

    return task, spec, goal, colour, pages, on


def test_pages_the_named_colour_turns_the_page_and_a_wrong_button_goes_back():
    task, spec, goal, colour, pages, on = _paged("pages", 3)
    state = _run(task, [_center(on(0, True)), _center(on(1, True))])
    assert state["page"] == 2 and not state["done"]
    state = apply(spec, state, _center(on(2, False)))          # a wrong colour: one page back, not the end
    assert state["page"] == 1 and not state["done"]
    for page in range(1, pages):
        state = apply(spec, state, _center(on(page, True)))
    assert state["done"] and state_match(state, goal) == 1.0    # the last page's colour submits
    # every page has the quadrant shades and 2-4 buttons, one of them the named colour
    for page in range(pages):
        buttons = [w for w in spec["widgets"] if w["page"] == page and w["kind"] == "button"]
        assert 2 <= len(buttons) <= 4 and sum(b["name"].startswith(colour) for b in buttons) == 1
        assert sum(w["kind"] == "panel" and w["page"] == page for w in spec["widgets"]) == 4


def test_chain_a_wrong_colour_costs_a_step_and_nothing_else():
    task, spec, goal, _, pages, on = _paged("chain", 5)
    state = _run(task, [_center(on(0, True)), _center(on(1, True))])
    wrong = on(2, False)
    state = apply(spec, state, _center(wrong))
    assert state["page"] == 2 and not state["done"] and state["pressed"][-1] == wrong["name"]
    for page in range(2, pages):
        state = apply(spec, state, _center(on(page, True)))
    assert state["done"] and state_match(state, goal) == 1.0
    assert len(state["pressed"]) == pages + 1


def test_check_then_ok_needs_both_steps():
    task = next(t for t in generate_tasks(80, preset="tiny", seed=0) if t["instruction"].startswith("Check"))
    plan = oracle_plan(task)
    assert len(plan) == 2
    assert state_match(_run(task, plan[1:]), goal_of(task)) == 0.0  # OK without the box
    assert state_match(_run(task, plan), goal_of(task)) == 1.0


def test_text_fields_type_select_all_and_backspace():
    task = generate_tasks(1, preset="forms", seed=5)[0]
    field = next(w for w in screen_of(task)["widgets"] if w["kind"] == "textfield")
    x0, y0, x1, y1 = field["box"]
    click = Click(x=(x0 + x1) / 2, y=(y0 + y1) / 2)
    name = field["name"]
    assert _run(task, [Type(content="lost")])["values"][name] == ""  # nothing focused
    assert _run(task, [click, Type(content="ab"), Type(content="c\n")])["values"][name] == "abc"
    assert _run(task, [click, Type(content="abc"), Hotkey(keys=("backspace",))])["values"][name] == "ab"
    assert (
        _run(task, [click, Type(content="abc"), Hotkey(keys=("ctrl", "a")), Type(content="Z")])["values"][
            name
        ]
        == "Z"
    )


def test_list_scrolls_within_bounds_and_selects_visible_rows():
    task = generate_tasks(1, preset="forms", seed=2)[0]
    lst = next(w for w in screen_of(task)["widgets"] if w["kind"] == "list")
    x0, y0, x1, y1 = lst["box"]
    down = Scroll(x=(x0 + x1) / 2, y=(y0 + y1) / 2, direction="down")
    state = _run(task, [down] * 10)
    assert state["list_offset"]["city"] == len(lst["items"]) - lst["visible"]
    row_h = (y1 - y0) / lst["visible"]
    state = _run(task, [down, Click(x=x0 + 5, y=y0 + row_h * 0.5)])
    assert state["values"]["city"] == lst["items"][1]
    assert _run(task, [Scroll(x=None, y=None, direction="up")])["list_offset"]["city"] == 0


def test_oracle_recovers_from_detours():
    task = generate_tasks(1, preset="forms", seed=9)[0]
    spec = screen_of(task)
    state = _run(task, [Wait(), Click(x=1, y=1), Hotkey(keys=("tab",)), Type(content="junk")])
    for _ in range(40):
        if state["done"]:
            break
        state = apply(spec, state, oracle_action(task, state))
    assert state_match(state, goal_of(task)) == 1.0


def test_render_is_deterministic_and_shows_state():
    task = next(t for t in generate_tasks(80, preset="tiny", seed=0) if t["instruction"].startswith("Check"))
    spec = screen_of(task)
    s0 = initial_state(spec)
    png0 = render_png(spec, s0)
    assert png0 == render_png(spec, initial_state(spec))
    img = Image.open(io.BytesIO(png0))
    assert img.size == (112, 112)
    s1 = apply(spec, s0, oracle_plan(task)[0])  # the box gets checked
    assert render_png(spec, s1) != png0


def test_unknown_preset_and_bad_spec_are_config_errors():
    with pytest.raises(ConfigError, match="unknown synthetic preset"):
        generate_tasks(1, preset="huge")
    task = make_task("tiny", 0)
    task["config"][0]["parameters"]["screen"]["widgets"][0]["box"] = [5, 5, 1, 1]
    with pytest.raises(ConfigError, match="box"):
        screen_of(task)
    with pytest.raises(ConfigError, match="too few distinct"):
        generate_tasks(100_000, preset="tiny")


@pytest.mark.parametrize("kind", ["lognormal", "pareto"])
def test_latency_distributions_hit_their_median_and_p99(kind):
    cfg = LatencyConfig(kind=kind, median_s=0.5, p99_s=4.0, max_s=1e9)
    rng = random.Random(0)
    xs = sorted(sample_latency(cfg, rng) for _ in range(40_000))
    assert statistics.median(xs) == pytest.approx(0.5, rel=0.05)
    assert xs[int(0.99 * len(xs))] == pytest.approx(4.0, rel=0.1)


def test_latency_fixed_scale_cap_and_validation():
    rng = random.Random(0)
    assert sample_latency(LatencyConfig(kind="fixed", median_s=0.2, scale=0.5), rng) == pytest.approx(0.1)
    assert sample_latency(LatencyConfig(), rng) == 0.0
    capped = LatencyConfig(kind="pareto", median_s=0.1, p99_s=0.2, max_s=0.3)
    assert max(sample_latency(capped, rng) for _ in range(5000)) <= 0.3
    with pytest.raises(ConfigError, match="p99_s"):
        LatencyConfig(kind="lognormal", median_s=1.0, p99_s=0.5)
