"""xdesktop pure parts: actions as xdotool argv, key names, task paths, shipped tasks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dart.agent.actions import (
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
from dart.env.tasks import check_pool
from dart.env.xdesktop import PLANS, SETUP_TYPES, UnknownKey, key_combo, keysym, local_tasks, xdotool_argvs
from dart.env.xdesktop.getters import task_file_path
from dart.env.xdesktop.setup import (
    command_of,
    expand_argv,
    office_argv,
    open_argv,
    resolve_path,
    window_pattern,
)
from dart.errors import ConfigError

SCREEN = (1024, 768)


def argvs(action, **kw):
    return xdotool_argvs(action, screen=SCREEN, **kw)


def test_clicks_move_then_press_the_right_button():
    assert argvs(Click(x=10.4, y=20.6)) == [["xdotool", "mousemove", "--sync", "10", "21", "click", "1"]]
    assert argvs(RightSingle(x=1, y=2))[0][-2:] == ["click", "3"]
    assert argvs(LeftDouble(x=1, y=2))[0][-6:] == ["click", "--repeat", "2", "--delay", "60", "1"]


def test_points_are_clamped_to_the_screen():
    assert argvs(Click(x=-50, y=5000))[0][3:5] == ["0", "767"]


def test_drag_presses_moves_through_the_middle_and_releases():
    (cmd,) = argvs(Drag(x=0, y=0, end_x=100, end_y=50))
    assert cmd == ["xdotool", "mousemove", "--sync", "0", "0", "mousedown", "1", "mousemove", "--sync", "50", "25",
                   "mousemove", "--sync", "100", "50", "mouseup", "1"]


@pytest.mark.parametrize(("keys", "combo"), [
    (("ctrl", "c"), "ctrl+c"),
    (("ctrl", "shift", "s"), "ctrl+shift+s"),
    (("enter",), "Return"),
    (("esc",), "Escape"),
    (("pagedown",), "Next"),
    (("PageUp",), "Prior"),
    (("alt", "f4"), "alt+F4"),
    (("ctrl+s",), "ctrl+s"),
    (("win",), "super"),
    (("backspace",), "BackSpace"),
    (("ctrl", "="), "ctrl+equal"),
    (("shift", "Tab"), "shift+Tab"),
])
def test_ui_tars_key_names_map_to_x_keysyms(keys, combo):
    assert key_combo(keys) == combo
    assert argvs(Hotkey(keys=keys)) == [["xdotool", "key", "--clearmodifiers", combo]]


def test_unknown_keys_are_refused_not_passed_through():
    for bad in ("ctrl+bogus", "--window", "rm -rf /", "é"):
        with pytest.raises(UnknownKey):
            keysym(bad) if "+" not in bad else key_combo((bad,))
    with pytest.raises(UnknownKey):
        key_combo(())


def test_typed_text_follows_a_double_dash_and_newlines_press_return():
    cmds = argvs(Type(content="--help me\nline two\n"), type_delay_ms=7)
    assert cmds == [
        ["xdotool", "type", "--clearmodifiers", "--delay", "7", "--", "--help me"],
        ["xdotool", "key", "--clearmodifiers", "Return"],
        ["xdotool", "type", "--clearmodifiers", "--delay", "7", "--", "line two"],
        ["xdotool", "key", "--clearmodifiers", "Return"],
    ]
    assert argvs(Type(content="")) == []


def test_scroll_with_and_without_a_point():
    assert argvs(Scroll(x=5, y=6, direction="down"), scroll_clicks=3) == [
        ["xdotool", "mousemove", "--sync", "5", "6", "click", "--repeat", "3", "--delay", "10", "5"]]
    assert argvs(Scroll(direction="left"))[0][1:] == ["click", "--repeat", "5", "--delay", "10", "6"]


def test_actions_without_input_give_no_commands():
    for a in (Wait(), Finished(content="x"), InvalidAction(reason="r")):
        assert argvs(a) == []


def test_task_paths_live_in_the_slot_home():
    home = Path("/tmp/slot/home")
    assert resolve_path("~/a.txt", home) == home / "a.txt"
    assert resolve_path("/home/user/docs/b.xlsx", home) == home / "docs/b.xlsx"
    assert resolve_path("rel.txt", home) == home / "rel.txt"
    assert resolve_path("/etc/hostname", home) == Path("/etc/hostname")
    assert expand_argv(["cat", "~/a.txt", "-n"], home) == ["cat", str(home / "a.txt"), "-n"]


def test_office_always_gets_the_slot_profile():
    prof = Path("/tmp/slot/lo")
    argv = office_argv(["soffice", "--calc", "x.xlsx"], prof)
    assert argv[0] == "soffice" and f"-env:UserInstallation={prof.as_uri()}" in argv and "--norestore" in argv
    assert argv[-2:] == ["--calc", "x.xlsx"]
    assert office_argv(["mousepad", "a"], prof) == ["mousepad", "a"]
    assert open_argv(Path("/h/t.ods"), prof)[-2:] == ["--calc", "/h/t.ods"]
    assert open_argv(Path("/h/t.txt"), prof) == ["mousepad", "/h/t.txt"]


def test_commands_are_argv_lists_never_shell_strings():
    assert command_of({"command": "echo 'a b' c"}, "x") == ["echo", "a b", "c"]
    assert command_of({"command": ["ls", "-l"]}, "x") == ["ls", "-l"]
    with pytest.raises(ConfigError):
        command_of({"command": 5}, "x")


def test_gold_files_cannot_leave_the_tasks_folder():
    assert task_file_path("files/fox_gold.txt").is_file()
    with pytest.raises(ConfigError, match="outside"):
        task_file_path("../../../../etc/passwd")


def test_shipped_tasks_load_have_plans_and_run_on_this_backend():
    from dart.env.evaluators import capabilities
    from dart.env.xdesktop import register_evaluators

    register_evaluators()
    tasks = local_tasks()
    assert len(tasks) >= 6
    assert {t.id for t in tasks} == set(PLANS)
    report = check_pool(tasks, capabilities(SETUP_TYPES))
    assert report.ok, report.problems()
    funcs = {f for t in tasks for f in t.evaluator.funcs}
    assert {"compare_text_file", "compare_table", "exact_match", "check_include_exclude"} <= funcs


def test_gimps_window_is_found_with_or_without_an_image_but_not_its_splash():
    """Titles GIMP 2.10 showed on Xvfb while opening shapes.png (polled every 20 ms): the splash,
    the plain title for ~0.1 s, then the image's. A search for the plain title alone missed it
    in CI, twice, and the task's setup waited 120 s for nothing."""
    pattern = window_pattern("GNU Image Manipulation Program")
    image = "[shapes] (imported)-1.0 (RGB color 8-bit gamma integer, GIMP built-in sRGB, 1 layer) 200x120 \u2013 GIMP"
    assert re.search(pattern, image)
    assert re.search(pattern, "GNU Image Manipulation Program")
    assert not re.search(pattern, "GIMP Startup")
    assert not re.search(pattern, "gimp.txt - Mousepad")
    assert window_pattern("Google Chrome") == "(Google\\ Chrome|Chromium)"
