"""`dart up` wiring: one config for the whole run, refused early when wrong; supervised
services restarted when they crash; the progress display."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dart.bus import free_port
from dart.config import build
from dart.errors import ConfigError
from dart.log.archiver import ArchiverConfig
from dart.stack.config import StackConfig
from dart.stack.progress import Snapshot, render
from dart.stack.services import service_configs, service_specs, write_configs
from dart.stack.supervisor import ServiceSpec, Supervisor

REPO = Path(__file__).resolve().parents[2]


def sections(data: dict, tmp_path: Path) -> dict:
    """Every process's (section, config object), for a run in ``tmp_path``."""
    return service_configs(build(StackConfig, {**data, "workdir": str(tmp_path)}))


def test_the_default_config_builds_every_service(tmp_path):
    from dart.config import load_yaml

    out = sections(load_yaml(REPO / "configs" / "synthetic.yaml"), tmp_path)
    assert set(out) == {"env-0", "rollout-0", "trainer", "data-manager", "archiver", "metrics"}
    assert out["archiver"] == ("archiver", ArchiverConfig(log_dir=tmp_path / "log", flush_interval_s=1.0))
    assert out["metrics"][1].out_dir == tmp_path / "tensorboard" / "local"  # named by the run id
    assert "metrics" not in sections({"tensorboard": False}, tmp_path)


def test_rollout_workers_and_trainer_get_the_same_prompt_and_model(tmp_path):
    out = sections({"rollout": {"workers": 2, "prompt": {"max_images": 3}}}, tmp_path)
    prompts = [out[n][1].prompt for n in ("rollout-0", "rollout-1", "trainer")]
    assert prompts[0].max_images == 3 and all(p == prompts[0] for p in prompts)
    assert prompts[0].template == "compact"  # the recipe's prompt, with the one change laid over it
    assert out["rollout-1"][1].model == str(out["trainer"][1].model) == str(tmp_path / "warm")
    with pytest.raises(ConfigError, match=r"trainer\.prompt: differs from rollout\.prompt"):
        build(StackConfig, {"trainer": {"prompt": {"max_images": 3}}})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"trainer": {"optim": {"lr": -1.0}}}, r"^trainer.optim.lr: must be > 0"),
        ({"env": {"slotz": 3}}, r"^unknown field env.slotz"),
        ({"data": {"curation": {"n_min": 1}}}, r"^data.curation.n_min"),
        ({"rollout": {"engine": "tgi"}}, r"^rollout.engine: input should be 'hf', 'openai' or 'vllm'"),
    ],
)
def test_a_mistake_in_any_service_is_refused_naming_the_field(data, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        sections(data, tmp_path)


def test_stack_level_mistakes_name_the_field():
    with pytest.raises(ConfigError, match="pipeline: input should be 'decoupled' or 'coupled'"):
        build(StackConfig, {"pipeline": "lockstep"})
    with pytest.raises(ConfigError, match=r"^data\.batcher\.groups_per_batch: must be <= recipe\.train_tasks"):
        build(StackConfig, {"recipe": {"train_tasks": 10, "sft_demos": 10}})


def test_the_recipe_presets_the_services_and_the_file_wins(tmp_path):
    out = sections({}, tmp_path)
    assert out["trainer"][1].optim.lr == 6e-4 and out["data-manager"][1].curation.max_steps == 3
    out = sections({"trainer": {"optim": {"lr": 2e-4}}, "data": {"curation": {"n_default": 4}}}, tmp_path)
    assert out["trainer"][1].optim.lr == 2e-4 and out["trainer"][1].optim.weight_decay == 0.0
    assert out["data-manager"][1].curation.n_default == 4 and out["data-manager"][1].curation.max_steps == 3


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_each_process_reads_exactly_its_services_object(name, tmp_path):
    from dart.config import load_yaml

    data = load_yaml(REPO / "configs" / name)
    configs = service_configs(build(StackConfig, {**data, "workdir": str(tmp_path), "env": {**data.get("env", {}),
                                                                                           "workers": 2}}))
    write_configs(configs, {"bootstrap": "127.0.0.1:9092", "prefix": "t"}, tmp_path)
    for service, (section, obj) in configs.items():
        if section != "serve":  # `dart serve` takes flags
            assert build(type(obj), load_yaml(tmp_path / f"{service}.yaml")[section], path=section) == obj, service
    assert [configs[f"env-{i}"][1].reply_partition for i in (0, 1)] == [0, 1]


def test_coupled_pipeline_reaches_the_data_manager(tmp_path):
    out = sections({"pipeline": "coupled"}, tmp_path)
    assert out["data-manager"][1].pipeline == "coupled"


def test_each_service_is_a_dart_command_reading_its_own_file(tmp_path):
    specs = {s.name: s for s in service_specs(sections({}, tmp_path), tmp_path)}
    assert specs["trainer"].argv == ("train", str(tmp_path / "trainer.yaml"))
    assert specs["env-0"].argv == ("env-worker", "--config", str(tmp_path / "env-0.yaml"))


def test_producers_run_below_the_trainers_priority(tmp_path):
    specs = {s.name: s for s in service_specs(sections({}, tmp_path), tmp_path, nice={"env": 10, "rollout": 7})}
    assert (specs["env-0"].nice, specs["rollout-0"].nice, specs["trainer"].nice, specs["data-manager"].nice) == \
        (10, 7, 0, 0)
    with pytest.raises(ConfigError, match=r"rollout.nice"):
        build(StackConfig, {"rollout": {"nice": 20}})


def test_a_spec_nice_value_reaches_the_process(tmp_path):
    sup = Supervisor(tmp_path / "logs")
    # `dart broker` stays up until stopped; its nice value is field 19 of /proc/PID/stat
    sup.start(ServiceSpec(name="low", argv=("broker", "--port", str(free_port())), nice=7))
    try:
        stat = Path(f"/proc/{sup.services['low'].proc.pid}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[16]) == min(19, os.nice(0) + 7)  # 19 is the lowest
    finally:
        sup.stop(timeout_s=15)


def test_a_crashed_service_is_restarted_and_says_so(tmp_path):
    sup = Supervisor(tmp_path / "logs")
    # A config mistake makes this service exit with code 2 at once, every time.
    sup.start(ServiceSpec(name="bad", argv=("env-worker", "--slots", "0"), max_restarts=2))
    deadline = time.monotonic() + 60
    while sup.status()["bad"] == "running" and time.monotonic() < deadline:
        sup.poll()
        time.sleep(0.2)
    assert sup.status()["bad"] == "failed (2)"
    assert sum("crashed with code 2; restarting" in e for e in sup.events) == 2
    assert any("gave up after 2 restarts" in e for e in sup.events)
    assert "env.slots" in (tmp_path / "logs" / "bad.log").read_text()


def test_stop_terminates_services_cleanly(tmp_path):
    import socket

    port = free_port()
    sup = Supervisor(tmp_path / "logs")
    sup.start(ServiceSpec(name="broker", argv=("broker", "--port", str(port))))
    # stop it once it serves (on a busy machine a SIGTERM during the imports would find no handler yet)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    time.sleep(0.5)
    sup.poll()
    assert sup.status() == {"broker": "running"}
    sup.stop(timeout_s=15)
    assert sup.status() == {"broker": "stopped"}
    assert sup.services["broker"].proc.returncode == 0


def test_render_shows_versions_utilisation_and_staleness():
    snap = Snapshot(trajectories=40, per_minute=12, infra_errors=1, by_version=[(2, 10, 0.5), (1, 30, 0.2)],
                    utilisation={"env": 0.97, "rollout": 0.5}, updates=2, version=2, loss=0.25, batches=3,
                    staleness_mean=0.5, staleness_max=1)
    text = render(snap, {"env-0": "running", "trainer": "running"}, elapsed_s=90, budget_s=480, events=["x started"])
    assert "v2: 50.0% of 10" in text and "v1: 20.0% of 30" in text
    assert "env 97.0%" in text and "12/min" in text and "staleness mean 0.50 max 1" in text
    assert "env-0 running" in text


def test_render_shows_the_update_budget():
    text = render(Snapshot(updates=7), {}, elapsed_s=60, budget_s=1200, events=[], max_updates=40)
    assert text.splitlines()[0] == "dart up — RL phase  1.0 / 20.0 min, update 7 of 40"


def test_budget_note_says_when_the_cap_cut_the_run_short():
    from dart.stack.up import budget_note

    assert budget_note("clock", 41, 60, 1200) == ("stopped at 41 of 60 updates: the 20-minute cap came first "
                                                   "(the machine was slower than planned)")
    assert budget_note("updates", 60, 60, 1200) == ""
    assert budget_note("clock", 41, 0, 1200) == ""       # no update budget: the clock is the plan
    assert budget_note("failure", 3, 60, 1200) == "stopped at 3 of 60 updates: failure"


def test_dart_up_help_works():
    out = subprocess.run([sys.executable, "-m", "dart.cli", "up", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "pipeline" in out.stdout


def test_updates_done_reads_the_trainers_newest_checkpoint(tmp_path):
    from dart.stack.up import updates_done
    from dart.train.checkpoint import TrainState, commit_checkpoint

    assert updates_done(tmp_path / "none") == 0
    state = TrainState()
    for _ in range(3):
        commit_checkpoint(tmp_path, state, lambda d: (d / "model.safetensors").write_bytes(b"w"), keep=2)
        state = state.updated(publish=True)
    assert updates_done(tmp_path) == 2
    from dart.stack.up import trainer_progress

    assert trainer_progress(tmp_path) == (2, 2)


def test_the_summary_waits_for_the_projection_to_show_the_last_update_and_its_load():
    """A CI run stopped at 2 updates while the projection still showed v1: the summary said v1."""
    from dart.stack.progress import Snapshot
    from dart.stack.up import settle

    class Lagging:  # the projection catches up one beat per read
        def __init__(self, snaps):
            self.snaps, self.reads = snaps, 0

        def snapshot(self):
            self.reads += 1
            return self.snaps.pop(0)

    late = Lagging([Snapshot(updates=2, version=2, served=1), Snapshot(updates=2, version=2, served=2)])
    snap = settle(late, Snapshot(updates=1, version=1, served=1), updates=2, version=2)
    assert (snap.updates, snap.version, snap.served, late.reads) == (2, 2, 2, 2)
    # an engine that reports no loads (served -1) is not waited for; a projection that never
    # catches up is given up on after the timeout
    assert settle(Lagging([]), Snapshot(updates=2, version=2), updates=2, version=2).version == 2
    stuck = Lagging([Snapshot(updates=1, version=1, served=1)] * 5)
    assert settle(stuck, Snapshot(updates=1, version=1, served=1), updates=2, version=2, timeout_s=1.5).version == 1
