"""The update loop: one step per batch by default, PPO-style reuse (epochs x mini-batches) on request.

A fake engine (no model: a free log-prob parameter per token) behind the trainer's Engine
interface, so the step count, the fixed π_old and the direction of each step can be checked
by hand; the real engines are exercised in test_trainer.py and test_deepspeed.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dart.train.loss import LossConfig
from dart.train.update import apply_update


class FakeEngine:
    """log π of every response token is -softplus(θ) of its own parameter; plain SGD."""

    def __init__(self, rows: int, tokens: int, lr: float = 0.5) -> None:
        self.theta = torch.zeros(rows, tokens, requires_grad=True)
        self.lr, self.steps, self.forwards = lr, 0, 0

    def forward(self, batch: SimpleNamespace) -> tuple[torch.Tensor, torch.Tensor]:
        self.forwards += 1
        logp = -torch.nn.functional.softplus(self.theta[batch.rows])
        return logp, torch.zeros_like(logp)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        with torch.no_grad():
            norm = float(self.theta.grad.norm())
            self.theta -= self.lr * self.theta.grad
            self.theta.grad = None
        self.steps += 1
        return norm


def micro(rows: list[int], adv: list[float], tokens: int = 3) -> SimpleNamespace:
    n = len(rows)
    logp0 = -torch.nn.functional.softplus(torch.zeros(n, tokens))
    return SimpleNamespace(rows=torch.tensor(rows), adv_B=torch.tensor(adv), rollout_logprobs_B_T=logp0,
                           mask_B_T=torch.ones(n, tokens), step_mask_B=torch.ones(n, dtype=torch.bool),
                           sft_B=torch.zeros(n, dtype=torch.bool))


BATCHES = [micro([0, 1], [1.0, -1.0]), micro([2, 3], [1.0, -1.0]), micro([4, 5], [0.5, -0.5])]
CFG = LossConfig(kl_coef=0.0)


def test_default_update_is_one_step_over_every_micro_batch() -> None:
    engine = FakeEngine(6, 3)
    result = apply_update(engine, BATCHES, CFG)
    assert (engine.steps, engine.forwards, result.num_samples) == (1, 3, 6)


def test_epochs_and_minibatches_take_one_step_per_minibatch_per_epoch_against_a_fixed_old_policy() -> None:
    engine = FakeEngine(6, 3)
    before = (-torch.nn.functional.softplus(engine.theta)).detach().clone()
    result = apply_update(engine, BATCHES, CFG, epochs=2, minibatches=2)
    # π_old: one scoring pass over the 3 micro-batches; then 2 epochs x mini-batches [0, 2] and [1].
    assert engine.steps == 4 and engine.forwards == 3 + 2 * 3
    assert result.num_samples == 6
    after = (-torch.nn.functional.softplus(engine.theta)).detach()
    moved = (after - before).mean(dim=1)
    assert all(moved[i] > 0 for i in (0, 2, 4)) and all(moved[i] < 0 for i in (1, 3, 5))
    # The last epoch saw ratios away from 1: π_old stayed the pre-update policy.
    assert result.stats.means()["ratio/max"] > 1.01


def test_reused_batch_is_clipped_once_the_ratio_leaves_the_trust_region() -> None:
    engine = FakeEngine(6, 3, lr=20.0)
    result = apply_update(engine, BATCHES, CFG, epochs=2, minibatches=2)
    means = result.stats.means()
    assert means["clip/high_frac"] > 0 and means["clip/low_frac"] > 0
    single = apply_update(FakeEngine(6, 3, lr=20.0), BATCHES, CFG)
    assert single.stats.means()["ratio/max"] == pytest.approx(1.0) and single.stats.means()["clip/frac"] == 0


def test_more_minibatches_than_micro_batches_step_once_per_micro_batch() -> None:
    engine = FakeEngine(6, 3)
    apply_update(engine, BATCHES, CFG, epochs=1, minibatches=8)
    assert engine.steps == 3


def test_epochs_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="epochs and minibatches"):
        apply_update(FakeEngine(6, 3), BATCHES, CFG, epochs=0)


def test_the_clip_range_changes_an_update_only_when_a_batch_takes_more_than_one_step() -> None:
    from dart.train.config import TrainerConfig

    def theta(loss: LossConfig, **kw: int) -> torch.Tensor:
        engine = FakeEngine(6, 3, lr=20.0)
        apply_update(engine, BATCHES, loss, **kw)
        return engine.theta.detach().clone()

    higher, symmetric = LossConfig(kl_coef=0.0, eps_high=0.28), LossConfig(kl_coef=0.0, eps_high=0.1)
    # one step: the ratio is exactly 1, clip-higher or not gives the same weights
    assert torch.equal(theta(higher), theta(symmetric))
    assert not TrainerConfig(model=Path("m"), checkpoint_dir=Path("c")).clip_acts
    # two epochs of two mini-batches: the later steps see ratios beyond 1.1 and the upper clip bites
    assert not torch.allclose(theta(higher, epochs=2, minibatches=2), theta(symmetric, epochs=2, minibatches=2))
    assert TrainerConfig(model=Path("m"), checkpoint_dir=Path("c"), ppo_minibatches=2).clip_acts
