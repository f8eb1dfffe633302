"""Progress bars on a terminal and silence elsewhere; machine-readable output; `dart replay` subcommands
that still take the old spellings."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import uuid

import pytest

from dart.bus import BusConfig
from dart.cli import build_parser
from tests.metrics.test_sink import history, write_archive


def run_on_a_terminal(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``argv`` with its stdout and stderr on a pseudo-terminal; (exit code, what it showed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal of 100 columns
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                            env={**os.environ, **(env or {})})
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=120), shown.decode(errors="replace")


BAR = [sys.executable, "-c", "from dart.config import progress\nfor _ in progress(range(7), desc='steps'): pass"]


def test_a_bar_shows_on_a_terminal_and_nothing_in_a_pipe():
    rc, shown = run_on_a_terminal(BAR)
    assert rc == 0 and "steps:" in shown and "0/7 [" in shown  # (the bar clears its line when done)
    piped = subprocess.run(BAR, capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stderr == "" and piped.stdout == ""
    forced = subprocess.run(BAR, capture_output=True, text=True, timeout=60, env={**os.environ, "DART_PROGRESS": "1"})
    assert "0/7 [" in forced.stderr
    rc, shown = run_on_a_terminal(BAR, env={"DART_PROGRESS": "0"})
    assert rc == 0 and shown == ""


@pytest.mark.kafka
def test_log_import_shows_its_bar_on_a_terminal_only(bus: BusConfig, tmp_path):
    prefix = f"imp{uuid.uuid4().hex[:8]}"
    write_archive(tmp_path / "log", history(), seed=4, prefix=prefix, partitions=1)
    argv = [sys.executable, "-m", "dart.cli", "log", "import", str(tmp_path / "log"), "--bootstrap", bus.bootstrap,
            "--prefix", prefix]
    rc, shown = run_on_a_terminal(argv)
    assert rc == 0, shown
    assert "import:" in shown and "partition/s]" in shown and "imported 48 records" in shown
    # the same again, into a fresh prefix, through a pipe: the summary line and no bar
    prefix2 = f"imp{uuid.uuid4().hex[:8]}"
    write_archive(tmp_path / "log2", history(), seed=4, prefix=prefix2, partitions=1)
    argv2 = [*argv[:5], str(tmp_path / "log2"), *argv[6:-1], prefix2]
    piped = subprocess.run(argv2, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "imported 48 records" in piped.stdout and "partition/s" not in piped.stderr + piped.stdout


def test_log_ls_and_doctor_speak_json(tmp_path):
    write_archive(tmp_path / "run" / "log", history(), seed=5)
    out = subprocess.run([sys.executable, "-m", "dart.cli", "log", "ls", "--json", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=60)
    rows = json.loads(out.stdout)
    assert sum(r["records"] for r in rows) == 48 and {"topic", "partition", "first", "last", "gaps"} <= set(rows[0])
    doctor = subprocess.run([sys.executable, "-m", "dart.cli", "doctor", "--json", "--bootstrap", "127.0.0.1:1"],
                            capture_output=True, text=True, timeout=120)
    verdict = json.loads(doctor.stdout)
    broker = next(c for c in verdict["checks"] if c["check"] == "broker")
    assert broker["ok"] is False and "dart broker" in broker["fix"] and verdict["ok"] is False
    assert doctor.returncode == 1 and any(c["check"] == "chdb" and c["ok"] for c in verdict["checks"])


@pytest.mark.parametrize(("argv", "command", "fields"), [
    (["replay", "runs/x"], "store", {"target": ["runs/x"]}),
    (["replay", "runs/x", "--until-version", "3"], "store", {"target": ["runs/x"], "until_version": 3}),
    (["replay", "--config", "c.yaml"], "store", {"target": [], "config": "c.yaml"}),
    (["replay"], "store", {"target": []}),
    (["replay", "store", "runs/x"], "store", {"target": ["runs/x"]}),
    (["replay", "decision", "runs/x", "r-1", "4"], "decision", {"rollout_id": "r-1", "step": 4}),
    (["replay", "update", "runs/x", "7"], "update", {"version": 7}),
])
def test_replay_subcommands_and_the_old_spellings(argv, command, fields):
    args = build_parser().parse_args(argv)
    assert args.replay_command == command and args.func.__name__ == f"cmd_replay_{command}"
    assert {k: getattr(args, k) for k in fields} == fields
