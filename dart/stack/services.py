"""Per-process configs of a `dart up` run: the stack config's service objects, wired.

Pure: the stack config in, one config object per process out, each the stack's object with
what tells that process from its siblings (worker id, reply partition, the policy server's
address); `dart up` writes each as it is into its service's file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from dart.config import as_mapping
from dart.env.config import EnvWorkerConfig
from dart.log.archiver import ArchiverConfig
from dart.metrics.sink import MetricsConfig
from dart.rollout.config import RolloutWorkerConfig
from dart.rollout.hf_engine import HFEngineConfig
from dart.rundir import tensorboard_dir
from dart.stack.config import StackConfig
from dart.stack.supervisor import ServiceSpec


@dataclasses.dataclass(frozen=True)
class Serve:
    """`dart serve` of the run's policy (command-line flags, not a config file)."""

    model: str
    port: int
    name: str
    max_batch_size: int


def own_part(obj: Any, cls: type) -> Any:
    """The ``cls`` object inside a stack section that extends it (the section's own fields dropped)."""
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls) if f.init})


def service_configs(cfg: StackConfig, *, serve_port: int = 8000) -> dict[str, tuple[str, Any]]:
    """(YAML section, config object) of every process, by service name.

    With ``rollout.engine: openai`` and ``rollout.serve``, a ``serve`` process (`dart serve` of the
    run's policy on 127.0.0.1:``serve_port``) answers the rollout workers."""
    workdir = cfg.workdir.resolve()
    out: dict[str, tuple[str, Any]] = {}
    env = own_part(cfg.env, EnvWorkerConfig)
    for i in range(cfg.env.workers):
        out[f"env-{i}"] = ("env", dataclasses.replace(env, worker_id=f"env-{i}", reply_partition=i))
    rollout = own_part(cfg.rollout, RolloutWorkerConfig)
    if cfg.rollout.engine == "openai":
        if cfg.rollout.serve:
            out["serve"] = ("serve", Serve(model=rollout.model, port=serve_port, name=rollout.openai.model,
                                           max_batch_size=rollout.hf.max_batch_size))
            rollout = dataclasses.replace(rollout, openai=dataclasses.replace(
                rollout.openai, base_url=f"http://127.0.0.1:{serve_port}/v1"))
        # The server owns its weights: these workers cannot swap them (a new trainer version
        # reaches such a server only by restarting it on that version's weights); its engine is
        # the server's, not the workers' hf one.
        rollout = dataclasses.replace(rollout, follow_weights=False, hf=HFEngineConfig())
    for i in range(cfg.rollout.workers):
        out[f"rollout-{i}"] = ("rollout", dataclasses.replace(rollout, worker_id=f"rollout-{i}"))
    out["trainer"] = ("train", cfg.trainer)
    # The archiver writes the log to RUN_DIR/log as it happens: the run's durable copy of the log.
    out["archiver"] = ("archiver", ArchiverConfig(log_dir=workdir / "log"))
    if cfg.tensorboard:  # TensorBoard files from the log (`dart metrics`), as the run goes
        # One folder per run id: `tensorboard --logdir` over runs names each run by its id.
        out["metrics"] = ("metrics", MetricsConfig(out_dir=tensorboard_dir(workdir, cfg.run_id),
                                                   blobs=str(workdir / "blobs")))
    # Requests for tasks that name no backend go to the env workers' one.
    out["data-manager"] = ("data", dataclasses.replace(cfg.data, backend=cfg.env.backend))
    return out


def write_configs(configs: dict[str, tuple[str, Any]], bus: dict[str, Any], config_dir: Path) -> None:
    """Each process's file: the bus and its own config object, as it is (``dart.config.as_mapping``)."""
    for name, (section, obj) in configs.items():
        if section != "serve":  # `dart serve` takes flags, not a file
            text = yaml.safe_dump({"bus": bus, section: as_mapping(obj)}, sort_keys=False)
            (config_dir / f"{name}.yaml").write_text(text)


def service_specs(configs: dict[str, tuple[str, Any]], config_dir: Path, *,
                  nice: dict[str, int] | None = None) -> list[ServiceSpec]:
    """One supervised process per service, each reading its own YAML file (:func:`write_configs`);
    ``nice`` lowers the priority of the services of a kind (env, rollout, serve, data, train)."""
    nice = nice or {}
    commands = {"env": "env-worker", "rollout": "rollout-worker", "train": "train", "data": "data-manager",
                "archiver": "archiver", "metrics": "metrics"}
    specs = []
    for name, (section, obj) in configs.items():
        if section == "serve":
            flags = [(f"--{key.replace('_', '-')}", str(value)) for key, value in dataclasses.asdict(obj).items()]
            specs.append(ServiceSpec(name=name, argv=("serve", *(part for flag in flags for part in flag)),
                                     nice=nice.get(section, 0), env={"DART_SERVICE": name}))
            continue
        path = config_dir / f"{name}.yaml"
        # `dart train CONFIG` takes its file as a positional argument; the others as --config.
        argv = (commands[section], str(path)) if section == "train" else (commands[section], "--config", str(path))
        specs.append(ServiceSpec(name=name, argv=argv, nice=nice.get(section, 0), env={"DART_SERVICE": name}))
    return specs
