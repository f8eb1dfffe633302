"""From a batch manifest to model tensors: rebuild each step's prompt, check it, collate.

The rollout worker and the trainer must score the same tokens. Each sample's prompt is rebuilt
with the rollout service's prompt builder (``dart.agent.prompt``) and its hash compared with
the one the rollout worker recorded; a sample that differs (or whose screenshots cannot be
read, or whose token arrays disagree) is dropped and reported, never trained on and never a
crash. Shapes: ``_B`` samples, ``_L`` prompt+response positions, ``_T`` response tokens.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dart.agent.prompt import PromptConfig, PromptInputs, build_messages, encode_prompt, prompt_hash
from dart.errors import BlobError, DecodeError
from dart.events.manifest import BatchManifest, Sample
from dart.train.advantages import group_advantages, length_weights


@dataclass(frozen=True, kw_only=True)
class TrainSample:
    """One sample whose prompt was rebuilt and checked: ready to collate.

    Why a shape of its own: it holds the rebuilt prompt's tensors and the advantage, which only
    the trainer computes (the manifest's :class:`Sample` carries digests and a reward). Its token
    fields keep the Sample's names; :class:`ModelBatch` adds only the shape suffix."""

    inputs: PromptInputs
    response_token_ids: list[int]
    rollout_logprobs: list[float]
    entropies: list[float]
    advantage: float
    sft: bool
    rollout_id: str
    step_index: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """A sample left out of the update, and why (``prompt_hash``, ``unreadable``, ``ragged``,
    ``vision_token``)."""

    rollout_id: str
    step_index: int
    reason: str
    detail: str


def check_arrays(sample: Sample) -> str | None:
    """Why a sample's token arrays cannot be trained on, or None when they can."""
    n = len(sample.response_token_ids)
    if n == 0:
        return "empty response"
    # experience may come without the sampler's log-probs (all or none); online steps never do
    if (sample.rollout_logprobs or sample.origin == "online") and len(sample.rollout_logprobs) != n:
        return f"{n} response tokens but {len(sample.rollout_logprobs)} rollout log-probs"
    if sample.entropies and len(sample.entropies) != n:
        return f"{n} response tokens but {len(sample.entropies)} entropies"
    if not all(math.isfinite(x) and x <= 0.0 for x in sample.rollout_logprobs):
        return "rollout log-probs must be finite and <= 0"
    return None


VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
"""Qwen2.5-VL's vision placeholders. A sampled response can contain one (a small policy at
temperature 1 does); fed back to the model it would count as an image slot without an image,
and the forward pass fails for the whole micro-batch, so such a step is dropped instead."""


def vision_token_ids(tokenizer: Any) -> frozenset[int]:
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = (tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS)
    return frozenset(i for i in ids if isinstance(i, int) and i != unk)


def prepare_samples(
    manifest: BatchManifest,
    *,
    tokenizer: Any,
    image_processor: Any,
    load_image: Callable[[str], Any],
    prompt_cfg: PromptConfig,
    check_hash: bool = True,
    advantages: bool = True,
    step_weight: str = "step",
) -> tuple[list[TrainSample], list[Dropped]]:
    """Advantages for every sample, then the prompts rebuilt; returns (kept, dropped).

    Advantages are computed over the whole manifest first: a trajectory's outcome belongs in
    its group's baseline even when one of its steps is dropped here. BatchError (inconsistent
    rewards) fails the whole batch. ``check_hash=False`` (SFT on foreign data) skips the check;
    ``advantages=False`` (SFT) leaves every advantage at 0. ``step_weight="trajectory"`` scales
    each advantage by ``n̄ / n_i`` (``LossConfig.step_weight``), counted over the manifest.
    """
    samples = manifest.samples
    if advantages:
        rollout_ids = [s.rollout_id for s in samples]
        adv = group_advantages([s.reward for s in samples], [s.group_id for s in samples], rollout_ids)
        if step_weight == "trajectory":
            adv = adv * length_weights(rollout_ids)
        adv_B = adv.tolist()
    else:
        adv_B = [0.0] * len(samples)
    kept: list[TrainSample] = []
    dropped: list[Dropped] = []
    vision_ids = vision_token_ids(tokenizer)
    for sample, adv in zip(samples, adv_B, strict=True):
        def drop(reason: str, detail: str, s: Sample = sample) -> None:
            dropped.append(Dropped(s.rollout_id, s.step_index, reason, detail))

        if (problem := check_arrays(sample)) is not None:
            drop("ragged", problem)
            continue
        if hits := [t for t in sample.response_token_ids if t in vision_ids]:
            drop("vision_token", f"response holds vision placeholder token(s) {sorted(set(hits))}")
            continue
        try:
            messages, images = build_messages(sample.context, load_image, prompt_cfg)
            inputs = encode_prompt(tokenizer, image_processor, messages, images)
        except (DecodeError, BlobError) as exc:
            drop("unreadable", f"{type(exc).__name__}: {exc}")
            continue
        rebuilt = prompt_hash(inputs.input_ids)
        if check_hash and rebuilt != sample.prompt_hash:
            drop("prompt_hash", f"rollout {sample.prompt_hash[:12]}, trainer {rebuilt[:12]} "
                                f"({inputs.num_tokens} prompt tokens)")
            continue
        kept.append(TrainSample(
            inputs=inputs, response_token_ids=list(sample.response_token_ids),
            # experience (an oracle's, a replay's) may come without the sampler's log-probs: NaN
            # marks them unknown, and the loss then gives those tokens an importance weight of 1
            rollout_logprobs=list(sample.rollout_logprobs) or [math.nan] * len(sample.response_token_ids),
            entropies=list(sample.entropies) or [0.0] * len(sample.response_token_ids),
            advantage=float(adv), sft=sample.sft, rollout_id=sample.rollout_id, step_index=sample.step_index,
        ))
    return kept, dropped


def pad_2d(rows: Sequence[Sequence[float]], *, value: float, dtype: torch.dtype) -> torch.Tensor:
    """Right-padded ``(len(rows), max_len)`` tensor."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
    return out


@dataclass(frozen=True, kw_only=True)
class ModelBatch:
    """A collated micro-batch: right-padded prompt+response sequences and the response view.

    Why a shape of its own: the loss takes padded tensors, not per-sample lists; each field is its
    :class:`TrainSample` field's name plus the shape suffix."""

    input_ids_B_L: torch.Tensor
    attention_mask_B_L: torch.Tensor
    mm_token_type_ids_B_L: torch.Tensor
    pixel_values: torch.Tensor | None
    """All images' patches, concatenated in sample order (None: no image in the micro-batch)."""
    image_grid_thw: torch.Tensor | None
    response_token_ids_B_T: torch.Tensor
    logit_pos_B_T: torch.Tensor
    """Position whose logits predict response token t (prompt length - 1 + t; 0 on padding)."""
    mask_B_T: torch.Tensor
    """1.0 on real response tokens, 0.0 on padding."""
    rollout_logprobs_B_T: torch.Tensor
    entropy_B_T: torch.Tensor
    """Rollout-side token entropies (for the entropy step mask)."""
    adv_B: torch.Tensor
    sft_B: torch.Tensor
    step_mask_B: torch.Tensor
    """Samples that learn (entropy step mask)."""

    @property
    def num_tokens(self) -> int:
        """Response tokens that count in the loss."""
        return int((self.mask_B_T * self.step_mask_B[:, None]).sum())

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """What ``ResponseScorer.forward`` takes."""
        kw = {
            "input_ids": self.input_ids_B_L,
            "attention_mask": self.attention_mask_B_L,
            "mm_token_type_ids": self.mm_token_type_ids_B_L,
            "response_token_ids": self.response_token_ids_B_T,
            "logit_pos": self.logit_pos_B_T,
        }
        if self.pixel_values is not None:
            kw["pixel_values"] = self.pixel_values
            kw["image_grid_thw"] = self.image_grid_thw  # type: ignore[assignment]
        return kw

    def to(self, device: Any, dtype: torch.dtype | None = None) -> ModelBatch:
        """On ``device``; ``dtype`` (if given) applies to pixel values only."""
        moved = {name: (v.to(device) if isinstance(v, torch.Tensor) else v)
                 for name, v in vars(self).items()}
        if self.pixel_values is not None and dtype is not None:
            moved["pixel_values"] = self.pixel_values.to(device=device, dtype=dtype)
        return replace(self, **moved)


def collate(samples: Sequence[TrainSample], step_mask_B: torch.Tensor, *, pad_id: int) -> ModelBatch:
    """Right-pad the samples of one micro-batch into a ModelBatch (CPU tensors)."""
    sequences = [s.inputs.with_response(s.response_token_ids) for s in samples]
    prompt_lens = [s.inputs.num_tokens for s in samples]
    response_lens = [len(s.response_token_ids) for s in samples]
    pixels = [s.inputs.pixel_values for s in samples if s.inputs.pixel_values is not None]
    grids = [s.inputs.image_grid_thw for s in samples if s.inputs.image_grid_thw is not None]
    logit_pos = [[p - 1 + t for t in range(n)] for p, n in zip(prompt_lens, response_lens, strict=True)]
    return ModelBatch(
        input_ids_B_L=pad_2d([q.input_ids[0].tolist() for q in sequences], value=pad_id, dtype=torch.long),
        attention_mask_B_L=pad_2d([q.attention_mask[0].tolist() for q in sequences], value=0, dtype=torch.long),
        mm_token_type_ids_B_L=pad_2d([q.mm_token_type_ids[0].tolist() for q in sequences], value=0,
                                     dtype=torch.int32),
        pixel_values=torch.cat(pixels) if pixels else None,
        image_grid_thw=torch.cat(grids) if grids else None,
        response_token_ids_B_T=pad_2d([s.response_token_ids for s in samples], value=pad_id, dtype=torch.long),
        logit_pos_B_T=pad_2d(logit_pos, value=0, dtype=torch.long),
        mask_B_T=pad_2d([[1.0] * n for n in response_lens], value=0.0, dtype=torch.float32),
        rollout_logprobs_B_T=pad_2d([s.rollout_logprobs for s in samples], value=0.0, dtype=torch.float32),
        entropy_B_T=pad_2d([s.entropies for s in samples], value=0.0, dtype=torch.float32),
        adv_B=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        sft_B=torch.tensor([s.sft for s in samples], dtype=torch.bool),
        step_mask_B=step_mask_B.bool(),
    )


def micro_batches(samples: Sequence[TrainSample], step_mask_B: torch.Tensor | None = None, *, size: int,
                  pad_id: int) -> list[ModelBatch]:
    """Micro-batches of at most ``size`` samples of similar length (less padding); ``step_mask_B``:
    which samples get a loss (None: every one; which steps train is the data manager's choice,
    ``curation.entropy_top_fraction``, made before the batch is sent).

    The order is deterministic: by sequence length, ties broken by a hash of (rollout, step), so
    the samples of one group (which arrive together and mostly share a length) spread over many
    micro-batches. One optimiser step over all micro-batches does not depend on the order (each
    micro-batch's loss is normalised by the whole batch's sample count); with PPO mini-batches
    (:func:`dart.train.update.apply_update`) every step then sees many tasks, not one group."""
    lengths = [s.inputs.num_tokens + len(s.response_token_ids) for s in samples]
    mix = [hashlib.blake2b(f"{s.rollout_id}:{s.step_index}".encode(), digest_size=8).digest() for s in samples]
    order = sorted(range(len(samples)), key=lambda j: (lengths[j], mix[j]))
    if step_mask_B is None:
        step_mask_B = torch.ones(len(samples), dtype=torch.bool)
    return [collate([samples[j] for j in order[i : i + size]], step_mask_B[order[i : i + size]], pad_id=pad_id)
            for i in range(0, len(samples), size)]

