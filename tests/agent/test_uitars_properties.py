"""Properties of the UI-TARS parser: it never raises, and parse(render(a)) == a."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart.agent.actions import (
    CallUser,
    Click,
    Drag,
    Finished,
    Hotkey,
    InvalidAction,
    LeftDouble,
    RightSingle,
    Scroll,
    Type,
    Wait,
)
from dart.agent.uitars import Frame, parse_actions, parse_response, render_action, render_response
from dart.agent.uitars import _parse_response as parse_strict  # the parser without its safety net

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # examples: the profile (tests/conftest.py)
SCREENS = st.sampled_from([(1920, 1080), (1280, 720), (1366, 768), (800, 600), (3840, 2160), (640, 1136)])
CONVENTIONS = st.sampled_from(["qwen25vl", "qwen2vl"])

# Near-miss syntax: fragments of real action text glued together at random.
FRAGMENTS = st.sampled_from(
    [
        "Action:", "Thought:", "Reflection:", "Action_Summary:", "click(", "type(", "drag(", "scroll(",
        "hotkey(", "finished(", "call_user()", "wait()", "start_box=", "end_box=", "content=", "key=",
        "direction=", "'", '"', "\\", "\\'", "\\n", "(", ")", ",", " ", "\n", "\n\n", "=", "<|box_start|>",
        "<|box_end|>", "<point>", "</point>", "<bbox>", "</bbox>", "(12,34)", "1 2", "12, 34, 56, 78",
        "9" * 400, "-1", "1e309", "中文", "I've", "<think>", "</think>", "<|im_end|>", "up", "'down'",
    ]
)  # fmt: skip
NEAR_MISS = st.lists(FRAGMENTS, max_size=40).map("".join)


@FAST
@given(text=st.one_of(st.text(max_size=300), NEAR_MISS), screen=SCREENS, convention=CONVENTIONS)
def test_parser_never_raises_and_always_returns_an_action(text, screen, convention):
    r = parse_strict(text, Frame.of(screen, convention))
    assert r.actions
    for a in r.actions:
        if isinstance(a, InvalidAction):
            assert a.reason
        for attr in ("x", "y", "end_x", "end_y"):
            v = getattr(a, attr, None)
            if v is not None:
                assert math.isfinite(v)
                limit = screen[0] if attr in ("x", "end_x") else screen[1]
                assert 0 <= v <= limit - 1


def _grid_point(frame: Frame):
    """Screen points exactly on the model grid: they survive render -> parse bit for bit."""
    return st.tuples(
        st.integers(0, frame.model_w - 1).map(lambda mx: mx * frame.screen_w / frame.model_w),
        st.integers(0, frame.model_h - 1).map(lambda my: my * frame.screen_h / frame.model_h),
    ).filter(lambda p: p[0] <= frame.screen_w - 1 and p[1] <= frame.screen_h - 1)


def _any_point(frame: Frame):
    return st.tuples(
        st.floats(0, frame.screen_w - 1, allow_nan=False), st.floats(0, frame.screen_h - 1, allow_nan=False)
    )


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
KEYS = st.lists(
    st.sampled_from(["ctrl", "shift", "alt", "a", "enter", "f5", "super", "+"]), min_size=1, max_size=3
)


def _actions(points):
    return st.one_of(
        points.map(lambda p: Click(x=p[0], y=p[1])),
        points.map(lambda p: LeftDouble(x=p[0], y=p[1])),
        points.map(lambda p: RightSingle(x=p[0], y=p[1])),
        st.tuples(points, points).map(
            lambda pp: Drag(x=pp[0][0], y=pp[0][1], end_x=pp[1][0], end_y=pp[1][1])
        ),
        KEYS.map(lambda ks: Hotkey(keys=tuple(ks))),
        TEXT.map(lambda s: Type(content=s)),
        st.tuples(points, st.sampled_from(["up", "down", "left", "right"])).map(
            lambda pd: Scroll(x=pd[0][0], y=pd[0][1], direction=pd[1])
        ),
        st.sampled_from(["up", "down"]).map(lambda d: Scroll(direction=d)),
        st.just(Wait()),
        st.just(CallUser()),
        TEXT.map(lambda s: Finished(content=s)),
    )


@st.composite
def _frame_and_actions(draw, *, on_grid: bool):
    screen, convention = draw(SCREENS), draw(CONVENTIONS)
    frame = Frame.of(screen, convention)
    points = _grid_point(frame) if on_grid else _any_point(frame)
    return screen, convention, draw(st.lists(_actions(points), min_size=1, max_size=4))


@FAST
@given(case=_frame_and_actions(on_grid=True), thought=st.none() | TEXT.filter(lambda t: "Action" not in t))
def test_render_then_parse_is_identity_on_the_model_grid(case, thought):
    screen, convention, actions = case
    text = render_response(thought, actions, screen=screen, convention=convention)
    r = parse_response(text, screen=screen, convention=convention)
    assert r.actions == actions
    if thought is not None and thought.strip() and "\n" not in thought and ":" not in thought:
        assert r.thought == thought.strip()


def _close(a, b, tol: float) -> bool:
    if type(a) is not type(b):
        return False
    for attr in ("x", "y", "end_x", "end_y"):
        va, vb = getattr(a, attr, None), getattr(b, attr, None)
        if (va is None) != (vb is None) or (va is not None and abs(va - vb) > tol):
            return False
    rest = {"x", "y", "end_x", "end_y"}
    return all(getattr(a, f) == getattr(b, f) for f in a.__slots__ if f not in rest)


@FAST
@given(case=_frame_and_actions(on_grid=False))
def test_render_then_parse_is_within_one_pixel_anywhere(case):
    screen, convention, actions = case
    frame = Frame.of(screen, convention)
    # Rounding to the model grid moves a point by at most half a model unit: under a pixel for
    # qwen25vl (the resized image is about the screen's size); 1.92 px on a 4K screen for qwen2vl.
    tol = max(frame.screen_w / frame.model_w, frame.screen_h / frame.model_h) / 2 + 1e-9
    if convention == "qwen25vl" or screen[0] <= 2000:
        assert tol <= 1.0
    for a in actions:
        [b] = parse_actions(
            render_action(a, screen=screen, convention=convention), screen=screen, convention=convention
        )
        assert _close(a, b, tol), (a, b)
