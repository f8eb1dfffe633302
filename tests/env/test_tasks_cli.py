"""`dart tasks check` and `dart actions parse`, run in-process through the real entry point."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

import dart.cli
from dart.cli import main
from dart.env import cli as env_cli
from dart.env.cli import DEFAULT_EXAMPLES

OSWORLD = Path(__file__).resolve().parents[3] / "shared" / "data" / "osworld"


@pytest.fixture(autouse=True)
def only_env_commands(monkeypatch):
    """The real ``dart`` entry point with only this package's commands (other packages' CLIs
    are not this test's business)."""
    monkeypatch.setattr(dart.cli, "command_modules", lambda: [env_cli])


def test_default_examples_folder_is_found_relative_to_the_repo():
    assert DEFAULT_EXAMPLES.resolve() == (OSWORLD / "examples").resolve()
    assert DEFAULT_EXAMPLES.is_dir()


def test_dart_trainset_is_refused_against_test_all(capsys):
    rc = main(
        [
            "tasks",
            "check",
            str(OSWORLD / "dart_trainset_181.json"),
            "--holdout",
            str(OSWORLD / "test_all.json"),
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 1
    assert "181 tasks on backend libvirt" in out
    assert "held-out overlap" in out and "181 of 181" in out
    assert "REFUSED" in err and "181 tasks are in the held-out test list" in err


def test_check_lists_unsupported_parts_per_task_and_a_summary(capsys):
    rc = main(["tasks", "check", str(OSWORLD / "examples" / "os"), "--backend", "xdesktop"])
    out, _ = capsys.readouterr()
    assert rc == 1
    # The counts depend on the setup steps the xdesktop backend declares; the sum does not.
    m = re.search(r"24 tasks on backend xdesktop: (\d+) runnable, (\d+) need parts not supported yet", out)
    assert m and int(m[1]) + int(m[2]) == 24 and int(m[2]) > 0
    # A GNOME terminal's scrollback: no GNOME on a local X desktop.
    assert "os/13584542-872b-42d8-b299-866967b5c3ef: getter:vm_terminal_output" in out
    assert re.search(r"^\s+\d+  getter:vm_terminal_output$", out, re.MULTILINE)


def test_check_accepts_a_supported_pool_and_single_files(tmp_path, capsys):
    task = {
        "id": "ok-1",
        "instruction": "say hi",
        "config": [{"type": "launch", "parameters": {"command": ["xterm"]}}],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "echo hi"},
                      "expected": {"type": "rule", "rules": {"expected": "hi\n"}}},
    }  # fmt: skip
    f = tmp_path / "ok-1.json"
    f.write_text(json.dumps(task))
    rc = main(
        ["tasks", "check", str(f), "--backend", "xdesktop", "--holdout", str(OSWORLD / "test_all.json")]
    )
    out, _ = capsys.readouterr()
    assert rc == 0, out
    assert "1 runnable" in out and "pool OK" in out and "0 of 1 tasks" in out


def test_check_of_a_missing_path_is_a_clean_error(capsys):
    assert main(["tasks", "check", "/nonexistent/tasks"]) == 2
    assert "no task file or folder" in capsys.readouterr().err


def test_actions_parse_reads_stdin_and_prints_wire_records(monkeypatch, capsys):
    text = "Thought: go\nAction: click(start_box='(966,546)')\n\ntype(content='hi\\n')\n\nfly()"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["actions", "parse", "--screen", "1920x1080"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in records] == ["click", "type", "invalid"]
    assert (records[0]["x"], records[0]["y"]) == (960.0, 540.0)
    assert records[1]["text"] == "hi\n"
    assert "unknown action 'fly'" in records[2]["text"]


def test_actions_parse_qwen2vl_and_full_output(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("Reflection: r\nAction: click(start_box='(500,500)')"))
    assert main(["actions", "parse", "--screen", "1000x800", "--convention", "qwen2vl", "--full"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reflection"] == "r" and out["thought"] is None
    assert (out["actions"][0]["x"], out["actions"][0]["y"]) == (500.0, 400.0)


@pytest.mark.parametrize("bad", ["1920", "axb", "0x10"])
def test_actions_parse_rejects_a_bad_screen(bad, capsys):
    with pytest.raises(SystemExit):
        main(["actions", "parse", "--screen", bad])
    assert "screen" in capsys.readouterr().err


def test_check_uses_the_backends_own_setup_types_and_evaluators(tmp_path, capsys):
    synthetic = pytest.importorskip("dart.env.synthetic")
    for t in synthetic.generate_tasks(3, preset="tiny", seed=0):
        (tmp_path / f"{t['id']}.json").write_text(json.dumps(t))
    assert main(["tasks", "check", str(tmp_path), "--backend", "synthetic"]) == 0
    assert "3 runnable" in capsys.readouterr().out
    assert main(["tasks", "check", str(tmp_path), "--backend", "xdesktop"]) == 1
    assert f"setup:{synthetic.SETUP_TYPE}" in capsys.readouterr().out
