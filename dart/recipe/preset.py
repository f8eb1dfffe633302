"""The recipe as a preset of the services' own configs: the one place where the recipe's knobs
become the env workers', rollout workers', trainer's and data manager's settings.

`dart up` lays its config file, and then the command line's dotted overrides, over these
objects (:class:`dart.stack.config.StackConfig`), so ``trainer.optim.lr=1e-4`` wins over
``recipe.rl_lr`` and ``recipe.rl_lr=1e-4`` reaches the trainer through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dart.data.config import (
    BatcherConfig,
    CurationConfig,
    DataConfig,
    HttpConfig,
    SchedulerConfig,
    StoreConfig,
)
from dart.env.config import EnvWorkerConfig
from dart.env.xdesktop.backend import XDesktopConfig
from dart.recipe.config import Recipe, curation_section
from dart.rollout.config import RolloutWorkerConfig
from dart.rollout.hf_engine import HFEngineConfig
from dart.train.config import EngineConfig, OptimConfig, TrainerConfig


@dataclass(frozen=True, kw_only=True)
class ServicesPreset:
    """Each service's config as the recipe sets it (the stack's process counts aside)."""

    env: EnvWorkerConfig
    rollout: RolloutWorkerConfig
    trainer: TrainerConfig
    data: DataConfig


def policy_dir(recipe: Recipe, *, workdir: Path, warm_model: Path | None, osworld: bool) -> Path:
    """Where the policy RL starts from will be: the given ``warm_model``; a random tiny one in
    ``workdir/init`` for OSWorld tasks (no oracle demonstrations) or a recipe without SFT
    steps; else the SFT warm start in ``workdir/warm`` (:func:`dart.recipe.warmstart.warm_start`)."""
    if warm_model is not None:
        return warm_model.resolve()
    return workdir / ("init" if osworld or recipe.sft_steps == 0 else "warm")


def warm_start_kind(recipe: Recipe, *, warm_model: Path | None, osworld: bool) -> str:
    """How `dart up` gets that policy: ``given``, ``random`` (OSWorld) or ``sft``."""
    if warm_model is not None:
        return "given"
    return "random" if osworld else "sft"


def services(recipe: Recipe, *, run_id: str, workdir: Path, pipeline: str, model_dir: Path,
             downloads: Path | None = None) -> ServicesPreset:
    """The services' configs of a run of ``recipe`` in ``workdir`` (absolute), with the policy
    in ``model_dir``; ``downloads``: the OSWorld download cache the env workers read."""
    blobs = str(workdir / "blobs")
    env = EnvWorkerConfig(slots=8, run_id=run_id, blobs=blobs, heartbeat_s=2.0,
                          xdesktop=XDesktopConfig(downloads=str(downloads)) if downloads else XDesktopConfig())
    rollout = RolloutWorkerConfig(model=str(model_dir), device="cpu", blobs=blobs, run_id=run_id,
                                  convention=recipe.convention, prompt=recipe.prompt, heartbeat_s=2.0,
                                  hf=HFEngineConfig(max_batch_size=recipe.engine_batch, threads=recipe.threads))
    trainer = TrainerConfig(model=model_dir, checkpoint_dir=workdir / "checkpoints", blobs=blobs, run_id=run_id,
                            worker_id="trainer", seed=recipe.seed, prompt=recipe.prompt, loss=recipe.loss,
                            ppo_epochs=recipe.ppo_epochs, ppo_minibatches=recipe.ppo_minibatches,
                            optim=OptimConfig(lr=recipe.rl_lr, weight_decay=recipe.weight_decay,
                                              max_grad_norm=recipe.max_grad_norm),
                            engine=EngineConfig(device="cpu", threads=recipe.threads,
                                                micro_batch_samples=recipe.micro_batch))
    data = DataConfig(
        run_id=run_id, blobs=blobs, store=StoreConfig(dsn=f"chdb://{workdir / 'chdb'}"),
        curation=CurationConfig(**curation_section(recipe)),
        # A pass of the scheduler or the batcher is a few curation queries (0.3-0.5 s on the store
        # thread late in a run on 2 busy cores): every 1.5 s, with three times the slots in
        # flight at least (at 2x the slots ran dry between two passes late in a run: engine
        # batches fell from ~20 rows to 3) and more where the slots finish faster than that queue
        # lasts (``SchedulerConfig.refill_cycles``), while the data manager leaves the CPU to the
        # rollout worker and trainer (at 0.5 s, 1x it took ~55 % of a core).
        scheduler=SchedulerConfig(temperature=recipe.temperature, top_p=recipe.top_p,
                                  max_new_tokens=recipe.max_new_tokens, frequency_penalty=0.0,
                                  interval_s=1.5, capacity_factor=3.0),
        batcher=BatcherConfig(groups_per_batch=recipe.tasks_per_update, interval_s=1.5),
        http=HttpConfig(port=0, host="127.0.0.1"),
        pipeline=pipeline,  # type: ignore[arg-type]
    )
    return ServicesPreset(env=env, rollout=rollout, trainer=trainer, data=data)
