"""The data manager as a process: killed with SIGKILL it resumes with nothing lost or doubled;
`dart sql` and `dart report` work from other processes while it runs (chdb allows one process
per database path, so they go through its ClickHouse HTTP endpoint)."""

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

from dart.bus import BusConfig, Producer
from dart.cli import build_parser
from dart.data.experience import load_experience
from tests.data.factories import group, task

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse]
REPO = Path(__file__).resolve().parents[2]


def test_commands_are_registered() -> None:
    parser = build_parser()
    for argv in (["data-manager"], ["sql", "SELECT 1"], ["report"], ["experience", "import", "f.jsonl"],
                 ["replay", "--out", "chdb:///tmp/x"], ["trace", "some-rollout", "--out", "d"]):
        assert callable(parser.parse_args(argv).func)


def dart(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dart.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def start(cfg: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dart.cli", "data-manager", "--config", str(cfg)], cwd=REPO,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def wait_port(port_file: Path, proc: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return f"http://127.0.0.1:{port_file.read_text().strip()}"
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no SQL endpoint: {log.read_text()}")


def count(url: str, table: str) -> int:
    r = dart("sql", f"SELECT count() FROM {table} FINAL", "--url", url, "--format", "TSV")
    return int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else -1


def wait_count(url: str, table: str, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if count(url, table) == n:
            return
        time.sleep(0.3)
    raise AssertionError(f"{table}: {count(url, table)} rows, expected {n}")


def send(bus: BusConfig, events) -> None:
    with Producer(bus) as p:
        for e in events:
            p.send_nowait(e)
        p.flush()


def test_killed_data_manager_resumes_and_sql_works_from_other_processes(bus: BusConfig, tmp_path: Path) -> None:
    db = tmp_path / "chdb"
    port_file = tmp_path / "port"
    log = tmp_path / "dm.log"
    cfg = tmp_path / "dart.yaml"
    cfg.write_text(yaml.safe_dump({
        "bus": {"bootstrap": bus.bootstrap, "prefix": bus.prefix, "session_timeout_ms": 3000,
                "heartbeat_interval_ms": 500},
        "data": {"store": {"dsn": f"chdb://{db}"}, "blobs": str(tmp_path / "blobs"),
                 "http": {"port": 0, "port_file": str(port_file)},
                 "scheduler": {"enabled": False}, "batcher": {"enabled": False}},
    }))
    first, second = [], []
    for i in range(20):
        events, _ = group(f"t{i % 3}", [1.0, 0.0, 0.0], steps=5)
        (first if i < 10 else second).extend(events)
    send(bus, [task("t0"), task("t1"), task("t2"), *first])
    proc = start(cfg, log)
    try:
        url = wait_port(port_file, proc, log)
        wait_count(url, "actions", 10 * 3 * 5)
        proc.send_signal(signal.SIGKILL)                 # no clean shutdown
        proc.wait(10)
        port_file.unlink()
        send(bus, second)                                # the log moves on while it is down
        proc = start(cfg, log)
        url = wait_port(port_file, proc, log)
        wait_count(url, "actions", 20 * 3 * 5)
        time.sleep(1.0)
        got = {t: count(url, t) for t in ("tasks", "requests", "observations", "actions", "trajectories", "rewards")}
        assert got == {"tasks": 3, "requests": 60, "observations": 300, "actions": 300, "trajectories": 60,
                       "rewards": 60}
        # the same command against the chdb path finds the running manager's endpoint
        r = dart("sql", "SELECT task_id, count() AS n FROM trajectories FINAL GROUP BY task_id ORDER BY task_id",
                 "--dsn", f"chdb://{db}", "--format", "JSONCompact")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["data"] == [["t0", 21], ["t1", 21], ["t2", 18]]
        # named as a run directory: its store is checked while the manager writes it, the endpoint said first
        r = dart("sql", "SELECT count() FROM trajectories FINAL", "--run", str(tmp_path), "--format", "TSV")
        assert r.returncode == 0 and r.stdout.strip() == "60", r.stderr
        assert f"asking {url} (from {db}.http)" in r.stderr
        r = dart("sql", "SELECT count() FROM steps FORMAT CSV", "--url", url)   # the query's FORMAT wins
        assert r.returncode == 0 and r.stdout.strip() == "300", r.stderr
        r = dart("sql", "SELEC 1", "--url", url)
        assert r.returncode == 1 and "Syntax error" in r.stderr
        r = dart("report", "--url", url, "--out", str(tmp_path / "report"))
        assert r.returncode == 0, r.stderr
        assert "t0" in r.stdout and "success  33.3%" in r.stdout
        assert {p.name for p in (tmp_path / "report").glob("*.png")} == {
            "success_by_version.png", "success_by_time.png", "learning.png", "task_difficulty.png",
            "utilisation.png", "staleness.png"}
        # 20 groups of 3 rollouts, one success each: every group is mixed, none has zero advantage
        assert "zero advantage   0.0%" in r.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
        assert not (tmp_path / "chdb.http").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_experience_import_is_idempotent_events(tmp_path: Path) -> None:
    (tmp_path / "shot.png").write_bytes(b"\x89PNG fake")
    line = {"task_id": "t1", "instruction": "open it", "reward": 1.0,
            "steps": [{"screenshot": "shot.png", "response_text": "Action: click(start_box='(1,2)')",
                       "response_token_ids": [1, 2]},
                      {"screenshot_digest": "d" * 64, "response_text": "Action: finished()",
                       "response_token_ids": [3], "logprobs": [-0.5]}]}
    f = tmp_path / "xp.jsonl"
    f.write_text(json.dumps(line) + "\n\n")
    put = []
    a = load_experience(f, run_id="r", put_file=lambda p: put.append(p) or "s" * 64, at_ms=1)
    b = load_experience(f, run_id="r", put_file=lambda p: "s" * 64, at_ms=2)
    assert [e.event_id for e in a] == [e.event_id for e in b]          # re-import: same ids
    kinds = [type(e).__name__ for e in a]
    assert kinds == ["ObservationEmitted", "ActionChosen", "ObservationEmitted", "ActionChosen",
                     "TrajectoryFinished", "RewardAssigned"]
    fin = a[4]
    assert fin.origin == "experience" and fin.mode == "experience" and fin.num_steps == 2
    assert a[2].history[0].screenshot_digest == "s" * 64 and put == [tmp_path / "shot.png"]
    f.write_text('{"task_id": "t1", "steps": []}\n')
    with pytest.raises(ValueError, match="line 1: missing field 'instruction'"):
        load_experience(f, run_id="r")
    r = dart("experience", "import", str(f), "--bootstrap", "127.0.0.1:1")
    assert r.returncode == 2 and "missing field" in r.stderr
    assert os.environ.get("DART_NO_SUCH") is None


def test_samples_become_one_experience_trajectory_per_rollout_in_step_order():
    from dart.data.experience import samples_as_experience
    from dart.events.manifest import PromptContext, Sample

    def sample(rollout: str, step: int, tokens: list[int]) -> Sample:
        ctx = PromptContext(instruction=f"do {rollout}", step_index=step, screenshot_digest=f"{rollout}{step}" * 8,
                            screen_width=112, screen_height=112)
        return Sample(rollout_id=rollout, step_index=step, task_id=f"t-{rollout}", group_id=rollout, context=ctx,
                      prompt_hash="h", response_token_ids=tokens, rollout_logprobs=[0.0] * len(tokens),
                      entropies=[], policy_version=0, reward=1.0, origin="oracle", sft=True)

    samples = [sample("a", 0, [1, 2]), sample("b", 0, [3]), sample("a", 1, [4])]
    events, n = samples_as_experience(samples, decode=lambda ids: "+".join(map(str, ids)), run_id="r",
                                      origin="oracle", at_ms=5)
    assert n == 2
    actions = [e for e in events if type(e).__name__ == "ActionChosen"]
    assert [(a.task_id, a.step_index, a.response_text, list(a.response_token_ids)) for a in actions] == [
        ("t-a", 0, "1+2", [1, 2]), ("t-a", 1, "4", [4]), ("t-b", 0, "3", [3])]
    finished = [e for e in events if type(e).__name__ == "TrajectoryFinished"]
    assert [(f.task_id, f.num_steps, f.origin, f.status.name) for f in finished] == [
        ("t-a", 2, "oracle", "SUCCESS"), ("t-b", 1, "oracle", "SUCCESS")]
    # the second step's observation carries the first step's answer as history
    second = next(e for e in events if type(e).__name__ == "ObservationEmitted" and e.step_index == 1)
    assert [h.response_text for h in second.history] == ["1+2"]
