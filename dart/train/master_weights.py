"""AdamW for bfloat16 weights that keeps an exact float32 master at 2 bytes a parameter.

A bfloat16 number is the high 16 bits of a float32. At RL learning rates (~1e-6) an AdamW step
moves a weight of magnitude ~0.02 by about 1/20,000 of itself and an RMSNorm weight of 1.0 by
1/1,000,000, far below bfloat16's 1/256 spacing: on plain bfloat16 parameters almost every step
rounds away. Here each parameter keeps a second, 16-bit buffer, ``low``, so that

    master (float32 bits) = bfloat16 weight bits * 2**16 + low        (``low`` in [-2**15, 2**15))

i.e. the weight is the master rounded to the nearest bfloat16 and ``low`` is what that rounding
dropped, to the bit. Every step rebuilds the float32 master, applies torch's AdamW formula to it
in float32, and splits it again: the update is exactly a float32-master update, while the model
the forward pass sees stays one bfloat16 tensor (no second copy of the weights, nothing for the
publisher to convert). Memory: 2 bytes a parameter beyond plain bfloat16 AdamW, against 4 for a
separate float32 master (the arithmetic for a 7B model is in docs/gpu.md).

The moments stay in the parameter's dtype, as torch's AdamW keeps them. ``low`` is optimizer
state: it is saved and restored with it (``state_dict`` / ``load_state_dict``), and a resume that
loads the weights and then this state rebuilds the same float32 master bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

LOW = "low"
"""Optimizer-state key of a parameter's low 16 bits."""
CHUNK_ELEMENTS = 1 << 24
"""Elements updated at once: the float32 temporaries of one chunk (~5 x 64 MB) bound the step's
extra memory whatever the largest tensor (a 7B model's embedding has 545 M elements)."""


def join_master(weight: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The float32 master of a bfloat16 ``weight`` and its int16 ``low`` half (a new tensor)."""
    high = weight.view(torch.int16).to(torch.int32) << 16
    return (high + low.to(torch.int32)).view(torch.float32)


def split_master(master: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bfloat16 weight, int16 low) of a float32 ``master``: the weight is the master rounded to
    nearest (ties away from zero), ``low`` the bits that rounding dropped, so
    ``join_master(*split_master(m))`` is ``m`` exactly."""
    bits = master.view(torch.int32)
    # A float's bits, read as an integer, order its magnitude: rounding the integer to a multiple
    # of 2**16 rounds the value to the nearest bfloat16 (the exponent carries on its own).
    high = (bits + (1 << 15)) >> 16
    low = bits - (high << 16)
    return high.to(torch.int16).view(torch.bfloat16), low.to(torch.int16)


class SplitMasterAdamW(torch.optim.Optimizer):
    """torch's AdamW (decoupled weight decay, bias-corrected moments) on a float32 master held as
    each bfloat16 parameter plus its ``low`` half (see the module docstring)."""

    def __init__(self, params: Iterable[Any], *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.bfloat16:
                    raise TypeError(f"SplitMasterAdamW keeps the master of bfloat16 weights; got a {p.dtype} "
                                    f"parameter of shape {tuple(p.shape)}")

    def master(self, p: torch.Tensor) -> torch.Tensor:
        """The float32 master of parameter ``p`` (its weight exactly, before its first step)."""
        low = self.state.get(p, {}).get(LOW)
        return p.detach().float() if low is None else join_master(p.detach(), low)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_one(p, group)
        return loss

    def _step_one(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state[LOW] = torch.zeros_like(p, dtype=torch.int16)
        state["step"] += 1
        t = float(state["step"])
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        step_size = lr / (1 - beta1**t)
        bias2_sqrt = math.sqrt(1 - beta2**t)
        decay = 1 - lr * group["weight_decay"]
        flat = [x.view(-1) for x in (p.data, p.grad, state["exp_avg"], state["exp_avg_sq"], state[LOW])]
        for start in range(0, p.numel(), CHUNK_ELEMENTS):
            w, g, m, v, low = (x[start:start + CHUNK_ELEMENTS] for x in flat)
            # In place wherever it can be: five chunk-sized temporaries in all.
            g32 = g.float()
            m32 = m.float().lerp_(g32, 1 - beta1)
            v32 = v.float().mul_(beta2).addcmul_(g32, g32, value=1 - beta2)
            m.copy_(m32)
            v.copy_(v32)
            bits = w.view(torch.int16).to(torch.int32).bitwise_left_shift_(16).add_(low)
            master = bits.view(torch.float32).mul_(decay)
            master.addcdiv_(m32, v32.sqrt_().div_(bias2_sqrt).add_(group["eps"]), value=-step_size)
            high = torch.add(bits, 1 << 15).bitwise_right_shift_(16)  # as split_master, in place
            w.view(torch.int16).copy_(high)
            low.copy_(bits.sub_(high, alpha=1 << 16))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # NOTE: torch casts every floating-point state tensor to its parameter's dtype and would
        # turn the int16 ``low`` halves into bfloat16 *values*: keep them aside and put them back.
        lows = {index: s[LOW] for index, s in state_dict["state"].items() if LOW in s}
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, low in lows.items():
            p = params[int(index)]
            if low.dtype != torch.int16 or low.shape != p.shape:
                raise ValueError(f"optimizer state of parameter {index}: {LOW} is {low.dtype} {tuple(low.shape)}, "
                                 f"expected int16 {tuple(p.shape)}")
            self.state[p][LOW] = low.to(p.device)
