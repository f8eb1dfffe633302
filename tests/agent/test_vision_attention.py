"""The batched vision attention: the per-window path's numbers in a handful of calls per layer.

A Qwen2.5-VL vision tower at the tiny model's widths and Qwen2.5-VL's window layout (window 112
px, patch 14, spatial merge 2, global blocks among windowed ones) sees several images of
different sizes in one packed batch, as a micro-batch of screenshot steps does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from dart.agent.vision_attention import ATTENTION_NAME, use_packed_vision_attention

SCREENSHOTS = [[1, 52, 92], [1, 20, 36], [1, 16, 16]]
"""Patch grids (t, h, w): a 1288x728 screenshot and two smaller images."""
IMAGES = [[1, 20, 36], [1, 16, 16], [1, 12, 28]]
"""Smaller images (every window length: whole, both edges, corner) for the gradient checks."""


def vl_model(depth: int = 4) -> torch.nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "bos_token_id": 0, "eos_token_id": 1,
                     "pad_token_id": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                            "mrope_section": [2, 2, 4]}},
        vision_config={"depth": depth, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                       "out_hidden_size": 32, "fullatt_block_indexes": [1, 3], "window_size": 112,
                       "patch_size": 14, "spatial_merge_size": 2},
        image_token_id=60, video_token_id=61, vision_start_token_id=62, vision_end_token_id=63)
    return Qwen2_5_VLForConditionalGeneration(config)


@contextlib.contextmanager
def counted_sdpa() -> Iterator[list[int]]:
    """Counts calls of ``torch.nn.functional.scaled_dot_product_attention`` (what every path calls)."""
    calls = [0]
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    F.scaled_dot_product_attention = counting
    try:
        yield calls
    finally:
        F.scaled_dot_product_attention = real


def windows_of(grid: list[int]) -> list[int]:
    """Patches per 112-px window of one image: merged 2x2 units, 4x4 units per window."""
    h, w = grid[1] // 2, grid[2] // 2
    return [4 * min(4, h - r) * min(4, w - c) for r in range(0, h, 4) for c in range(0, w, 4)]


def run_tower(model, implementation: str | None, dtype: torch.dtype,
              grid_thw: list[list[int]], *, grad: bool = True) -> tuple[torch.Tensor, list, int]:
    """Vision features, the gradients of a loss on them (pixels and every weight) and the SDPA calls."""
    if implementation is None:
        assert use_packed_vision_attention(model)
    else:
        model.set_attn_implementation({"vision_config": implementation})
    visual = model.model.visual.to(dtype)
    grids = torch.tensor(grid_thw)
    torch.manual_seed(1)
    pixels = torch.randn(int(grids.prod(-1).sum()), 3 * 2 * 14 * 14).to(dtype).requires_grad_(grad)
    with counted_sdpa() as calls, torch.set_grad_enabled(grad):
        features = visual(pixels, grid_thw=grids).pooler_output
        grads = torch.autograd.grad(features.float().square().sum(), [pixels, *visual.parameters()]) if grad else ()
    return features.detach(), list(grads), calls[0]


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_packed_vision_attention_equals_the_per_window_path_forward_and_gradient(dtype, tolerance) -> None:
    model = vl_model()
    ref_out, ref_grads, _ = run_tower(model, "sdpa", dtype, IMAGES)
    out, grads, _ = run_tower(model, None, dtype, IMAGES)
    scale = ref_out.abs().max()
    assert (out - ref_out).abs().max() <= tolerance * scale
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got - want).abs().max() <= tolerance * want.abs().max().clamp(min=1e-12)
    assert any(g.abs().max() > 0 for g in grads[1:])  # the weights really get a gradient


def test_a_layer_makes_one_call_per_window_length_instead_of_one_per_window() -> None:
    model = vl_model()
    windows = [n for g in SCREENSHOTS for n in windows_of(g)]
    assert len(windows) == 84 + 15 + 4  # a 1288x728 screenshot has 84 windows
    *_, per_window = run_tower(model, "sdpa", torch.float32, SCREENSHOTS, grad=False)
    *_, packed = run_tower(model, None, torch.float32, SCREENSHOTS, grad=False)
    windowed_layers, global_layers = 2, 2
    assert per_window == windowed_layers * len(windows) + global_layers * len(SCREENSHOTS)
    # windows: 64, 32 (edges), 16 (corner) patches; images: 4784, 720, 256 patches
    assert packed == windowed_layers * len(set(windows)) + global_layers * 3 == 12


def test_the_language_model_keeps_its_attention_and_the_whole_model_its_logits() -> None:
    model = vl_model(depth=2).eval()
    grid = torch.tensor([[1, 8, 12]])
    ids = torch.tensor([[5, 6] + [model.config.image_token_id] * 24 + [7, 8]])
    kw = {"input_ids": ids, "pixel_values": torch.randn(96, 1176), "image_grid_thw": grid,
          "mm_token_type_ids": (ids == model.config.image_token_id).long()}
    with torch.no_grad():
        before = model(**kw).logits
        assert use_packed_vision_attention(model)
        after = model(**kw).logits
    assert model.config.vision_config._attn_implementation == ATTENTION_NAME
    assert model.config.text_config._attn_implementation == "sdpa"
    assert torch.allclose(before, after, atol=1e-6)


def test_load_policy_batches_the_vision_attention_and_other_models_are_left_alone(policy) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    assert policy.model.config.vision_config._attn_implementation == ATTENTION_NAME
    text_only = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    assert not use_packed_vision_attention(text_only)
    assert text_only.config._attn_implementation == "sdpa"
    chosen = vl_model(depth=2)
    chosen.set_attn_implementation({"vision_config": "eager"})  # a choice made on purpose stays
    assert not use_packed_vision_attention(chosen)
    assert chosen.config.vision_config._attn_implementation == "eager"
