"""Every vLLM name, signature and argument dart uses, checked against the pinned vLLM on CPU
(runs in .venv-vllm: ``make contract-test``; skipped where vLLM is not installed). A rename or a
changed signature in a new vLLM fails here, not on a GPU machine."""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import typing

import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM contract runs in .venv-vllm (make contract-test)")

from PIL import Image  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.entrypoints.llm import LLM  # noqa: E402
from vllm.inputs import TextPrompt  # noqa: E402
from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from vllm.utils.import_utils import resolve_obj_by_qualname  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, run_method  # noqa: E402
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as ModelRunnerV2  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner as ModelRunnerV1  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

from dart.events import Sampling  # noqa: E402
from dart.rollout.engine import GenerateRequest, entropy_from_top_logprobs  # noqa: E402
from dart.rollout.vllm_engine import (  # noqa: E402
    LLM_DEFAULTS,
    TOP_LOGPROBS,
    VLLMEngineConfig,
    completion_fields,
    sampling_params,
    text_prompt,
)
from dart.rollout.vllm_worker import RELOAD, WORKER_EXTENSION, DartWorkerExtension  # noqa: E402


def smoke_kwargs() -> dict:
    """What benchmarks/gpu_smoke.py passes on top of LLM_DEFAULTS (the tiny model's and UI-TARS')."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_smoke.py"
    spec = importlib.util.spec_from_file_location("gpu_smoke_contract", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**module.TINY_VLLM, **module.UITARS_VLLM}


SMOKE_KWARGS = smoke_kwargs()
CONFIG_KWARGS = {**VLLMEngineConfig(max_model_len=4096, max_num_batched_tokens=8192).llm_kwargs(), "hf_overrides": {}}
"""What VLLMEngineConfig passes (every field set), and the M-RoPE overrides of dart's tiny models."""


def params(fn) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


def engine_arg_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(EngineArgs)}


def request(images: int = 1) -> GenerateRequest:
    return GenerateRequest(
        messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "click"}]}],
        images=[Image.new("RGB", (28, 28), "white") for _ in range(images)],
        sampling=Sampling(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=1234, frequency_penalty=0.1),
    )


class ChatTemplate:
    """The tokenizer's one method text_prompt uses."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "<chat>"


# --- the LLM constructor


def test_every_llm_argument_dart_passes_is_an_llm_or_engine_argument():
    named = params(LLM.__init__)
    fields = engine_arg_fields()
    assert "model" in named
    for key in {**LLM_DEFAULTS, **SMOKE_KWARGS, **CONFIG_KWARGS}:
        # LLM forwards **kwargs to EngineArgs, which raises TypeError on an unknown one
        assert key in named or key in fields, f"vllm.LLM takes no argument {key!r}"


def test_the_engine_arguments_take_darts_values():
    args = EngineArgs(model="unused", **{k: v for k, v in {**LLM_DEFAULTS, **SMOKE_KWARGS}.items()
                                          if k in engine_arg_fields()})
    assert args.worker_extension_cls == WORKER_EXTENSION
    assert args.logprobs_mode == "raw_logprobs" and args.enable_prefix_caching is True
    from vllm.config.model import LogprobsMode, ModelConfig

    assert LLM_DEFAULTS["logprobs_mode"] in typing.get_args(LogprobsMode)
    # vLLM refuses more top log-probs per token than max_logprobs (its default unless dart sets it)
    max_logprobs = {f.name: f for f in dataclasses.fields(ModelConfig)}["max_logprobs"].default
    assert 0 < TOP_LOGPROBS <= getattr(max_logprobs, "default", max_logprobs)


def test_the_worker_extension_resolves_and_does_not_clash_with_vllms_worker():
    ext = resolve_obj_by_qualname(WORKER_EXTENSION)
    assert ext is DartWorkerExtension
    # what vLLM asserts when it mixes the extension into its Worker
    own = [a for a in dir(ext) if not a.startswith("__")]
    assert RELOAD in own and not [a for a in own if hasattr(Worker, a)]


# --- requests and outputs


def test_sampling_params_take_every_field_dart_sets():
    req = request()
    sp = sampling_params(vllm, req)
    assert isinstance(sp, vllm.SamplingParams)
    s = req.sampling
    assert (sp.temperature, sp.top_p, sp.max_tokens, sp.seed, sp.frequency_penalty, sp.logprobs) == (
        s.temperature, s.top_p, s.max_new_tokens, s.seed, s.frequency_penalty, TOP_LOGPROBS)


def test_the_prompt_is_a_text_prompt_with_the_images_as_multi_modal_data():
    prompt = text_prompt(ChatTemplate(), request(images=2))
    keys = TextPrompt.__required_keys__ | TextPrompt.__optional_keys__
    assert set(prompt) <= keys and TextPrompt.__required_keys__ <= set(prompt)
    from vllm.inputs.llm import MultiModalDataBuiltins

    assert set(prompt["multi_modal_data"]) <= set(MultiModalDataBuiltins.__annotations__)
    assert len(prompt["multi_modal_data"]["image"]) == 2
    assert "multi_modal_data" not in text_prompt(ChatTemplate(), request(images=0))


def test_generate_takes_a_batch_of_prompts_with_a_sampling_params_each():
    p = params(LLM.generate)
    assert list(p)[:3] == ["self", "prompts", "sampling_params"]
    assert p["use_tqdm"].kind is inspect.Parameter.KEYWORD_ONLY
    ann = p["sampling_params"].annotation
    assert vllm.SamplingParams in typing.get_args(ann)
    assert any(typing.get_origin(a) is collections.abc.Sequence and typing.get_args(a) == (vllm.SamplingParams,)
               for a in typing.get_args(ann))


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "FlatLogprobs"])
def test_the_logprobs_of_a_real_request_output_become_logprobs_and_entropies(flat):
    """vLLM's per-token container (a list of dicts or FlatLogprobs, filled by its own helper):
    the sampled token's log-prob, and the entropy bound from the sampled token + the top-k."""
    tops = create_sample_logprobs(flat)
    sampled = [5, 9]
    # vLLM's layout per position: the sampled token (with its rank), then the top-k by rank; the
    # sampled token 5 is the top-1 at the first position, the sampled 9 is 2nd at the second
    positions = [([5, 5, 9], [-0.1, -0.1, -2.5], 1), ([9, 4, 9], [-1.2, -0.5, -1.2], 2)]
    for ids, row, rank in positions:
        append_logprobs_for_next_position(tops, ids, row, [None] * 3, rank=rank, num_logprobs=2)
    out = RequestOutput(
        request_id="r", prompt="p", prompt_token_ids=[1, 2, 3], prompt_logprobs=None,
        outputs=[CompletionOutput(index=0, text="ab", token_ids=sampled, cumulative_logprob=None,
                                  logprobs=tops, finish_reason="length")],
        finished=True,
    )
    got = completion_fields(out)
    assert got["token_ids"] == sampled and got["prompt_token_ids"] == [1, 2, 3]
    assert got["logprobs"] == pytest.approx([-0.1, -1.2])
    assert got["entropies"] == pytest.approx([entropy_from_top_logprobs([-0.1, -2.5]),
                                              entropy_from_top_logprobs([-1.2, -0.5])])
    assert [len(t) for t in tops] == [2, 2]  # the sampled token counted once
    assert got["finish_reason"] == "length"


# --- weight swaps and cache resets


def test_the_swap_rpc_is_a_method_name_that_crosses_vllms_msgpack_rpc():
    """vLLM's engine core runs in another process and serialises RPCs with msgpack: a method
    name crosses, a Python function (what dart used to send) does not."""
    enc, dec = MsgpackEncoder(), MsgpackDecoder()
    method, args = dec.decode(enc.encode((RELOAD, ("/tmp/model.safetensors",))))
    assert (method, tuple(args)) == (RELOAD, ("/tmp/model.safetensors",))

    def load(worker, path):
        return 0

    with pytest.raises(TypeError, match="not serializable"):
        enc.encode((load, ("/tmp/model.safetensors",)))


def test_collective_rpc_takes_a_method_name_and_args():
    p = params(LLM.collective_rpc)
    assert list(p)[1:] == ["method", "timeout", "args", "kwargs"] and "str" in str(p["method"].annotation)
    assert params(LLMEngine.collective_rpc).keys() == p.keys()

    class W(DartWorkerExtension):
        def reload_weights(self, *, weights_iterator):
            self.loaded = dict(weights_iterator)

    # vLLM's worker-side dispatch by name (run_method), with a file the extension reads
    import tempfile

    import torch
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        save_file({"w": torch.ones(2)}, f"{tmp}/m.safetensors")
        w = W()
        assert run_method(w, RELOAD, (f"{tmp}/m.safetensors",), {}) == 1
    assert torch.equal(w.loaded["w"], torch.ones(2))


def test_the_workers_reload_weights_from_an_iterator_and_reset_their_caches():
    for runner in (ModelRunnerV1, ModelRunnerV2):
        p = params(runner.reload_weights)
        assert {"weights_iterator", "weights_path", "is_checkpoint_format"} <= p.keys(), runner
        src = inspect.getsource(runner.reload_weights)
        # vLLM's own reload clears the worker-side caches; if a version stops, dart must
        assert "reset_encoder_cache()" in src and "reset_mm_cache()" in src, runner
    for name in ("reload_weights", "get_model", "reset_encoder_cache", "reset_mm_cache"):
        assert callable(getattr(Worker, name, None)), f"vLLM's Worker has no {name}"
    assert "get_model" in dir(ModelRunnerV2) and "get_model" in dir(ModelRunnerV1)


def test_the_engine_side_cache_resets_exist_with_the_signatures_dart_calls():
    assert inspect.signature(LLM.reset_prefix_cache).return_annotation in (bool, "bool")
    assert all(p.default is not inspect.Parameter.empty for n, p in params(LLM.reset_prefix_cache).items()
               if n != "self")
    assert list(params(LLM.reset_mm_cache)) == ["self"]
    assert list(params(LLMEngine.reset_encoder_cache)) == ["self"]
    # close() shuts the engine core down through the client LLMEngine holds as engine_core
    from vllm.v1.engine.core_client import EngineCoreClient

    assert "self.engine_core = " in inspect.getsource(LLMEngine.__init__)
    assert all(p.default is not inspect.Parameter.empty for n, p in params(EngineCoreClient.shutdown).items()
               if n != "self")
    assert "self.llm_engine = " in inspect.getsource(LLM.__init__)


def test_the_engine_constructs_vllms_llm_up_to_the_gpu_with_every_argument(monkeypatch):
    """dart's own constructor call through the real ``vllm.LLM.__init__`` and ``EngineArgs``; it
    stops where vLLM would start the engine core on a GPU."""
    from dart.rollout.vllm_engine import VLLMEngine

    seen = {}

    class StopBeforeTheGPU(Exception):
        pass

    def from_engine_args(cls, engine_args, usage_context=None, **kwargs):
        seen["args"] = engine_args
        raise StopBeforeTheGPU

    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(from_engine_args))
    with pytest.raises(StopBeforeTheGPU):
        VLLMEngine("/models/ui-tars", **smoke_kwargs())
    args = seen["args"]
    assert isinstance(args, EngineArgs) and args.model == "/models/ui-tars"
    assert args.worker_extension_cls == WORKER_EXTENSION and args.logprobs_mode == "raw_logprobs"
    assert args.limit_mm_per_prompt == {"image": 8} and args.enable_prefix_caching is True
    assert (args.dtype, args.max_model_len) == (SMOKE_KWARGS["dtype"], SMOKE_KWARGS["max_model_len"])
