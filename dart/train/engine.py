"""Training engines: plain torch (CPU / one GPU) and DeepSpeed ZeRO behind one interface.

An engine owns the trained module and its optimiser and knows nothing of PPO: the trainer
calls ``forward`` (response log-probs with a gradient), computes the loss itself, and hands it
to ``backward``; ``step`` clips and applies the accumulated gradient. Both engines wrap the
same ``ResponseScorer``, so the two code paths differ only in who owns the parameters.

How to launch on GPUs (DeepSpeed ZeRO, several ranks) is in ``dart/train/README.md``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from pathlib import Path
from typing import Any, Protocol

import torch

from dart.errors import ConfigError
from dart.train.batch import ModelBatch
from dart.train.config import EngineConfig, OptimConfig
from dart.train.master_weights import SplitMasterAdamW
from dart.train.staging import HostStaging

log = logging.getLogger(__name__)


class ResponseScorer(torch.nn.Module):
    """Per-token log-probs (with gradient) and entropies (without) of response tokens.

    Runs the HF decoder once and applies the LM head only at the positions that predict a
    response token, so a 32k-token prompt never materialises 32k x vocab logits.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        if not (hasattr(policy, "model") and hasattr(policy, "lm_head")):
            raise ConfigError(f"{type(policy).__name__} has no .model/.lm_head: the trainer needs an HF "
                              "causal VLM such as Qwen2_5_VLForConditionalGeneration")
        self.policy = policy

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mm_token_type_ids: torch.Tensor,
                response_token_ids: torch.Tensor, logit_pos: torch.Tensor, pixel_values: torch.Tensor | None = None,
                image_grid_thw: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        kw: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask,
                              "mm_token_type_ids": mm_token_type_ids, "use_cache": False}
        if pixel_values is not None:
            kw.update(pixel_values=pixel_values, image_grid_thw=image_grid_thw)
        hidden_B_L_H = self.policy.model(**kw).last_hidden_state
        index = logit_pos[..., None].expand(-1, -1, hidden_B_L_H.shape[-1])
        logits_B_T_V = self.policy.lm_head(hidden_B_L_H.gather(1, index)).float()
        logp_B_T_V = logits_B_T_V.log_softmax(-1)
        logp_B_T = logp_B_T_V.gather(-1, response_token_ids[..., None]).squeeze(-1)
        with torch.no_grad():
            entropy_B_T = -(logp_B_T_V.exp() * logp_B_T_V).sum(-1)
        return logp_B_T, entropy_B_T


class Engine(Protocol):
    policy: torch.nn.Module
    """The HF model being trained (unwrapped)."""
    device: torch.device

    def forward(self, batch: ModelBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp_B_T with gradient, entropy_B_T) of the micro-batch's response tokens."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of ``loss`` (already normalised over the whole batch)."""
        ...

    def step(self) -> float:
        """Clip, apply and clear the accumulated gradient; returns the global grad norm before clipping."""
        ...

    def full_state_dict(self, staging: HostStaging | None = None) -> dict[str, torch.Tensor]:
        """The complete HF ``state_dict()`` on CPU (gathered across ranks under ZeRO-3): views of
        ``staging``'s buffer (valid until its next copy), or a fresh copy the caller owns."""
        ...

    def save_state(self, directory: Path) -> None:
        """Write what ``model.safetensors`` does not hold (optimiser state) under ``directory``."""
        ...

    def load_state(self, directory: Path) -> None:
        """Restore the model (from ``directory/model.safetensors``) and the optimiser state."""
        ...


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"engine.device is {name!r} but torch sees no CUDA device; use cpu or auto")
    return torch.device(name)


def make_optimizer(params: Any, cfg: OptimConfig, *, split_master: bool = False) -> torch.optim.Optimizer:
    """torch's AdamW; ``split_master``: the same maths on a float32 master kept beside bfloat16
    weights (:class:`dart.train.master_weights.SplitMasterAdamW`)."""
    # Frozen parameters (a frozen vision tower) get no optimiser state.
    params = [p for p in params if p.requires_grad]
    if split_master:
        return SplitMasterAdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    # A plain torch AdamW (not DeepSpeed's fused/CPU Adam): no JIT op builds, same maths on every engine.
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


class TorchEngine:
    """One process, one device; gradient accumulation by repeated ``backward``."""

    def __init__(self, policy: torch.nn.Module, optim: OptimConfig, engine: EngineConfig) -> None:
        self.device = resolve_device(engine.device)
        self.dtype = getattr(torch, engine.dtype)
        self.policy = policy.to(device=self.device, dtype=self.dtype).train()
        if engine.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.scorer = ResponseScorer(self.policy)
        self.optim_cfg = optim
        self.optimizer = make_optimizer(self.policy.parameters(), optim, split_master=engine.split_master)

    def forward(self, batch: ModelBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.scorer(**batch.to(self.device, self.dtype).model_inputs())

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.optim_cfg.max_grad_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            # A NaN/inf gradient would poison every weight: skip the update, keep the weights.
            log.error("non-finite gradient norm %s: update skipped", norm)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def full_state_dict(self, staging: HostStaging | None = None) -> dict[str, torch.Tensor]:
        return (staging or HostStaging(pin=False)).copy(self.policy.state_dict())

    def save_state(self, directory: Path) -> None:
        # With split master weights this holds each weight's low 16 bits too: with the bfloat16
        # weights of model.safetensors they are the float32 master, bit for bit.
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def load_state(self, directory: Path) -> None:
        from safetensors.torch import load_file

        self.policy.load_state_dict(load_file(directory / "model.safetensors"), strict=True)
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_single_process_group() -> None:
    """Environment for a one-process group when not started by a launcher (deepspeed/torchrun)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)


class DeepSpeedEngine:
    """DeepSpeed ZeRO-``stage``; the trainer marks the accumulation boundary by calling ``step``
    (``managed_gradient_accumulation: false``), so batches may hold any number of micro-batches."""

    def __init__(self, policy: torch.nn.Module, optim: OptimConfig, engine: EngineConfig) -> None:
        import deepspeed

        self.device = resolve_device(engine.device)
        if self.device.type == "cpu":
            # NOTE: without this DeepSpeed JIT-builds its shared-memory comm op on CPU (a compile at start-up).
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        else:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        init_single_process_group()
        deepspeed.init_distributed(dist_backend="gloo" if self.device.type == "cpu" else "nccl")
        self.stage = engine.zero_stage
        self.dtype = getattr(torch, engine.dtype)
        self.policy = policy.to(dtype=self.dtype)
        if engine.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        config = {
            "train_micro_batch_size_per_gpu": engine.micro_batch_samples,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "gradient_clipping": optim.max_grad_norm,
            "zero_optimization": {"stage": engine.zero_stage},
            "bf16": {"enabled": engine.dtype == "bfloat16"},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        scorer = ResponseScorer(self.policy)
        self.ds, self.optimizer, _, _ = deepspeed.initialize(
            model=scorer, optimizer=make_optimizer(scorer.parameters(), optim), config=config)
        self.ds.train()

    def forward(self, batch: ModelBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ds(**batch.to(self.ds.device, self.dtype).model_inputs())

    def backward(self, loss: torch.Tensor) -> None:
        # The loss is already divided by the batch's sample count: no scaling by accumulation steps.
        self.ds.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.ds.step()
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else math.nan

    def full_state_dict(self, staging: HostStaging | None = None) -> dict[str, torch.Tensor]:
        import deepspeed

        params = list(self.policy.parameters()) if self.stage == 3 else []
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=self.stage == 3):
            return (staging or HostStaging(pin=False)).copy(self.policy.state_dict())

    def save_state(self, directory: Path) -> None:
        self.ds.save_checkpoint(str(directory / "deepspeed"), tag="state", save_latest=False)

    def load_state(self, directory: Path) -> None:
        path, _ = self.ds.load_checkpoint(str(directory / "deepspeed"), tag="state")
        if path is None:
            raise ConfigError(f"no DeepSpeed state under {directory / 'deepspeed'}: was it written by another engine?")


def build_engine(policy: torch.nn.Module, optim: OptimConfig, engine: EngineConfig) -> Engine:
    """The engine ``engine.kind`` names, owning ``policy`` from now on."""
    if engine.kind == "deepspeed":
        return DeepSpeedEngine(policy, optim, engine)
    return TorchEngine(policy, optim, engine)


class ReferencePolicy:
    """The frozen reference policy of the KL term (a copy of the initial weights, no gradient)."""

    def __init__(self, policy: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.device = device
        self.scorer = ResponseScorer(policy.to(device=device, dtype=dtype).eval())
        self.scorer.requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, batch: ModelBatch) -> torch.Tensor:
        return self.scorer(**batch.to(self.device, self.dtype).model_inputs())[0]
