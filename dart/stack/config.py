"""`dart up` configuration: one file describes a whole run on one machine.

The stack's config is the run's config tree: the run's own settings, the recipe's own knobs
(:class:`~dart.recipe.config.Recipe`: model size, tasks, warm start, dev check, evaluation) and
each service's own config object (``env``, ``rollout``, ``trainer``, ``data``), each fact in one of
them. The recipe's choices for the services are a preset of the tree (:func:`dart.recipe.preset.preset`)
that the file's sections and the command line's dotted overrides are laid over. Every object is
built (and so validated, with the field named) before anything starts, and `dart up` writes each
one, as it is, into its service's file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dart.agent.prompt import PromptConfig
from dart.config import as_mapping, build, defaults_of, merge, require
from dart.data.config import DataConfig
from dart.env.config import EnvWorkerConfig
from dart.env.downloads import default_root
from dart.recipe.config import Recipe
from dart.recipe.preset import policy_dir, preset
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
    """Model, tasks, warm start, dev check and evaluation settings (the services' settings are in
    their sections: sampling in ``data.scheduler``, the loss in ``trainer.loss``, ...)."""
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
        defaults with the recipe's preset of the services (:func:`dart.recipe.preset.preset`)."""
        for old, new in MOVED.items():
            require(not has_path(data, old), old, f"moved to {new} (one key per setting, where its service reads it); "
                    f"set {new}")
        run = build(RunConfig, {k: v for k, v in data.items() if k in RUN_FIELDS})
        workdir = run.workdir.resolve()
        osworld = run.tasks.source == "osworld"
        tree = preset(run.recipe, run_id=run.run_id, workdir=workdir, pipeline=run.pipeline,
                      model_dir=policy_dir(run.recipe, workdir=workdir, warm_model=run.warm_model, osworld=osworld),
                      max_updates=run.max_updates, downloads=downloads_root(run.tasks) if osworld else None)
        # The trainer rebuilds the rollout workers' prompts: ``rollout.prompt`` is the one key of
        # both (a different ``trainer.prompt`` is refused below).
        prompt = (data.get("rollout") or {}).get("prompt")
        if isinstance(prompt, Mapping):
            tree["trainer"]["prompt"] = merge(tree["trainer"]["prompt"], prompt)
        return merge(defaults_of(cls), {**as_mapping(run), **tree})

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
        for name, value, source, key in self.shared_facts():
            require(value == getattr_path(self, source), name, f"differs from {source}; set {key} (one key, "
                    "every service that needs it given it)")
        require(self.rollout.convention == "qwen2vl" or not self.writes_oracle_answers
                or (self.rollout.prompt.min_pixels, self.rollout.prompt.max_pixels) == UITARS_PIXELS,
                "rollout.convention", "qwen25vl's frame is rendered for UI-TARS' default pixel bounds only, and "
                "rollout.prompt sets others: the warm start's oracle answers would not parse; use qwen2vl")
        if self.tasks.source == "synthetic":
            require(self.data.batcher.groups_per_batch <= self.recipe.train_tasks, "data.batcher.groups_per_batch",
                    f"must be <= recipe.train_tasks ({self.recipe.train_tasks})")

    def shared_facts(self) -> list[tuple[str, Any, str, str]]:
        """The facts of the run that more than one process holds, as (field, its value, the field it
        must equal, the one key to set): each is set once, and a service's own different copy is
        refused rather than left to drift."""
        out = [(f"{name}.{fact}", getattr(getattr(self, name), fact), source, key)
               for name in ("env", "rollout", "trainer", "data")
               for fact, source, key in (("run_id", "run_id", "run_id"), ("blobs", "blob_dir", "workdir"))]
        return [*out,
                ("data.pipeline", self.data.pipeline, "pipeline", "pipeline"),
                # the trainer stops itself at the budget the stack watches
                ("trainer.max_updates", self.trainer.max_updates, "max_updates", "max_updates"),
                ("trainer.seed", self.trainer.seed, "recipe.seed", "recipe.seed"),
                # one policy: the trainer publishes versions of the weights the rollout workers start from
                ("rollout.model", self.rollout.model, "policy_model", "warm_model"),
                ("trainer.model", str(self.trainer.model), "policy_model", "warm_model"),
                # a sample whose prompt the trainer builds otherwise than the rollout worker did is
                # dropped (samples/dropped_prompt_hash); the warm start trains on it too
                ("trainer.prompt", self.trainer.prompt, "rollout.prompt", "rollout.prompt.*"),
                *([("env.xdesktop.downloads", self.env.xdesktop.downloads, "downloads", "tasks.downloads")]
                  if self.osworld else [])]

    @property
    def blob_dir(self) -> str:
        """The run's blob store, WORKDIR/blobs (absolute)."""
        return str(self.workdir.resolve() / "blobs")

    @property
    def policy_model(self) -> str:
        """The policy every service starts from (:func:`dart.recipe.preset.policy_dir`)."""
        return str(policy_dir(self.recipe, workdir=self.workdir.resolve(), warm_model=self.warm_model,
                              osworld=self.osworld))

    @property
    def downloads(self) -> str:
        """The OSWorld download cache the env workers read (:func:`downloads_root`)."""
        return str(downloads_root(self.tasks))

    @property
    def writes_oracle_answers(self) -> bool:
        """Whether the run renders oracle solutions as answers (the SFT warm start, the experience pool)."""
        sft = self.warm_model is None and not self.osworld and self.recipe.sft_steps > 0
        return sft or self.experience_tasks > 0


UITARS_PIXELS = (PromptConfig.min_pixels, PromptConfig.max_pixels)
"""The pixel bounds of UI-TARS' prompt: the only ones the qwen25vl frame is rendered for."""


MOVED = {
    "recipe.convention": "rollout.convention", "recipe.prompt": "rollout.prompt", "recipe.threads": "rollout.hf.threads "
    "and trainer.engine.threads", "recipe.engine_batch": "rollout.hf.max_batch_size", "recipe.loss": "trainer.loss",
    "recipe.rl_lr": "trainer.optim.lr", "recipe.weight_decay": "trainer.optim.weight_decay",
    "recipe.max_grad_norm": "trainer.optim.max_grad_norm", "recipe.micro_batch": "trainer.engine.micro_batch_samples",
    "recipe.ppo_epochs": "trainer.ppo_epochs", "recipe.ppo_minibatches": "trainer.ppo_minibatches",
    "recipe.temperature": "data.scheduler.temperature", "recipe.top_p": "data.scheduler.top_p",
    "recipe.max_new_tokens": "data.scheduler.max_new_tokens", "recipe.max_steps": "data.curation.max_steps",
    "recipe.group_size": "data.curation.n_default", "recipe.tasks_per_update": "data.batcher.groups_per_batch",
    "recipe.inject_experience": "data.curation.inject_experience with experience_tasks",
    "trainer.loss.entropy_top_frac": "data.curation.entropy_top_fraction",
}
"""Keys of an older config and where each setting lives now (issue 55: one home per setting)."""


def has_path(data: Mapping[str, Any], dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


def getattr_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def downloads_root(tasks: TasksSection) -> Path:
    """The download cache of an OSWorld run (tasks.downloads, else $DART_DOWNLOADS or .dart/blobs), absolute."""
    return Path(tasks.downloads or default_root()).resolve()
