"""The DeepSpeed engine on the GPU against the plain torch engine on the GPU, on the tiny random
Qwen2.5-VL.

- DeepSpeedEngine ZeRO-2 and ZeRO-3 (one process, nccl): one float32 update equals TorchEngine's
  float32 update on the same GPU (the tolerances of test_cuda.py's float32 test);
- a DeepSpeed checkpoint written on the GPU (``save_state``/``load_state``) gives back the
  weights, the fp32 master partitions and the AdamW moments, and resumes the same next update.

The rules of test_cuda.py hold here, and its fixtures and helpers are reused (loaded from its
file): skipped where torch sees no CUDA device, ``DART_GPU_CHECK_DEVICE=cpu`` runs the DeepSpeed
side on the CPU (gloo) against TorchEngine on the CPU, ``DART_GPU_CHECK_OUT=DIR`` gets every
test's figures in ``DIR/cuda_check.jsonl``. deepspeed is not on the GPU host's Python:
``deploy/gpu/cuda_check.sh`` installs it (and pydantic, hjson, ...) from ``.whl/``; where it does
not import, every test here is skipped and says why.

A process holds one process group: the first DeepSpeedEngine initialises it (nccl on cuda, gloo
on cpu; ``deepspeed.init_distributed`` is a no-op once one exists), every later engine of this
module reuses it, and the module destroys it at its end. No DeepSpeed op may be JIT-built (the
engine uses torch's AdamW; the GPU host has no network and its nvcc need not match torch's
CUDA): an attempt fails the test at once instead of compiling for minutes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dart.agent.model import Policy, load_policy
from dart.agent.weight_format import write_weights
from dart.blobs import LocalBlobStore
from dart.events.manifest import BatchManifest
from dart.train.batch import ModelBatch, micro_batches, prepare_samples
from dart.train.checkpoint import TrainState, commit_checkpoint
from dart.train.config import EngineConfig, OptimConfig
from dart.train.engine import DeepSpeedEngine, ReferencePolicy
from dart.train.loss import LossConfig
from dart.train.update import apply_update

ROOT = Path(__file__).resolve().parents[2]


def _load(relative: str, name: str) -> Any:
    """A test module loaded from its file (as test_cuda.py loads its helpers: ``import tests...``
    could resolve to another distribution's ``tests`` package on a GPU host's Python)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_cuda = _load("tests/gpu/test_cuda.py", "_gpu_check_cuda")
DEVICE: str = _cuda.DEVICE
LR, MICRO = _cuda.LR, _cuda.MICRO
Update, record, flat, cos = _cuda.Update, _cuda.record, _cuda._flat, _cuda._cos

# test_cuda.py's fixtures, registered here too: the tiny model, the blob store, the 12-sample
# batch (scored by the CPU policy), and float32 as IEEE float32 on the GPU (autouse).
model_dir, store, cpu_policy, batch = _cuda.model_dir, _cuda.store, _cuda.cpu_policy, _cuda.batch
ieee_float32 = _cuda.ieee_float32

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: torch.cuda.is_available() is False "
                              "(DART_GPU_CHECK_DEVICE=cpu runs the comparisons CPU against CPU)"),
]

STAGES = [2, 3]
"""ZeRO stages checked. Both run in one process (measured on CPU/gloo: ZeRO-3's partitioning and
gathering work with a world of one)."""


@pytest.fixture(scope="module")
def deepspeed():
    """deepspeed, imported with its accelerator matching DEVICE; the process group this module's
    engines create is destroyed at its end. No JIT op build is allowed meanwhile."""
    with pytest.MonkeyPatch.context() as mp:
        # DeepSpeed picks its accelerator once, at first use; left to itself it takes cuda wherever
        # torch sees a GPU, also when DART_GPU_CHECK_DEVICE=cpu asks for the CPU path (gloo).
        mp.setenv("DS_ACCELERATOR", torch.device(DEVICE).type)
        ds = pytest.importorskip("deepspeed")
        from deepspeed.ops.op_builder.builder import OpBuilder

        def refuse(builder: Any, *args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"DeepSpeed tried to JIT-build its op {builder.name!r} (nothing here needs one)")

        mp.setattr(OpBuilder, "jit_load", refuse)
        had_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        yield ds
        if not had_group and torch.distributed.is_available() and torch.distributed.is_initialized():
            ds.comm.destroy_process_group()


def samples(policy: Policy, store: LocalBlobStore, manifest: BatchManifest) -> list[ModelBatch]:
    found, dropped = prepare_samples(manifest, tokenizer=policy.tokenizer, image_processor=policy.image_processor,
                                     load_image=store.get, prompt_cfg=_cuda._train.SMALL)
    assert not dropped
    return micro_batches(found, size=MICRO, pad_id=policy.pad_token_id)


def ds_engine(model_dir: Path, store: LocalBlobStore, manifest: BatchManifest,
              stage: int) -> tuple[DeepSpeedEngine, list[ModelBatch]]:
    """A DeepSpeedEngine as the trainer builds it: policy loaded on the CPU, handed over."""
    policy = load_policy(model_dir, device="cpu", dtype="float32")
    engine = DeepSpeedEngine(policy.model, OptimConfig(lr=LR),
                             EngineConfig(kind="deepspeed", zero_stage=stage, device=DEVICE, dtype="float32",
                                          micro_batch_samples=MICRO))
    assert engine.ds.device.type == torch.device(DEVICE).type
    assert engine.ds.zero_optimization_stage() == stage
    backend = torch.distributed.get_backend()
    assert backend == ("nccl" if engine.device.type == "cuda" else "gloo"), backend
    return engine, samples(policy, store, manifest)


def ds_update(model_dir: Path, store: LocalBlobStore, manifest: BatchManifest, stage: int) -> Update:
    """test_cuda.one_update through DeepSpeed (its gradient lives in ZeRO's flat partitions: not kept)."""
    engine, batches = ds_engine(model_dir, store, manifest, stage)
    ref = ReferencePolicy(load_policy(model_dir, device="cpu", dtype="float32").model, engine.device, torch.float32)
    before = flat(engine.full_state_dict())
    with torch.no_grad():
        logp = torch.cat([engine.forward(b)[0].to("cpu", torch.float64)[b.mask_B_T.bool()] for b in batches])
    result = apply_update(engine, batches, LossConfig(), ref)
    return Update(logp=logp, grad_norm=result.grad_norm, grad=torch.empty(0), before=before,
                  after=flat(engine.full_state_dict()), loss=float(result.stats.means()["loss/total"]))


@pytest.fixture(scope="module")
def torch_update(model_dir, store, batch) -> Update:
    """TorchEngine's float32 update on DEVICE."""
    return _cuda.one_update(model_dir, store, batch, device=DEVICE, dtype="float32")


@pytest.mark.parametrize("stage", STAGES)
def test_a_zero_float32_update_on_the_gpu_equals_the_torch_engine_update(deepspeed, model_dir, store, batch,
                                                                       torch_update, stage) -> None:
    zero = ds_update(model_dir, store, batch, stage)
    plain = torch_update
    logp_diff = (zero.logp - plain.logp).abs()
    off = (zero.after - plain.after).abs()
    figures = dict(stage=stage, backend=torch.distributed.get_backend(), tokens=plain.logp.numel(),
                   logp_max_abs=logp_diff.max(), logp_mean_abs=logp_diff.mean(),
                   grad_norm_torch=plain.grad_norm, grad_norm_zero=zero.grad_norm,
                   grad_norm_rel=abs(zero.grad_norm - plain.grad_norm) / plain.grad_norm,
                   before_equal=bool(torch.equal(zero.before, plain.before)),
                   delta_cos=cos(zero.delta, plain.delta),
                   delta_rel_l2=float((zero.delta - plain.delta).norm() / plain.delta.norm()),
                   weights_max_abs=off.max(), weights_frac_off=float((off > 0.1 * LR).double().mean()),
                   loss_torch=plain.loss, loss_zero=zero.loss)
    record(f"zero{stage}_fp32_update", **figures)
    assert figures["before_equal"]  # both start from the same weights
    assert float(plain.delta.norm()) > 0.1  # the update moved the weights
    assert figures["logp_max_abs"] < _cuda.FP32_LOGP_ATOL
    assert figures["grad_norm_rel"] < 1e-3
    assert abs(zero.loss - plain.loss) < 1e-5
    # As in test_cuda.py: AdamW's first step is about lr * sign(g), so an element whose gradient
    # is within rounding noise of zero may step either way; the weights are compared as a whole.
    assert figures["delta_cos"] > 0.9999 and figures["delta_rel_l2"] < 1e-2
    assert figures["weights_frac_off"] < 1e-3
    assert figures["weights_max_abs"] <= 2.1 * LR


def optimizer_tensors(engine: DeepSpeedEngine) -> dict[str, torch.Tensor]:
    """ZeRO's fp32 master partitions and the moments that the torch AdamW inside it holds for
    them, by position (ZeRO-3 hands that AdamW one partition at a time, so its param_groups are
    empty between steps: the partitions are read from ZeRO itself)."""
    zero = engine.ds.optimizer
    inner = zero.optimizer
    assert isinstance(inner, torch.optim.AdamW), type(inner)
    masters = zero.fp32_partitioned_groups_flat if engine.stage == 3 else zero.single_partition_of_fp32_groups
    found = {}
    for i, master in enumerate(masters):
        found[f"{i}.master"] = master.detach()
        found.update({f"{i}.{name}": value for name, value in inner.state[master].items()})
    return found


@pytest.mark.parametrize("stage", STAGES)
def test_a_deepspeed_checkpoint_on_the_gpu_resumes_the_same_update(deepspeed, model_dir, store, batch, tmp_path,
                                                                 stage) -> None:
    """Weights, fp32 master partitions and AdamW moments through a checkpoint (the trainer's
    write), loaded into a fresh engine; the next update of both gives the same weights."""
    first, batches = ds_engine(model_dir, store, batch, stage)
    apply_update(first, batches, LossConfig(kl_coef=0.0))

    def write(directory: Path) -> None:
        write_weights(first.full_state_dict(), first.policy.config.to_json_string(), directory)
        first.save_state(directory)

    ckpt = commit_checkpoint(tmp_path / "ckpt", TrainState(step=1), write, keep=1)
    assert (ckpt / "deepspeed" / "state").is_dir()
    second, _ = ds_engine(model_dir, store, batch, stage)
    assert not torch.equal(flat(second.full_state_dict()), flat(first.full_state_dict()))
    second.load_state(ckpt)
    assert torch.equal(flat(second.full_state_dict()), flat(first.full_state_dict()))
    saved, loaded = optimizer_tensors(first), optimizer_tensors(second)
    assert sorted(saved) == sorted(loaded) and any(k.endswith("exp_avg_sq") for k in saved)
    for key, value in saved.items():
        assert torch.equal(loaded[key].cpu(), value.cpu()), key
        if value.dim() > 0:
            assert loaded[key].device.type == torch.device(DEVICE).type, key
    start = flat(first.full_state_dict())
    r_first = apply_update(first, batches, LossConfig(kl_coef=0.0))
    r_second = apply_update(second, batches, LossConfig(kl_coef=0.0))
    a, b = flat(first.full_state_dict()), flat(second.full_state_dict())
    off = (a - b).abs()
    record(f"zero{stage}_resume", saved_tensors=len(saved), grad_norms=[r_first.grad_norm, r_second.grad_norm],
           delta_cos=cos(a - start, b - start), weights_max_abs=off.max(),
           weights_frac_off=float((off > 0.1 * LR).double().mean()))
    assert float((a - start).norm()) > 0  # the second update moved the weights
    assert cos(a - start, b - start) > 0.9999
    assert float((off > 0.1 * LR).double().mean()) < 1e-3
