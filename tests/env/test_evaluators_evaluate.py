"""evaluate_task: getters through EnvAccess, conj rules, the infeasible rule, clamping."""

from __future__ import annotations

import itertools

import pytest

from dart.agent.actions import CallUser, Finished
from dart.env.backend import CommandResult
from dart.env.evaluators import (
    SUPPORTED_GETTERS,
    SUPPORTED_METRICS,
    capabilities,
    combine,
    command_argv,
    evaluate_task,
    register_getter,
    register_metric,
)
from dart.env.tasks import Task, load_task, unsupported_parts
from dart.errors import ConfigError, EnvError
from tests.conftest import SHARED

EXAMPLES = SHARED / "data" / "osworld" / "examples"
_names = itertools.count()


class InMemoryEnv:
    """An EnvAccess over a dict of files and scripted command outputs; records every call."""

    def __init__(
        self, files: dict[str, bytes] | None = None, outputs: dict[tuple[str, ...], str] | None = None
    ):
        self.files = files or {}
        self.outputs = outputs or {}
        self.calls: list[tuple] = []

    async def read_file(self, path: str) -> bytes:
        self.calls.append(("read_file", path))
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    async def run_command(self, argv: list[str], *, timeout_s: float = 30.0) -> CommandResult:
        self.calls.append(("run_command", tuple(argv), timeout_s))
        out = self.outputs.get(tuple(argv))
        if out is None:
            return CommandResult(returncode=127, stdout="", stderr=f"{argv[0]}: not found")
        return CommandResult(returncode=0, stdout=out)


class BrokenEnv(InMemoryEnv):
    async def read_file(self, path: str) -> bytes:
        raise EnvError("guest agent unreachable")


def task(evaluator: dict, tid: str = "t") -> Task:
    return Task.from_dict({"id": tid, "instruction": "i", "evaluator": evaluator})


def fixed(score: float) -> str:
    """Register a metric that always returns ``score``; its (unique) name."""
    name = f"test_fixed_{next(_names)}"
    register_metric(name)(lambda result, expected, **o: score)
    return name


def test_builtin_registries_cover_the_required_names():
    assert {
        "compare_text_file",
        "exact_match",
        "check_include_exclude",
        "compare_table",
        "infeasible",
    } <= set(SUPPORTED_METRICS)
    assert {"vm_file", "vm_command_line", "rule"} <= set(SUPPORTED_GETTERS)


def test_registries_are_open_and_refuse_accidental_shadowing():
    name = fixed(0.5)
    assert name in SUPPORTED_METRICS and name in capabilities(()).metrics
    with pytest.raises(ConfigError, match="already registered"):
        register_metric(name)(lambda r, e: 1.0)

    @register_getter(f"{name}_getter")
    async def g(env, params, ctx):
        return params["v"]

    assert f"{name}_getter" in SUPPORTED_GETTERS


@pytest.mark.parametrize(
    ("scores", "conj", "total"),
    [
        ([1.0, 0.5], "and", 0.75),
        ([1.0, 0.0], "and", 0.0),
        ([0.0, 0.5], "or", 0.5),
        ([0.0, 0.0], "or", 0.0),
        ([0.2, 1.0], "or", 1.0),
    ],
)
async def test_conj_and_is_zero_if_any_zero_else_mean_or_is_max(scores, conj, total):
    assert combine(scores, conj) == total
    ev = {"func": [fixed(s) for s in scores], "conj": conj}
    score, details = await evaluate_task(task(ev), InMemoryEnv(), final_action=None)
    assert score == pytest.approx(total)
    assert details["conj"] == conj


async def test_and_stops_at_the_first_zero_without_fetching_the_rest():
    env = InMemoryEnv()
    ev = {
        "func": [fixed(0.0), fixed(1.0)],
        "result": [None, {"type": "vm_file", "path": "/never"}],
    }
    score, details = await evaluate_task(task(ev), env, final_action=None)
    assert score == 0.0 and details["decided_early"] and env.calls == []


@pytest.mark.parametrize(("raw", "clamped"), [(1.7, 1.0), (-0.3, 0.0), (float("nan"), 0.0), (0.25, 0.25)])
async def test_scores_are_clamped_into_unit_interval(raw, clamped):
    score, _ = await evaluate_task(task({"func": fixed(raw)}), InMemoryEnv(), final_action=None)
    assert score == clamped


async def test_infeasible_task_file_scores_call_user_only():
    t = load_task(EXAMPLES / "chrome" / "3720f614-37fd-4d04-8a6b-76f54f8c222d.json")
    assert t.evaluator.funcs == ("infeasible",)
    assert (await evaluate_task(t, InMemoryEnv(), final_action=CallUser()))[0] == 1.0
    assert (await evaluate_task(t, InMemoryEnv(), final_action=None))[0] == 0.0  # step limit ran out
    assert (await evaluate_task(t, InMemoryEnv(), final_action=Finished(content="done")))[0] == 0.0


async def test_call_user_on_a_feasible_task_is_zero_without_touching_the_env():
    env = InMemoryEnv(files={"/a.txt": b"x"})
    ev = {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": "/a.txt"},
        "expected": {"type": "vm_file", "path": "/a.txt"},
    }
    score, details = await evaluate_task(task(ev), env, final_action=CallUser())
    assert score == 0.0 and "call_user" in details["reason"] and env.calls == []
    assert (await evaluate_task(task(ev), env, final_action=Finished()))[0] == 1.0


async def test_vm_file_missing_result_scores_zero_but_env_failure_raises():
    ev = {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": "/out.txt", "dest": "out.txt"},
        "expected": {"type": "vm_file", "path": "/gold.txt"},
    }
    env = InMemoryEnv(files={"/gold.txt": b"gold"})
    assert (await evaluate_task(task(ev), env, final_action=None))[0] == 0.0
    env.files["/out.txt"] = b"gold"
    assert (await evaluate_task(task(ev), env, final_action=None))[0] == 1.0
    with pytest.raises(EnvError, match="unreachable"):
        await evaluate_task(task(ev), BrokenEnv(), final_action=None)


async def test_vm_file_multi_gives_picks_files():
    got = []
    name = f"test_capture_{next(_names)}"

    @register_metric(name)
    def capture(result, expected, **o):
        got.append(result)
        return 1.0

    env = InMemoryEnv(files={"/a": b"A", "/c": b"C"})
    ev = {"func": [name, name], "result": [
        {"type": "vm_file", "multi": True, "path": ["/a", "/b", "/c"], "dest": ["a", "b", "c"]},
        {"type": "vm_file", "multi": "true", "path": ["/a", "/c"], "dest": ["a", "c"], "gives": [1]},
    ]}  # fmt: skip
    await evaluate_task(task(ev), env, final_action=None)
    assert [None if f is None else f.data for f in got[0]] == [b"A", None, b"C"]
    assert got[1].data == b"C" and got[1].path == "/c"


def test_command_argv_never_runs_a_string_through_a_host_shell():
    assert command_argv("which spotify") == ["which", "spotify"]
    assert command_argv("grep -q 'conda initialize' ~/.bashrc") == [
        "grep",
        "-q",
        "conda initialize",
        "~/.bashrc",
    ]
    assert command_argv(["ls", "/home/user/Desktop", "|", "grep", "x"]) == [
        "ls",
        "/home/user/Desktop",
        "|",
        "grep",
        "x",
    ]
    # The task file's own shell flag: bash inside the environment, as list-form tasks spell it.
    assert command_argv("a | b", shell=True) == ["/bin/bash", "-c", "a | b"]
    assert command_argv("a | b", shell="true") == ["/bin/bash", "-c", "a | b"]
    for bad in ("", "unclosed 'quote", [], ["ls", 3]):
        with pytest.raises(ConfigError):
            command_argv(bad)  # type: ignore[arg-type]


async def test_real_osworld_exact_match_task_over_command_output():
    t = load_task(EXAMPLES / "multi_apps" / "869de13e-bef9-4b91-ba51-f6708c40b096.json")
    expected = [e.params["rules"]["expected"] for e in t.evaluator.expected]
    outputs = {tuple(r.params["command"]): out for r, out in zip(t.evaluator.results, expected, strict=True)}
    env = InMemoryEnv(outputs=outputs)
    score, details = await evaluate_task(t, env, final_action=Finished())
    assert score == 1.0 and [m["score"] for m in details["metrics"]] == [1.0, 1.0, 1.0]
    assert [c[1][0] for c in env.calls] == ["ls", "ls", "ls"]
    env.outputs[next(iter(outputs))] = "wrong\n"
    assert (await evaluate_task(t, env, final_action=Finished()))[0] == 0.0


async def test_real_osworld_include_exclude_task_with_shell_string():
    t = load_task(EXAMPLES / "gimp" / "a746add2-cab0-4740-ac36-c3769d9bfb46.json")
    cmd = t.evaluator.results[0].params["command"]
    env = InMemoryEnv(outputs={("/bin/bash", "-c", cmd): "(filters-vignette)\n"})
    assert (await evaluate_task(t, env, final_action=Finished()))[0] == 1.0
    assert env.calls[0][2] == 60.0


def test_capabilities_from_registries_reject_what_is_not_registered():
    caps = capabilities({"launch", "sleep", "execute", "activate_window"})
    t = load_task(EXAMPLES / "libreoffice_calc" / "01b269ae-2111-4a07-81fd-3fcd711993b0.json")
    assert unsupported_parts(t, caps) == ["setup:download", "setup:open"]
    drive = next(p for p in sorted((EXAMPLES / "multi_apps").glob("*.json")) if '"googledrive_file"' in p.read_text())
    assert "getter:googledrive_file" in unsupported_parts(load_task(drive), caps)
