"""Per-service configs of a `dart up` run, derived from one StackConfig.

Pure: mappings in, mappings out. Every mapping is also built into the service's own config
class here, so a mistake anywhere is refused at start-up with the dotted field named
(``trainer.optim.lr: must be > 0``), before a single process starts.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dart.config import build
from dart.errors import ConfigError
from dart.recipe.config import curation_section
from dart.rundir import tensorboard_dir
from dart.stack.config import StackConfig
from dart.stack.supervisor import ServiceSpec


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _plain(value: Any) -> Any:
    """asdict() output made YAML-friendly (paths as strings, tuples as lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def service_sections(cfg: StackConfig, *, workdir: Path, model_dir: Path,
                     serve_port: int = 8000) -> dict[str, dict[str, Any]]:
    """The YAML body (without ``bus:``) of every service, by service name.

    With ``rollout.engine: openai`` and no ``rollout.base_url``, a ``serve`` service (`dart serve`
    of ``model_dir`` on 127.0.0.1:``serve_port``) answers the rollout workers."""
    r = cfg.recipe
    blobs = str(workdir / "blobs")
    prompt = _plain(asdict(r.prompt))
    out: dict[str, dict[str, Any]] = {}
    for i in range(cfg.env.workers):
        env = {"backend": cfg.env.backend, "slots": cfg.env.slots, "run_id": cfg.run_id, "worker_id": f"env-{i}",
               "reply_partition": i, "blobs": blobs, "heartbeat_s": 2.0}
        if cfg.tasks.source == "osworld" and cfg.env.backend == "xdesktop":
            # The same cache the offline filter of `dart up` looked into.
            env["xdesktop"] = {"downloads": str(downloads_root(cfg))}
        out[f"env-{i}"] = {"env": deep_merge(env, cfg.env.options)}
    if cfg.rollout.engine == "openai" and not cfg.rollout.base_url:
        out["serve"] = {"serve": {"model": str(model_dir), "port": serve_port, "name": cfg.rollout.served_model,
                                  "max_batch_size": r.engine_batch}}
    for i in range(cfg.rollout.workers):
        rollout = {"engine": "hf", "model": str(model_dir), "device": "cpu", "blobs": blobs,
                   "worker_id": f"rollout-{i}", "run_id": cfg.run_id, "convention": r.convention, "prompt": prompt,
                   "hf": {"max_batch_size": r.engine_batch, "threads": r.threads}, "heartbeat_s": 2.0}
        if cfg.rollout.engine == "openai":
            # The server owns its weights: these workers cannot swap them (a new trainer version
            # reaches such a server only by restarting it on that version's weights).
            rollout.update(engine="openai", follow_weights=False, openai={
                "base_url": cfg.rollout.base_url or f"http://127.0.0.1:{serve_port}/v1",
                "model": cfg.rollout.served_model})
            del rollout["hf"]
        out[f"rollout-{i}"] = {"rollout": deep_merge(rollout, cfg.rollout.options)}
    train = {"model": str(model_dir), "checkpoint_dir": str(workdir / "checkpoints"), "blobs": blobs,
             "run_id": cfg.run_id, "worker_id": "trainer", "seed": r.seed, "prompt": prompt,
             "loss": _plain(asdict(r.loss)), "ppo_epochs": r.ppo_epochs, "ppo_minibatches": r.ppo_minibatches,
             "optim": {"lr": r.rl_lr, "weight_decay": r.weight_decay, "max_grad_norm": r.max_grad_norm},
             "engine": {"device": "cpu", "threads": r.threads, "micro_batch_samples": r.micro_batch}}
    out["trainer"] = {"train": deep_merge(train, cfg.trainer.options)}
    data = {
        "run_id": cfg.run_id, "blobs": blobs, "backend": cfg.env.backend,
        "store": {"dsn": f"chdb://{(workdir / 'chdb').resolve()}"},
        "curation": curation_section(r),
        # A pass of the scheduler or the batcher is a few curation queries (0.3-0.5 s on the store
        # thread late in a run on 2 busy cores): every 1.5 s, with three times the slots in
        # flight so that the slots never run dry between two passes (at 2x they did, late in a
        # run: engine batches fell from ~20 rows to 3), while the data manager leaves the CPU to
        # the rollout worker and trainer (at 0.5 s, 1x it took ~55 % of a core).
        "scheduler": {"temperature": r.temperature, "top_p": r.top_p, "max_new_tokens": r.max_new_tokens,
                      "frequency_penalty": 0.0, "interval_s": 1.5, "capacity_factor": 3.0},
        "batcher": {"groups_per_batch": r.tasks_per_update, "interval_s": 1.5},
        "http": {"port": 0, "host": "127.0.0.1"},
    }
    # The archiver writes the log to RUN_DIR/log as it happens: the run's durable copy of the log.
    out["archiver"] = {"archiver": {"log_dir": str(workdir / "log"), "flush_interval_s": 1.0}}
    if cfg.tensorboard:  # TensorBoard files from the log (`dart metrics`), as the run goes
        # One folder per run id: `tensorboard --logdir` over runs names each run by its id.
        out["metrics"] = {"metrics": {"out_dir": str(tensorboard_dir(workdir, cfg.run_id)), "blobs": blobs}}
    if cfg.pipeline == "coupled":
        data["pipeline"] = "coupled"
    out["data-manager"] = {"data": deep_merge(data, cfg.data.options)}
    validate(out)
    return out


def downloads_root(cfg: StackConfig) -> Path:
    """The download cache of an OSWorld run (tasks.downloads, else $DART_DOWNLOADS or .dart/blobs), absolute."""
    from dart.env.downloads import default_root

    return Path(cfg.tasks.downloads or default_root()).resolve()


def validate(sections: dict[str, dict[str, Any]]) -> None:
    """Build every service config; ConfigError names the service and the field."""
    from dart.data.config import DataConfig
    from dart.env.config import EnvWorkerConfig
    from dart.log.archiver import ArchiverConfig
    from dart.obs.sink import MetricsConfig
    from dart.rollout.service import RolloutWorkerConfig
    from dart.train.config import TrainerConfig

    kinds = {"env": EnvWorkerConfig, "rollout": RolloutWorkerConfig, "train": TrainerConfig, "data": DataConfig,
             "archiver": ArchiverConfig, "metrics": MetricsConfig}
    for name, body in sections.items():
        for section, data in body.items():
            if section == "serve":  # command-line flags, not a config file
                continue
            try:
                build(kinds[section], data, path=section)
            except ConfigError as exc:
                raise ConfigError(f"service {name}: {exc}") from exc


def service_specs(sections: dict[str, dict[str, Any]], config_dir: Path, *,
                  nice: dict[str, int] | None = None) -> list[ServiceSpec]:
    """One supervised process per service, each reading its own YAML file (written by the caller);
    ``nice`` lowers the priority of the services of a kind (env, rollout, serve, data, train)."""
    nice = nice or {}
    commands = {"env": "env-worker", "rollout": "rollout-worker", "train": "train", "data": "data-manager",
                "archiver": "archiver", "metrics": "metrics"}
    specs = []
    for name, body in sections.items():
        (section,) = body
        if section == "serve":
            flags = [(f"--{key.replace('_', '-')}", str(value)) for key, value in body["serve"].items()]
            specs.append(ServiceSpec(name=name, argv=("serve", *(part for flag in flags for part in flag)),
                                     nice=nice.get(section, 0), env={"DART_SERVICE": name}))
            continue
        path = config_dir / f"{name}.yaml"
        # `dart train CONFIG` takes its file as a positional argument; the others as --config.
        argv = (commands[section], str(path)) if section == "train" else (commands[section], "--config", str(path))
        specs.append(ServiceSpec(name=name, argv=argv, nice=nice.get(section, 0), env={"DART_SERVICE": name}))
    return specs
