"""The log outlives the run: `dart up` with its own dev broker archives every topic; kill -9 of
the broker mid-run is recovered from the archive; after the run, with no dart process left, the
archive verifies, replays equal to the store, and plain tools read it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import fastavro
import pytest

from dart.config import build
from dart.log import list_segments
from dart.log.check import verify
from dart.stack.config import StackConfig
from dart.stack.up import up

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.slow, pytest.mark.timeout(600)]


def dart(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dart.cli", *argv], capture_output=True, text=True, timeout=timeout)


def broker_pid(port: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"listener-url tcp://127.0.0.1:{port}"], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def test_kill_9_of_the_broker_mid_run_is_restored_from_the_archive_and_the_run_replays(tmp_path):
    run = tmp_path / "run"
    cfg = build(StackConfig, {
        "run_id": "durable", "workdir": str(run), "rl_minutes": 10, "max_updates": 4, "evaluate": False,
        "experience_tasks": 6,
        "recipe": {"train_tasks": 6, "eval_tasks": 2, "sft_demos": 4, "sft_steps": 2},
        "data": {"batcher": {"groups_per_batch": 1}, "curation": {"n_default": 2}, "scheduler": {"max_new_tokens": 16}},
        "env": {"slots": 4},
    })
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(up(cfg)), daemon=True)
    runner.start()

    # Once the trainer has published a policy version and the archiver has filed it, kill -9 the broker.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        weights = [k for k in list_segments(run / "log") if k[0].endswith(".weights")]
        if weights:
            break
        time.sleep(0.5)
    assert weights, "no policy version was archived"
    bootstrap = json.dumps((run / "config" / "data-manager.yaml").read_text())
    port = re.search(r"127\.0\.0\.1:(\d+)", bootstrap)[1]
    os.kill(broker_pid(port), signal.SIGKILL)
    runner.join(timeout=400)
    assert not runner.is_alive()

    # The run went on after the restore: all its updates were made.
    assert result["broker_restores"] == 1
    assert result["updates"] >= 4

    # No dart process is left; the run directory alone answers.
    verdict = verify(run / "log")
    assert verdict.ok, verdict.problems
    out = dart("log", "verify", str(run))
    assert out.returncode == 0, out.stdout + out.stderr
    for f in (run / "log").rglob("*.avro"):   # plain fastavro, no dart code
        with open(f, "rb") as fh:
            assert sum(1 for _ in fastavro.reader(fh)) > 0

    replay = dart("replay", str(run))
    print(replay.stdout)
    # What the broker acknowledged but the archiver never fetched before the kill is in the store
    # and not in the log: the loss window. Everything else replays equal.
    rows = {line.split()[0]: line.split() for line in replay.stdout.splitlines()[2:] if line.endswith(("yes", "NO"))}
    assert rows, replay.stdout + replay.stderr
    lost = {t: int(r[1]) - int(r[2]) for t, r in rows.items() if r[-1] == "NO"}
    print(f"acknowledged events inside the loss window (in the store, not in the archive): {lost or 'none'}")
    for table, r in rows.items():
        live, replayed = int(r[1]), int(r[2])
        assert replayed <= live, f"{table}: the log holds rows the store never saw"
        assert live - replayed <= 200, f"{table}: {live - replayed} rows lost, more than the flush window allows"

    # No trajectory counted twice across the restore.
    dsn = f"chdb://{run / 'chdb'}"
    doubled = dart("sql", "--dsn", dsn, "SELECT count() FROM (SELECT rollout_id FROM trajectories FINAL "
                   "GROUP BY rollout_id HAVING count() > 1) FORMAT TSV")
    assert doubled.returncode == 0, doubled.stderr
    assert doubled.stdout.strip() == "0"

    # The state as of a policy version, from the archive alone.
    past = dart("replay", str(run), "--until-version", "2")
    assert past.returncode == 0, past.stdout + past.stderr
    assert "kept in database" in past.stdout

    # One logged decision re-run with the weights that made it: same prompt token for token, and
    # the logged log-probs reproduced by a re-scoring forward pass.
    from dart.data.replay import archived_events
    from dart.events import ActionChosen

    acted = [e for _, e in archived_events(run / "log")
             if isinstance(e, ActionChosen) and e.policy_version >= 1 and e.response_token_ids]
    assert acted, "no action of a trained version was logged"
    pick = acted[0]
    out = dart("replay", "decision", str(run), pick.rollout_id, str(pick.step_index))
    print(out.stdout)
    assert out.returncode in (0, 1), out.stderr
    assert f"policy version {pick.policy_version}" in out.stdout
    assert "rebuilt token for token" in out.stdout
    diff = float(re.search(r"max \|diff\| ([0-9.e+-]+) nats", out.stdout)[1])
    assert diff < 1e-3

    # The last logged trainer update re-run from the checkpoint before it: the same weights, bit for bit.
    from dart.events import WeightsPublished

    version = max(e.version for _, e in archived_events(run / "log") if isinstance(e, WeightsPublished))
    update = dart("replay", "update", str(run), str(version))
    print(update.stdout, update.stderr[-2000:])
    assert update.returncode == 0, update.stdout + update.stderr[-2000:]
    assert "bit-exact" in update.stdout
