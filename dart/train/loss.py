"""The step-wise GRPO policy loss: tensors and a frozen config in, ``(loss, stats)`` out.

Pure maths, no logging. Shapes: ``_B`` samples (one step of one trajectory each), ``_T``
response tokens (right-padded; ``mask_B_T`` is 1 on real tokens). Per token:

    ratio  r_t = exp(logπθ_t − logπ_old_t)        (GSPO: one ratio per sample)
    A      ← A · s  when A < 0                 (s = negative_scale, 1 by default)
    PPO    ℓ_t = max(−A·r_t, −A·clip(r_t, 1−ε_low, 1+ε_high)), and min(ℓ_t, −A·c) when A < 0
    TIS    ℓ_t ← ℓ_t · min(exp(logπ_old_t − logπ_rollout_t), C)      (detached; a NaN rollout
           log-prob means unknown, off-policy experience without the sampler's log-probs: w_t = 1)
    KL     ℓ_t += β · k3(π_ref ‖ πθ),  k3 = exp(d) − d − 1, d = logπ_ref_t − logπθ_t
    SFT    ℓ_t += λ · (−logπθ_t)        on samples flagged sft

Aggregation is "seq-mean-token-mean": the mean over each sample's real tokens, then the sum
over selected samples divided by ``num_samples`` (the selected samples of the whole batch, so
micro-batches add up to exactly the full-batch loss). Unselected samples (entropy step mask)
get no loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from dart.config import require

LOG_RATIO_LIMIT = 20.0
"""Log-ratios are clamped to ±this before exp so a wild token cannot overflow to inf."""


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    eps_low: float = 0.1
    """PPO clip range below 1: the ratio is clipped at 1 - eps_low."""
    eps_high: float = 0.28
    """PPO clip range above 1 (clip-higher): the ratio is clipped at 1 + eps_high."""
    dual_clip: float | None = 10.0
    """Dual-clip bound c for negative advantages: the token loss never exceeds -A * c. None: off."""
    ratio_level: Literal["token", "sequence"] = "token"
    """token: PPO ratio per token. sequence: GSPO, one ratio per sample, exp(mean_t(logπ - logπ_old))."""
    tis: Literal["token", "sequence", "geometric", "off"] = "token"
    """Truncated importance sampling against the rollout log-probs: token: w_t = min(exp(logπ_old -
    logπ_rollout), C); sequence: one weight per sample from the summed log-ratio; geometric: from
    the mean log-ratio; off: w = 1."""
    tis_cap: float = 1.0
    """C, the cap of the importance weights."""
    kl_coef: float = 0.1
    """Weight of the k3 KL to the frozen reference policy; 0 turns the reference model off."""
    sft_coef: float = 1.0
    """Weight of the NLL term on samples flagged ``sft`` (off-policy successes); 0 turns it off."""
    negative_scale: float = 1.0
    """Negative advantages are multiplied by this (1: plain GRPO; 0: only better-than-average samples
    learn). Below 1 it damps the push-down of sampled failures, which on a small model flattens
    every logit at once (entropy collapse the other way) before the successes are learned."""
    step_weight: Literal["step", "trajectory"] = "step"
    """How a trajectory's steps share its advantage. step: every step sample carries the whole A_i
    (the paper's step-wise GRPO; a long trajectory weighs more). trajectory: A_i · n̄ / n_i, where
    n_i is the trajectory's steps in the batch and n̄ the batch's mean, so every trajectory weighs
    the same whatever its length. On multi-step tasks a failure runs to the step cap and a success
    stops early, so with ``step`` the failures' right steps are pushed down more than the successes'
    same steps are pushed up."""

    def __post_init__(self) -> None:
        require(0.0 <= self.eps_low < 1.0, "loss.eps_low", f"must be in [0, 1), got {self.eps_low}")
        require(self.eps_high >= 0.0, "loss.eps_high", f"must be >= 0, got {self.eps_high}")
        require(self.dual_clip is None or self.dual_clip > 1.0, "loss.dual_clip",
                f"must be > 1 (or null to turn it off), got {self.dual_clip}")
        require(self.tis_cap > 0.0, "loss.tis_cap", f"must be > 0, got {self.tis_cap}")
        require(self.kl_coef >= 0.0, "loss.kl_coef", f"must be >= 0, got {self.kl_coef}")
        require(self.sft_coef >= 0.0, "loss.sft_coef", f"must be >= 0, got {self.sft_coef}")
        require(0.0 <= self.negative_scale <= 1.0, "loss.negative_scale",
                f"must be in [0, 1], got {self.negative_scale}")
        require(self.step_weight in ("step", "trajectory"), "loss.step_weight",
                f"must be 'step' or 'trajectory', got {self.step_weight!r}")



@dataclass(frozen=True, slots=True)
class LossStats:
    """Statistics as sums and counts, so the stats of micro-batches add up to the batch's.

    ``means()`` gives the slash-named metrics (``loss/policy``, ``clip/high_frac``, ...):
    token statistics are means over the loss tokens, ``loss/*`` are seq-mean-token-mean.
    """

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    """Reported as sums (token and sample counts)."""
    maxima: dict[str, float] = field(default_factory=dict)

    def __add__(self, other: LossStats) -> LossStats:
        keys = self.sums.keys() | other.sums.keys()
        return LossStats(
            sums={k: self.sums.get(k, 0.0) + other.sums.get(k, 0.0) for k in keys},
            counts={k: self.counts.get(k, 0.0) + other.counts.get(k, 0.0) for k in keys},
            totals={k: self.totals.get(k, 0.0) + other.totals.get(k, 0.0)
                    for k in self.totals.keys() | other.totals.keys()},
            maxima={k: max(self.maxima.get(k, -math.inf), other.maxima.get(k, -math.inf))
                    for k in self.maxima.keys() | other.maxima.keys()},
        )

    def means(self) -> dict[str, float]:
        out = {k: (self.sums[k] / self.counts[k] if self.counts[k] else 0.0) for k in self.sums}
        out.update(self.totals)
        out.update(self.maxima)
        return out


def masked_mean_B(x_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """Mean over each sample's real tokens (0 for a sample without any)."""
    return (x_B_T * mask_B_T).sum(-1) / mask_B_T.sum(-1).clamp(min=1.0)


def k3(log_ratio_B_T: torch.Tensor) -> torch.Tensor:
    """The k3 ("low-variance") KL estimator exp(d) − d − 1 of d = log q − log p (>= 0)."""
    d = log_ratio_B_T.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return d.exp() - d - 1.0


def ppo_ratio(logp_B_T: torch.Tensor, old_logp_B_T: torch.Tensor, mask_B_T: torch.Tensor,
              level: Literal["token", "sequence"]) -> torch.Tensor:
    """The importance ratio πθ/π_old per token; for GSPO (sequence) every token of a sample carries
    the sample's exp(mean_t log-ratio), with the gradient of its own token (GSPO-token form)."""
    log_ratio_B_T = (logp_B_T - old_logp_B_T).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if level == "token":
        return log_ratio_B_T.exp()
    seq_B = masked_mean_B(log_ratio_B_T, mask_B_T).detach()
    return (logp_B_T - logp_B_T.detach() + seq_B[:, None]).exp()


def tis_weights(old_logp_B_T: torch.Tensor, rollout_logprobs_B_T: torch.Tensor, mask_B_T: torch.Tensor,
                cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights (detached) and where the cap C bit, both ``_B_T``.

    The sampler is not the trainer's forward pass (other kernels, a stale version): weight each
    token by min(π_old/π_rollout, C); sequence/geometric use the summed/mean log-ratio of the sample.
    """
    log_w_B_T = (old_logp_B_T - rollout_logprobs_B_T).detach() * mask_B_T
    if cfg.tis == "off":
        return torch.ones_like(log_w_B_T), torch.zeros_like(log_w_B_T, dtype=torch.bool)
    if cfg.tis == "sequence":
        log_w_B_T = log_w_B_T.sum(-1, keepdim=True).expand_as(log_w_B_T)
    elif cfg.tis == "geometric":
        log_w_B_T = masked_mean_B(log_w_B_T, mask_B_T)[:, None].expand_as(log_w_B_T)
    log_cap = math.log(cfg.tis_cap)
    # Clamping the log first keeps exp finite for long sequences (a sum of many log-ratios).
    return log_w_B_T.clamp(max=log_cap).exp(), log_w_B_T > log_cap


def nll_loss(logp_B_T: torch.Tensor, mask_B_T: torch.Tensor, *, num_samples: float | None = None
             ) -> tuple[torch.Tensor, LossStats]:
    """Plain SFT: −log π of the response tokens, seq-mean-token-mean (padding never averaged)."""
    mask_B_T = mask_B_T.to(logp_B_T.dtype)
    nll_B = masked_mean_B(-logp_B_T, mask_B_T)
    den = max(float(num_samples if num_samples is not None else nll_B.numel()), 1.0)
    stats = LossStats(sums={"loss/sft": float(nll_B.detach().sum())}, counts={"loss/sft": float(nll_B.numel())},
                      totals={"batch/tokens": float(mask_B_T.sum()), "batch/samples": float(nll_B.numel())})
    return nll_B.sum() / den, stats


def policy_loss(
    logp_B_T: torch.Tensor,
    old_logp_B_T: torch.Tensor,
    rollout_logprobs_B_T: torch.Tensor,
    adv_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp_B_T: torch.Tensor | None = None,
    step_mask_B: torch.Tensor | None = None,
    sft_B: torch.Tensor | None = None,
    entropy_B_T: torch.Tensor | None = None,
    num_samples: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss to minimise for one (micro-)batch and its statistics (see the module docstring).

    ``logp_B_T`` carries the gradient; old/rollout/ref log-probs are constants. ``step_mask_B``
    (bool) selects the samples that learn (default: all); ``sft_B`` (bool) flags samples that
    also get the NLL term. ``num_samples``: the selected samples of the whole batch across all
    micro-batches (default: those selected here). ``entropy_B_T`` (the trainer's own token
    entropies) only feeds the stats. ``ref_logp_B_T`` is required when ``cfg.kl_coef > 0``.
    """
    if not logp_B_T.shape == old_logp_B_T.shape == rollout_logprobs_B_T.shape == mask_B_T.shape:
        raise ValueError(f"log-prob and mask shapes differ: {tuple(logp_B_T.shape)}, {tuple(old_logp_B_T.shape)}, "
                         f"{tuple(rollout_logprobs_B_T.shape)}, {tuple(mask_B_T.shape)}")
    if cfg.kl_coef > 0 and ref_logp_B_T is None:
        raise ValueError("loss.kl_coef > 0 needs ref_logp_B_T (the frozen reference policy's log-probs)")
    num_B = logp_B_T.shape[0]
    step_mask_B = torch.ones(num_B, dtype=torch.bool) if step_mask_B is None else step_mask_B.bool()
    step_mask_B = step_mask_B.to(logp_B_T.device)
    sel_B = step_mask_B.to(logp_B_T.dtype)
    den = float(sel_B.sum()) if num_samples is None else float(num_samples)
    den = max(den, 1.0)
    mask_B_T = mask_B_T.to(logp_B_T.dtype) * sel_B[:, None]  # unselected samples: no token counts
    old_logp_B_T, rollout_logprobs_B_T = old_logp_B_T.detach(), rollout_logprobs_B_T.detach()
    rollout_logprobs_B_T = torch.where(torch.isnan(rollout_logprobs_B_T), old_logp_B_T, rollout_logprobs_B_T)
    adv_B = adv_B.to(logp_B_T)
    if cfg.negative_scale != 1.0:
        adv_B = torch.where(adv_B < 0, adv_B * cfg.negative_scale, adv_B)
    adv_B_T = adv_B[:, None].expand_as(logp_B_T)

    ratio_B_T = ppo_ratio(logp_B_T, old_logp_B_T, mask_B_T, cfg.ratio_level)
    pg1_B_T = -adv_B_T * ratio_B_T
    pg2_B_T = -adv_B_T * ratio_B_T.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    pg_B_T = torch.maximum(pg1_B_T, pg2_B_T)
    negative_B_T = adv_B_T < 0
    if cfg.dual_clip is not None:
        # A < 0 and a huge ratio would push a bad token down without bound: cap the loss at −A·c.
        pg_B_T = torch.where(negative_B_T, torch.minimum(pg_B_T, -adv_B_T * cfg.dual_clip), pg_B_T)
    tis_B_T, capped_B_T = tis_weights(old_logp_B_T, rollout_logprobs_B_T, mask_B_T, cfg)
    pg_B_T = pg_B_T * tis_B_T

    per_sample = {"policy": masked_mean_B(pg_B_T, mask_B_T)}
    loss = per_sample["policy"].sum() / den
    if cfg.kl_coef > 0:
        assert ref_logp_B_T is not None
        per_sample["kl"] = masked_mean_B(k3(ref_logp_B_T.detach() - logp_B_T), mask_B_T)
        loss = loss + cfg.kl_coef * per_sample["kl"].sum() / den
    sft_sel_B = torch.zeros_like(sel_B) if sft_B is None else sft_B.to(sel_B) * sel_B
    if cfg.sft_coef > 0 and sft_B is not None:
        per_sample["sft"] = masked_mean_B(-logp_B_T, mask_B_T) * sft_sel_B
        loss = loss + cfg.sft_coef * per_sample["sft"].sum() / den

    with torch.no_grad():
        per_sample["total"] = loss.detach() * den / max(float(sel_B.sum()), 1.0) * sel_B
        stats = _stats(per_sample, sel_B, sft_sel_B, mask_B_T, adv_B_T, ratio_B_T, logp_B_T, old_logp_B_T,
                       rollout_logprobs_B_T, tis_B_T, capped_B_T, entropy_B_T, cfg)
    return loss, stats


def _stats(per_sample: dict[str, torch.Tensor], sel_B: torch.Tensor, sft_sel_B: torch.Tensor,
           mask_B_T: torch.Tensor, adv_B_T: torch.Tensor, ratio_B_T: torch.Tensor, logp_B_T: torch.Tensor,
           old_logp_B_T: torch.Tensor, rollout_logprobs_B_T: torch.Tensor, tis_B_T: torch.Tensor,
           capped_B_T: torch.Tensor, entropy_B_T: torch.Tensor | None, cfg: LossConfig) -> LossStats:
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    n_tok = float(mask_B_T.sum())
    n_sel = float(sel_B.sum())

    def tok(name: str, x_B_T: torch.Tensor) -> None:
        sums[name] = float((x_B_T.to(mask_B_T) * mask_B_T).sum())
        counts[name] = n_tok

    for name, x_B in per_sample.items():
        sums[f"loss/{name}"] = float(x_B.detach().sum())
        counts[f"loss/{name}"] = float(sft_sel_B.sum()) if name == "sft" else n_sel
    negative_B_T, positive_B_T = adv_B_T < 0, adv_B_T > 0
    high_B_T = positive_B_T & (ratio_B_T > 1.0 + cfg.eps_high)
    low_B_T = negative_B_T & (ratio_B_T < 1.0 - cfg.eps_low)
    tok("clip/high_frac", high_B_T)
    tok("clip/low_frac", low_B_T)
    tok("clip/frac", high_B_T | low_B_T)
    tok("clip/dual_frac", negative_B_T & (ratio_B_T > (cfg.dual_clip or math.inf)))
    tok("ratio/mean", ratio_B_T)
    tok("ratio/abs_dev", (ratio_B_T.detach() - 1.0).abs())
    tok("tis/mean", tis_B_T)
    tok("tis/capped_frac", capped_B_T)
    mismatch_B_T = old_logp_B_T - rollout_logprobs_B_T
    tok("mismatch/abs", mismatch_B_T.abs())
    tok("mismatch/k3", k3(-mismatch_B_T))
    tok("logp/mean", logp_B_T.detach())
    if entropy_B_T is not None:
        tok("entropy/mean", entropy_B_T.detach())
    totals = {"batch/tokens": n_tok, "batch/samples": n_sel}
    masked = mask_B_T > 0
    maxima = {"ratio/max": float(ratio_B_T[masked].max()) if n_tok else 0.0,
              "tis/max": float(tis_B_T[masked].max()) if n_tok else 0.0}
    return LossStats(sums=sums, counts=counts, totals=totals, maxima=maxima)
