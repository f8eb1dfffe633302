from __future__ import annotations

import asyncio
import dataclasses
import math
import threading

import pytest
import torch

from dart.agent.model import load_policy, score_response
from dart.agent.prompt import blob_image_loader, build_messages, encode_prompt
from dart.agent.weight_format import state_dict_to_bytes
from dart.errors import BlobCorrupted
from dart.events import Sampling
from dart.rollout.engine import (
    EngineError,
    GenerateRequest,
    draw_token,
    entropy_from_top_logprobs,
    sampling_probs,
)
from dart.rollout.hf_engine import HFEngine, HFEngineConfig
from tests.agent.screens import SMALL, context


def request(
    store, *, steps=1, seed=1, max_new_tokens=16, temperature=1.0, top_p=1.0, instruction="Open the file"
):
    messages, images = build_messages(
        context(store, steps=steps, instruction=instruction), blob_image_loader(store), SMALL
    )
    sampling = Sampling(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    return GenerateRequest(messages=messages, images=images, sampling=sampling)


def test_top_p_keeps_the_nucleus_only():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = sampling_probs(logits, temperature=1.0, top_p=0.8)
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    assert sampling_probs(logits, 1.0, 0.1).tolist() == pytest.approx([1.0, 0, 0, 0])


def test_greedy_and_frequency_penalty():
    logits = torch.tensor([2.0, 1.5, 0.0])
    greedy = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=1, seed=0)
    assert draw_token(logits, greedy, [], None) == 0
    penalised = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=1, seed=0, frequency_penalty=1.0)
    assert draw_token(logits, penalised, [0], None) == 1


def test_entropy_from_top_logprobs_is_exact_on_full_support():
    p = [0.5, 0.25, 0.25]
    assert entropy_from_top_logprobs([math.log(x) for x in p]) == pytest.approx(
        -sum(x * math.log(x) for x in p)
    )


async def test_hf_logprobs_and_entropies_match_rescoring_in_a_micro_batch(policy, store):
    engine = HFEngine(policy, HFEngineConfig(max_batch_size=8))
    reqs = [
        request(store, steps=0, seed=1, max_new_tokens=8),
        request(
            store, steps=2, seed=2, max_new_tokens=16, top_p=0.9, instruction="a longer instruction here"
        ),
        request(store, steps=1, seed=3, max_new_tokens=12, temperature=0.7),
    ]
    try:
        gens = await asyncio.gather(*(engine.generate(r) for r in reqs))
    finally:
        await engine.close()
    assert engine.stats().batches == 1  # concurrent requests ran as one micro-batch
    for req, gen in zip(reqs, gens, strict=True):
        inputs = encode_prompt(policy.tokenizer, policy.image_processor, req.messages, req.images)
        assert gen.prompt_token_ids == inputs.token_ids()
        logprobs, entropies = score_response(policy.model, inputs, gen.token_ids)
        assert len(gen.token_ids) == len(gen.logprobs) == len(gen.entropies) > 0
        assert max(abs(a - b) for a, b in zip(logprobs, gen.logprobs, strict=True)) < 1e-4
        assert max(abs(a - b) for a, b in zip(entropies, gen.entropies, strict=True)) < 1e-4
        assert len(gen.token_ids) <= req.sampling.max_new_tokens
        assert gen.finish_reason in ("stop", "length")
        if gen.finish_reason == "length":
            assert len(gen.token_ids) == req.sampling.max_new_tokens
        assert gen.policy_version == 0 and gen.newer_version_seen is None


async def test_same_seed_same_tokens_alone_or_batched(policy, store):
    engine = HFEngine(policy, HFEngineConfig(max_batch_size=4))
    try:
        alone = await engine.generate(request(store, seed=7))
        batched = await asyncio.gather(
            engine.generate(request(store, seed=7)), engine.generate(request(store, seed=8))
        )
    finally:
        await engine.close()
    assert alone.token_ids == batched[0].token_ids
    assert batched[0].token_ids != batched[1].token_ids


async def test_each_turn_of_a_trajectory_draws_its_own_random_numbers(policy, store):
    """The env worker asks each turn under ``Sampling.at_step``: one seed for every turn would make
    an engine repeat its draws, so a trajectory would be one sample repeated, not one per turn."""
    base = request(store, seed=11)
    engine = HFEngine(policy, HFEngineConfig(max_batch_size=4))
    try:
        one_seed = [await engine.generate(base) for _ in range(3)]
        per_turn = [await engine.generate(dataclasses.replace(base, sampling=base.sampling.at_step(i)))
                    for i in range(3)]
    finally:
        await engine.close()
    assert len({tuple(g.token_ids) for g in one_seed}) == 1
    assert len({tuple(g.token_ids) for g in per_turn}) == 3
    seeds = [base.sampling.at_step(i).seed for i in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**31 for s in seeds)
    assert seeds[:3] == [base.sampling.at_step(i).seed for i in range(3)]  # a replay draws the same
    assert Sampling(temperature=1.0, top_p=1.0, max_new_tokens=1, seed=12).at_step(0).seed != seeds[0]


async def test_bad_prompt_fails_its_request_only(policy, store):
    engine = HFEngine(policy)
    good = request(store)
    bad = GenerateRequest(
        messages=good.messages, images=[], sampling=good.sampling
    )  # image slots without images
    try:
        results = await asyncio.gather(engine.generate(bad), engine.generate(good), return_exceptions=True)
    finally:
        await engine.close()
    assert isinstance(results[0], EngineError)
    assert len(results[1].token_ids) > 0


async def test_weight_swap_mid_stream_fails_nothing_and_stamps_versions(tiny_dir, store, tmp_path):
    from dart.agent.tiny import build_tiny
    from dart.agent.weight_format import state_dict_from_bytes

    own = load_policy(tiny_dir)  # a private copy: this test changes its weights
    other = state_dict_from_bytes(state_dict_to_bytes(load_policy(build_tiny(tmp_path / "v1", seed=1)).model))
    engine = HFEngine(own, HFEngineConfig(max_batch_size=2))
    req = request(store, max_new_tokens=16)
    # The first batch is held inside its generate call until the newer version has been seen
    # (a fixed 50 ms sleep raced a batch that had already finished).
    gate, run_batch = threading.Event(), engine._run_batch
    engine._run_batch = lambda batch: (gate.wait(30), run_batch(batch))[1]
    try:
        first = [asyncio.create_task(engine.generate(req)) for _ in range(2)]
        while not engine._lock.locked():  # the first batch is running
            await asyncio.sleep(0.005)
        engine.note_version_seen(1)
        swap = asyncio.create_task(engine.swap_weights(1, other))
        later = [asyncio.create_task(engine.generate(req)) for _ in range(3)]
        gate.set()
        before = await asyncio.gather(*first)
        swap_s = await swap
        after = await asyncio.gather(*later)
    finally:
        await engine.close()
    assert swap_s >= 0 and engine.version == 1
    assert [g.policy_version for g in before] == [0, 0]
    assert [g.newer_version_seen for g in before] == [1, 1]
    assert [g.policy_version for g in after] == [1, 1, 1]
    assert all(g.newer_version_seen is None for g in after)
    # the new tokens are scored by the new weights
    inputs = encode_prompt(own.tokenizer, own.image_processor, req.messages, req.images)
    logprobs, _ = score_response(own.model, inputs, after[0].token_ids)
    assert max(abs(a - b) for a, b in zip(logprobs, after[0].logprobs, strict=True)) < 1e-4


async def test_swap_refuses_weights_that_do_not_fit(tiny_dir):
    engine = HFEngine(load_policy(tiny_dir))
    state = dict(engine.policy.model.state_dict())
    name = next(iter(state))
    state[name] = torch.zeros(3)
    with pytest.raises(BlobCorrupted):
        await engine.swap_weights(1, state)
    await engine.close()
    assert engine.version == 0
