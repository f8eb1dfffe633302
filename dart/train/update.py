"""One policy update: micro-batches through the engine with gradient accumulation, then a step.

The engine supplies log-probs and applies gradients; the loss comes from ``dart.train.loss``.
The old log-probs are those of the policy before this update: every micro-batch is scored
before the single optimiser step, so the detached forward of the current parameters is
exactly π_old (the ratio starts at 1 and truncated IS carries the rollout/trainer gap).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dart.train.batch import Dropped, ModelBatch
from dart.train.engine import Engine, ReferencePolicy
from dart.train.loss import LossConfig, LossStats, policy_loss


@dataclass(frozen=True, kw_only=True)
class UpdateResult:
    stats: LossStats
    grad_norm: float
    num_samples: int
    num_tokens: int
    duration_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.duration_s if self.duration_s > 0 else 0.0


def apply_update(engine: Engine, batches: Sequence[ModelBatch], loss_cfg: LossConfig,
                 ref: ReferencePolicy | None = None, *, epochs: int = 1, minibatches: int = 1,
                 num_samples: int | None = None) -> UpdateResult:
    """The policy update of one batch of micro-batches.

    Default (``epochs = minibatches = 1``): forward/backward every micro-batch, then clip and
    step once. The loss of each micro-batch is divided by the selected samples of the whole
    batch, so the accumulated gradient is the full batch's seq-mean-token-mean gradient whatever
    the micro-batch size.

    PPO-style reuse (``epochs * minibatches > 1``): π_old is scored once for the whole batch
    before any step; the micro-batches are dealt round-robin into ``minibatches`` mini-batches and
    each epoch takes one optimiser step per mini-batch (its loss normalised by that mini-batch's
    samples), so the clipped ratio bounds how far each step moves from π_old.

    ``num_samples`` (one step only): the selected samples of the whole batch when ``batches``
    is one rank's shard of it (:mod:`dart.train.ranks`); default: those of ``batches``.
    """
    if epochs < 1 or minibatches < 1:
        raise ValueError(f"epochs and minibatches must be >= 1, got {epochs} and {minibatches}")
    if epochs == 1 and minibatches == 1:
        return _single_step(engine, batches, loss_cfg, ref, num_samples)
    start = time.perf_counter()
    with torch.no_grad():
        old = [engine.forward(b)[0].detach() for b in batches]
        refs = [ref.logprobs(b) if ref is not None and loss_cfg.kl_coef > 0 else None for b in batches]
    groups = [list(range(i, len(batches), minibatches)) for i in range(min(minibatches, len(batches)))]
    stats, grad_norm = LossStats(), 0.0
    for epoch in range(epochs):
        for group in groups:
            num_samples = int(sum(int(batches[i].step_mask_B.sum()) for i in group))
            for i in group:
                batch = batches[i]
                logp_B_T, entropy_B_T = engine.forward(batch)
                device = logp_B_T.device
                ref_logp_B_T = refs[i].to(device) if refs[i] is not None else None
                loss, micro_stats = policy_loss(
                    logp_B_T, old[i].to(device), batch.rollout_logprobs_B_T.to(device), batch.adv_B.to(device),
                    batch.mask_B_T.to(device), loss_cfg, ref_logp_B_T=ref_logp_B_T,
                    step_mask_B=batch.step_mask_B.to(device), sft_B=batch.sft_B.to(device),
                    entropy_B_T=entropy_B_T, num_samples=max(num_samples, 1),
                )
                engine.backward(loss)
                if epoch == epochs - 1:
                    stats = stats + micro_stats  # the last pass: how far the update moved
            grad_norm = engine.step()
    return UpdateResult(stats=stats, grad_norm=grad_norm,
                        num_samples=int(sum(int(b.step_mask_B.sum()) for b in batches)),
                        num_tokens=int(stats.totals.get("batch/tokens", 0)),
                        duration_s=time.perf_counter() - start)


def _single_step(engine: Engine, batches: Sequence[ModelBatch], loss_cfg: LossConfig,
                 ref: ReferencePolicy | None, num_samples: int | None = None) -> UpdateResult:
    start = time.perf_counter()
    if num_samples is None:
        num_samples = int(sum(int(b.step_mask_B.sum()) for b in batches))
    stats = LossStats()
    for batch in batches:
        logp_B_T, entropy_B_T = engine.forward(batch)
        device = logp_B_T.device
        ref_logp_B_T = ref.logprobs(batch).to(device) if ref is not None and loss_cfg.kl_coef > 0 else None
        loss, micro_stats = policy_loss(
            logp_B_T, logp_B_T.detach(), batch.rollout_logprobs_B_T.to(device), batch.adv_B.to(device),
            batch.mask_B_T.to(device), loss_cfg, ref_logp_B_T=ref_logp_B_T,
            step_mask_B=batch.step_mask_B.to(device), sft_B=batch.sft_B.to(device), entropy_B_T=entropy_B_T,
            num_samples=num_samples,
        )
        engine.backward(loss)
        stats = stats + micro_stats
    grad_norm = engine.step()
    return UpdateResult(stats=stats, grad_norm=grad_norm, num_samples=num_samples,
                        num_tokens=int(stats.totals.get("batch/tokens", 0)),
                        duration_s=time.perf_counter() - start)


def step_metrics(result: UpdateResult, dropped: Sequence[Dropped], *, kept: int, adv_B: torch.Tensor,
                 timings: dict[str, float]) -> dict[str, float]:
    """The slash-named metrics of one update (the TrainStepCompleted ``metrics`` map)."""
    metrics = dict(result.stats.means())
    reasons = Counter(d.reason for d in dropped)
    for reason in ("prompt_hash", "unreadable", "ragged", "vision_token"):
        metrics[f"samples/dropped_{reason}"] = float(reasons.get(reason, 0))
    metrics["samples/kept"] = float(kept)
    metrics["grad/norm"] = result.grad_norm
    if adv_B.numel():
        metrics["adv/mean"] = float(adv_B.mean())
        metrics["adv/abs_mean"] = float(adv_B.abs().mean())
    metrics["perf/tokens_per_s"] = result.tokens_per_s
    metrics.update({f"time/{name}_s": value for name, value in timings.items()})
    return metrics
