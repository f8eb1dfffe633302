"""A frozen vision tower: the trainer updates the language model and leaves the tower as it was.

With ``TrainerConfig.freeze_vision`` the policy's vision tower (``model.visual``) gets no
gradient and no optimiser state, and its forward pass runs without autograd: a screenshot's
features are computed once per forward pass and nothing of the tower is kept for the backward
pass or recomputed under gradient checkpointing (at 7B: 0.68 B of the 8.29 B parameters, and
1,196 of a screenshot step's 2,048 tokens). The KL reference is a copy of the whole initial
policy taken before the freeze, so it computes its own features as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from dart.errors import ConfigError


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision tower of an HF vision-language model (``model.model.visual`` or ``model.visual``);
    None for a text-only model."""
    for owner in (getattr(model, "model", None), model):
        tower = getattr(owner, "visual", None)
        if isinstance(tower, torch.nn.Module):
            return tower
    return None


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Freeze ``model``'s vision tower in place (before the optimiser is built, so that it holds none
    of the tower's parameters); returns the number of parameters frozen. ConfigError naming
    ``freeze_vision`` for a model without a vision tower."""
    tower = vision_tower(model)
    if tower is None:
        raise ConfigError(f"freeze_vision is set but {type(model).__name__} has no vision tower (model.visual): "
                          "unset freeze_vision for a text-only model")
    tower.requires_grad_(False)
    # On the instance: every caller (get_image_features, generate) goes through module __call__.
    tower.forward = _without_grad(tower.forward)
    return sum(p.numel() for p in tower.parameters())


def _without_grad(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        # Also under gradient checkpointing, whose input hook would otherwise make the tower's patch
        # embeddings require a gradient and so record (and recompute) the whole tower.
        with torch.no_grad():
            return forward(*args, **kwargs)

    return run
