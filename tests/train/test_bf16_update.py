"""Updates that survive bfloat16: the torch engine's split float32 master (``engine.master_weights``).

At lr 1e-6 a plain bfloat16 AdamW step is mostly rounded away (an RMSNorm weight of 1.0 never
moves: bfloat16's spacing there is 1/128). The engine keeps each weight's dropped low 16 bits,
so its float32 master learns as a float32 engine does.
"""

from __future__ import annotations

import pytest
import torch

from dart.config import build
from dart.errors import ConfigError
from dart.train.config import EngineConfig, TrainerConfig
from dart.train.master_weights import SplitMasterAdamW, join_master, split_master
from dart.train.precision_check import CheckShape, run_check


def test_a_bfloat16_engine_learns_what_float32_learns_at_lr_1e_6_norm_weights_included(capsys) -> None:
    # One decoder layer: the steps' fixed costs dominate on a CPU, and rounding depends on the
    # weights' scale, not the depth (two layers: ratio 1.066; one: 1.070, 25 % less CPU).
    result = run_check(lr=1e-6, steps=200, threads=1, shape=CheckShape(num_hidden_layers=1))["auto"]
    with capsys.disabled():
        print(f"\nbf16/fp32 loss drop at lr 1e-6, 200 steps: {result.drop_ratio:.3f} "
              f"({result.loss_drop:.4f} / {result.loss_drop_fp32:.4f})")
    assert result.loss_drop_fp32 > 0.02  # float32 learns something to compare with
    assert result.drop_ratio >= 0.8
    for name, move in result.weights.items():
        assert move.cosine > 0.9, (name, move)
        assert move.changed_frac >= 0.9 * move.changed_frac_fp32, (name, move)
    # The norm weights moved in the master although not one of their bfloat16 values did yet:
    # exactly what plain bfloat16 AdamW would have thrown away, step after step.
    for name in ("layers.0.input_layernorm.weight", "norm.weight"):
        assert result.weights[name].served_changed_frac == 0.0
        assert result.weights[name].changed_frac > 0.99


def test_a_float32_master_splits_into_its_rounded_bfloat16_and_low_bits_and_joins_back_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    scales = torch.logspace(-40, 38, 4096, dtype=torch.float64).float()
    x = torch.cat([torch.randn(4096, generator=gen) * scales, torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45])])
    high, low = split_master(x)
    assert high.dtype == torch.bfloat16 and low.dtype == torch.int16
    assert torch.equal(join_master(high, low).view(torch.int32), x.view(torch.int32))
    # The bfloat16 half is the master rounded to nearest (torch rounds ties to even, we away from 0).
    nearest = x.to(torch.bfloat16).float()
    gap = (high.float() - nearest).abs()
    assert int((gap > 0).sum()) <= 2 and bool((gap <= nearest.abs() / 64).all())


def test_one_split_master_step_is_torch_adamw_in_float32_to_the_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = (torch.randn(64, 32, generator=gen) * 0.02).bfloat16()
    grads = [torch.randn(64, 32, generator=gen).bfloat16() for _ in range(20)]
    p16 = torch.nn.Parameter(w0.clone())
    p32 = torch.nn.Parameter(w0.float())
    kw = {"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}
    split, plain = SplitMasterAdamW([p16], **kw), torch.optim.AdamW([p32], **kw)
    for i, g in enumerate(grads):
        p16.grad, p32.grad = g.clone(), g.float()
        split.step()
        plain.step()
        if i == 0:  # same inputs, same float32 arithmetic
            assert torch.equal(split.master(p16), p32.detach())
    # Later steps differ only by the moments being kept in bfloat16, as torch keeps them for bf16 weights.
    delta16, delta32 = split.master(p16) - w0.float(), p32.detach() - w0.float()
    assert float((delta16 - delta32).norm() / delta32.norm()) < 0.01
    # The weights the forward pass uses are the master rounded to nearest.
    assert torch.equal(p16.detach(), split_master(split.master(p16))[0])


def test_split_master_weights_are_refused_with_float32_or_deepspeed_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"engine\.master_weights: split .* engine\.dtype float32"):
        EngineConfig(dtype="float32", master_weights="split")
    with pytest.raises(ConfigError, match=r"engine\.master_weights: .*DeepSpeed"):
        EngineConfig(kind="deepspeed", dtype="bfloat16", master_weights="split")
    with pytest.raises(ConfigError, match="master_weights"):
        build(TrainerConfig, {"model": "m", "checkpoint_dir": "c", "engine": {"master_weights": "fp32"}}, path="train")
    assert EngineConfig(dtype="bfloat16").split_master
    assert not EngineConfig(dtype="float32").split_master
    assert not EngineConfig(dtype="bfloat16", master_weights="off").split_master
    assert not EngineConfig(kind="deepspeed", dtype="bfloat16").split_master
