"""Typed, frozen configs of the trainer service: the optimiser, the engine and the service
(the loss config lives beside the loss, in ``dart.train.loss``).

Defaults are the DART numbers (FACTS.md): PPO clip-higher 0.1 / 0.28, dual clip 10, truncated
importance sampling with C = 1, k3 KL with coefficient 0.1, AdamW lr 1e-6 constant, weight
decay 0.1, gradient clip 2.0. Build them from a mapping with ``dart.config.build``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dart.agent.config import TransferConfig
from dart.agent.prompt import PromptConfig
from dart.config import require
from dart.train.loss import LossConfig


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate (constant: no schedule)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 2.0
    """Gradients are clipped to this global L2 norm before each step."""

    def __post_init__(self) -> None:
        require(self.lr > 0.0, "optim.lr", f"must be > 0, got {self.lr}")
        require(self.weight_decay >= 0.0, "optim.weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "optim.betas",
                f"must be two numbers in [0, 1), got {self.betas}")
        require(self.max_grad_norm > 0.0, "optim.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    kind: Literal["torch", "deepspeed"] = "torch"
    """torch: plain PyTorch on one device. deepspeed: DeepSpeed ZeRO (launch with `deepspeed`/torchrun
    for several GPUs; on CPU it runs one gloo process)."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (0-3); ignored by the torch engine."""
    device: str = "auto"
    """auto (cuda if available, else cpu), cpu, cuda or cuda:N."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the trained model (bfloat16 on GPUs; float32 on CPU for exact tests)."""
    micro_batch_samples: int = 4
    """Samples per forward/backward; the gradient accumulates over the micro-batches of one batch."""
    master_weights: Literal["auto", "split", "off"] = "auto"
    """What keeps the part of each update that bfloat16 rounding drops (the torch engine).
    split: an exact float32 master held as the bfloat16 weight plus its low 16 bits
    (:mod:`dart.train.master_weights`; 2 bytes a parameter). off: plain AdamW on the bfloat16
    weights (at lr ~1e-6 most of every step rounds away: for comparisons only). auto: split for
    the torch engine in bfloat16; nothing otherwise (float32 weights are their own master, and
    DeepSpeed's bf16 mode keeps a float32 master in its optimizer)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (memory for time)."""
    threads: int | None = None
    """torch CPU threads (None: torch's default). Fixed thread counts keep CPU runs bit-reproducible."""
    dist_timeout_s: float = 300.0
    """Several ranks: the process group's timeout (gloo's default is 30 min). A rank that exits is
    noticed at once (its connections close); one that hangs stops the others after this long."""

    def __post_init__(self) -> None:
        require(0 <= self.zero_stage <= 3, "engine.zero_stage", f"must be 0..3, got {self.zero_stage}")
        require(self.dist_timeout_s > 0, "engine.dist_timeout_s", f"must be > 0, got {self.dist_timeout_s}")
        require(self.micro_batch_samples >= 1, "engine.micro_batch_samples",
                f"must be >= 1, got {self.micro_batch_samples}")
        require(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
                "engine.device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        require(self.master_weights != "split" or self.dtype == "bfloat16", "engine.master_weights",
                "split keeps the float32 master of bfloat16 weights; with engine.dtype float32 the weights "
                "are their own master: use auto or off")
        require(self.master_weights != "split" or self.kind == "torch", "engine.master_weights",
                "split is the torch engine's; DeepSpeed's bf16 mode keeps a float32 master in its own "
                "optimizer: use auto")

    @property
    def split_master(self) -> bool:
        """Whether the torch engine steps through :class:`dart.train.master_weights.SplitMasterAdamW`."""
        return self.kind == "torch" and self.dtype == "bfloat16" and self.master_weights != "off"


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    model: Path
    """Directory of the initial HF model (config.json + weights + tokenizer + image processor),
    e.g. one written by `dart model tiny`."""
    checkpoint_dir: Path
    """Where checkpoints live (``step-NNNNNNNN/`` + ``latest``); the trainer resumes from here."""
    blobs: str = "./blobs"
    """Blob store URL (a directory) shared with the other services."""
    run_id: str = "dev"
    """Training run id stamped on every event."""
    worker_id: str = "trainer-0"
    """Producer id of this trainer on its events."""
    group: str = "trainer"
    """Consumer group on the batches topic (the bus itself is configured by the file's ``bus:`` section)."""
    ranks: int = 1
    """Trainer processes (one per GPU): above 1, `dart train` starts itself under torchrun with this
    many ranks (``dart.train.ranks``); under a launcher its WORLD_SIZE decides instead."""
    seed: int = 0
    """Seed of torch / random / numpy at start (resumes restore the RNG state instead)."""
    keep_checkpoints: int = 2
    """Number of newest checkpoints (full or weights only) kept on disk; older ones are deleted
    unless among the newest ``keep_full_checkpoints`` full ones."""
    full_checkpoint_every: int = 1
    """Write the optimiser state and RNG (a full checkpoint, what a restart resumes from) at every
    N-th update; the updates between write their weights and position only (``dart.train.checkpoint``).
    A restart resumes from the newest full checkpoint and trains the batches after it again (their
    offsets are committed only once a full checkpoint covers them). 1: every update, exact resume
    with nothing to redo; on a GPU at 7B, where the AdamW state is 28 GiB, every 20-50 updates."""
    keep_full_checkpoints: int = 1
    """Number of newest full checkpoints kept on disk (besides the newest ``keep_checkpoints``)."""
    publish_every: int = 1
    """Publish the policy weights after every N-th update (the first and initial weights always)."""
    max_updates: int = 0
    """Take no batch after this many updates in all (0: no limit): the trainer then idles until
    stopped, and the batches after stay uncommitted in the log for a run resumed with a higher cap."""
    freeze_vision: bool = False
    """Train the language model only: the vision tower keeps its initial weights (no gradient, no
    optimiser state) and computes each screenshot's features without autograd. Refused at start-up
    for a model without a vision tower."""
    prompt: PromptConfig = field(default_factory=PromptConfig)
    """Prompt settings: must equal the rollout workers' (a mismatch shows as dropped samples,
    ``samples/dropped_prompt_hash``)."""
    ppo_epochs: int = 1
    """Passes over each batch (1: one pass, the paper's setting)."""
    ppo_minibatches: int = 1
    """Optimiser steps per pass: the batch's micro-batches dealt into this many mini-batches;
    with more than one step per batch, π_old is the policy before the batch and the PPO clip acts."""
    transfer: TransferConfig = field(default_factory=TransferConfig)
    """How published versions reach the rollout workers: the blob store (default) or also a direct
    broadcast to the workers' group (:mod:`dart.agent.weight_broadcast`)."""
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def clip_acts(self) -> bool:
        """Whether the PPO clip (``loss.eps_low`` / ``loss.eps_high``, clip-higher) can change an update:
        only with more than one optimiser step per batch. With one, π_old is the policy being
        stepped, the ratio is exactly 1 and the clip range changes nothing."""
        return self.ppo_epochs * self.ppo_minibatches > 1

    def __post_init__(self) -> None:
        require(self.ranks >= 1, "ranks", f"must be >= 1, got {self.ranks}")
        require(self.ppo_epochs >= 1, "ppo_epochs", f"must be >= 1, got {self.ppo_epochs}")
        require(self.ppo_minibatches >= 1, "ppo_minibatches", f"must be >= 1, got {self.ppo_minibatches}")
        require(self.keep_checkpoints >= 1, "keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")
        require(self.full_checkpoint_every >= 1, "full_checkpoint_every",
                f"must be >= 1, got {self.full_checkpoint_every}")
        require(self.keep_full_checkpoints >= 1, "keep_full_checkpoints",
                f"must be >= 1, got {self.keep_full_checkpoints}")
        require(self.publish_every >= 1, "publish_every", f"must be >= 1, got {self.publish_every}")
        require(self.max_updates >= 0, "max_updates", f"must be >= 0, got {self.max_updates}")
