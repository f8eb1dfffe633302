"""The CUDA code paths against the CPU ones, on the tiny random Qwen2.5-VL.

- TorchEngine (``engine.device: cuda``): one update of the same policy on the same batch on CPU
  float32 and on the GPU in float32 (must agree to float32 rounding) and in bfloat16 (must agree
  to bf16 precision and move the weights the same way);
- a TorchEngine checkpoint written on the GPU resumes the same update;
- the checkpoint RNG state holds the CUDA generator: restored, the GPU draws repeat;
- the ``hf`` rollout engine on the GPU: greedy answers equal the CPU engine's, and seeded
  sampling (one ``torch.Generator`` per row, on the GPU) repeats.

Every test is skipped where torch sees no CUDA device (CI, the dev machine). On a GPU host:
``deploy/gpu/cuda_check.sh``. ``DART_GPU_CHECK_DEVICE=cpu`` runs the GPU side on the CPU instead,
so the comparisons themselves can be exercised anywhere (CPU against CPU must pass). With
``DART_GPU_CHECK_OUT=DIR`` every test's figures are appended to ``DIR/cuda_check.jsonl``.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from dart.agent.model import Policy, load_policy
from dart.agent.prompt import blob_image_loader, build_messages, encode_prompt
from dart.agent.tiny import build_tiny
from dart.agent.weight_format import write_weights
from dart.blobs import LocalBlobStore
from dart.events import Sampling
from dart.events.manifest import BatchManifest
from dart.rollout.engine import GenerateRequest, Generation
from dart.rollout.hf_engine import HFEngine, HFEngineConfig
from dart.train.batch import ModelBatch, micro_batches, prepare_samples
from dart.train.checkpoint import RNG_FILE, TrainState, commit_checkpoint, load_rng
from dart.train.config import EngineConfig, OptimConfig
from dart.train.engine import ReferencePolicy, TorchEngine
from dart.train.loss import LossConfig
from dart.train.update import apply_update

ROOT = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("DART_GPU_CHECK_DEVICE", "cuda")
"""The device under test (cpu only to exercise the comparisons without a GPU)."""

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: torch.cuda.is_available() is False "
                              "(DART_GPU_CHECK_DEVICE=cpu runs the comparisons CPU against CPU)"),
]


def _helpers(relative: str, name: str) -> Any:
    """A test helper module loaded from its file: ``import tests...`` could resolve to another
    distribution's top-level ``tests`` package on a GPU host's Python."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_train = _helpers("tests/train/conftest.py", "_gpu_check_train_helpers")
_screens = _helpers("tests/agent/screens.py", "_gpu_check_screens")

LR = 1e-3
"""Big enough that one AdamW step visibly moves every weight (first step: about lr * sign(g))."""
MICRO = 4
FP32_LOGP_ATOL = 1e-4
"""Per-token log-prob, GPU float32 vs CPU float32. Measured here: CPU float32 vs float64 differ by
at most 5e-7 on this model; a GPU sums in another order, not to another precision."""
BF16_LOGP_MAX, BF16_LOGP_MEAN = 3e-2, 5e-3
"""Per-token log-prob, GPU bfloat16 vs CPU float32. bf16 keeps 8 significant bits (unit roundoff
2^-8 = 0.004, under 3 decimal digits): a log-prob near -7.6 (this model is close to uniform over
2048 tokens) would itself be resolved in bf16 only to its spacing there, 2^-5 = 0.031, the max
allowed. The scorer applies the log-softmax in float32 to bf16 logits, so the real error is
smaller: CPU bfloat16 vs float32 measured 2.1e-3 max and 6e-4 mean on this batch; the bounds leave
about 10x for the GPU's kernels."""
BF16_GRAD_NORM_RTOL, BF16_GRAD_COS, BF16_DELTA_COS = 0.05, 0.97, 0.9
"""CPU bfloat16 vs float32 measured: grad norm 0.95% apart, gradient cosine 0.992, weight-delta
cosine 0.969 (pure-bf16 AdamW: a step of lr = 1e-3 rounds away on weights near 1, where bf16's
spacing is 0.008, and AdamW's first step is about lr * sign(g), so every element whose gradient
is below bf16's noise steps either way: the k_proj biases' deltas have a cosine of only 0.72)."""
TIE = 1e-4
"""A greedy answer may leave the CPU's only where the CPU's top two logits are nearer than this:
float32 logits of this model differ across devices by ~1e-6, the closest greedy choices measured
here were 2e-4 apart."""


def record(test: str, **figures: Any) -> None:
    """Print the figures and append them to ``$DART_GPU_CHECK_OUT/cuda_check.jsonl``."""
    line = json.dumps({"test": test, "device": DEVICE, **figures}, default=float)
    print(line)
    if out := os.environ.get("DART_GPU_CHECK_OUT"):
        with open(Path(out) / "cuda_check.jsonl", "a") as fh:
            fh.write(line + "\n")


@pytest.fixture(scope="module", autouse=True)
def ieee_float32():
    """float32 as IEEE float32 on the GPU: cuDNN would otherwise run the vision tower's Conv3d in
    TF32 (10-bit mantissa, torch's default for convolutions), 1e-3 off before any other error."""
    try:
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    except RuntimeError:  # a torch that refuses the legacy flags once the new API was used
        saved = None
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    yield
    if saved is not None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> LocalBlobStore:
    return LocalBlobStore(tmp_path_factory.mktemp("blobs"))


@pytest.fixture(scope="module")
def cpu_policy(model_dir) -> Policy:
    return load_policy(model_dir)


@pytest.fixture(scope="module")
def batch(store, cpu_policy) -> BatchManifest:
    """12 samples (2 groups of 3 two-step rollouts) with their screenshots, scored on the CPU."""
    return _train.make_manifest(store, cpu_policy, seq=0, groups=2, per_group=3, steps=2)


# ---------------------------------------------------------------- one TorchEngine update


@dataclass(frozen=True)
class Update:
    logp: torch.Tensor
    """Per-token log-probs of the response tokens before the update (float64, on the CPU)."""
    grad_norm: float
    grad: torch.Tensor
    """Every parameter's gradient (before clipping), flattened in name order."""
    before: torch.Tensor
    after: torch.Tensor
    """Every weight before and after the update, flattened in name order (float64)."""
    loss: float

    @property
    def delta(self) -> torch.Tensor:
        return self.after - self.before


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensors[k].detach().to("cpu", torch.float64).flatten() for k in sorted(tensors)])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def one_update(model_dir: Path, store: LocalBlobStore, manifest: BatchManifest, *, device: str,
               dtype: str) -> Update:
    """One update as the trainer makes it (policy loaded on the CPU in ``dtype``, handed to the
    engine; KL reference on the engine's device), every micro-batch scored first."""
    policy = load_policy(model_dir, device="cpu", dtype=dtype)
    ref_model = copy.deepcopy(policy.model)
    engine = TorchEngine(policy.model, OptimConfig(lr=LR),
                         EngineConfig(device=device, dtype=dtype, micro_batch_samples=MICRO))
    param = next(engine.policy.parameters())
    assert (param.device.type, param.dtype) == (torch.device(device).type, getattr(torch, dtype))
    ref = ReferencePolicy(ref_model, engine.device, getattr(torch, dtype))
    samples, dropped = prepare_samples(manifest, tokenizer=policy.tokenizer, image_processor=policy.image_processor,
                                       load_image=store.get, prompt_cfg=_train.SMALL)
    assert not dropped
    batches: list[ModelBatch] = micro_batches(samples, size=MICRO,
                                              pad_id=policy.pad_token_id)
    before = _flat(engine.full_state_dict())
    with torch.no_grad():
        logp = torch.cat([engine.forward(b)[0].to("cpu", torch.float64)[b.mask_B_T.bool()] for b in batches])
    grads: dict[str, torch.Tensor] = {}
    engine_step = engine.step

    def step() -> float:  # the gradient as the engine is about to clip and apply it
        grads.update({n: p.grad.detach().clone() for n, p in engine.policy.named_parameters() if p.grad is not None})
        return engine_step()

    engine.step = step  # type: ignore[method-assign]
    result = apply_update(engine, batches, LossConfig(), ref)
    assert len(grads) == sum(1 for _ in engine.policy.parameters())
    return Update(logp=logp, grad_norm=result.grad_norm, grad=_flat(grads), before=before,
                  after=_flat(engine.full_state_dict()), loss=float(result.stats.means()["loss/total"]))


@pytest.fixture(scope="module")
def cpu_update(model_dir, store, batch) -> Update:
    return one_update(model_dir, store, batch, device="cpu", dtype="float32")


def test_a_float32_update_on_the_gpu_equals_the_cpu_update(model_dir, store, batch, cpu_update) -> None:
    gpu = one_update(model_dir, store, batch, device=DEVICE, dtype="float32")
    cpu = cpu_update
    logp_diff = (gpu.logp - cpu.logp).abs()
    grad_rel = float((gpu.grad - cpu.grad).norm() / cpu.grad.norm())
    off = (gpu.after - cpu.after).abs()
    figures = dict(tokens=cpu.logp.numel(), logp_max_abs=logp_diff.max(), logp_mean_abs=logp_diff.mean(),
                   grad_norm_cpu=cpu.grad_norm, grad_norm_gpu=gpu.grad_norm,
                   grad_norm_rel=abs(gpu.grad_norm - cpu.grad_norm) / cpu.grad_norm, grad_rel_l2=grad_rel,
                   delta_cos=_cos(gpu.delta, cpu.delta),
                   delta_rel_l2=float((gpu.delta - cpu.delta).norm() / cpu.delta.norm()),
                   weights_max_abs=off.max(), weights_frac_off=float((off > 0.1 * LR).double().mean()),
                   loss_cpu=cpu.loss, loss_gpu=gpu.loss)
    record("fp32_update", **figures)
    assert float(cpu.delta.norm()) > 0.1  # the update moved the weights (measured 0.54)
    assert figures["logp_max_abs"] < FP32_LOGP_ATOL
    assert figures["grad_norm_rel"] < 1e-3
    assert grad_rel < 1e-3
    assert abs(gpu.loss - cpu.loss) < 1e-5
    # AdamW's first step is about lr * sign(g): an element whose gradient is within rounding noise
    # of zero (or of AdamW's eps) may step differently on each device, so the weights are compared
    # as a whole, and element-wise only up to that bound (CPU float32 vs float64 measured: delta
    # cosine 1 - 1e-8, relative L2 1.7e-4, max 5.5e-5, 2e-5 of the elements off by over 1e-5).
    assert figures["delta_cos"] > 0.9999 and figures["delta_rel_l2"] < 1e-2
    assert figures["weights_frac_off"] < 1e-3
    assert figures["weights_max_abs"] <= 2.1 * LR


def test_a_bfloat16_update_on_the_gpu_agrees_with_the_cpu_float32_update(model_dir, store, batch,
                                                                         cpu_update) -> None:
    gpu = one_update(model_dir, store, batch, device=DEVICE, dtype="bfloat16")
    cpu = cpu_update
    logp_diff = (gpu.logp - cpu.logp).abs()
    figures = dict(tokens=cpu.logp.numel(), logp_max_abs=logp_diff.max(), logp_mean_abs=logp_diff.mean(),
                   grad_norm_cpu=cpu.grad_norm, grad_norm_gpu=gpu.grad_norm,
                   grad_norm_rel=abs(gpu.grad_norm - cpu.grad_norm) / cpu.grad_norm,
                   grad_cos=_cos(gpu.grad, cpu.grad), delta_cos=_cos(gpu.delta, cpu.delta),
                   delta_norm_ratio=float(gpu.delta.norm() / cpu.delta.norm()), loss_cpu=cpu.loss, loss_gpu=gpu.loss)
    record("bf16_update", **figures)
    assert math.isfinite(gpu.grad_norm) and bool(torch.isfinite(gpu.after).all())
    assert figures["logp_max_abs"] < BF16_LOGP_MAX and figures["logp_mean_abs"] < BF16_LOGP_MEAN
    assert figures["grad_norm_rel"] < BF16_GRAD_NORM_RTOL
    assert figures["grad_cos"] > BF16_GRAD_COS
    assert figures["delta_cos"] > BF16_DELTA_COS
    assert 0.5 < figures["delta_norm_ratio"] < 1.5


def test_a_gpu_engine_checkpoint_resumes_the_same_update(model_dir, store, batch, tmp_path) -> None:
    """TorchEngine on the GPU: weights and AdamW state through a checkpoint (the trainer's write),
    loaded into a fresh engine; the next update of both gives the same weights."""
    def engine() -> tuple[TorchEngine, list[ModelBatch]]:
        policy = load_policy(model_dir, device="cpu", dtype="float32")
        eng = TorchEngine(policy.model, OptimConfig(lr=LR),
                          EngineConfig(device=DEVICE, dtype="float32", micro_batch_samples=MICRO))
        samples, _ = prepare_samples(batch, tokenizer=policy.tokenizer, image_processor=policy.image_processor,
                                     load_image=store.get, prompt_cfg=_train.SMALL)
        return eng, micro_batches(samples, size=MICRO, pad_id=policy.pad_token_id)

    first, batches = engine()
    apply_update(first, batches, LossConfig(kl_coef=0.0))

    def write(directory: Path) -> None:
        write_weights(first.full_state_dict(), first.policy.config.to_json_string(), directory)
        first.save_state(directory)

    ckpt = commit_checkpoint(tmp_path / "ckpt", TrainState(step=1), write, keep=1)
    second, _ = engine()
    second.load_state(ckpt)
    assert torch.equal(_flat(second.full_state_dict()), _flat(first.full_state_dict()))
    # The AdamW moments came back, on the GPU (one more step would hardly show their loss: the
    # second step of AdamW on the same batch is again about lr * sign(g) with or without them).
    saved, loaded = first.optimizer.state_dict()["state"], second.optimizer.state_dict()["state"]
    assert sorted(saved) == sorted(loaded) and len(loaded) == sum(1 for _ in second.policy.parameters())
    for i, state in saved.items():
        for name, value in state.items():
            assert torch.equal(loaded[i][name].cpu(), value.cpu()), (i, name)
            if value.dim() > 0:
                assert loaded[i][name].device.type == torch.device(DEVICE).type, (i, name)
    start = _flat(first.full_state_dict())
    apply_update(first, batches, LossConfig(kl_coef=0.0))
    apply_update(second, batches, LossConfig(kl_coef=0.0))
    a, b = _flat(first.full_state_dict()), _flat(second.full_state_dict())
    off = (a - b).abs()
    record("engine_resume", delta_cos=_cos(a - start, b - start), weights_max_abs=off.max(),
           weights_frac_off=float((off > 0.1 * LR).double().mean()))
    assert _cos(a - start, b - start) > 0.9999
    assert float((off > 0.1 * LR).double().mean()) < 1e-3


# ---------------------------------------------------------------- checkpoint RNG


def test_the_checkpoint_rng_state_restores_the_gpu_generator(tmp_path) -> None:
    device = torch.device(DEVICE)
    torch.manual_seed(1234)  # seeds every CUDA device too
    torch.rand(7, device=device)  # the generator's offset is part of its state

    def draws() -> list[torch.Tensor]:
        return [torch.rand(4096, device=device).cpu(), torch.randn(64, device=device).cpu(),
                torch.randint(0, 1 << 30, (16,), device=device).cpu(), torch.rand(8)]

    ckpt = commit_checkpoint(tmp_path / "ckpt", TrainState(), lambda directory: None, keep=1)
    saved = torch.load(ckpt / RNG_FILE, weights_only=True)
    if device.type == "cuda":
        assert len(saved["cuda"]) == torch.cuda.device_count() >= 1
    expected = draws()
    moved_on = draws()
    assert not torch.equal(expected[0], moved_on[0])
    load_rng(ckpt)
    again = draws()
    record("rng_round_trip", saved=sorted(saved), cuda_states=len(saved.get("cuda", [])))
    for want, got in zip(expected, again, strict=True):
        assert torch.equal(want, got)


# ---------------------------------------------------------------- hf rollout engine


def request(store: LocalBlobStore, *, steps: int, seed: int, temperature: float, top_p: float = 1.0,
            max_new_tokens: int = 24, frequency_penalty: float = 0.0,
            instruction: str = "Open the file") -> GenerateRequest:
    ctx = _screens.context(store, steps=steps, instruction=instruction)
    messages, images = build_messages(ctx, blob_image_loader(store), _screens.SMALL)
    return GenerateRequest(messages=messages, images=images, sampling=Sampling(
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
        frequency_penalty=frequency_penalty))


def generate(policy: Policy, requests: list[GenerateRequest], *, rounds: int = 1) -> list[list[Generation]]:
    """``rounds`` times every request, sent together (one micro-batch), on a fresh engine."""
    async def run() -> list[list[Generation]]:
        engine = HFEngine(policy, HFEngineConfig(max_batch_size=len(requests)))
        try:
            return [list(await asyncio.gather(*(engine.generate(r) for r in requests))) for _ in range(rounds)]
        finally:
            await engine.close()

    return asyncio.run(run())


def next_token_gap(policy: Policy, req: GenerateRequest, prefix: list[int]) -> float:
    """Gap between the top two logits of the token after ``prefix`` (one forward pass)."""
    inputs = encode_prompt(policy.tokenizer, policy.image_processor, req.messages, req.images)
    full = inputs.with_response(prefix).to(policy.model.device)
    with torch.no_grad():
        top = policy.model(**full.model_kwargs()).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def test_hf_engine_greedy_answers_on_the_gpu_equal_the_cpu_engine(model_dir, store, cpu_policy) -> None:
    reqs = [request(store, steps=k % 3, seed=k, temperature=0.0, frequency_penalty=0.5 if k == 7 else 0.0,
                    instruction=f"task {k}: open the file number {k}") for k in range(8)]
    gpu_policy = load_policy(model_dir, DEVICE, dtype="float32")
    assert gpu_policy.model.device.type == torch.device(DEVICE).type
    [cpu] = generate(cpu_policy, reqs)
    [gpu] = generate(gpu_policy, reqs)
    ties, logp_diff = [], 0.0
    for k, (req, a, b) in enumerate(zip(reqs, cpu, gpu, strict=True)):
        assert b.token_ids and b.finish_reason in ("stop", "length")
        assert b.prompt_token_ids == a.prompt_token_ids
        n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y),
                 min(len(a.token_ids), len(b.token_ids)))
        logp_diff = max([logp_diff, *(abs(x - y) for x, y in zip(a.logprobs[:n], b.logprobs[:n], strict=True))])
        if a.token_ids != b.token_ids:
            ties.append({"request": k, "at": n, "cpu_top2_gap": next_token_gap(cpu_policy, req, a.token_ids[:n])})
    record("hf_greedy", requests=len(reqs), equal=len(reqs) - len(ties), near_ties=ties,
           logp_max_abs=logp_diff, tokens=[len(g.token_ids) for g in gpu])
    # Answers leave the CPU's only at a near tie of the CPU's own logits (float32 rounding order).
    assert all(t["cpu_top2_gap"] < TIE for t in ties), ties
    assert len(ties) <= len(reqs) // 4
    assert logp_diff < FP32_LOGP_ATOL


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_engine_seeded_sampling_on_the_gpu_repeats(model_dir, store, dtype) -> None:
    """One batch: rows 0, 1 and 4 ask the same thing, 0 and 4 with the same seed, 1 with another;
    rows 2 and 3 sample under top-p and a frequency penalty. The batch is sent twice, row 0 once alone."""
    def ask(k: int, seed: int) -> GenerateRequest:
        return request(store, steps=k % 2, seed=seed, temperature=0.7 if k == 3 else 1.0, top_p=0.9 if k == 2 else 1.0,
                       max_new_tokens=16, frequency_penalty=0.5 if k == 3 else 0.0, instruction=f"sample {k % 2}")

    reqs = [ask(0, 100), ask(0, 101), ask(2, 102), ask(3, 103), ask(0, 100)]
    policy = load_policy(model_dir, DEVICE, dtype=dtype)
    assert (policy.model.device.type, str(policy.model.dtype)) == (torch.device(DEVICE).type, f"torch.{dtype}")
    first, second = generate(policy, reqs, rounds=2)
    [alone] = generate(policy, reqs[:1])
    tokens = [list(g.token_ids) for g in first]
    record(f"hf_sampling_{dtype}", tokens=[len(t) for t in tokens],
           repeat=tokens == [list(g.token_ids) for g in second], same_seed_rows_equal=tokens[0] == tokens[4],
           other_seed_row_differs=tokens[0] != tokens[1], alone_equals_batched=alone[0].token_ids == first[0].token_ids)
    assert tokens == [list(g.token_ids) for g in second]  # same seeds, same tokens
    assert tokens[0] == tokens[4]  # one seed, one draw, whichever row
    assert tokens[0] != tokens[1]  # the seed matters (16 draws at temperature 1 from ~2048 tokens)
    if dtype == "float32":  # (in bf16, padding alone shifts a logit by 2^-8 and may flip a draw)
        assert alone[0].token_ids == first[0].token_ids  # a row's draws do not depend on its batch
    for g in first:
        assert len(g.logprobs) == len(g.token_ids) and all(math.isfinite(x) and x <= 0 for x in g.logprobs)
