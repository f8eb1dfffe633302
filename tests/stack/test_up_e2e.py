"""The whole system on this machine: `dart up` on the real broker and chdb.

tasks -> trajectories -> a batch -> an update -> new weights -> rollout workers swap ->
later steps stamped with the new version; then `dart replay` proves the projection equal to
a rebuild from the log.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from dart.config import build
from dart.stack.config import StackConfig
from dart.stack.up import up

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.slow]


def dart_sql(dsn: str, query: str) -> list[list]:
    out = subprocess.run([sys.executable, "-m", "dart.cli", "sql", "--dsn", dsn, query + " FORMAT JSONCompact"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["data"]


def dart_eval(config, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "dart.cli", "eval", str(config), *args, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_short_run_trains_swaps_weights_and_replays_equal(broker, tmp_path):
    raw = {
        "run_id": "e2e", "workdir": str(tmp_path / "run"), "bootstrap": broker.bootstrap,
        "rl_minutes": 5, "max_updates": 2, "evaluate": True, "experience_tasks": 6,
        "recipe": {"train_tasks": 6, "eval_tasks": 30, "eval_episodes": 30, "sft_demos": 4, "sft_steps": 2,
                   "dev_tasks": 12, "check_every": 1},
        "data": {"batcher": {"groups_per_batch": 1}, "curation": {"n_default": 2}, "scheduler": {"max_new_tokens": 16}},
        "env": {"slots": 4},
    }
    summary = up(build(StackConfig, raw))
    assert summary["updates"] >= 2 and summary["policy_version"] >= 2
    # The summary records what each service ran with: the object in its own file.
    for name, section in (("trainer", "train"), ("data-manager", "data"), ("rollout-0", "rollout")):
        assert summary["services"][name] == yaml.safe_load((tmp_path / "run" / "config" / f"{name}.yaml").read_text())[
            section], name
    assert summary["trajectories"] > 0
    # Held-out success, overall and per instruction that >= 5 of the 30 held-out tasks share.
    assert summary["delta"] == pytest.approx(summary["rl_success"] - summary["warm_success"])
    # Every version was checked on the 12 dev tasks; the one handed over is the best check (a tie:
    # the later), and the held-out figure is that version's.
    checks = summary["dev_checks"]
    assert summary["dev_tasks"] == 12 and [v for v, _ in checks] == list(range(1, summary["last_version"] + 1))
    assert all(0.0 <= rate <= 1.0 and round(rate * 12) == pytest.approx(rate * 12) for _, rate in checks)
    assert summary["selected_version"] == max(checks, key=lambda c: (c[1], c[0]))[0]
    # `dart eval --selected` measures the handed-over version again: the same figure (greedy, same
    # tasks), and --version N any other published one.
    stack_yaml = tmp_path / "stack.yaml"
    stack_yaml.write_text(yaml.safe_dump(raw))
    again = dart_eval(stack_yaml, "--selected")
    assert (again["version"], again["success"]) == (summary["selected_version"], summary["rl_success"])
    assert dart_eval(stack_yaml, "--version", "1")["version"] == 1
    missing = subprocess.run([sys.executable, "-m", "dart.cli", "eval", str(stack_yaml), "--version", "99"],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and f"version 99 was not published in {tmp_path / 'run'}" in missing.stderr
    # ... each with its standard error over the 30 tasks, the gain's paired, the outcomes kept
    assert summary["eval_tasks"] == 30 and all(summary[k] >= 0 for k in ("warm_se", "rl_se", "delta_se"))
    assert (tmp_path / "run" / "held_out.json").exists()
    rows = summary["held_out_by_instruction"]
    assert rows and all(r["tasks"] >= 5 and 0.0 <= r["warm"] <= 1.0 and 0.0 <= r["rl"] <= 1.0 for r in rows)
    assert sum(r["tasks"] for r in rows) <= 30
    assert sum(r["tasks"] * r["rl"] for r in rows) <= round(summary["rl_success"] * 30) + 1e-9

    config = str(tmp_path / "run" / "config" / "data-manager.yaml")
    dsn = f"chdb://{tmp_path / 'run' / 'chdb'}"
    # The trainer's updates became versions that every rollout worker loaded ...
    loaded = dart_sql(dsn, "SELECT version, min(event_time) FROM weights_loaded FINAL WHERE ok GROUP BY version "
                              "ORDER BY version")
    assert [int(v) for v, _ in loaded][:2] == [1, 2]
    # ... and steps after the swap were answered by the new version.
    newer = dart_sql(dsn, "SELECT count() FROM actions FINAL WHERE policy_version >= 1 AND engine = 'hf'")
    assert int(newer[0][0]) > 0
    batches = dart_sql(dsn, "SELECT count(), sum(injected) FROM batches FINAL")
    assert int(batches[0][0]) >= 2

    replay = subprocess.run([sys.executable, "-m", "dart.cli", "replay", "--config", config],
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "replayed" in replay.stdout
