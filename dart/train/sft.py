"""Warm start: supervised fine-tuning on experience-pool trajectories before RL.

``dart train --sft DATA`` trains plain NLL on the response tokens of the given samples for N
epochs and writes a policy directory (weights + config + tokenizer + image processor) that
the RL trainer (``model:``) and the rollout workers load; with a bus it also publishes the
result as policy version 0. DATA is a batch manifest (``dart.batch.v1`` JSON) or an
experience file: a JSON list, or JSON lines, of ``Sample`` records.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dart.agent.model import load_policy, save_policy
from dart.agent.prompt import PromptConfig, blob_image_loader
from dart.blobs import BlobStore
from dart.config import require
from dart.errors import DecodeError
from dart.events.manifest import BatchManifest, Sample
from dart.train.batch import Dropped, collate, prepare_samples
from dart.train.config import EngineConfig, OptimConfig
from dart.train.engine import TorchEngine
from dart.train.loss import nll_loss

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    data: Path
    """Batch manifest or experience file (JSON list / JSON lines of samples)."""
    model: Path
    """Policy directory to start from (e.g. `dart model tiny` output)."""
    out: Path
    """Policy directory to write (model.safetensors, config.json, tokenizer, image processor)."""
    epochs: int = 3
    """Passes over the data."""
    micro_batch_samples: int = 4
    """Samples per optimiser step."""
    seed: int = 0
    """Shuffling and torch seed."""
    check_hash: bool = False
    """Drop samples whose rebuilt prompt hash differs (on for data from this policy's own rollouts)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, weight_decay=0.0))
    engine: EngineConfig = field(default_factory=EngineConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        require(self.micro_batch_samples >= 1, "micro_batch_samples", f"must be >= 1, got {self.micro_batch_samples}")


@dataclass(frozen=True, kw_only=True)
class SFTResult:
    out: Path
    epoch_losses: list[float]
    """Mean NLL per response token sample-mean, per epoch (as trained, before each step)."""
    samples: int
    dropped: list[Dropped]


def load_sft_data(path: Path) -> BatchManifest:
    """The samples of a manifest or an experience file, as one manifest (DecodeError if neither)."""
    data = Path(path).read_bytes()
    try:
        return BatchManifest.from_bytes(data)
    except DecodeError:
        pass
    try:
        text = data.decode()
        stripped = text.lstrip()
        rows = json.loads(text) if stripped.startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]
        samples = [Sample.from_dict(r) for r in rows]
    except (ValueError, KeyError, TypeError) as exc:
        raise DecodeError(f"{path} is neither a batch manifest nor a JSON list/lines of samples: {exc}") from exc
    if not samples:
        raise DecodeError(f"{path} holds no samples")
    return BatchManifest(batch_id=f"sft:{Path(path).name}", seq=0, run_id="sft", samples=samples)


def epoch_chunks(n: int, size: int, rng: random.Random) -> list[list[int]]:
    """One epoch's micro-batches (sample indices): consecutive chunks of a fresh shuffle.

    Every optimiser step of SFT is one micro-batch, so their composition must change between
    epochs. (``micro_batches`` sorts by length to save padding, which here would walk the same
    length-ordered batches every epoch; on the synthetic tasks length follows the target's
    colour name, and the tiny policy did not learn to ground that way.)"""
    order = rng.sample(range(n), n)
    return [order[i : i + size] for i in range(0, n, size)]


def sft_chunks(n: int, size: int, rng: random.Random, *, whole_only: bool = False) -> Iterator[list[int]]:
    """Endless micro-batches (sample indices) of ``n`` samples, each pass a fresh shuffle
    (:func:`epoch_chunks`). ``whole_only``: a pass's short last chunk is left out, so every step
    sees ``size`` samples (the warm start counts steps); else it is kept (``--sft`` counts epochs)."""
    if n < 1 or size < 1 or (whole_only and size > n):
        raise ValueError(f"chunk size must be in [1, {n}], got {size}")
    while True:
        for chunk in epoch_chunks(n, size, rng):
            if len(chunk) == size or not whole_only:
                yield chunk


def sft_step(engine: TorchEngine, samples: Sequence[Any], pad_id: int) -> float:
    """One SFT optimiser step, the only one of dart (``dart train --sft``, the recipe's warm start,
    the SFT probe): collate ``samples`` (prepared ones, :func:`dart.train.batch.prepare_samples`),
    forward, plain NLL on the response tokens, backward, step. Returns the loss."""
    batch = collate(list(samples), torch.ones(len(samples), dtype=torch.bool), pad_id=pad_id)
    logp_B_T, _ = engine.forward(batch)
    loss, _ = nll_loss(logp_B_T, batch.mask_B_T.to(logp_B_T.device))
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def sft_loop(engine: TorchEngine, samples: Sequence[Any], pad_id: int, *, micro_batch: int, steps: int,
             rng: random.Random, whole_only: bool = False) -> Iterator[tuple[int, float]]:
    """The SFT loop, the only one of dart (``dart train --sft``, the recipe's warm start, the SFT
    probe): up to ``steps`` :func:`sft_step` s over :func:`sft_chunks` of ``samples``, yielding each
    step's (samples, loss) once it is taken, so a caller can check the policy between steps or stop."""
    chunks = sft_chunks(len(samples), micro_batch, rng, whole_only=whole_only)
    for chunk in itertools.islice(chunks, steps):
        yield len(chunk), sft_step(engine, [samples[i] for i in chunk], pad_id)


def run_sft(cfg: SFTConfig, blobs: BlobStore) -> SFTResult:
    """Train, then write the policy directory ``cfg.out``; returns the per-epoch losses."""
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if cfg.engine.threads:
        torch.set_num_threads(cfg.engine.threads)
    policy = load_policy(cfg.model, device="cpu", dtype=cfg.engine.dtype)
    samples, dropped = prepare_samples(load_sft_data(cfg.data), tokenizer=policy.tokenizer,
                                       image_processor=policy.image_processor, load_image=blob_image_loader(blobs),
                                       prompt_cfg=cfg.prompt, check_hash=cfg.check_hash, advantages=False)
    for d in dropped:
        log.warning("sft: dropped step %d of %s (%s: %s)", d.step_index, d.rollout_id, d.reason, d.detail)
    if not samples:
        raise DecodeError(f"no usable sample in {cfg.data} ({len(dropped)} dropped)")
    engine = TorchEngine(policy.model, cfg.optim, cfg.engine)
    per_epoch = -(-len(samples) // cfg.micro_batch_samples)
    steps = sft_loop(engine, samples, policy.pad_token_id, micro_batch=cfg.micro_batch_samples,
                     steps=cfg.epochs * per_epoch, rng=random.Random(cfg.seed))
    losses = []
    for epoch in range(cfg.epochs):
        taken = list(itertools.islice(steps, per_epoch))
        count = sum(n for n, _ in taken)
        losses.append(sum(n * loss for n, loss in taken) / count)
        log.info("sft epoch %d/%d: nll %.4f over %d samples", epoch + 1, cfg.epochs, losses[-1], count)
    save_policy(policy, cfg.out, state=engine.full_state_dict())
    return SFTResult(out=cfg.out, epoch_losses=losses, samples=len(samples), dropped=dropped)
