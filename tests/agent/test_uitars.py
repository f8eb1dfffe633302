"""UI-TARS parser: every real output in outputs.json, each syntax form, both conventions."""

from __future__ import annotations

import json

import pytest

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
from dart.agent.uitars import Frame, parse_actions, parse_response, render_action, smart_resize
from dart.errors import ConfigError
from tests.conftest import SHARED

OUTPUTS = SHARED / "data" / "uitars" / "outputs.json"
"""Real model outputs no one here wrote (``$DART_SHARED``, else ``shared/`` beside the repository)."""
SCREEN = (1920, 1080)


def _cases() -> list[dict]:
    return json.loads(OUTPUTS.read_text())["cases"]


def _as_expected(action) -> dict:
    """An action in outputs.json's vocabulary."""
    d: dict = {"type": action.kind}
    match action:
        case Click() | LeftDouble() | RightSingle():
            d["point"] = [action.x, action.y]
        case Drag():
            d["point"], d["end_point"] = [action.x, action.y], [action.end_x, action.end_y]
        case Hotkey():
            d["key"] = " ".join(action.keys)
        case Type() | Finished():
            d["content"] = action.content
        case Scroll():
            d["direction"] = action.direction
            if action.x is not None:
                d["point"] = [action.x, action.y]
    return d


def test_outputs_file_holds_21_cases_on_1920x1080():
    data = json.loads(OUTPUTS.read_text())
    assert len(data["cases"]) == 21
    assert tuple(data["screen"]) == SCREEN
    assert smart_resize(1080, 1920) == (data["resized"][1], data["resized"][0])


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["text"][-40:])
def test_every_real_output_parses_to_its_expected_actions(case):
    got = [_as_expected(a) for a in parse_actions(case["text"], screen=SCREEN)]
    want = case["expected"]
    assert [g["type"] for g in got] == [w["type"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w), (g, w)
        for key in w:
            if key in ("point", "end_point"):
                # expected values are rounded to 0.1 px
                assert g[key] == pytest.approx(w[key], abs=0.051), (key, g, w)
            else:
                assert g[key] == w[key]


def test_smart_resize_matches_qwen25vl_rule():
    assert smart_resize(1080, 1920) == (1092, 1932)
    assert smart_resize(28, 28) == (280, 280)  # below min_pixels: scaled up to 100 patches
    h, w = smart_resize(4000, 8000)  # above max_pixels: scaled down onto the grid
    assert h % 28 == 0 and w % 28 == 0 and h * w <= 16384 * 28 * 28
    assert smart_resize(768, 1366) == (756, 1372)
    with pytest.raises(ConfigError):
        smart_resize(10, 5000)
    with pytest.raises(ConfigError):
        smart_resize(0, 100)


def test_qwen2vl_convention_is_relative_thousandths():
    [a] = parse_actions("Action: click(start_box='(500,250)')", screen=SCREEN, convention="qwen2vl")
    assert (a.x, a.y) == (960.0, 270.0)


def test_bad_convention_or_screen_is_a_config_error():
    with pytest.raises(ConfigError, match="convention"):
        parse_actions("Action: wait()", screen=SCREEN, convention="qwen3")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Frame.of((0, 1080))


@pytest.mark.parametrize(
    "box",
    [
        "(966,546)",
        "<|box_start|>(966,546)<|box_end|>",
        "<point>966 546</point>",
        "956, 536, 976, 556",
        "(956,536,976,556)",
        "<bbox>956 536 976 556</bbox>",
        "[966, 546]",
        "<|box_start|>(956,536),(976,556)<|box_end|>",
    ],
)
def test_every_point_and_box_form_means_the_same_point(box):
    [a] = parse_actions(f"Action: click(start_box='{box}')", screen=SCREEN)
    assert isinstance(a, Click)
    assert (a.x, a.y) == pytest.approx((966 * 1920 / 1932, 546 * 1080 / 1092))


def test_headers_are_split_into_thought_reflection_and_summary():
    r = parse_response(
        "Reflection: it opened.\nAction_Summary: type the url.\nAction: type(content='a.com\\n')",
        screen=SCREEN,
    )
    assert (r.thought, r.reflection, r.summary) == (None, "it opened.", "type the url.")
    assert r.actions == [Type(content="a.com\n")]
    r = parse_response("<think>\nhmm\n</think>\nThought: go\nAction: wait()", screen=SCREEN)
    assert r.thought == "go" and r.actions == [Wait()]


def test_several_actions_separated_by_blank_lines():
    text = "Thought: t\nAction: hotkey(key='ctrl a')\n\ntype(content='x')\n\nclick(start_box='(0,0)')"
    assert parse_actions(text, screen=SCREEN) == [
        Hotkey(keys=("ctrl", "a")),
        Type(content="x"),
        Click(x=0, y=0),
    ]


@pytest.mark.parametrize(
    ("call", "content"),
    [
        ("type(content='it\\'s')", "it's"),
        ("type(content=\"say 'hi'\")", "say 'hi'"),
        ("type(content='I've got \"quotes\" and ) parens')", 'I\'ve got "quotes" and ) parens'),
        ("type(content='中文输入')", "中文输入"),
        ("type(content='line\\nnext\\n')", "line\nnext\n"),
        ("type(content='back\\\\slash')", "back\\slash"),
        ("type(content='')", ""),
    ],
)
def test_type_content_keeps_quotes_apostrophes_escapes_and_unicode(call, content):
    assert parse_actions(f"Action: {call}", screen=SCREEN) == [Type(content=content)]


def test_aliases_and_bare_calls():
    assert parse_actions("Action: press(key='enter')", screen=SCREEN) == [Hotkey(keys=("enter",))]
    assert parse_actions("Action: hotkey(key='ctrl+shift+t')", screen=SCREEN) == [
        Hotkey(keys=("ctrl", "shift", "t"))
    ]
    [s] = parse_actions("Action: select(start_box='(0,0)', end_box='(1932,1092)')", screen=SCREEN)
    assert isinstance(s, Drag) and (s.end_x, s.end_y) == (1919.0, 1079.0)  # clamped onto the screen
    assert parse_actions("call_user()", screen=SCREEN) == [CallUser()]
    assert parse_actions("Action: finished()", screen=SCREEN) == [Finished(content="")]
    [s] = parse_actions("Action: scroll(start_box=(966,546), direction='UP')", screen=SCREEN)
    assert isinstance(s, Scroll) and s.direction == "up"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Thought: nothing to do", "no 'Action:'"),
        ("Action:   ", "empty 'Action:'"),
        ("Action: hover(start_box='(1,2)')", "unknown action 'hover'"),
        ("Action: click(start_box='(1,2)'", "missing ')'"),
        ("Action: click(start_box='(1,2)", "unterminated"),
        ("Action: click(start_box='(1,2,3)')", "2 numbers"),
        ("Action: click(start_box='(-5,2)')", "not a point"),
        ("Action: click()", "needs start_box"),
        ("Action: scroll(direction='sideways')", "direction"),
        ("Action: hotkey(key='')", "without keys"),
        ("Action: click(start_box='(1,2)', start_box='(3,4)')", "twice"),
        ("Action: import os; os.system('rm -rf /')", "expected an action call"),
    ],
)
def test_unreadable_text_is_an_invalid_action_with_a_reason(text, reason):
    actions = parse_actions(text, screen=SCREEN)
    assert len(actions) >= 1
    assert isinstance(actions[0], InvalidAction)
    assert reason in actions[0].reason


def test_garbage_between_actions_is_invalid_but_the_others_survive():
    text = "Action: click(start_box='(10,10)')\n\n??? not a call\n\nwait()"
    a, b, c = parse_actions(text, screen=SCREEN)
    assert isinstance(a, Click) and isinstance(b, InvalidAction) and b.text == "??? not a call"
    assert c == Wait()


def test_non_text_input_is_invalid_not_a_crash():
    [a] = parse_actions(None, screen=SCREEN)  # type: ignore[arg-type]
    assert isinstance(a, InvalidAction) and "NoneType" in a.reason


def test_render_writes_integer_model_coordinates():
    assert render_action(Click(x=960.0, y=540.0), screen=SCREEN) == "click(start_box='(966,546)')"
    assert render_action(Type(content="it's\n"), screen=SCREEN) == "type(content='it\\'s\\n')"
    assert render_action(Scroll(direction="down"), screen=SCREEN) == "scroll(direction='down')"
    assert render_action(CallUser(), screen=SCREEN, convention="qwen2vl") == "call_user()"


def test_repeated_action_headers_and_full_width_colons_keep_every_action():
    text = "Thought： 先点击\nAction: click(start_box='(966,546)')\nAction: type(content='hi')"
    r = parse_response(text, screen=SCREEN)
    assert r.thought == "先点击"
    assert [a.kind for a in r.actions] == ["click", "type"]
