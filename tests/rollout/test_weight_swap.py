from __future__ import annotations

import asyncio
import dataclasses
import logging

from dart.agent.model import load_policy
from dart.agent.tiny import build_tiny
from dart.agent.weight_format import WEIGHTS_FILE, state_dict_to_bytes, weights_sha256
from dart.events import BlobRef, WeightsLoaded, WeightsPublished
from dart.rollout.hf_engine import HFEngine
from dart.rollout.weight_swap import WeightFollower


def publish(store, version: int, data: bytes) -> WeightsPublished:
    digest = store.put(data)
    blobs = [BlobRef(name=WEIGHTS_FILE, digest=digest, size_bytes=len(data))]
    return WeightsPublished.new(
        run_id="t",
        producer="trainer",
        version=version,
        parent_version=version - 1,
        blobs=blobs,
        sha256=weights_sha256(blobs),
        train_step=version,
    )


def follower_for(engine, store):
    sent: list = []

    async def send(event):
        sent.append(event)

    return WeightFollower(engine, store, worker_id="w1", run_id="t", send=send), sent


async def test_follower_applies_only_the_newest_version(tiny_dir, store, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dart.rollout.weight_swap")
    engine = HFEngine(load_policy(tiny_dir))
    blob = state_dict_to_bytes(load_policy(build_tiny(tmp_path / "s1", seed=1)).model)
    follower, sent = follower_for(engine, store)
    for v in (1, 2, 3):  # a replay of the topic from the beginning
        follower.offer(publish(store, v, blob))
    runner = asyncio.create_task(follower.run())
    for _ in range(200):
        if sent:
            break
        await asyncio.sleep(0.02)
    runner.cancel()
    await engine.close()
    assert [(e.version, e.previous_version, e.ok) for e in sent] == [(3, 0, True)]
    assert isinstance(sent[0], WeightsLoaded) and sent[0].worker_id == "w1" and sent[0].swap_s >= 0
    assert engine.version == 3
    # the swap is said in words (the line's arguments once came in the wrong order: a logging error)
    (line,) = [r.getMessage() for r in caplog.records if "serves version" in r.getMessage()]
    assert line.startswith("worker w1 serves version 3 (was 0): fetch ") and "s (blobs), swap " in line


async def test_corrupt_version_is_refused_and_old_one_kept(tiny_dir, store):
    engine = HFEngine(load_policy(tiny_dir))
    follower, sent = follower_for(engine, store)
    good = state_dict_to_bytes(engine.policy.model)
    event = publish(store, 1, good)
    # flip bytes on disk: the store's sha256 check must catch it
    path = store.local_path(event.blobs[0].digest, verify=False)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    refused = await follower.apply(event)
    not_safetensors = await follower.apply(publish(store, 2, b"not a safetensors file"))
    await engine.close()
    assert not refused.ok and "BlobCorrupted" in refused.error
    assert not not_safetensors.ok and "safetensors" in not_safetensors.error
    assert engine.version == 0 and engine.newer_version_than(0) is None
    assert [e.ok for e in sent] == [False, False]


async def test_version_digest_mismatch_is_refused(tiny_dir, store):
    engine = HFEngine(load_policy(tiny_dir))
    follower, _ = follower_for(engine, store)
    event = publish(store, 1, state_dict_to_bytes(engine.policy.model))
    forged = dataclasses.replace(event, sha256="0" * 64)
    outcome = await follower.apply(forged)
    await engine.close()
    assert not outcome.ok and "does not match" in outcome.error and engine.version == 0


async def test_follower_survives_any_error_from_a_swap_and_takes_the_next_version(tiny_dir, store, tmp_path):
    """vLLM's RPC raised TypeError for a pickled function; whatever a swap raises, the follower
    task lives on, the old version keeps serving, and the next published version is tried."""
    engine = HFEngine(load_policy(tiny_dir))
    real_swap = engine.swap_weights
    calls: list[int] = []

    async def swap_failing_once(version, state):
        calls.append(version)
        if len(calls) == 1:
            raise TypeError("Object of type <class 'function'> is not serializable")
        return await real_swap(version, state)

    engine.swap_weights = swap_failing_once
    blob = state_dict_to_bytes(load_policy(build_tiny(tmp_path / "s1", seed=1)).model)
    follower, sent = follower_for(engine, store)
    runner = asyncio.create_task(follower.run())
    follower.offer(publish(store, 1, blob))
    for _ in range(200):
        if sent:
            break
        await asyncio.sleep(0.02)
    assert not runner.done() and engine.version == 0
    follower.offer(publish(store, 2, blob))
    for _ in range(200):
        if len(sent) == 2:
            break
        await asyncio.sleep(0.02)
    runner.cancel()
    await engine.close()
    assert [(e.version, e.ok) for e in sent] == [(1, False), (2, True)]
    assert "TypeError" in sent[0].error and engine.version == 2 and calls == [1, 2]
