"""The ``vllm`` engine: an in-process vLLM ``LLM`` (the ``gpu`` extra), weights updated in place.

Import-guarded: importing this module never imports vLLM; constructing the engine does, and
raises ToolMissing with the install command when vLLM is absent (CPU installs and tests never
need it). Written against vLLM 0.32.0 (the ``gpu`` extra's pin); every vLLM name, signature and
argument used here is checked against the real package by ``make contract-test``
(tests/vllm_contract/).

Requests are queued and run as batches: each batch is one ``LLM.generate`` over all its prompts
(so vLLM batches them), on one inference thread that also runs the swaps, so a batch never
mixes versions and its version label is read when the batch starts on that thread.

A swap goes through vLLM's own reload path by method name: the state dict is written to one
safetensors file, each worker loads it through its ``reload_weights`` (the worker extension in
:mod:`dart.rollout.vllm_worker`; vLLM's layerwise reload, which clears the worker's encoder and
multimodal caches), then the engine resets the prefix (KV) cache and the encoder and multimodal
caches, so no request after a swap reuses state computed under the old weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dart.agent.prompt import render_prompt
from dart.errors import ToolMissing
from dart.rollout.engine import (
    Engine,
    EngineError,
    EngineStats,
    GenerateRequest,
    Generation,
    Pending,
    deliver,
    entropy_from_top_logprobs,
)
from dart.rollout.vllm_worker import RELOAD, WORKER_EXTENSION

log = logging.getLogger(__name__)

TOP_LOGPROBS = 20
"""Top log-probs asked per token: the entropy estimate's support (entropy_from_top_logprobs)."""

LLM_DEFAULTS: dict[str, Any] = {
    "limit_mm_per_prompt": {"image": 8},
    # log-probs of the raw logits, before temperature/top-p: what the hf engine and the trainer use
    "logprobs_mode": "raw_logprobs",
    "worker_extension_cls": WORKER_EXTENSION,
    "enable_prefix_caching": True,
}


def sampling_params(vllm: Any, request: GenerateRequest) -> Any:
    s = request.sampling
    return vllm.SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=s.max_new_tokens,
        seed=s.seed,
        frequency_penalty=s.frequency_penalty,
        logprobs=TOP_LOGPROBS,
    )


def text_prompt(tokenizer: Any, request: GenerateRequest) -> dict[str, Any]:
    """A vLLM ``TextPrompt``: the rendered chat, the screenshots as ``multi_modal_data``."""
    prompt: dict[str, Any] = {"prompt": render_prompt(tokenizer, request.messages)}
    if request.images:
        prompt["multi_modal_data"] = {"image": list(request.images)}
    return prompt


def completion_fields(result: Any) -> dict[str, Any]:
    """A ``RequestOutput``'s first completion as Generation fields. ``logprobs`` holds, per
    generated token, a mapping token id -> ``Logprob`` (a list of dicts or vLLM's FlatLogprobs)
    with the sampled token and the top ``TOP_LOGPROBS``."""
    completion = result.outputs[0]
    ids = list(completion.token_ids)
    tops = completion.logprobs
    if tops is None or len(tops) != len(ids):
        raise EngineError(
            f"vLLM returned log-probs for {0 if tops is None else len(tops)} of {len(ids)} tokens "
            "(SamplingParams.logprobs must be set)"
        )
    logprobs, entropies = [], []
    for tid, top in zip(ids, tops, strict=True):
        logprobs.append(float(top[tid].logprob))
        entropies.append(entropy_from_top_logprobs([float(v.logprob) for v in top.values()]))
    return {
        "text": completion.text,
        "token_ids": ids,
        "logprobs": logprobs,
        "entropies": entropies,
        "finish_reason": "length" if completion.finish_reason == "length" else "stop",
        "prompt_token_ids": list(result.prompt_token_ids or []),
    }


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, model_dir: str | Path, *, initial_version: int = 0, max_batch_size: int = 64,
                 llm: Any = None, tokenizer: Any = None, **llm_kwargs: Any) -> None:
        """``llm_kwargs`` go to ``vllm.LLM`` over :data:`LLM_DEFAULTS`; ``llm`` / ``tokenizer``
        stand in for the ones built from ``model_dir`` (the tests' seam, where no GPU is)."""
        try:
            import vllm
        except ImportError as exc:
            raise ToolMissing(
                "the vllm engine needs vLLM: pip install 'dart-rl[gpu]' on a CUDA host"
            ) from exc
        self._vllm = vllm
        if llm is None:
            llm = vllm.LLM(model=str(model_dir), **{**LLM_DEFAULTS, **llm_kwargs})
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._llm = llm
        self._tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self._version = initial_version
        self._queue: asyncio.Queue[Pending] = asyncio.Queue()
        # one inference thread: batches and swaps never overlap, in the order they were started
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self._batcher: asyncio.Task[None] | None = None
        self._staging = tempfile.TemporaryDirectory(prefix="dart-vllm-swap-")
        self._requests = 0
        self._batches = 0
        self._busy_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    def stats(self) -> EngineStats:
        return EngineStats(requests=self._requests, batches=self._batches, busy_s=self._busy_s)

    async def start(self) -> None:
        if self._batcher is None:
            self._batcher = asyncio.get_running_loop().create_task(self._batch_loop(), name="vllm-batcher")

    async def generate(self, request: GenerateRequest) -> Generation:
        await self.start()
        pending = Pending(request=request, future=asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        return await pending.future

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [p for p in batch if not p.future.cancelled()]
            if not batch:
                continue
            try:
                version, started, busy, results = await loop.run_in_executor(self._executor, self._run_batch, batch)
            except Exception as exc:  # vLLM raises many types; the batch fails, never the engine
                log.exception("vllm engine: batch of %d failed", len(batch))
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(EngineError(f"vLLM generate failed: {exc}"))
                continue
            self._busy_s += busy
            self._batches += 1
            self._requests += deliver(batch, results, version=version, newer=self.newer_version_than(version),
                                      started=started, busy_s=busy)

    def _run_batch(self, batch: list[Pending]) -> tuple[int, float, float, list[dict[str, Any] | BaseException]]:
        """One ``generate`` over the batch, on the inference thread; the version is read here,
        after any swap queued before it has finished."""
        version = self._version
        started = time.perf_counter()
        prompts = [text_prompt(self._tokenizer, p.request) for p in batch]
        params = [sampling_params(self._vllm, p.request) for p in batch]
        outputs = self._llm.generate(prompts, params, use_tqdm=False)
        results: list[dict[str, Any] | BaseException] = []
        for out in outputs:
            try:
                results.append(completion_fields(out))
            except EngineError as exc:
                results.append(exc)
        return version, started, time.perf_counter() - started, results

    async def swap_weights(self, version: int, state: dict[str, Any]) -> float:
        """Install ``state`` as ``version`` once the running batch is done; returns seconds."""
        self.note_version_seen(version)
        loop = asyncio.get_running_loop()
        swap_s = await loop.run_in_executor(self._executor, self._swap, version, state)
        log.info("vllm engine: now version %d, swap %.3f s", version, swap_s)
        return swap_s

    def _swap(self, version: int, state: dict[str, Any]) -> float:
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        path = Path(self._staging.name) / "model.safetensors"
        save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(path))
        try:
            loaded = self._llm.collective_rpc(RELOAD, args=(str(path),))
            if any(n != len(state) for n in loaded):
                raise EngineError(f"vLLM workers read {loaded} tensors of {len(state)}")
        except BaseException:
            # a reload that failed part way may have changed some layers: whatever the caches
            # hold was computed under other weights either way
            with contextlib.suppress(Exception):
                self.reset_caches()
            raise
        finally:
            path.unlink(missing_ok=True)
        self.reset_caches()
        self._version = version
        return time.perf_counter() - t0

    def reset_caches(self) -> None:
        """Forget everything computed under the old weights: the prefix (KV) cache, the encoder
        cache (vision embeddings keyed by image hash) and the multimodal processor caches."""
        if not self._llm.reset_prefix_cache():
            # False: requests still hold blocks; none run between batches, so this is a bug here
            raise EngineError("vLLM did not reset its prefix cache after a weight swap")
        self._llm.llm_engine.reset_encoder_cache()
        self._llm.reset_mm_cache()

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
            self._batcher = None
        while not self._queue.empty():
            self._queue.get_nowait().future.cancel()
        self._executor.shutdown(wait=True)
        self._staging.cleanup()
