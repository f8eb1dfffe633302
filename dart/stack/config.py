"""`dart up` configuration: one file describes a whole run on one machine.

The learning knobs live in one :class:`~dart.recipe.config.Recipe` (model size, tasks, prompt,
sampling, warm start, RL learning rate, evaluation) and every service's config is derived
from it, so the rollout workers and the trainer can never disagree on the prompt. Each
service section may add raw options that are merged into that service's own config; all of
them are built (and so validated, with the field named) before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dart.config import require
from dart.recipe.config import Recipe


@dataclass(frozen=True, kw_only=True)
class EnvSection:
    workers: int = 1
    """Env worker processes."""
    slots: int = 8
    """Environment slots per env worker."""
    backend: Literal["synthetic", "xdesktop"] = "synthetic"
    """Backend of every slot."""
    options: dict[str, Any] = field(default_factory=dict)
    """Extra fields of the env workers' `env:` section (e.g. synthetic.latency)."""
    nice: int = 0
    """CPU priority of the env workers below the other services' (0-19; see RolloutSection.nice)."""

    def __post_init__(self) -> None:
        require(self.workers >= 1, "env.workers", f"must be >= 1, got {self.workers}")
        require(self.slots >= 1, "env.slots", f"must be >= 1, got {self.slots}")
        require(0 <= self.nice <= 19, "env.nice", f"must be 0-19, got {self.nice}")


@dataclass(frozen=True, kw_only=True)
class RolloutSection:
    workers: int = 1
    """Rollout worker processes (each holds one copy of the policy)."""
    engine: Literal["hf", "openai"] = "hf"
    """hf: each rollout worker loads the policy and follows the trainer's versions. openai: the
    workers ask an OpenAI-compatible server (``base_url``, or a `dart serve` of the run's policy)."""
    base_url: str = ""
    """openai: the server's root including /v1 (vLLM, SGLang, another `dart serve`); empty starts
    `dart serve` of the run's policy on a free loopback port as one more supervised service."""
    served_model: str = "policy"
    """openai: the model name the server serves (vLLM: its --served-model-name)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Extra fields of the rollout workers' `rollout:` section (e.g. max_concurrency, hf.max_batch_size,
    openai.timeout_s)."""
    nice: int = 0
    """CPU priority of the rollout workers (and `dart serve`) below the other services' (0-19), for
    a machine where the trainer's CPU time is what limits updates. Not the default: measured on 2
    cores with `make run`, the trainer waits for batches most of the time (one update takes ~6 s of
    its ~50 s cycle) and niced rollout workers only made fewer samples, and a CPU hog beside
    the run (nice 0) would take their share first."""

    def __post_init__(self) -> None:
        require(self.workers >= 1, "rollout.workers", f"must be >= 1, got {self.workers}")
        require(0 <= self.nice <= 19, "rollout.nice", f"must be 0-19, got {self.nice}")
        require(not self.base_url or self.base_url.startswith(("http://", "https://")), "rollout.base_url",
                f"not an http URL: {self.base_url!r}")
        require(not self.base_url or self.engine == "openai", "rollout.base_url",
                "only the openai engine talks to a server; set rollout.engine: openai")


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
class ServiceSection:
    options: dict[str, Any] = field(default_factory=dict)
    """Extra fields merged into the service's own config section."""


@dataclass(frozen=True, kw_only=True)
class StackConfig:
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
    env: EnvSection = field(default_factory=EnvSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    trainer: ServiceSection = field(default_factory=ServiceSection)
    data: ServiceSection = field(default_factory=ServiceSection)

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
