"""`dart` commands as a person runs them: separate processes around one broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dart.bus import BusConfig

pytestmark = pytest.mark.kafka


def dart(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dart.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_tail_decodes_what_another_process_produced(bus: BusConfig):
    env = {"DART_BOOTSTRAP": bus.bootstrap, "DART_TOPIC_PREFIX": bus.prefix}
    code = "import asyncio; from dart.demo import _demo_produce; asyncio.run(_demo_produce(4))"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, **env}, timeout=60)
    out = dart("tail", "trajectories", "--max", "4", env=env)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 4
    assert {r["type"] for r in rows} == {"TrajectoryFinished"}
    assert sorted(r["rollout_id"] for r in rows) == ["r0.0", "r1.0", "r2.0", "r3.0"]
    assert {r["status"] for r in rows} == {"success", "fail"}


def test_topics_ensure_is_idempotent_and_flags_win_over_the_environment(bus: BusConfig):
    out = dart("topics", "ensure", "--bootstrap", bus.bootstrap, "--prefix", bus.prefix,
               env={"DART_BOOTSTRAP": "127.0.0.1:1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("exists") == len(bus.topics.all())


def test_a_bad_bootstrap_in_a_config_file_is_refused_naming_the_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("bus:\n  bootstrap: nohostport\n")
    out = dart("topics", "ensure", "--config", str(cfg))
    assert out.returncode == 2
    assert "bus.bootstrap" in out.stderr


def test_doctor_reports_a_missing_broker_with_the_command_to_fix_it():
    out = dart("doctor", "--bootstrap", "127.0.0.1:1")
    assert out.returncode == 1
    assert "MISSING  broker" in out.stdout and "fix: dart broker" in out.stdout
    assert "ok       chdb" in out.stdout


def test_every_command_has_help():
    out = dart("--help")
    assert out.returncode == 0
    for cmd in ("broker", "topics", "tail", "doctor"):
        assert cmd in out.stdout
        assert dart(cmd, "--help").returncode == 0
