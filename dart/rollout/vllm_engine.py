"""The ``vllm`` engine: an in-process vLLM ``LLM`` (the ``gpu`` extra), weights updated in place.

Import-guarded: importing this module never imports vLLM; constructing the engine does, and
raises ToolMissing with the install command when vLLM is absent (CPU installs and tests never
need it). NOTE: written against vLLM's offline ``LLM`` API (``generate`` with
``multi_modal_data``, ``collective_rpc``); it has not run on a GPU in this repository's CI.

Swaps load ``model.safetensors`` on each vLLM worker through the model's own
``load_weights`` between ``generate`` calls (no process restart); the engine serialises
generate and swap on one thread, so a batch never mixes versions.
"""

from __future__ import annotations

import asyncio
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
    entropy_from_top_logprobs,
)

log = logging.getLogger(__name__)


def _load_weights_on_worker(worker: Any, path: str) -> int:
    """Runs inside each vLLM worker (collective_rpc): stream tensors into the live model."""
    from safetensors.torch import load_file

    state = load_file(path)
    model = worker.model_runner.model
    model.load_weights(weights=iter(state.items()))
    return len(state)


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, model_dir: str | Path, *, initial_version: int = 0, **llm_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ToolMissing(
                "the vllm engine needs vLLM: pip install 'dart-rl[gpu]' on a CUDA host"
            ) from exc
        from transformers import AutoTokenizer

        self._vllm = vllm
        self._llm = vllm.LLM(model=str(model_dir), limit_mm_per_prompt={"image": 8}, **llm_kwargs)
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._version = initial_version
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self._requests = 0
        self._busy_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    def stats(self) -> EngineStats:
        return EngineStats(requests=self._requests, batches=self._requests, busy_s=self._busy_s)

    async def generate(self, request: GenerateRequest) -> Generation:
        loop = asyncio.get_running_loop()
        version = self._version
        t0 = time.perf_counter()
        out = await loop.run_in_executor(self._executor, self._generate, request)
        busy = time.perf_counter() - t0
        self._busy_s += busy
        self._requests += 1
        return Generation(
            **out,
            policy_version=version,
            newer_version_seen=self.newer_version_than(version),
            generate_s=busy,
        )

    def _generate(self, request: GenerateRequest) -> dict[str, Any]:
        s = request.sampling
        params = self._vllm.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_new_tokens,
            seed=s.seed,
            frequency_penalty=s.frequency_penalty,
            logprobs=20,
        )
        prompt = {"prompt": render_prompt(self._tokenizer, request.messages)}
        if request.images:
            prompt["multi_modal_data"] = {"image": request.images}
        try:
            result = self._llm.generate([prompt], params, use_tqdm=False)[0]
        except Exception as exc:  # vLLM raises many types; the request fails, not the worker
            raise EngineError(f"vLLM generate failed: {exc}") from exc
        completion = result.outputs[0]
        ids = list(completion.token_ids)
        logprobs, entropies = [], []
        for tid, top in zip(ids, completion.logprobs or [], strict=False):
            logprobs.append(float(top[tid].logprob))
            ps = [float(v.logprob) for v in top.values()]
            entropies.append(entropy_from_top_logprobs(ps))
        return {
            "text": completion.text,
            "token_ids": ids,
            "logprobs": logprobs,
            "entropies": entropies,
            "finish_reason": "length" if completion.finish_reason == "length" else "stop",
            "prompt_token_ids": list(result.prompt_token_ids or []),
        }

    async def swap_weights(self, version: int, state: dict[str, Any]) -> float:
        from safetensors.torch import save_file

        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "model.safetensors")
            save_file({k: v.contiguous() for k, v in state.items()}, path)
            await loop.run_in_executor(
                self._executor, lambda: self._llm.collective_rpc(_load_weights_on_worker, args=(path,))
            )
        self._version = version
        return time.perf_counter() - t0

    async def close(self) -> None:
        self._executor.shutdown(wait=False)
