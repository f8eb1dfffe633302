"""The bfloat16 update check: does a bfloat16 engine learn what a float32 engine learns?

One small Qwen2.5-VL with the weight scale of a real one (transformers' own initialiser: linear
and embedding weights ~ N(0, 0.02), RMSNorm weights 1.0), one fixed text batch whose samples are
all flagged SFT (the loss is the response tokens' NLL, through :func:`dart.train.update.apply_update`
and :func:`dart.train.loss.policy_loss`, the trainer's own path), trained for ``steps`` updates
by a float32 engine and by the engine under test, both from the same (bfloat16-representable)
start. It reports how much of float32's loss drop the engine under test achieves and how its
weights moved against float32's. The test suite runs it on the CPU; the GPU benchmark at larger
shapes on a GPU.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from dart.train.batch import ModelBatch
from dart.train.config import EngineConfig, OptimConfig
from dart.train.engine import TorchEngine, build_engine
from dart.train.loss import LossConfig
from dart.train.update import apply_update

WATCHED = ("layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight", "layers.0.input_layernorm.weight",
           "norm.weight")
"""Language-model weights (name suffixes) whose movement the check reports."""


@dataclass(frozen=True, kw_only=True)
class CheckShape:
    """Model and batch size of the check (defaults: ~0.3 M parameters, 200 steps in seconds on a
    CPU). The width does not change what rounding does: that depends on the weights' scale."""

    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1024
    samples: int = 4
    prompt_tokens: int = 16
    response_tokens: int = 16


@dataclass(frozen=True, kw_only=True)
class WeightMove:
    """One watched weight: how the engine's kept weights moved against float32's."""

    cosine: float
    """Cosine of (kept weights - start) with (float32's weights - start)."""
    changed_frac: float
    """Fraction of elements whose kept value changed."""
    changed_frac_fp32: float
    """The same under float32."""
    served_changed_frac: float
    """Fraction of elements changed in the bfloat16 weights the forward pass uses (the kept
    master rounded): a step smaller than half a bfloat16 spacing shows there only once it adds up."""


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    lr: float
    steps: int
    master_weights: str
    loss_drop_fp32: float
    loss_drop: float
    seconds: float
    """Wall time of the bfloat16 engine's steps."""
    weights: dict[str, WeightMove] = field(default_factory=dict)

    @property
    def drop_ratio(self) -> float:
        """Loss drop of the engine under test over float32's (1.0: it learns as much)."""
        return self.loss_drop / self.loss_drop_fp32


def qwen_like_model(shape: CheckShape, *, seed: int = 0) -> torch.nn.Module:
    """A random Qwen2.5-VL (float32) initialised by transformers itself, with a minimal vision tower."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    v = shape.vocab_size
    head_half = shape.hidden_size // shape.num_attention_heads // 2
    t = head_half // 4
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": v, "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
                     "num_hidden_layers": shape.num_hidden_layers, "num_attention_heads": shape.num_attention_heads,
                     "num_key_value_heads": shape.num_key_value_heads, "max_position_embeddings": 4096,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0,
                                         "mrope_section": [t, (head_half - t) // 2, head_half - t - (head_half - t) // 2]},
                     "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 0},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                       "out_hidden_size": shape.hidden_size, "fullatt_block_indexes": [0]},
        image_token_id=v - 1, video_token_id=v - 2, vision_start_token_id=v - 3, vision_end_token_id=v - 4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    # Start where bfloat16 can: both engines then begin from exactly the same weights.
    return model.to(torch.bfloat16).to(torch.float32)


def fixed_batch(shape: CheckShape, *, seed: int = 0) -> ModelBatch:
    """Random text sequences (no vision token), every sample SFT with advantage 0: the loss is the NLL."""
    gen = torch.Generator().manual_seed(seed)
    b, p, n = shape.samples, shape.prompt_tokens, shape.response_tokens
    ids = torch.randint(2, shape.vocab_size - 8, (b, p + n), generator=gen)
    return ModelBatch(
        input_ids_B_L=ids, attention_mask_B_L=torch.ones(b, p + n, dtype=torch.long),
        mm_token_type_ids_B_L=torch.zeros(b, p + n, dtype=torch.int32), pixel_values=None, image_grid_thw=None,
        response_token_ids_B_T=ids[:, p:], logit_pos_B_T=torch.arange(p - 1, p + n - 1).expand(b, n).clone(),
        mask_B_T=torch.ones(b, n), rollout_logprobs_B_T=torch.full((b, n), float("nan")),
        entropy_B_T=torch.zeros(b, n), adv_B=torch.zeros(b), sft_B=torch.ones(b, dtype=torch.bool),
        step_mask_B=torch.ones(b, dtype=torch.bool),
    )


def kept_weights(engine: TorchEngine) -> dict[str, torch.Tensor]:
    """The weights the engine keeps, in float32: its float32 master where it has one."""
    master = getattr(engine.optimizer, "master", None)
    return {name: (master(p) if master is not None else p.detach()).float().clone()
            for name, p in engine.policy.named_parameters()}


def train(engine: TorchEngine, batch: ModelBatch, steps: int) -> tuple[float, float]:
    """(loss before the first step, loss after the last) on ``batch``, as the engine computes it."""
    loss_cfg = LossConfig(kl_coef=0.0)
    first = float(apply_update(engine, [batch], loss_cfg).stats.means()["loss/total"])
    for _ in range(steps - 1):
        apply_update(engine, [batch], loss_cfg)
    with torch.no_grad():
        logp_B_T, _ = engine.forward(batch)
    mask_B_T = batch.mask_B_T.to(logp_B_T.device)
    last = float(-(logp_B_T * mask_B_T).sum() / mask_B_T.sum())
    return first, last


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.reshape(1, -1).double(), b.reshape(1, -1).double()))


def run_check(*, lr: float = 1e-6, steps: int = 200, modes: tuple[str, ...] = ("auto",), device: str = "cpu",
              shape: CheckShape | None = None, threads: int | None = None) -> dict[str, CheckResult]:
    """Train a float32 engine, then a bfloat16 engine per ``engine.master_weights`` mode in
    ``modes``, on the same batch from the same start; each mode's result against float32's.
    ``threads``: torch CPU threads while it runs (1 on a busy CPU: two threads contending with
    other processes ran this 30 times slower here)."""
    threads_before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(lr=lr, steps=steps, modes=modes, device=device, shape=shape or CheckShape())
    finally:
        torch.set_num_threads(threads_before)


def _run(*, lr: float, steps: int, modes: tuple[str, ...], device: str, shape: CheckShape) -> dict[str, CheckResult]:
    start_model = qwen_like_model(shape)
    batch = fixed_batch(shape)
    start = {name: p.detach().float() for name, p in start_model.named_parameters()}

    def trained(dtype: str, mode: str) -> tuple[float, TorchEngine, float]:
        t0 = time.perf_counter()
        cfg = EngineConfig(dtype=dtype, device=device, micro_batch_samples=shape.samples, master_weights=mode)
        engine = build_engine(copy.deepcopy(start_model), OptimConfig(lr=lr), cfg)
        assert isinstance(engine, TorchEngine)
        before, after = train(engine, batch, steps)
        return before - after, engine, time.perf_counter() - t0

    drop32, engine32, _ = trained("float32", "auto")
    kept32 = kept_weights(engine32)
    results = {}
    for mode in modes:
        drop, engine, seconds = trained("bfloat16", mode)
        kept = kept_weights(engine)
        served = {name: p.detach().float().cpu() for name, p in engine.policy.named_parameters()}
        moves = {}
        for suffix in WATCHED:
            name = next(n for n in start if n.endswith(suffix) and "visual" not in n)
            d16, d32 = kept[name].cpu() - start[name], kept32[name].cpu() - start[name]
            moves[suffix] = WeightMove(cosine=_cosine(d16, d32), changed_frac=_changed(d16),
                                       changed_frac_fp32=_changed(d32), served_changed_frac=_changed(served[name] - start[name]))
        results[mode] = CheckResult(lr=lr, steps=steps, master_weights=mode, loss_drop_fp32=drop32, loss_drop=drop,
                                    seconds=seconds, weights=moves)
    return results


def _changed(delta: torch.Tensor) -> float:
    return float((delta != 0).float().mean())
