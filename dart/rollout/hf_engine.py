"""The ``hf`` engine: transformers ``generate`` on CPU or GPU, micro-batched, weights swapped in place.

One inference thread owns the model. Requests wait in a queue; whenever the thread is free
it takes every queued request (up to ``max_batch_size``) as one left-padded batch, so
concurrency turns into batching without a fixed delay. Weight swaps run on the same thread
between batches, so a batch never sees two versions.

Sampling is done by a logits processor with one ``torch.Generator`` per row (seeded by the
request's ``Sampling.seed``), under each row's own temperature / top-p / frequency penalty;
``generate`` itself runs greedy over the processed scores, and ``output_logits=True`` returns
the raw logits the tokens were drawn from, which give the log-probs and entropies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dart.agent.model import Policy
from dart.agent.prompt import PromptInputs, encode_prompt
from dart.agent.weight_format import check_state_dict
from dart.config import require
from dart.errors import DartError
from dart.rollout.engine import (
    Engine,
    EngineError,
    EngineStats,
    GenerateRequest,
    Generation,
    Pending,
    deliver,
    draw_token,
    token_logprobs_entropies,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class HFEngineConfig:
    max_batch_size: int = 8
    """Most requests run together in one generate call (1 = one at a time)."""
    initial_version: int = 0
    """Policy version of the weights loaded from the model directory."""
    threads: int = 0
    """torch CPU threads of this process (0: torch's default, one per core). On a CPU shared with
    other services, 1: a parallel region waits for its slowest thread, and with the cores
    oversubscribed that thread is often not running."""

    def __post_init__(self) -> None:
        require(self.max_batch_size >= 1, "max_batch_size", f"must be >= 1, got {self.max_batch_size}")
        require(self.threads >= 0, "threads", f"must be >= 0, got {self.threads}")


class _RowSampler:
    """Logits processor: draws each row's next token under that row's sampling parameters and
    returns scores that make greedy search pick exactly it."""

    def __init__(self, requests: list[GenerateRequest], prompt_len: int, stop_id: int, device: Any) -> None:
        import torch

        self.sampling = [r.sampling for r in requests]
        self.prompt_len = prompt_len
        self.stop_id = stop_id
        self.generators = [
            torch.Generator(device=device).manual_seed(s.seed & 0xFFFF_FFFF) for s in self.sampling
        ]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        step = input_ids.shape[1] - self.prompt_len
        out = torch.full_like(scores, -float("inf"))
        for row, sampling in enumerate(self.sampling):
            if step >= sampling.max_new_tokens:
                token = self.stop_id  # past this row's budget: end it; the token is cut off later
            else:
                generated = input_ids[row, self.prompt_len :].tolist()
                token = draw_token(scores[row], sampling, generated, self.generators[row])
            out[row, token] = 0.0
        return out


def collate(inputs: list[PromptInputs], pad_id: int) -> dict[str, Any]:
    """One left-padded batch of prompts (images concatenated in row order)."""
    import torch

    width = max(x.num_tokens for x in inputs)

    def left_pad(t: torch.Tensor, value: int) -> torch.Tensor:
        pad = torch.full((1, width - t.shape[1]), value, dtype=t.dtype, device=t.device)
        return torch.cat([pad, t], dim=1)

    kw: dict[str, Any] = {
        "input_ids": torch.cat([left_pad(x.input_ids, pad_id) for x in inputs]),
        "attention_mask": torch.cat([left_pad(x.attention_mask, 0) for x in inputs]),
        "mm_token_type_ids": torch.cat([left_pad(x.mm_token_type_ids, 0) for x in inputs]),
    }
    with_images = [x for x in inputs if x.pixel_values is not None]
    if with_images:
        kw["pixel_values"] = torch.cat([x.pixel_values for x in with_images])
        kw["image_grid_thw"] = torch.cat([x.image_grid_thw for x in with_images])
    return kw


class HFEngine(Engine):
    name = "hf"

    def __init__(self, policy: Policy, cfg: HFEngineConfig | None = None) -> None:
        self.policy = policy
        self.cfg = cfg or HFEngineConfig()
        if self.cfg.threads:
            import torch

            torch.set_num_threads(self.cfg.threads)
        self._version = self.cfg.initial_version
        self._queue: asyncio.Queue[Pending] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._lock = asyncio.Lock()  # held while the inference thread runs a batch or a swap
        self._batcher: asyncio.Task[None] | None = None
        self._requests = 0
        self._batches = 0
        self._busy_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    @property
    def device(self) -> Any:
        return next(self.policy.model.parameters()).device

    def stats(self) -> EngineStats:
        return EngineStats(requests=self._requests, batches=self._batches, busy_s=self._busy_s)

    async def start(self) -> None:
        if self._batcher is None:
            self._batcher = asyncio.get_running_loop().create_task(self._batch_loop(), name="hf-batcher")

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
            self._batcher = None
        while not self._queue.empty():
            self._queue.get_nowait().future.cancel()
        self._executor.shutdown(wait=True)

    async def generate(self, request: GenerateRequest) -> Generation:
        await self.start()
        pending = Pending(request=request, future=asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        return await pending.future

    async def swap_weights(self, version: int, state: dict[str, Any]) -> float:
        """Load ``state`` in place once the running batch (if any) is done; returns seconds."""
        check_state_dict(self.policy.model, state)
        self.note_version_seen(version)
        async with self._lock:
            loop = asyncio.get_running_loop()
            swap_s = await loop.run_in_executor(self._executor, self._load, state)
            previous, self._version = self._version, version
        log.info("hf engine: version %d -> %d in %.3f s", previous, version, swap_s)
        return swap_s

    def _load(self, state: dict[str, Any]) -> float:
        import torch

        t0 = time.perf_counter()
        with torch.no_grad():
            self.policy.model.load_state_dict(state, strict=True)
        return time.perf_counter() - t0

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.cfg.max_batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [p for p in batch if not p.future.cancelled()]
            if not batch:
                continue
            async with self._lock:
                version = self._version
                started = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self._executor, self._run_batch, batch)
                except Exception as exc:  # a broken batch fails its requests, never the engine
                    log.exception("hf engine: batch of %d failed", len(batch))
                    results = [EngineError(f"generation failed: {exc}")] * len(batch)
                busy = time.perf_counter() - started
                self._busy_s += busy
                self._batches += 1
            self._requests += deliver(batch, results, version=version, newer=self.newer_version_than(version),
                                      started=started, busy_s=busy)

    def _run_batch(self, batch: list[Pending]) -> list[dict[str, Any] | BaseException]:
        """Encode, generate and split one batch (on the inference thread)."""
        policy = self.policy
        results: list[dict[str, Any] | BaseException] = [EngineError("not run")] * len(batch)
        encoded: list[tuple[int, PromptInputs]] = []
        for i, pending in enumerate(batch):
            req = pending.request
            try:
                encoded.append(
                    (i, encode_prompt(policy.tokenizer, policy.image_processor, req.messages, req.images))
                )
            except (DartError, ValueError) as exc:
                results[i] = EngineError(f"cannot encode the prompt: {exc}")
        if not encoded:
            return results
        outputs = self._generate([batch[i].request for i, _ in encoded], [x for _, x in encoded])
        for (i, _), out in zip(encoded, outputs, strict=True):
            results[i] = out
        return results

    def _generate(self, requests: list[GenerateRequest], inputs: list[PromptInputs]) -> list[dict[str, Any]]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        policy = self.policy
        device = self.device
        stop_ids = set(policy.stop_token_ids)
        kw = collate([x.to(device, dtype=policy.model.dtype) for x in inputs], policy.pad_token_id)
        prompt_len = kw["input_ids"].shape[1]
        sampler = _RowSampler(requests, prompt_len, min(stop_ids), device)
        gen_cfg = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(r.sampling.max_new_tokens for r in requests),
            eos_token_id=sorted(stop_ids),
            pad_token_id=policy.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        with torch.no_grad():
            out = policy.model.generate(
                **kw, generation_config=gen_cfg, logits_processor=LogitsProcessorList([sampler])
            )
        logits_T_B_V = torch.stack(out.logits)  # raw logits of every generated position
        results = []
        for row, (req, prompt) in enumerate(zip(requests, inputs, strict=True)):
            tokens = out.sequences[row, prompt_len:].tolist()[: req.sampling.max_new_tokens]
            end = next((k + 1 for k, t in enumerate(tokens) if t in stop_ids), None)
            tokens = tokens[:end] if end is not None else tokens
            logprobs, entropies = token_logprobs_entropies(logits_T_B_V[: len(tokens), row], tokens)
            results.append(
                {
                    "text": policy.tokenizer.decode(tokens, skip_special_tokens=True),
                    "token_ids": tokens,
                    "logprobs": logprobs,
                    "entropies": entropies,
                    "finish_reason": "stop" if end is not None else "length",
                    "prompt_token_ids": prompt.token_ids(),
                }
            )
        return results
