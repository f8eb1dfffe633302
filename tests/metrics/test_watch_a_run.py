"""Watching a short `dart up` with the field's tools.

While the run goes, every service's /metrics is scraped and parsed with the Prometheus client's
own parser. After it, `dart metrics RUN_DIR` folds the run's archive into TensorBoard files, and
TensorBoard's own event reader finds the same records (tag, step, value, wall time; image bytes)
in them as in the files the live sink wrote during the run: scalars and images, step = policy
version.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dart.bus.prom import read_ports
from dart.config import build
from dart.stack.config import StackConfig
from dart.stack.up import up

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.slow]

SERVICES = {"env-0", "rollout-0", "trainer", "data-manager", "archiver", "metrics"}


def scrape(port: int) -> list:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def records(directory) -> tuple[dict, dict]:
    """Scalars {tag: [(step, value, wall_time)]} and images {tag: [(step, png bytes)]}, as TensorBoard reads them."""
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [(e.step, e.value, e.wall_time) for e in acc.Scalars(t)] for t in tags["scalars"]}
    images = {t: [(e.step, e.encoded_image_string) for e in acc.Images(t)] for t in tags["images"]}
    return scalars, images


def test_a_run_is_watched_live_and_rebuilt_equal_from_its_archive(tmp_path):
    run = tmp_path / "run"
    data = {
        "run_id": "watch", "workdir": str(run), "rl_minutes": 4, "max_updates": 3, "evaluate": False,
        "experience_tasks": 4,
        "recipe": {"train_tasks": 6, "eval_tasks": 2, "sft_demos": 4, "sft_steps": 2},
        "data": {"batcher": {"groups_per_batch": 1}, "curation": {"n_default": 2}, "scheduler": {"max_new_tokens": 16}},
        "env": {"slots": 4},
    }
    cfg = build(StackConfig, data)
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(up(cfg)), daemon=True)
    runner.start()
    scraped: dict[str, list[list]] = {}
    while runner.is_alive():
        for name, port in read_ports(run / "metrics").items():
            with contextlib.suppress(OSError):  # stopping, or not yet serving
                scraped.setdefault(name, []).append(scrape(port))
        time.sleep(1.0)
    runner.join()
    assert result["updates"] >= 3

    # Prometheus: every service answered, in the text format the client's parser reads.
    assert set(scraped) >= SERVICES, sorted(scraped)

    def peak(name: str, metric: str) -> float:
        return max(sum(s.value for s in samples if s.name == metric) for samples in scraped[name])

    assert peak("env-0", "dart_records_produced_total") > 0
    assert peak("env-0", "dart_records_consumed_total") > 0  # its reply inbox: the actions that answer it
    assert peak("rollout-0", "dart_handler_seconds_count") > 0
    assert peak("data-manager", "dart_records_consumed_total") > 0
    assert peak("data-manager", "dart_handler_seconds_count") > 0
    assert peak("trainer", "dart_trainer_step_seconds_count") >= 1
    assert peak("rollout-0", "dart_weight_sync_seconds_count") >= 1
    assert peak("metrics", "dart_records_consumed_total") > 0
    # Consumer lag per group and partition: the data manager's reached 0 once it had read the log.
    lags = [sum(s.value for s in samples if s.name == "dart_consumer_lag") for samples in scraped["data-manager"]
            if any(s.name == "dart_consumer_lag" for s in samples)]
    assert lags and lags[-1] == 0, lags
    assert {s.labels["partition"] for s in scraped["data-manager"][-1] if s.name == "dart_consumer_lag"} >= {"0", "1"}

    # TensorBoard: the live files and the archive's, equal record for record.
    after = tmp_path / "after"
    dart("metrics", str(run), "--out", str(after))
    live_scalars, live_images = records(run / "tensorboard" / "watch")  # named by the run id
    after_scalars, after_images = records(after)
    assert live_scalars == after_scalars
    assert live_images == after_images
    # Step = policy version: one loss per update, at the version it made.
    versions = [step for step, _, _ in live_scalars["train/loss"]]
    assert versions == list(range(1, len(versions) + 1)) and len(versions) >= 3
    for tag in ("train/entropy", "train/clip_frac", "update/ratio/abs_dev", "rollout/success_rate",
                "rollout/staleness_mean", "rollout/per_minute", "utilisation/env", "batch/staleness_max"):
        assert tag in live_scalars, tag
    assert any(t.startswith("weights/swap_s/") for t in live_scalars)
    assert any(t.startswith("success_by_instruction/") for t in live_scalars)
    assert all(0.0 <= v <= 1.0 for _, v, _ in live_scalars["rollout/success_rate"])
    # Pictures of trajectories, as PNGs, at policy versions.
    assert live_images and all(png.startswith(b"\x89PNG") for shots in live_images.values() for _, png in shots)
    assert {step for shots in live_images.values() for step, _ in shots} <= set(range(0, versions[-1] + 1))

    # Machine-readable: `dart report --json` of the run's store, `dart eval --json` of its warm start.
    report = dart("report", "--json", "--dsn", f"chdb://{run / 'chdb'}")
    tables = json.loads(report.stdout)
    assert [u["version"] for u in tables["updates"]] == versions
    assert sum(n for _, n, _ in tables["success_by_version"]) > 0
    (tmp_path / "stack.yaml").write_text(yaml.safe_dump(data))
    evaluated = json.loads(dart("eval", str(tmp_path / "stack.yaml"), "--episodes", "4", "--json").stdout)
    assert evaluated["episodes"] == 4 and 0.0 <= evaluated["success"] <= 1.0
    assert evaluated["model"] == str(run / "warm") and evaluated["checkpoint"] is None


def dart(*argv: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "dart.cli", *argv], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return out
