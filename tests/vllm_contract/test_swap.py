"""The vllm engine's swap sequence against the real vLLM classes, the GPU parts faked behind
vLLM's own interfaces (runs in .venv-vllm: ``make contract-test``).

Real: ``vllm.LLM``'s ``collective_rpc`` / ``reset_prefix_cache`` / ``reset_mm_cache``,
``LLMEngine``'s, vLLM's msgpack RPC encoding and worker-side dispatch (``run_method``), vLLM's
``Worker`` with dart's extension mixed in as vLLM does it, Model Runner V2's ``reload_weights``
and its ``EncoderCache``, ``SamplingParams``, ``RequestOutput``. Faked (no GPU here), each named
``...OnCPU`` / ``...WithoutGPU``: the forward pass (``LLM.generate``), the engine-core process
(its scheduler's prefix cache is a dict), the model (one CPU parameter) and vLLM's layerwise
in-place reload of it. The fake forward pass reuses a cached prefix and a cached encoder output
as vLLM does, so a swap that does not reset them answers with the old weights.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM contract runs in .venv-vllm (make contract-test)")

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from vllm.inputs import TextPrompt  # noqa: E402
from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from vllm.utils.import_utils import resolve_obj_by_qualname  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, run_method  # noqa: E402
from vllm.v1.worker.gpu import model_runner as runner_v2  # noqa: E402
from vllm.v1.worker.gpu.mm.encoder_cache import EncoderCache  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

from dart.events import Sampling  # noqa: E402
from dart.rollout.engine import GenerateRequest  # noqa: E402
from dart.rollout.vllm_engine import VLLMEngine  # noqa: E402
from dart.rollout.vllm_worker import RELOAD, WORKER_EXTENSION  # noqa: E402

A = {"bias": torch.tensor([1.0])}
B = {"bias": torch.tensor([2.0])}


class ModelOnCPU(torch.nn.Module):
    """vLLM's model interface (``load_weights`` of checkpoint-format pairs) on one parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(A["bias"].clone(), requires_grad=False)

    def load_weights(self, weights):
        loaded = set()
        for name, tensor in weights:
            getattr(self, name).data.copy_(tensor)  # an unknown name raises, as vLLM's loaders do
            loaded.add(name)
        return loaded


def reload_on_cpu(vllm_config, model, weights_iterator, weights_path, is_checkpoint_format):
    """vLLM's in-place layerwise reload (model_loader.reload.inplace), minus the device work."""
    assert weights_iterator is not None and weights_path is None and is_checkpoint_format
    model.load_weights(weights_iterator)


class EngineCoreOnCPU:
    """vLLM's engine-core client: RPCs cross msgpack (as to the engine-core process) and run on
    the worker by name (vLLM's run_method); the scheduler's prefix (KV) cache is a dict."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.prefix_cache: dict[str, float] = {}
        self.calls: list[str] = []
        self._enc, self._dec = MsgpackEncoder(), MsgpackDecoder()

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        method, args, kwargs = self._dec.decode(self._enc.encode((method, args, kwargs or {})))
        self.calls.append(f"rpc:{method}")
        return [run_method(self.worker, method, tuple(args), kwargs)]

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append("reset_prefix_cache")
        self.prefix_cache.clear()
        return True

    def shutdown(self, timeout=None):
        self.calls.append("shutdown")

    def reset_encoder_cache(self):
        self.calls.append("reset_encoder_cache")
        self.worker.reset_encoder_cache()

    def reset_mm_cache(self):
        self.calls.append("reset_mm_cache")
        self.worker.reset_mm_cache()


class RendererOnCPU:
    def __init__(self) -> None:
        self.mm_cache: dict[str, object] = {"warm": object()}

    def _join_mm_warmup(self):
        pass

    def clear_mm_cache(self):
        self.mm_cache.clear()


class LLMWithoutGPU(vllm.LLM):
    """``vllm.LLM`` with its engine built from the fakes above; only ``generate`` (the forward
    pass) is replaced: the answer's tokens are the prefix state and the image's encoder output,
    each taken from its cache when there, else computed from the current weights."""

    def __init__(self, llm_engine: LLMEngine, worker) -> None:  # no GPU: vLLM's own __init__ would start one
        self.llm_engine = llm_engine
        self.renderer = llm_engine.renderer
        self.worker = worker
        self.batches: list[int] = []
        self.gate: threading.Event | None = None
        self.running = threading.Event()

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, **kwargs):
        self.running.set()
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append(len(prompts))
        core = self.llm_engine.engine_core
        encoder = self.worker.model_runner.encoder_cache
        weight = float(self.worker.get_model().bias)
        outputs = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params, strict=True)):
            assert set(prompt) <= TextPrompt.__optional_keys__ | TextPrompt.__required_keys__
            assert isinstance(params, vllm.SamplingParams) and params.logprobs
            kv = core.prefix_cache.setdefault(prompt["prompt"], weight)
            tokens = [int(kv)]
            for image in prompt.get("multi_modal_data", {}).get("image", []):
                key = image.tobytes().hex()[:16]
                if key not in encoder.encoder_outputs:
                    encoder.encoder_outputs[key] = torch.tensor(weight)
                tokens.append(int(encoder.encoder_outputs[key]))
            tops = create_sample_logprobs(False)
            for t in tokens:
                append_logprobs_for_next_position(tops, [t, t], [-0.5, -0.5], [None, None], rank=1, num_logprobs=1)
            outputs.append(RequestOutput(
                request_id=str(i), prompt=prompt["prompt"], prompt_token_ids=[7, 8], prompt_logprobs=None,
                outputs=[CompletionOutput(index=0, text=" ".join(map(str, tokens)), token_ids=tokens,
                                          cumulative_logprob=None, logprobs=tops, finish_reason="stop")],
                finished=True,
            ))
        return outputs


class ChatTemplate:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "|".join(part["text"] for m in messages for part in m["content"] if part.get("type") == "text")


@pytest.fixture
def parts(monkeypatch):
    """(engine, llm, core, worker) around the fakes; Model Runner V2's reload minus the device."""
    monkeypatch.setattr(runner_v2, "reload_weights", reload_on_cpu)
    # the worker class as vLLM builds it: its Worker with the extension (by qualified name) mixed in
    worker_cls = type("WorkerWithDartExtension", (Worker, resolve_obj_by_qualname(WORKER_EXTENSION)), {})
    worker = object.__new__(worker_cls)
    runner = object.__new__(runner_v2.GPUModelRunner)
    runner.model = ModelOnCPU()
    runner.vllm_config = runner.lora_config = runner.pooling_runner = None
    runner.encoder_cache = EncoderCache()
    worker.model_runner = runner
    worker.vllm_config = None
    core = EngineCoreOnCPU(worker)
    llm_engine = object.__new__(LLMEngine)
    llm_engine.engine_core = core
    llm_engine.renderer = RendererOnCPU()
    llm = LLMWithoutGPU(llm_engine, worker)
    engine = VLLMEngine("unused", llm=llm, tokenizer=ChatTemplate())
    return engine, llm, core, worker


def request(text: str) -> GenerateRequest:
    return GenerateRequest(
        messages=[{"role": "system", "content": [{"type": "text", "text": "you click"}]},
                  {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
        images=[Image.new("RGB", (8, 8), "white")],
        sampling=Sampling(temperature=1.0, top_p=1.0, max_new_tokens=4, seed=3),
    )


async def ask(engine, texts):
    return await asyncio.gather(*(engine.generate(request(t)) for t in texts))


def test_a_swap_reloads_by_name_resets_every_cache_and_relabels_the_answers(parts):
    engine, llm, core, worker = parts

    async def run():
        before = await ask(engine, ["a", "b", "c"])
        swap_s = await engine.swap_weights(1, B)
        after = await ask(engine, ["a", "b", "c"])  # the same prompts and image: cached under A
        await engine.close()
        return before, swap_s, after

    before, swap_s, after = asyncio.run(run())
    assert llm.batches == [3, 3]                        # one generate per batch, not per request
    assert [(g.token_ids, g.policy_version) for g in before] == [([1, 1], 0)] * 3
    assert [(g.token_ids, g.policy_version) for g in after] == [([2, 2], 1)] * 3
    assert core.calls == [f"rpc:{RELOAD}", "reset_prefix_cache", "reset_encoder_cache", "reset_mm_cache", "shutdown"]
    assert float(worker.get_model().bias) == 2.0 and engine.version == 1 and swap_s > 0
    assert llm.renderer.mm_cache == {}                   # the processor cache of the renderer too
    assert before[0].logprobs == [-0.5, -0.5] and before[0].prompt_token_ids == [7, 8]


def test_without_the_cache_resets_the_same_prompt_answers_with_the_old_weights(parts, monkeypatch):
    """What the resets guard: vLLM's caches outlive a weight reload of the prefix cache."""
    engine, _, _, worker = parts
    monkeypatch.setattr(engine, "reset_caches", lambda: None)

    async def run():
        await ask(engine, ["a"])
        await engine.swap_weights(1, B)
        (stale,) = await ask(engine, ["a"])
        await engine.close()
        return stale

    stale = asyncio.run(run())
    # the worker's reload cleared its encoder cache itself; the engine's prefix cache survived
    assert float(worker.get_model().bias) == 2.0 and stale.token_ids == [1, 2] and stale.policy_version == 1


def test_requests_queued_behind_a_swap_run_on_and_are_labelled_with_the_new_version(parts):
    engine, llm, _, _ = parts
    llm.gate = threading.Event()

    async def run():
        first = asyncio.gather(*(engine.generate(request(t)) for t in ("a", "b")))
        await asyncio.to_thread(llm.running.wait, 10)   # batch 1 is in generate, on A
        swap = asyncio.ensure_future(engine.swap_weights(1, B))
        while engine.newer_version_than(0) is None:   # the swap is queued on the inference thread
            await asyncio.sleep(0.01)
        second = asyncio.gather(*(engine.generate(request(t)) for t in ("a", "c")))
        await asyncio.sleep(0.05)
        llm.gate.set()
        got = await first, await swap, await second
        await engine.close()
        return got

    first, _, second = asyncio.run(run())
    assert llm.batches == [2, 2]
    assert [(g.token_ids, g.policy_version, g.newer_version_seen) for g in first] == [([1, 1], 0, 1)] * 2
    assert [(g.token_ids, g.policy_version) for g in second] == [([2, 2], 1)] * 2


def test_a_failed_swap_keeps_the_old_version_and_the_engine_serving(parts):
    engine, _, core, worker = parts

    async def run():
        with pytest.raises(AttributeError, match="no_such_tensor"):
            await engine.swap_weights(1, {"no_such_tensor": torch.zeros(1)})
        (answer,) = await ask(engine, ["a"])
        await engine.close()
        return answer

    answer = asyncio.run(run())
    assert engine.version == 0 and answer.policy_version == 0 and answer.token_ids == [1, 1]
    assert float(worker.get_model().bias) == 1.0
    # a reload that failed part way may have changed some layers: the caches are reset anyway
    assert core.calls == [f"rpc:{RELOAD}", "reset_prefix_cache", "reset_encoder_cache", "reset_mm_cache", "shutdown"]
