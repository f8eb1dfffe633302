"""`dart up` configuration: one file describes a whole run on one machine.

The stack's config holds each service's own config object (``env``, ``rollout``, ``trainer``,
``data``); the recipe (:class:`~dart.recipe.config.Recipe`: model size, tasks, prompt, sampling,
warm start, RL) is a preset of those objects (:mod:`dart.recipe.preset`) that the file's service
sections and the command line's dotted overrides are laid over. Every object is built (and so
validated, with the field named) before anything starts, and `dart up` writes each one, as it
is, into its service's file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dart.config import as_mapping, build, defaults_of, merge, require
from dart.data.config import DataConfig
from dart.env.config import EnvWorkerConfig
from dart.env.downloads import default_root
from dart.recipe.config import Recipe
from dart.recipe.preset import policy_dir, services
from dart.rollout.config import RolloutWorkerConfig
from dart.train.config import TrainerConfig


@dataclass(frozen=True, kw_only=True)
class EnvSection(EnvWorkerConfig):
    """The env workers: each runs this config (its ``worker_id`` and ``reply_partition`` its own)."""

    workers: int = 1
    """Env worker processes."""
    nice: int = 0
    """CPU priority of the env workers below the other services' (0-19; see RolloutSection.nice)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.workers >= 1, "workers", f"must be >= 1, got {self.workers}")
        require(0 <= self.nice <= 19, "nice", f"must be 0-19, got {self.nice}")
        require(self.backend in ("synthetic", "xdesktop"), "backend",
                f"dart up runs synthetic or xdesktop env workers, got {self.backend!r}")


@dataclass(frozen=True, kw_only=True)
class RolloutSection(RolloutWorkerConfig):
    """The rollout workers: each runs this config (its ``worker_id`` its own)."""

    workers: int = 1
    """Rollout worker processes (each holds one copy of the policy)."""
    serve: bool = True
    """engine openai: start `dart serve` of the run's policy on a free loopback port as one more
    supervised service and point the workers at it; false: the server at ``openai.base_url``
    (vLLM, SGLang, another `dart serve`; ``openai.model`` is the name it serves)."""
    nice: int = 0
    """CPU priority of the rollout workers (and `dart serve`) below the other services' (0-19), for
    a machine where the trainer's CPU time is what limits updates. Not the default: measured on 2
    cores with `make run`, the trainer waits for batches most of the time (an update is a small part
    of its cycle) and niced rollout workers only made fewer samples, and a CPU hog beside
    the run (nice 0) would take their share first."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.workers >= 1, "workers", f"must be >= 1, got {self.workers}")
        require(0 <= self.nice <= 19, "nice", f"must be 0-19, got {self.nice}")


@dataclass(frozen=True, kw_only=True)
class TasksSection:
    source: Literal["synthetic", "osworld"] = "synthetic"
    """synthetic: the recipe's generated tasks (train and held-out splits). osworld: OSWorld task
    files (``paths``), all in the train split, run by ``env.backend``."""
    paths: tuple[str, ...] = ()
    """osworld: task files, folders of them, or id-list files (``{domain: [ids]}``, resolved
    against ``examples``); empty: every file under ``examples``."""
    examples: str = ""
    """osworld: the OSWorld examples folder id lists name tasks in (empty: ../shared/data/osworld/examples
    beside the repository)."""
    domains: tuple[str, ...] = ()
    """osworld: keep only tasks of these domains (empty: all)."""
    max_tasks: int = 0
    """osworld: keep at most this many tasks, the first by (domain, id) (0: all)."""
    offline: bool = True
    """osworld: leave out tasks that read a file from a URL not in the download cache (``dart tasks
    fetch`` fills it); off, such a task runs and ends as an infra error naming the file."""
    downloads: str = ""
    """osworld: the download cache (empty: $DART_DOWNLOADS or .dart/blobs); the env workers read it."""

    def __post_init__(self) -> None:
        require(self.max_tasks >= 0, "tasks.max_tasks", f"must be >= 0, got {self.max_tasks}")
        require(self.source == "osworld" or not (self.paths or self.domains or self.max_tasks), "tasks.source",
                "paths, domains and max_tasks select OSWorld tasks; set tasks.source: osworld")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A run's own settings: everything of a stack config but the services'."""

    run_id: str = "local"
    """Run id stamped on every event."""
    workdir: Path = Path("runs/local")
    """Everything of the run: model, blobs, ClickHouse store, checkpoints, logs, summary."""
    pipeline: Literal["decoupled", "coupled"] = "decoupled"
    """decoupled: DART's asynchronous services. coupled: the synchronous baseline (a batch of
    trajectories in lockstep, then train, then sync every rollout worker)."""
    bootstrap: str = ""
    """Kafka bootstrap servers; empty starts a dev broker (Tansu) for the run."""
    rl_minutes: float = 8.0
    """Wall-clock cap of the RL phase (with ``max_updates``: the most it may take; without:
    its length)."""
    max_updates: int = 0
    """The RL phase's budget in trainer updates: it ends after this many, so a slower or busier
    machine makes the same run more slowly instead of a shorter one; ``rl_minutes`` caps it and
    the summary says when the cap cut it short (0: only the clock stops it)."""
    max_trajectories: int = 0
    """Stop the RL phase once this many online trajectories finished (0: only the clock and
    ``max_updates`` stop it)."""
    experience_tasks: int = 0
    """Oracle solutions of this many training tasks go into the experience pool at start (the
    data manager injects one into a group whose online rollouts all failed)."""
    evaluate: bool = True
    """Measure held-out success of the warm start and of the final policy."""
    tensorboard: bool = True
    """Run `dart metrics` beside the services: TensorBoard event files of the run, rebuilt from
    the log as it happens, in ``WORKDIR/tensorboard/RUN_ID`` (false: no such service)."""
    warm_model: Path | None = None
    """Start from this policy directory (e.g. an earlier run's ``warm``) instead of building
    and warm-starting one; recipe.model and recipe.sft_* are then not used."""
    recipe: Recipe = field(default_factory=Recipe)
    """Model, tasks, prompt, sampling, warm start, RL and evaluation settings."""
    tasks: TasksSection = field(default_factory=TasksSection)
    """Where the training tasks come from (the recipe's synthetic ones by default)."""


@dataclass(frozen=True, kw_only=True)
class StackConfig(RunConfig):
    """A whole run: its own settings and every service's config object. A file is laid over
    the recipe's preset of the services (:meth:`config_defaults`); `dart up` writes each
    service's object, as it is, into that service's file."""

    env: EnvSection
    rollout: RolloutSection
    trainer: TrainerConfig
    data: DataConfig

    @classmethod
    def config_defaults(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """What ``data`` (a config file, overrides laid over it) is laid over: the stack's
        defaults with the services' configs as the file's recipe sets them."""
        run = build(RunConfig, {k: v for k, v in data.items() if k in RUN_FIELDS})
        workdir = run.workdir.resolve()
        osworld = run.tasks.source == "osworld"
        preset = services(run.recipe, run_id=run.run_id, workdir=workdir, pipeline=run.pipeline,
                          model_dir=policy_dir(run.recipe, workdir=workdir, warm_model=run.warm_model,
                                               osworld=osworld),
                          downloads=downloads_root(run.tasks) if osworld else None)
        # The trainer stops itself at the run's update budget (the stack's watch alone can see a
        # second update land before it stops the services).
        preset = dataclasses.replace(preset, trainer=dataclasses.replace(preset.trainer, max_updates=run.max_updates))
        return merge(defaults_of(cls), {**as_mapping(run), **{name: as_mapping(getattr(preset, name))
                                                               for name in ("env", "rollout", "trainer", "data")}})

    @property
    def osworld(self) -> bool:
        return self.tasks.source == "osworld"

    def __post_init__(self) -> None:
        require(self.rl_minutes > 0, "rl_minutes", f"must be > 0, got {self.rl_minutes}")
        require(self.experience_tasks >= 0, "experience_tasks", f"must be >= 0, got {self.experience_tasks}")
        require(self.max_updates >= 0, "max_updates", f"must be >= 0, got {self.max_updates}")
        require(self.max_trajectories >= 0, "max_trajectories", f"must be >= 0, got {self.max_trajectories}")
        if self.tasks.source == "osworld":
            # Held-out evaluation, the warm start's SFT and the oracle experience pool play
            # synthetic episodes in-process; OSWorld tasks run only on the env workers' desktops.
            require(self.env.backend != "synthetic", "env.backend",
                    "OSWorld tasks need a desktop; set env.backend: xdesktop")
            require(not self.evaluate, "evaluate", "held-out evaluation plays synthetic tasks; set evaluate: false")
            require(self.experience_tasks == 0, "experience_tasks",
                    "the oracle experience pool is synthetic; set experience_tasks: 0")
        require(bool(self.run_id) and self.run_id.replace("-", "").replace("_", "").isalnum(), "run_id",
                f"letters, digits, - and _ only, got {self.run_id!r}")
        # The warm start trains on the recipe's prompt; a sample whose prompt the trainer builds
        # otherwise than the rollout worker did is dropped (samples/dropped_prompt_hash).
        for name, prompt in (("rollout.prompt", self.rollout.prompt), ("trainer.prompt", self.trainer.prompt)):
            require(prompt == self.recipe.prompt, name,
                    "differs from recipe.prompt; set recipe.prompt.* (the warm start, the rollout workers and "
                    "the trainer share it)")


RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def downloads_root(tasks: TasksSection) -> Path:
    """The download cache of an OSWorld run (tasks.downloads, else $DART_DOWNLOADS or .dart/blobs), absolute."""
    return Path(tasks.downloads or default_root()).resolve()
