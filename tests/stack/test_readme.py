"""The README runs: every shell command in README.md and docs/*.md is executed here against a
real run, or is on :data:`NOT_RUN` with the reason (and, where it is a dart command, parsed, so
a wrong flag still fails). A wrong port, topic name, flag or path in the docs fails this suite.

The run is `make run`'s command, `dart up`, with a tiny recipe in a fresh directory whose run is
``runs/local`` as make run's is. While it runs, the commands of :data:`DURING` (and `dart tail
--run`, `dart sql --run`, `dart report --run`) must answer; the rest run after it has stopped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dart.bus.broker import DevBroker
from dart.cli import build_parser

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

NOT_RUN = {
    "make run": "the install and a 17-minute run; its command (`dart up`) runs here with a tiny recipe",
    "make test": "the whole suite, this test included",
    ".venv/bin/dart up [CONFIG] [--pipeline coupled] [--rl-minutes N]": "a synopsis; parsed",
    ".venv/bin/dart up configs/chain.yaml": "a 20-30 minute run (benchmarks/learning.py); parsed, the config built",
    ".venv/bin/dart up configs/synthetic.yaml trainer.loss.tis=token env.slots=32":
        "a whole run; parsed, the config built with its dotted overrides",
    ".venv/bin/dart --log-format json up": "a whole run; parsed",
    ".venv/bin/dart up": "a whole run; this test's run is its short form",
    ".venv/bin/tensorboard --logdir runs/local/tensorboard --host 127.0.0.1":
        "a server; the run's folder in that logdir is checked",
    "tensorboard --logdir runs/local/tensorboard --host 127.0.0.1": "a server; the same check",
    ".venv/bin/dart metrics --config runs/local/config/metrics.yaml":
        "a service that runs until stopped (`dart up` runs it); parsed, its config file checked",
    ".venv/bin/dart sql --dsn chdb://$PWD/runs/osworld/chdb \"SELECT t.task_id, t.status, r.reward, r.evaluator "
    "FROM trajectories AS t FINAL JOIN rewards AS r FINAL USING rollout_id\"":
        "needs an OSWorld run on desktop apps (tests/stack/test_up_osworld.py runs that stack); parsed",
    ".venv/bin/dart trace ROLLOUT_ID --dsn chdb://$PWD/runs/osworld/chdb --blobs runs/osworld/blobs":
        "needs an OSWorld run; parsed",
    "vllm serve ByteDance-Seed/UI-TARS-1.5-7B --served-model-name ui-tars --limit-mm-per-prompt image=5":
        "needs a GPU and the UI-TARS weights (docs/gpu.md)",
}

# Run while `dart up` runs; each with a check of its output.
DURING = {
    ".venv/bin/dart tail --run runs/local dart.trajectories": '"type": "TrajectoryFinished"',
    '.venv/bin/dart sql --run runs/local "SELECT status, count() FROM trajectories FINAL GROUP BY status"': "│",
    ".venv/bin/dart report --run runs/local": "success",
    "for f in runs/local/metrics/*.port; do curl -s 127.0.0.1:$(cat $f)/metrics; done | grep ^dart_consumer_lag":
        "dart_consumer_lag",
}

# Run after it, in a short form: a tiny run has no version 12 and 200 episodes take long;
# ROLLOUT_ID and BOOTSTRAP are filled in from the run and from a fresh `dart broker`.
SHORT = {
    ".venv/bin/dart eval --run runs/local --selected --episodes 200":
        ".venv/bin/dart eval --run runs/local --selected --episodes 4",
    ".venv/bin/dart replay runs/local --until-version 12": ".venv/bin/dart replay runs/local --until-version 1",
    ".venv/bin/dart replay decision runs/local ROLLOUT_ID STEP":
        ".venv/bin/dart replay decision runs/local ROLLOUT_ID 0",
    ".venv/bin/dart replay update runs/local VERSION": ".venv/bin/dart replay update runs/local 1",
    ".venv/bin/dart trace ROLLOUT_ID --run runs/local": ".venv/bin/dart trace ROLLOUT_ID --run runs/local",
    ".venv/bin/dart metrics runs/local --out /tmp/tb": ".venv/bin/dart metrics runs/local --out tb",
    # `dart broker`'s port (9092, checked below) may be taken on a shared machine: a fresh one's.
    ".venv/bin/dart log import runs/local --bootstrap 127.0.0.1:9092":
        ".venv/bin/dart log import runs/local --bootstrap BOOTSTRAP",
}

TINY = {
    "run_id": "local", "workdir": "runs/local", "rl_minutes": 8, "max_updates": 100, "evaluate": False,
    "experience_tasks": 4,  # oracle successes injected into all-fail groups: batches, so updates
    "recipe": {"train_tasks": 6, "eval_tasks": 4, "sft_demos": 4, "sft_steps": 2},
    "data": {"batcher": {"groups_per_batch": 1}, "curation": {"n_default": 2}, "scheduler": {"max_new_tokens": 16}},
    "env": {"slots": 4},
    "trainer": {"keep_checkpoints": 1000},  # `replay update 1` needs step 0's checkpoint
}


def without_comment(line: str) -> str:
    """The line up to a ``#`` that starts a shell comment (outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(path: Path) -> list[str]:
    """Every command of the file's sh/bash/shell code blocks (continuation lines joined)."""
    out = []
    for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", path.read_text(), re.S):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            command = without_comment(line.strip())
            if command:
                out.append(command)
    return out


ALL = list(dict.fromkeys(c for doc in DOCS for c in shell_commands(doc)))


def test_every_documented_command_is_run_here_or_listed_with_its_reason():
    assert len(ALL) >= 30  # the extraction finds the docs' commands (not an empty list that passes)
    stale = [c for c in (*NOT_RUN, *DURING, *SHORT) if c not in ALL]
    assert stale == [], "listed here but in no doc any more"
    assert not set(NOT_RUN) & (set(DURING) | set(SHORT))


def dart_argv(command: str) -> list[str] | None:
    """A documented dart command as argv, synopsis brackets opened and placeholders filled."""
    if not command.startswith(".venv/bin/dart"):
        return None
    text = re.sub(r"\[([^\]]*)\]", r"\1", command)
    subs = {"CONFIG": "configs/synthetic.yaml", "N": "1", "ROLLOUT_ID": "r-1", "$PWD": str(REPO)}
    return [subs.get(tok, tok.replace("$PWD", str(REPO))) for tok in shlex.split(text)[1:]]


@pytest.mark.parametrize("command", [c for c in NOT_RUN if c.startswith(".venv/bin/dart")])
def test_a_documented_command_not_run_here_still_parses(command):
    args = build_parser().parse_args(dart_argv(command))  # SystemExit(2) on a wrong flag
    if " configs/" in command and args.func.__name__ in ("cmd_up", "cmd_eval"):
        from dart.stack.cli import load_stack_config

        load_stack_config(args)  # the file and its dotted overrides build every service's config


def test_the_documented_make_targets_and_broker_port_exist():
    makefile = (REPO / "Makefile").read_text()
    for command in ALL:
        if command.startswith("make "):
            assert re.search(rf"^{command.split()[1]}:", makefile, re.M), command
    assert build_parser().parse_args(["broker"]).port == 9092  # the port the docs give `dart broker`


class Run:
    """A `dart up` in ``root``, its run in root/runs/local."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / ".venv").symlink_to(Path(sys.prefix))  # `.venv/bin/dart` as the docs write it
        (root / "tiny.yaml").write_text(yaml.safe_dump(TINY))
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.env.pop("DART_BOOTSTRAP", None)
        self.log = (root / "up.log").open("w")
        self.proc = subprocess.Popen([str(root / ".venv" / "bin" / "dart"), "up", "tiny.yaml"], cwd=root,
                                     stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        self.dir = root / "runs" / "local"

    def sh(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=self.root, capture_output=True, text=True,
                              timeout=timeout, env=self.env)

    def scalar(self, sql: str) -> int:
        out = self.sh(f'.venv/bin/dart sql --run runs/local "{sql} FORMAT TSV"')
        return int(out.stdout.strip() or 0) if out.returncode == 0 else 0

    def trainer_step(self) -> int:
        """The trainer's latest checkpointed step (0: none yet), from its checkpoint directory."""
        latest = self.dir / "checkpoints" / "latest"
        return int(latest.read_text().strip().split("-")[-1]) if latest.exists() else 0

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert self.proc.poll() is None, f"dart up exited ({self.proc.returncode}) before {what}: " + \
                (self.root / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
            time.sleep(2.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # Ctrl-C's path: every service stopped cleanly
        self.proc.wait(timeout=300)
        self.log.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    r = Run(tmp_path_factory.mktemp("readme"))
    yield r
    r.stop()


@pytest.mark.timeout(1200)
def test_tail_sql_and_report_answer_with_run_while_make_runs_command_runs(run):
    run.wait_for(lambda: (run.dir / "run.json").exists(), 300, "runs/local/run.json")
    info = json.loads((run.dir / "run.json").read_text())
    assert info["prefix"] == "dart-local" and info["pid"] == run.proc.pid
    tail = run.sh(".venv/bin/dart tail --run runs/local dart.tasks --max 3")
    assert tail.returncode == 0, tail.stderr
    assert [json.loads(line)["run_id"] for line in tail.stdout.splitlines()] == ["local"] * 3
    # The services (and the data manager's SQL endpoint) start after the warm start.
    run.wait_for(lambda: (run.dir / "chdb.http").exists(), 900, "the data manager's SQL endpoint")
    run.wait_for(lambda: run.scalar("SELECT count() FROM trajectories FINAL") > 0, 300, "a trajectory in the store")
    assert run.scalar("SELECT count() FROM tasks FINAL") == 10  # 6 training + 4 held-out
    for command, says in DURING.items():
        out = run.sh(command)
        assert run.proc.poll() is None, "the run ended before the commands that read it live"
        assert out.returncode == 0 and says in out.stdout, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"


@pytest.mark.timeout(1800)
def test_every_documented_command_runs_as_written_after_the_run(run):
    # Version 1 published (`replay update 1`, `--until-version 1` and `eval --latest` need it): the
    # trainer's second checkpoint is written after it. Stopped then, the archive stays small.
    run.wait_for(lambda: run.trainer_step() >= 2, 900, "the trainer's second update")
    run.stop()
    assert json.loads((run.dir / "run.json").read_text())["pid"] is None
    gone = run.sh(".venv/bin/dart tail --run runs/local dart.trajectories")
    assert gone.returncode == 1 and "is not running" in gone.stderr and "Traceback" not in gone.stderr
    assert (run.dir / "tensorboard" / "local").is_dir()  # the TensorBoard run is named by the run id
    assert (run.dir / "config" / "metrics.yaml").is_file()
    # A decision the policy sampled: the run also logs imported oracle steps (max_new_tokens 0),
    # which `replay decision` names as imported (checked below), not as reproduced.
    rollout = run.sh('.venv/bin/dart sql --run runs/local "SELECT rollout_id FROM actions FINAL '
                     'WHERE step_index = 0 AND max_new_tokens > 0 LIMIT 1 FORMAT TSV"').stdout.strip()
    assert rollout
    imported = run.sh('.venv/bin/dart sql --run runs/local "SELECT rollout_id FROM observations FINAL '
                      'WHERE step_index = 0 AND mode = \'experience\' LIMIT 1 FORMAT TSV"').stdout.strip()
    if imported:  # an oracle success was injected (most runs): its replay passes and says why
        out = run.sh(f".venv/bin/dart replay decision runs/local {imported} 0")
        assert out.returncode == 0 and "not sampled: imported from" in out.stdout, out.stdout + out.stderr[-1500:]
    failed = []
    with DevBroker() as fresh:
        for command in ALL:
            if command in NOT_RUN or command in DURING:
                continue
            short = SHORT.get(command, command).replace("ROLLOUT_ID", rollout).replace("BOOTSTRAP", fresh.bootstrap)
            out = run.sh(short)
            if out.returncode != 0:
                failed.append(f"{short}\n  exit {out.returncode}: {out.stdout[-1500:]}\n{out.stderr[-1500:]}")
    assert failed == [], "\n".join(failed)
