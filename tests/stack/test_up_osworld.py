"""`dart up` with OSWorld tasks: the pool it publishes, the `dart serve` it starts for the `openai`
engine, and a short real run on X desktops scored by the real evaluators."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dart.config import build, load_yaml
from dart.errors import ConfigError
from dart.stack.config import StackConfig
from dart.stack.osworld import osworld_pool
from dart.stack.services import service_configs, service_specs

REPO = Path(__file__).resolve().parents[2]
OS_TASKS = ("e0df059f-28a6-4169-924f-b9623e7184cc",   # rename a folder: execute setup, exact_match on a command
            "b3d4a89c-53f2-4d6b-8b6a-541fb5d205fa")   # switch Bluetooth on: infeasible, no setup


def osworld_cfg(tmp_path: Path, **extra) -> StackConfig:
    data = {"run_id": "osw", "workdir": str(tmp_path / "run"), "evaluate": False,
            "tasks": {"source": "osworld", "downloads": str(tmp_path / "downloads")},
            "recipe": {"sft_steps": 0}, "env": {"backend": "xdesktop", "slots": 2},
            "rollout": {"engine": "openai"}}
    for key, value in extra.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and key in data else value
    return build(StackConfig, data)


def test_the_osworld_config_builds_every_service_with_a_dart_serve_for_the_openai_engine(tmp_path):
    cfg = build(StackConfig, {**load_yaml(REPO / "configs" / "osworld-xdesktop.yaml"), "workdir": str(tmp_path)})
    out = service_configs(cfg, serve_port=8123)
    assert set(out) == {"env-0", "serve", "rollout-0", "trainer", "data-manager", "archiver", "metrics"}
    rollout = out["rollout-0"][1]
    assert rollout.engine == "openai" and rollout.openai.base_url == "http://127.0.0.1:8123/v1"
    assert rollout.follow_weights is False and rollout.openai.timeout_s == 300
    assert out["env-0"][1].backend == out["data-manager"][1].backend == "xdesktop"
    assert Path(out["env-0"][1].xdesktop.downloads).is_absolute()
    serve = next(s for s in service_specs(out, tmp_path) if s.name == "serve")
    assert serve.argv[:3] == ("serve", "--model", str(tmp_path / "init")) and "8123" in serve.argv


def test_a_server_given_by_url_is_used_and_none_is_started(tmp_path):
    cfg = osworld_cfg(tmp_path, rollout={"engine": "openai", "serve": False,
                                         "openai": {"base_url": "http://gpu-host:8000/v1", "model": "ui-tars"}})
    out = service_configs(cfg)
    assert "serve" not in out
    openai = out["rollout-0"][1].openai
    assert (openai.base_url, openai.model) == ("http://gpu-host:8000/v1", "ui-tars")


@pytest.mark.parametrize(("extra", "message"), [
    ({"evaluate": True}, "evaluate: held-out evaluation plays synthetic tasks"),
    ({"env": {"backend": "synthetic"}}, "env.backend: OSWorld tasks need a desktop"),
])
def test_osworld_mistakes_are_refused_naming_the_field(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        osworld_cfg(tmp_path, **extra)


def test_the_pool_leaves_out_unsupported_tasks_and_offline_those_whose_file_is_not_cached(tmp_path):
    from dart.env.downloads import DownloadCache

    def task(tid: str, config: list, domain: str = "os") -> None:
        (tmp_path / "tasks" / domain).mkdir(parents=True, exist_ok=True)
        body = {"id": tid, "instruction": tid, "config": config, "evaluator": {"func": "infeasible"}}
        (tmp_path / "tasks" / domain / f"{tid}.json").write_text(json.dumps(body))

    url = "http://files.invalid/a.xlsx"
    download = [{"type": "download", "parameters": {"files": [{"url": url, "path": "/tmp/a.xlsx"}]}}]
    task("plain", [])
    task("needs-file", download)
    task("googledrive", [{"type": "googledrive", "parameters": {}}])
    section = osworld_cfg(tmp_path, tasks={"paths": [str(tmp_path / "tasks")]}).tasks
    pool = osworld_pool(section, backend="xdesktop", downloads=tmp_path / "downloads")
    assert [t["id"] for t in pool.tasks] == ["plain"] and pool.unsupported == 1 and pool.not_cached == 1
    DownloadCache(tmp_path / "downloads").put(url, b"cells")
    pool = osworld_pool(section, backend="xdesktop", downloads=tmp_path / "downloads")
    assert sorted(t["id"] for t in pool.tasks) == ["needs-file", "plain"] and pool.not_cached == 0
    with pytest.raises(ConfigError, match="no task left to run"):
        osworld_pool(osworld_cfg(tmp_path, tasks={"paths": [str(tmp_path / "tasks")], "domains": ["vlc"]}).tasks,
                     backend="xdesktop", downloads=tmp_path / "downloads")


def dart_sql(dsn: str, query: str) -> list[list]:
    out = subprocess.run([sys.executable, "-m", "dart.cli", "sql", "--dsn", dsn, query + " FORMAT JSONCompact"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["data"]


@pytest.mark.kafka
@pytest.mark.clickhouse
@pytest.mark.xdesktop
@pytest.mark.slow
@pytest.mark.timeout(480)  # ~45 s on an idle machine; the clock below bounds a loaded one
def test_a_short_osworld_run_scores_real_trajectories_with_real_evaluators(broker, shared_data, tmp_path):
    from dart.blobs import LocalBlobStore
    from dart.stack.up import up

    missing = [t for t in ("Xvfb", "xdotool", "openbox") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install xvfb xdotool openbox)")
    examples = shared_data / "osworld" / "examples"
    cfg = osworld_cfg(
        tmp_path, bootstrap=broker.bootstrap, rl_minutes=2.0, max_trajectories=2,
        tasks={"paths": [str(examples / "os" / f"{tid}.json") for tid in OS_TASKS]},
        data={"curation": {"n_default": 2, "max_steps": 2}, "scheduler": {"max_new_tokens": 16},
              "batcher": {"groups_per_batch": 1}},
        rollout={"prompt": {"max_images": 1, "max_pixels": 100 * 28 * 28}},
        env={"backend": "xdesktop", "slots": 2, "xdesktop": {"width": 1024, "height": 768}},
    )
    summary = up(cfg)
    assert summary["trajectories"] >= 2, summary

    dsn = f"chdb://{tmp_path / 'run' / 'chdb'}"
    # Each finished trajectory was scored by its task's own evaluator ...
    scored = dart_sql(dsn, "SELECT t.task_id, t.status, r.reward, r.evaluator FROM trajectories AS t FINAL "
                           "JOIN rewards AS r FINAL ON t.rollout_id = r.rollout_id WHERE t.status != 'infra_error'")
    assert len(scored) >= 2, scored
    assert all(tid in OS_TASKS and 0.0 <= float(reward) <= 1.0 and evaluator for tid, _, reward, evaluator in scored)
    # ... after steps answered by `dart serve` through the openai engine, on real screenshots.
    steps = dart_sql(dsn, "SELECT o.screenshot_digest, o.screen_width, a.engine FROM observations AS o FINAL "
                          "JOIN actions AS a FINAL ON o.rollout_id = a.rollout_id AND o.step_index = a.step_index")
    assert steps and all(engine == "openai" and int(width) == 1024 for _, width, engine in steps)
    blobs = LocalBlobStore(tmp_path / "run" / "blobs")
    assert all(blobs.get(digest)[:8] == b"\x89PNG\r\n\x1a\n" for digest, _, _ in steps)
