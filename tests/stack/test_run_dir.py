"""`--run RUN_DIR` during a run: `make run`'s command (`dart up`, here with a tiny recipe) in a
fresh directory, and while it runs `dart tail --run`, `dart sql --run` and `dart report --run`
answer from what it wrote in runs/local; after it, the store still answers and tail says the run
has stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.slow]

TINY = {
    "run_id": "local", "workdir": "runs/local", "rl_minutes": 6, "max_updates": 50, "evaluate": False,
    "experience_tasks": 0,
    "recipe": {"train_tasks": 6, "eval_tasks": 2, "sft_demos": 4, "sft_steps": 2, "tasks_per_update": 1,
               "group_size": 2, "max_new_tokens": 16},
    "env": {"slots": 4},
}


def dart(cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dart.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"dart up exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
        time.sleep(1.0)


def test_tail_sql_and_report_answer_with_run_during_a_run(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen([sys.executable, "-m", "dart.cli", "up", "tiny.yaml"], cwd=tmp_path, stdout=log,
                          stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    run = tmp_path / "runs" / "local"
    try:
        wait_for(lambda: (run / "run.json").exists(), 300, "runs/local/run.json", up)
        info = json.loads((run / "run.json").read_text())
        assert info["prefix"] == "dart-local" and info["pid"] == up.pid and info["bootstrap"].startswith("127.0.0.1:")
        # The README's command, as written: the catalogue name, the run's directory.
        tail = dart(tmp_path, "tail", "--run", "runs/local", "dart.tasks", "--max", "3")
        assert tail.returncode == 0, tail.stderr
        rows = [json.loads(line) for line in tail.stdout.splitlines()]
        assert len(rows) == 3 and all(r["run_id"] == "local" and r["task_id"] for r in rows)

        # The data manager serves the store once the services are up (after the warm start).
        wait_for(lambda: (run / "chdb.http").exists(), 600, "data manager SQL endpoint", up)
        wait_for(lambda: dart(tmp_path, "sql", "--run", "runs/local", "SELECT count() FROM trajectories FINAL "
                              "FORMAT TSV").stdout.strip() not in ("", "0"), 300, "a trajectory in the store", up)
        sql = dart(tmp_path, "sql", "--run", "runs/local", "SELECT count() FROM tasks FINAL FORMAT TSV")
        assert sql.returncode == 0 and int(sql.stdout) == 8, sql.stderr  # 6 training + 2 held-out
        report = dart(tmp_path, "report", "--run", "runs/local", "--json")
        assert report.returncode == 0, report.stderr
        assert json.loads(report.stdout)
    finally:
        up.send_signal(signal.SIGTERM)  # Ctrl-C's path: every service stopped cleanly
        up.wait(timeout=300)
        log.close()
    assert json.loads((run / "run.json").read_text())["pid"] is None
    # After the run: the store answers from its directory; tail says the run has stopped.
    after = dart(tmp_path, "sql", "--run", "runs/local", "SELECT count() FROM tasks FINAL FORMAT TSV")
    assert after.returncode == 0 and int(after.stdout) == 8, after.stderr
    gone = dart(tmp_path, "tail", "--run", "runs/local", "dart.tasks", "--max", "1")
    assert gone.returncode == 1 and "is not running" in gone.stderr and "dart log ls" in gone.stderr
    assert "Traceback" not in gone.stderr
    # The TensorBoard run is named by the run id.
    assert (run / "tensorboard" / "local").is_dir()
