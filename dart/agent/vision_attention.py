"""Qwen2.5-VL's vision attention in one call per layer instead of one per window.

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

import itertools
import logging
import weakref
from dataclasses import dataclass
from typing import Any

from dart.errors import ConfigError

log = logging.getLogger(__name__)

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
    return _grouped_attention(query[0], key[0], value[0], plan, scaling, dropout).unsqueeze(0), None


@dataclass(frozen=True, slots=True)
class _Plan:
    """How a packed sequence's segments are batched: one group per distinct length."""

    groups: tuple[tuple[int, int, Any], ...]
    """(segments, length, rows): the sequence positions of the group's segments, segment-major
    (None when the group is the whole sequence in order)."""
    inverse: Any
    """Row of each sequence position in the concatenated group outputs (None: the identity)."""


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
        return _Plan(groups=((len(starts), length, None),), inverse=None)
    groups, order = [], []
    for length, starts in sorted(by_length.items(), reverse=True):
        rows = (torch.tensor(starts)[:, None] + torch.arange(length)).flatten()
        groups.append((len(starts), length, rows.to(device)))
        order.append(rows)
    inverse = torch.empty(bounds[-1] - bounds[0], dtype=torch.long)
    inverse[torch.cat(order) - bounds[0]] = torch.arange(inverse.numel())
    return _Plan(groups=tuple(groups), inverse=inverse.to(device))


def _grouped_attention(q_H_S_D: Any, k_H_S_D: Any, v_H_S_D: Any, plan: _Plan, scaling: float | None,
                       dropout: float) -> Any:
    """``[S, heads, head_dim]``: each segment attends within itself; equal-length segments batched.

    No padding and no mask, so every call is a plain SDPA the fastest kernel may take, and each
    segment's arithmetic is the per-window path's."""
    import torch
    import torch.nn.functional as F

    outs = []
    for count, length, rows in plan.groups:
        q, k, v = (_segments(x_H_S_D, rows, count, length) for x_H_S_D in (q_H_S_D, k_H_S_D, v_H_S_D))
        out_N_H_L_D = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling)
        outs.append(out_N_H_L_D.transpose(1, 2).flatten(0, 1))
    if plan.inverse is None:
        return outs[0]
    return torch.cat(outs).index_select(0, plan.inverse)


def _segments(x_H_S_D: Any, rows: Any, count: int, length: int) -> Any:
    """``[count, heads, length, head_dim]``: the segments at ``rows`` (None: all, in order)."""
    x_H_R_D = x_H_S_D if rows is None else x_H_S_D.index_select(1, rows)
    heads, _, dim = x_H_R_D.shape
    return x_H_R_D.reshape(heads, count, length, dim).transpose(0, 1)


def register() -> str:
    """Register :func:`packed_window_attention` in transformers' ``AttentionInterface`` (idempotent);
    returns :data:`ATTENTION_NAME`."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_window_attention)
    return ATTENTION_NAME


def use_packed_vision_attention(model: Any) -> bool:
    """Select :func:`packed_window_attention` for ``model``'s vision tower; the language model keeps
    its implementation. Returns False (and changes nothing) for a model without a vision tower or
    whose vision tower does not run windowed attention through ``AttentionInterface``."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)
    if vision is None or not hasattr(vision, "fullatt_block_indexes"):
        return False
    if implementation_of(vision) not in (None, "sdpa", "eager", ATTENTION_NAME):
        # A flash-attention or kernel implementation is already varlen: keep the user's choice.
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
