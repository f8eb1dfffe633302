"""Failures a person can act on: each case a stranger meets in the first hour, in an empty
directory, is one line naming what is missing and the fix, exit 1 (a failure at run time) or 2 (a
usage error), no traceback (``-v`` adds it), and no directory left behind. Every option of every
command says what it is for."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from dart.cli import build_parser, main

NO_BROKER = "127.0.0.1:1"  # nothing listens on port 1: a broker that is not there

CASES = [
    # (argv, exit status, what stderr must say)
    (["sql", "SELECT 1"], 1, "no store at"),
    (["report"], 1, "no store at"),
    (["trace", "r-1"], 1, "no store at"),
    (["replay"], 1, "no store at"),
    (["replay", "NONEXISTENT"], 1, "no run directory NONEXISTENT"),
    (["replay", "--run", "NONEXISTENT"], 1, "no run directory NONEXISTENT"),
    (["replay", "update", "NONEXISTENT", "3"], 1, "no run directory NONEXISTENT"),
    (["replay", "decision", "NONEXISTENT", "r-1", "0"], 1, "no run directory NONEXISTENT"),
    (["replay", "decision", "--run", "NONEXISTENT", "r-1", "0"], 1, "no run directory NONEXISTENT"),
    (["log", "ls", "missing"], 1, "no archive at missing"),
    (["log", "verify", "missing"], 1, "no archive at missing"),
    (["log", "import", "missing"], 1, "no archive at missing"),
    (["log", "export", "out"], 1, f"no broker answers on {NO_BROKER}"),
    (["tail", "trajectories"], 1, f"no broker answers on {NO_BROKER}"),
    (["tail", "dart.trajectories", "--run", "runs/local"], 1, "no run directory runs/local"),
    (["sql", "SELECT 1", "--run", "runs/local"], 1, "no run directory runs/local"),
    (["doctor", "--run", "runs/local"], 1, "no run directory runs/local"),
    (["eval", "--run", "runs/local"], 1, "no run directory runs/local"),
    (["eval"], 1, "no policy in"),
    (["metrics", "NONEXISTENT"], 1, "no run directory NONEXISTENT"),
    (["tail", "no.such.topic"], 2, "no topic 'no.such.topic' in the catalogue"),
    (["sql", "SELECT 1", "--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),
]


def dart(cwd, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dart.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DART_BOOTSTRAP": NO_BROKER})


@pytest.mark.parametrize(("argv", "code", "says"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_failure_is_one_line_with_the_fix_and_creates_nothing(tmp_path, monkeypatch, capsys, argv, code, says):
    # In this process (`dart` as its console script calls it): a subprocess per case costs ~10 s of imports.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DART_BOOTSTRAP", NO_BROKER)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == code, err
    assert says in err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 1, err
    assert list(tmp_path.iterdir()) == [], "a command only asked to read created something"


def test_verbose_adds_the_traceback(tmp_path):
    out = dart(tmp_path, "-v", "sql", "SELECT 1")
    assert out.returncode == 1 and "Traceback" in out.stderr and "no store at" in out.stderr


def test_replay_update_names_a_flag_that_exists(tmp_path):
    (tmp_path / "run" / "log").mkdir(parents=True)
    out = dart(tmp_path, "replay", "update", "run", "3")
    assert out.returncode == 2 and "--trainer-config" in out.stderr
    args = build_parser().parse_args(["replay", "update", "run", "3", "--trainer-config", "t.yaml"])
    assert str(args.trainer_config) == "t.yaml"


def options_without_help(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    missing.append(f"{path} {name} (the command)")
                missing += options_without_help(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction) and not action.help:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_of_every_command_has_help_text():
    assert options_without_help(build_parser(), "dart") == []
