"""Qwen2.5-VL's vision attention in a few calls per layer instead of one per window.

transformers' ``sdpa`` path for the Qwen2.5-VL vision tower splits the packed patch sequence at
every window boundary and issues one ``scaled_dot_product_attention`` per window: a 1288x728
screenshot has 84 windows of at most 64 patches, so 28 windowed layers make 2,352 calls per
screenshot and forward pass, each too small to keep a GPU busy (the 7B update with one screenshot
per step ran at 6.1 % MFU, launch-bound). :func:`packed_window_attention` takes the whole packed
sequence and its window boundaries and runs all windows of one length as one batch: a screenshot's
windows come in at most four lengths (whole windows, the right and bottom edges, the corner), so a
windowed layer makes at most four calls however many screenshots it sees, and a global layer over
same-sized screenshots one. Nothing is padded or masked: every call is a plain SDPA that the
fastest kernel may take, and each window's arithmetic is the per-window path's.

It is registered in transformers' ``AttentionInterface`` under :data:`ATTENTION_NAME`, and
:func:`use_packed_vision_attention` selects it for a loaded model's vision tower only (the language
model keeps its own implementation). Pure module; torch and transformers are imported inside the
functions.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from dataclasses import dataclass
from typing import Any

from dart.errors import ConfigError

ATTENTION_NAME = "dart_flash_packed_windows"
"""The name in transformers' ``AttentionInterface``. NOTE: it must contain "flash": that is how
transformers' vision attention decides to hand the attention function the whole packed sequence
with its window boundaries (``cu_seq_lens_q``) rather than call it once per window."""


def packed_window_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                            scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Any, None]:
    """Attention within each segment of a packed sequence, one SDPA call per distinct segment length.

    ``query``/``key``/``value`` are ``[1, heads, S, head_dim]``; ``kwargs["cu_seq_lens_q"]`` holds the
    segment boundaries (``[0, l1, l1 + l2, ..., S]``). Returns ``([1, S, heads, head_dim], None)``
    like transformers' other attention functions. Called without boundaries (a caller that splits
    the sequence itself), it is transformers' own SDPA function.
    """
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None or attention_mask is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    plan = _plan_of(cu_seqlens, query.device)
    q_S_H_D, k_S_H_D, v_S_H_D = (x[0].transpose(0, 1) for x in (query, key, value))
    return _grouped_attention(q_S_H_D, k_S_H_D, v_S_H_D, plan, scaling, dropout).unsqueeze(0), None


@dataclass(frozen=True, slots=True)
class _Plan:
    """How a packed sequence's segments are batched: one group per distinct segment length."""

    groups: tuple[tuple[int, int], ...]
    """(segments, length) of each group, in the order of ``order``."""
    order: Any
    """The sequence positions group by group, segment-major (None: the sequence as it is)."""
    inverse: Any
    """Where each sequence position sits in ``order`` (None: the identity)."""


_plans: dict[int, tuple[weakref.ref[Any], _Plan]] = {}
_MAX_PLANS = 8
"""Plans kept: every layer of a forward pass gets the same two boundary tensors (windows, whole
images), so each is read to the host once per pass rather than once per layer."""


def _plan_of(cu_seqlens: Any, device: Any) -> _Plan:
    cached = _plans.get(id(cu_seqlens))
    if cached is not None and cached[0]() is cu_seqlens:
        return cached[1]
    plan = _make_plan(cu_seqlens.tolist(), device)
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[id(cu_seqlens)] = (weakref.ref(cu_seqlens), plan)
    return plan


def _make_plan(bounds: list[int], device: Any) -> _Plan:
    import torch

    by_length: dict[int, list[int]] = {}
    for start, end in itertools.pairwise(bounds):
        if end > start:
            by_length.setdefault(end - start, []).append(start)
    if len(by_length) == 1:
        # Equal segments (the global layers over same-sized screenshots): a plain reshape.
        ((length, starts),) = by_length.items()
        return _Plan(groups=((len(starts), length),), order=None, inverse=None)
    groups = sorted(by_length.items(), reverse=True)
    order = torch.cat([(torch.tensor(starts)[:, None] + torch.arange(length)).flatten() for length, starts in groups])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return _Plan(groups=tuple((len(starts), length) for length, starts in groups), order=order.to(device),
                 inverse=inverse.to(device))


def _grouped_attention(q_S_H_D: Any, k_S_H_D: Any, v_S_H_D: Any, plan: _Plan, scaling: float | None,
                       dropout: float) -> Any:
    """``[S, heads, head_dim]``: each segment attends within itself; equal-length segments batched.

    No padding and no mask, so every call is a plain SDPA the fastest kernel may take, and each
    segment's arithmetic is the per-window path's. One gather puts the groups one after the
    other (rows of ``[S, heads, head_dim]``, whole heads at a time), one puts the outputs back."""
    import torch
    import torch.nn.functional as F

    if plan.order is not None:
        permute = _permutation().apply
        q_S_H_D, k_S_H_D, v_S_H_D = (permute(x, plan.order, plan.inverse) for x in (q_S_H_D, k_S_H_D, v_S_H_D))
    sizes = [count * length for count, length in plan.groups]
    # split, not slices: its gradient is one concatenation, where each slice's would be a zero
    # tensor of the whole sequence.
    parts = zip(*(x.split(sizes) for x in (q_S_H_D, k_S_H_D, v_S_H_D)), strict=True)
    outs = []
    for (count, length), qkv in zip(plan.groups, parts, strict=True):
        q, k, v = (x.reshape(count, length, *x.shape[1:]).transpose(1, 2) for x in qkv)
        out_N_H_L_D = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling)
        outs.append(out_N_H_L_D.transpose(1, 2).flatten(0, 1))
    if plan.inverse is None:
        return outs[0]
    return _permutation().apply(torch.cat(outs), plan.inverse, plan.order)


@functools.cache
def _permutation() -> Any:
    """An autograd function: rows reordered by a permutation, the gradient by its inverse.

    ``index_select``'s own backward scatters with ``index_add`` (it must allow repeated rows),
    which on a CPU costs more than the attention it serves; a permutation's gradient is a gather."""
    import torch

    class Permute(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, order: Any, inverse: Any) -> Any:
            ctx.save_for_backward(inverse)
            return x.index_select(0, order)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> tuple[Any, None, None]:
            (inverse,) = ctx.saved_tensors
            return grad.index_select(0, inverse), None, None

    return Permute


def register() -> str:
    """Register :func:`packed_window_attention` in transformers' ``AttentionInterface`` (idempotent);
    returns :data:`ATTENTION_NAME`."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_window_attention)
    return ATTENTION_NAME


def use_packed_vision_attention(model: Any) -> bool:
    """Select :func:`packed_window_attention` for ``model``'s vision tower; the language model keeps
    its implementation. Returns False (and changes nothing) for a model without a windowed vision
    tower, or whose vision tower was given another implementation than transformers' default
    (``eager``, a flash-attention kernel: already one call per layer)."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)
    if vision is None or not hasattr(vision, "fullatt_block_indexes"):
        return False
    if implementation_of(vision) not in (None, "sdpa", ATTENTION_NAME):
        return False
    model.set_attn_implementation({"vision_config": register()})
    if implementation_of(vision) != ATTENTION_NAME:
        raise ConfigError(f"{type(model).__name__}'s vision tower refused the {ATTENTION_NAME} attention "
                          f"(it runs {implementation_of(vision)!r}): this transformers version may not "
                          "route Qwen2.5-VL vision attention through AttentionInterface")
    return True


def implementation_of(config: Any) -> str | None:
    """The attention implementation a transformers config selects."""
    return config._attn_implementation  # noqa: SLF001 - transformers has no public reader of it
