"""JSON log lines: `--log-format json` or $DART_LOG_FORMAT=json, one object per line that parses,
with the service, worker id and run id, and the rollout id and policy version of the record a
consumer is handling; text stays the default."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import time

from dart.bus import BusConfig, Consumer, Producer
from dart.config import JsonLogFormatter, log_context
from tests.data.factories import Traj
from tests.metrics.test_sink import history, write_archive


def dart(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dart.cli", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_json_log_lines_parse_one_by_one_and_name_the_service_worker_and_run(tmp_path):
    write_archive(tmp_path / "run" / "log", history(), seed=1)
    ids = {"DART_SERVICE": "metrics-7", "DART_RUN_ID": "run-42"}
    for argv, env in ((["--log-format", "json"], ids), ([], {**ids, "DART_LOG_FORMAT": "json"})):
        out = dart(*argv, "metrics", str(tmp_path / "run"), "--out", str(tmp_path / "tb"), env=env)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stderr.splitlines()]
        assert lines and all(line["service"] == "metrics" and line["worker_id"] == "metrics-7"
                             and line["run_id"] == "run-42" and line["level"] in ("INFO", "WARNING")
                             and line["time"].endswith("Z") for line in lines)
        assert any("TensorBoard records" in line["message"] for line in lines)
    text = dart("metrics", str(tmp_path / "run"), "--out", str(tmp_path / "tb"))
    assert text.stderr and not text.stderr.lstrip().startswith("{")


def json_logger(name: str, service: str) -> tuple[logging.Logger, logging.Handler, io.StringIO]:
    """A logger of its own whose lines go, as JSON, into a string buffer only."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLogFormatter(service))
    log = logging.getLogger(name)
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    return log, handler, stream


def test_a_line_carries_extras_context_and_the_traceback():
    log, handler, stream = json_logger("dart.test.json", "train")
    try:
        with log_context(rollout_id="r-1", policy_version=3, run_id=None):
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("update failed", extra={"batch_id": "b-9"})
        log.info("outside")
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["rollout_id"] == "r-1" and first["policy_version"] == 3 and "run_id" not in first
    assert first["batch_id"] == "b-9" and "ValueError: boom" in first["exception"] and first["service"] == "train"
    assert "rollout_id" not in second and second["message"] == "outside"


async def test_a_consumer_handler_logs_with_the_ids_of_its_record(bus: BusConfig):
    action = next(e for e in Traj("a", "g", version=5).events() if type(e).__name__ == "ActionChosen")
    producer = Producer(bus)
    await producer.send(action, partition=0)
    log, handler, stream = json_logger("dart.test.consumer", "rollout-worker")
    done = asyncio.Event()

    async def handle(d):
        log.info("answered %s", d.event.step_index)
        done.set()

    consumer = Consumer(bus, topics=[bus.topics.actions], group=f"{bus.prefix}-json", handler=handle,
                        producer=producer)
    task = asyncio.create_task(consumer.run())
    await asyncio.wait_for(done.wait(), 30)
    consumer.stop()
    await task
    log.removeHandler(handler)
    producer.close()
    (line,) = (json.loads(x) for x in stream.getvalue().splitlines())
    assert (line["rollout_id"], line["policy_version"], line["run_id"]) == (action.rollout_id, 5, action.run_id)
    assert line["message"] == "answered 0"


def test_a_supervised_services_log_file_is_json_lines_throughout(bus: BusConfig, tmp_path):
    from dart.stack.supervisor import ServiceSpec, Supervisor

    sup = Supervisor(tmp_path / "logs", base_env={"DART_LOG_FORMAT": "json", "DART_RUN_ID": "run-7"})
    spec = ServiceSpec(name="archiver", env={"DART_SERVICE": "archiver"},
                       argv=("archiver", "--log-dir", str(tmp_path / "log"), "--bootstrap", bus.bootstrap,
                             "--prefix", bus.prefix))
    for run in range(1, 3):  # a restart appends to the same file
        sup.start(spec)
        deadline = time.monotonic() + 60
        while (tmp_path / "logs" / "archiver.log").read_text().count("archiving") < run and time.monotonic() < deadline:
            time.sleep(0.2)
        sup.stop()
        del sup.services["archiver"]
    lines = [json.loads(line) for line in (tmp_path / "logs" / "archiver.log").read_text().splitlines() if line]
    assert sum(line["message"].startswith("starting dart archiver") for line in lines) == 2
    assert sum("archiver stopped" in line["message"] for line in lines) == 2
    assert all(line["worker_id"] == "archiver" for line in lines)
    assert all(line["service"] == "archiver" and line["run_id"] == "run-7" for line in lines
               if line["logger"] != "dart.stack.supervisor")
