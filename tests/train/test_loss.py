"""The policy loss against hand-computed numbers and an obvious per-token loop."""

from __future__ import annotations

import math

import pytest
import torch

from dart.config import build
from dart.errors import ConfigError
from dart.train.loss import LossConfig, LossStats, k3, policy_loss

OFF = LossConfig(kl_coef=0.0, tis="off", sft_coef=0.0)
L = math.log


def one_token(ratio: float, adv: float, cfg: LossConfig = OFF) -> tuple[float, LossStats]:
    logp = torch.tensor([[L(ratio)]])
    zero = torch.zeros(1, 1)
    loss, stats = policy_loss(logp, zero, zero, torch.tensor([adv]), torch.ones(1, 1), cfg)
    return float(loss), stats


@pytest.mark.parametrize(
    ("ratio", "adv", "expected"),
    [
        (1.0, 1.0, -1.0),
        (1.5, 1.0, -1.28),  # clip-higher: a positive advantage stops at 1 + 0.28
        (1.2, 1.0, -1.2),  # inside the high range
        (0.5, 1.0, -0.5),  # pessimistic: the unclipped ratio is the larger loss
        (0.5, -1.0, 0.9),  # a negative advantage stops at 1 - 0.1
        (1.5, -1.0, 1.5),  # unclipped above for A < 0 ...
        (20.0, -1.0, 10.0),  # ... until the dual clip c = 10
        (20.0, -2.0, 20.0),  # the dual clip is -A * c
    ],
)
def test_ppo_clip_higher_and_dual_clip_by_hand(ratio: float, adv: float, expected: float) -> None:
    assert one_token(ratio, adv)[0] == pytest.approx(expected, rel=1e-6)


def test_dual_clip_off_lets_the_loss_grow() -> None:
    assert one_token(20.0, -1.0, LossConfig(kl_coef=0, tis="off", dual_clip=None))[0] == pytest.approx(20.0)


def test_clip_fractions_count_the_tokens_in_each_clipped_region() -> None:
    logp = torch.tensor([[L(1.5), L(1.0), L(0.5), L(20.0)]])
    adv = torch.tensor([1.0])
    _, stats = policy_loss(logp, torch.zeros(1, 4), torch.zeros(1, 4), adv, torch.ones(1, 4), OFF)
    m = stats.means()
    assert m["clip/high_frac"] == pytest.approx(0.5)  # 1.5 and 20 are above 1.28 with A > 0
    assert m["clip/low_frac"] == 0.0
    _, stats = policy_loss(logp, torch.zeros(1, 4), torch.zeros(1, 4), -adv, torch.ones(1, 4), OFF)
    m = stats.means()
    assert (m["clip/low_frac"], m["clip/high_frac"], m["clip/dual_frac"]) == (0.25, 0.0, 0.25)
    assert m["ratio/max"] == pytest.approx(20.0)


def test_truncated_importance_weights_by_hand() -> None:
    cfg = LossConfig(kl_coef=0.0, sft_coef=0.0)  # tis="token", C = 1
    # Token 0: pi_old/pi_rollout = 0.5 -> w = 0.5. Token 1: = 2 -> capped at 1.
    old = torch.tensor([[L(0.25), L(0.5)]])
    rollout = torch.tensor([[L(0.5), L(0.25)]])
    adv = torch.tensor([1.0])
    loss, stats = policy_loss(old.clone(), old, rollout, adv, torch.ones(1, 2), cfg)
    assert float(loss) == pytest.approx((-1 * 0.5 + -1 * 1.0) / 2)
    m = stats.means()
    assert m["tis/mean"] == pytest.approx(0.75)
    assert m["tis/capped_frac"] == pytest.approx(0.5)
    assert m["mismatch/abs"] == pytest.approx(math.log(2))
    # Sequence level: one weight exp(log 0.5 + log 2) = 1 for both tokens.
    seq, _ = policy_loss(old.clone(), old, rollout, adv, torch.ones(1, 2), LossConfig(kl_coef=0, tis="sequence"))
    assert float(seq) == pytest.approx(-1.0)
    # Both log-ratios log 0.5: sequence weight exp(2 log 0.5) = 0.25, geometric exp(log 0.5) = 0.5.
    rollout2 = torch.tensor([[L(0.5), L(1.0)]])
    for level, w in (("sequence", 0.25), ("geometric", 0.5)):
        got, _ = policy_loss(old.clone(), old, rollout2, adv, torch.ones(1, 2), LossConfig(kl_coef=0, tis=level))
        assert float(got) == pytest.approx(-w)


def test_unknown_rollout_log_probs_get_importance_weight_one() -> None:
    """Experience without the sampler's log-probs (an oracle's) is NaN there: w = 1, no NaN loss.
    Before, the trainer dropped such samples as ragged, so an injected success never trained and
    its all-fail group pushed only down."""
    cfg = LossConfig(kl_coef=0.0, sft_coef=0.0)
    old = torch.tensor([[L(0.25), L(0.5)], [L(0.25), L(0.5)]])
    rollout = torch.tensor([[math.nan, math.nan], [L(0.5), L(0.25)]])
    logp = old.clone().requires_grad_(True)
    loss, stats = policy_loss(logp, old, rollout, torch.tensor([1.0, 1.0]), torch.ones(2, 2), cfg)
    # sample 0: weights 1, 1 -> -1; sample 1: weights 0.5, 1 -> -0.75; mean over 2 samples
    assert float(loss.detach()) == pytest.approx((-1.0 - 0.75) / 2)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert stats.means()["tis/mean"] == pytest.approx((1 + 1 + 0.5 + 1) / 4)


def test_k3_kl_to_the_reference_by_hand() -> None:
    assert float(k3(torch.tensor(math.log(2.0)))) == pytest.approx(2 - math.log(2) - 1)
    assert float(k3(torch.tensor(0.0))) == 0.0
    cfg = LossConfig(tis="off", sft_coef=0.0)  # kl_coef 0.1
    logp, ref = torch.tensor([[L(0.25)]]), torch.tensor([[L(0.5)]])
    loss, stats = policy_loss(logp, logp.clone(), logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), cfg,
                              ref_logp_B_T=ref)
    assert float(loss) == pytest.approx(0.1 * (2 - math.log(2) - 1))
    assert stats.means()["loss/kl"] == pytest.approx(2 - math.log(2) - 1)
    with pytest.raises(ValueError, match="ref_logp_B_T"):
        policy_loss(logp, logp, logp, torch.tensor([0.0]), torch.ones(1, 1), cfg)


def test_sft_term_is_nll_on_flagged_samples_only() -> None:
    cfg = LossConfig(tis="off", kl_coef=0.0, sft_coef=0.5)
    logp = torch.tensor([[L(0.5), L(0.25)], [L(0.1), L(0.1)]])
    adv = torch.zeros(2)
    loss, stats = policy_loss(logp, logp.clone(), logp.clone(), adv, torch.ones(2, 2), cfg,
                              sft_B=torch.tensor([True, False]))
    nll = (math.log(2) + math.log(4)) / 2
    assert float(loss) == pytest.approx(0.5 * nll / 2)  # divided by the 2 samples of the batch
    assert stats.means()["loss/sft"] == pytest.approx(nll)  # reported per sft sample


def test_negative_scale_damps_only_negative_advantages_by_hand() -> None:
    cfg = LossConfig(kl_coef=0.0, tis="off", sft_coef=0.0, negative_scale=0.25)
    assert one_token(1.0, 2.0, cfg)[0] == pytest.approx(-2.0)  # A > 0 untouched
    assert one_token(1.0, -2.0, cfg)[0] == pytest.approx(0.5)  # A = -2 -> -0.5
    assert one_token(0.5, -2.0, cfg)[0] == pytest.approx(0.5 * 0.9)  # the clip still at 1 - 0.1
    assert one_token(20.0, -2.0, cfg)[0] == pytest.approx(0.5 * 10.0)  # dual clip of the damped A
    zero = LossConfig(kl_coef=0.0, tis="off", sft_coef=0.0, negative_scale=0.0)
    logp = torch.tensor([[L(0.7)], [L(0.2)]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(2, 1), torch.zeros(2, 1), torch.tensor([1.0, -1.0]), torch.ones(2, 1), zero)
    loss.backward()
    assert logp.grad is not None and logp.grad[1, 0] == 0.0 and logp.grad[0, 0] != 0.0
    assert float(loss.detach()) == pytest.approx(-0.7 / 2)  # the failure still counts in the mean
    with pytest.raises(ConfigError, match=r"loss\.negative_scale"):
        build(LossConfig, {"negative_scale": 1.5}, path="loss")


def test_seq_mean_token_mean_never_averages_padding() -> None:
    # Sample 0: two tokens with ratio 1.2 and 1.0 (A = 1); sample 1: one token, ratio 1.1, A = -1,
    # then padding with garbage log-probs that must not count.
    logp = torch.tensor([[L(1.2), 0.0, 0.0], [L(1.1), 50.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = policy_loss(logp, torch.zeros(2, 3), torch.zeros(2, 3), adv, mask, OFF)
    assert float(loss) == pytest.approx(((-1.2 - 1.0) / 2 + 1.1) / 2)
    assert stats.means()["loss/policy"] == pytest.approx(float(loss))
    assert stats.means()["batch/tokens"] == 3.0


def test_unselected_samples_get_no_loss_and_no_gradient() -> None:
    logp = torch.tensor([[L(1.2)], [L(0.7)]], requires_grad=True)
    loss, stats = policy_loss(logp, torch.zeros(2, 1), torch.zeros(2, 1), torch.tensor([1.0, 1.0]),
                              torch.ones(2, 1), OFF, step_mask_B=torch.tensor([False, True]))
    assert float(loss.detach()) == pytest.approx(-0.7)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0, 0] == 0.0 and logp.grad[1, 0] != 0.0
    assert stats.means()["batch/samples"] == 1.0


def test_gspo_uses_one_sequence_ratio_per_sample() -> None:
    cfg = LossConfig(kl_coef=0.0, tis="off", ratio_level="sequence")
    logp = torch.tensor([[L(2.0), L(0.5), 0.0]], requires_grad=True)  # mean log-ratio 0 -> s = 1
    loss, stats = policy_loss(logp, torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([1.0]),
                              torch.tensor([[1, 1, 0]]), cfg)
    assert float(loss.detach()) == pytest.approx(-1.0)
    assert stats.means()["clip/high_frac"] == 0.0  # token ratio 2.0 would have been clipped
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.5, 0.0])  # d(-s)/dlogp_t = -s / |y|


# ------------------------------------------------------------------ pinned to a per-token loop


def loop_loss(logp, old, rollout, ref, adv, mask, step_mask, sft, cfg: LossConfig) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The same loss written token by token, as plainly as possible."""
    total = torch.zeros(())
    selected = [b for b in range(logp.shape[0]) if step_mask[b]]
    for b in selected:
        tokens = [t for t in range(logp.shape[1]) if mask[b, t]]
        seq_log_ratio = sum(float((logp[b, t] - old[b, t]).detach()) for t in tokens) / len(tokens)
        seq_log_w = sum(float(old[b, t] - rollout[b, t]) for t in tokens)
        sample = torch.zeros(())
        for t in tokens:
            a = float(adv[b])
            if cfg.ratio_level == "token":
                ratio = torch.exp(logp[b, t] - old[b, t])
            else:
                ratio = math.exp(seq_log_ratio) * torch.exp(logp[b, t] - logp[b, t].detach())
            unclipped = -a * ratio
            clipped = -a * torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
            term = torch.maximum(unclipped, clipped)
            if a < 0 and cfg.dual_clip is not None:
                term = torch.minimum(term, torch.tensor(-a * cfg.dual_clip))
            if cfg.tis == "token":
                w = min(math.exp(float(old[b, t] - rollout[b, t])), cfg.tis_cap)
            elif cfg.tis == "sequence":
                w = min(math.exp(seq_log_w), cfg.tis_cap)
            elif cfg.tis == "geometric":
                w = min(math.exp(seq_log_w / len(tokens)), cfg.tis_cap)
            else:
                w = 1.0
            term = term * w
            d = ref[b, t] - logp[b, t]
            term = term + cfg.kl_coef * (torch.exp(d) - d - 1)
            if sft[b]:
                term = term + cfg.sft_coef * -logp[b, t]
            sample = sample + term
        total = total + sample / len(tokens)
    return total / len(selected)


CONFIGS = [
    LossConfig(),
    LossConfig(tis="sequence", tis_cap=2.0),
    LossConfig(tis="geometric", dual_clip=None),
    LossConfig(ratio_level="sequence", eps_low=0.05, eps_high=0.1, sft_coef=0.3),
    LossConfig(tis="off", kl_coef=0.0, sft_coef=0.0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.ratio_level}-{c.tis}-dual{c.dual_clip}")
def test_vectorised_loss_matches_the_per_token_loop_in_value_and_gradient(cfg: LossConfig) -> None:
    gen = torch.Generator().manual_seed(7)
    num_B, num_T = 6, 5
    old = -torch.rand(num_B, num_T, generator=gen, dtype=torch.float64) * 3
    logp0 = old + torch.randn(num_B, num_T, generator=gen, dtype=torch.float64) * 0.4
    rollout = old + torch.randn(num_B, num_T, generator=gen, dtype=torch.float64) * 0.3
    ref = old + torch.randn(num_B, num_T, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(num_B, generator=gen, dtype=torch.float64)
    lengths = [5, 1, 3, 4, 2, 5]
    mask = torch.tensor([[1.0] * n + [0.0] * (num_T - n) for n in lengths], dtype=torch.float64)
    step_mask = torch.tensor([True, True, False, True, True, True])
    sft = torch.tensor([False, True, False, False, True, False])

    logp_vec = logp0.clone().requires_grad_(True)
    loss_vec, _ = policy_loss(logp_vec, old, rollout, adv, mask, cfg, ref_logp_B_T=ref, step_mask_B=step_mask,
                              sft_B=sft)
    loss_vec.backward()
    logp_loop = logp0.clone().requires_grad_(True)
    loss_loop = loop_loss(logp_loop, old, rollout, ref, adv, mask, step_mask, sft, cfg)
    loss_loop.backward()
    assert float(loss_vec.detach()) == pytest.approx(float(loss_loop.detach()), rel=1e-9, abs=1e-12)
    assert logp_vec.grad is not None and logp_loop.grad is not None
    torch.testing.assert_close(logp_vec.grad, logp_loop.grad, rtol=1e-9, atol=1e-12)


def test_micro_batches_add_up_to_the_full_batch_loss_gradient_and_stats() -> None:
    gen = torch.Generator().manual_seed(3)
    num_B, num_T = 5, 4
    old = -torch.rand(num_B, num_T, generator=gen, dtype=torch.float64)
    logp0 = old + 0.3 * torch.randn(num_B, num_T, generator=gen, dtype=torch.float64)
    rollout = old + 0.2 * torch.randn(num_B, num_T, generator=gen, dtype=torch.float64)
    adv = torch.randn(num_B, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    cfg = LossConfig(kl_coef=0.0)
    full = logp0.clone().requires_grad_(True)
    loss_full, stats_full = policy_loss(full, old, rollout, adv, mask, cfg)
    loss_full.backward()
    parts = logp0.clone().requires_grad_(True)
    total, stats = torch.zeros((), dtype=torch.float64), LossStats()
    for sl in (slice(0, 2), slice(2, 5)):
        loss, st = policy_loss(parts[sl], old[sl], rollout[sl], adv[sl], mask[sl], cfg, num_samples=num_B)
        loss.backward()
        total, stats = total + loss.detach(), stats + st
    assert float(total) == pytest.approx(float(loss_full.detach()), rel=1e-12)
    assert parts.grad is not None and full.grad is not None
    torch.testing.assert_close(parts.grad, full.grad)
    for name, value in stats_full.means().items():
        assert stats.means()[name] == pytest.approx(value, rel=1e-9), name


def test_loss_config_defaults_are_the_dart_numbers_and_bad_values_name_the_field() -> None:
    cfg = LossConfig()
    assert (cfg.eps_low, cfg.eps_high, cfg.dual_clip, cfg.tis_cap, cfg.kl_coef) == (0.1, 0.28, 10.0, 1.0, 0.1)
    assert build(LossConfig, {"tis": "sequence", "dual_clip": None}).tis == "sequence"
    with pytest.raises(ConfigError, match=r"loss\.dual_clip"):
        build(LossConfig, {"dual_clip": 0.5}, path="loss")
    with pytest.raises(ConfigError, match="tis"):
        build(LossConfig, {"tis": "tokens"}, path="loss")
