"""Warm start: NLL on experience trajectories lowers their loss and yields a loadable policy v0."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from dart.agent.model import load_policy
from dart.agent.weight_format import check_state_dict, state_dict_from_bytes
from dart.blobs import LocalBlobStore
from dart.bus import read_topic
from dart.errors import DecodeError
from dart.train.__main__ import main
from dart.train.sft import epoch_chunks, load_sft_data
from tests.train.conftest import make_manifest


@pytest.mark.kafka
async def test_sft_lowers_the_nll_writes_a_policy_and_publishes_version_0(bus, tiny_dir, tiny_policy,
                                                                          tmp_path, capsys) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    manifest = make_manifest(store, tiny_policy, seq=0, groups=1, per_group=2, steps=2)
    experience = tmp_path / "experience.jsonl"
    experience.write_text("".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in manifest.samples))
    assert load_sft_data(experience).samples == manifest.samples
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({"train": {"worker_id": "sft", "engine": {"threads": 1},
                                            "prompt": {"min_pixels": 3136, "max_pixels": 3136, "max_images": 2}}}))
    out = tmp_path / "warm"
    # main() runs its own event loop to publish: call it from a thread, as the CLI would run it.
    rc = await asyncio.to_thread(main, [str(config), "--sft", str(experience), "--model", str(tiny_dir),
                                        "--out", str(out), "--epochs", "3", "--lr", "3e-3", "--blobs",
                                        str(store.root), "--publish", "--bootstrap", bus.bootstrap,
                                        "--prefix", bus.prefix])
    assert rc == 0
    printed = capsys.readouterr().out
    losses = [float(x) for x in printed.split("nll by epoch ")[1].split(";")[0].split(", ")]
    assert len(losses) == 3 and losses[2] < losses[0] - 0.1

    warm = load_policy(out)  # the RL trainer's `model:` and the rollout workers' loader
    (event,) = [d.event async for d in read_topic(bus, bus.topics.weights)]
    assert (event.version, event.parent_version, event.producer) == (0, -1, "sft")
    state = state_dict_from_bytes(store.get(event.blobs[0].digest))
    check_state_dict(warm.model, state)
    base = tiny_policy.model.state_dict()
    assert any(float((state[k] - base[k]).abs().max()) > 1e-4 for k in base)


def test_sft_data_that_is_neither_manifest_nor_samples_is_refused(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"nope": 1}]')
    with pytest.raises(DecodeError, match="neither a batch manifest"):
        load_sft_data(bad)



def test_sft_micro_batches_are_fresh_chunks_of_every_epoch_shuffle() -> None:
    import random

    rng = random.Random(0)
    first, second = epoch_chunks(10, 4, rng), epoch_chunks(10, 4, rng)
    for chunks in (first, second):
        assert [len(c) for c in chunks] == [4, 4, 2]
        assert sorted(i for c in chunks for i in c) == list(range(10))  # every sample once per epoch
    assert {frozenset(c) for c in first} != {frozenset(c) for c in second}  # new company every epoch
    assert epoch_chunks(10, 4, random.Random(0)) == first  # seeded


def test_the_sft_loop_takes_its_steps_over_fresh_shuffles_and_stops(tiny_dir, tmp_path) -> None:
    """The one SFT loop (``--sft``, the warm start, the SFT probe) on the tiny policy: 5 samples in
    micro-batches of 2, short last chunks kept or left out, exactly ``steps`` optimiser steps."""
    import random

    from dart.agent.prompt import blob_image_loader
    from dart.train.batch import prepare_samples
    from dart.train.config import EngineConfig, OptimConfig
    from dart.train.engine import TorchEngine
    from dart.train.sft import sft_loop
    from tests.train.conftest import SMALL

    store = LocalBlobStore(tmp_path / "blobs")
    policy = load_policy(tiny_dir)
    manifest = make_manifest(store, policy, seq=0, groups=1, per_group=5, steps=1)
    samples, dropped = prepare_samples(manifest, tokenizer=policy.tokenizer, image_processor=policy.image_processor,
                                       load_image=blob_image_loader(store), prompt_cfg=SMALL, check_hash=True,
                                       advantages=False)
    assert len(samples) == 5 and not dropped
    engine = TorchEngine(policy.model, OptimConfig(lr=1e-3, weight_decay=0.0), EngineConfig(threads=1))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    kept = list(sft_loop(engine, samples, policy.pad_token_id, micro_batch=2, steps=4, rng=random.Random(0)))
    assert [n for n, _ in kept] == [2, 2, 1, 2]  # a pass of 5 is 2 + 2 + 1, then the next pass
    whole = list(sft_loop(engine, samples, policy.pad_token_id, micro_batch=2, steps=4, rng=random.Random(0),
                          whole_only=True))
    assert [n for n, _ in whole] == [2, 2, 2, 2] and all(loss > 0 for _, loss in kept + whole)
    after = policy.model.state_dict()
    assert any(float((after[k] - before[k]).abs().max()) > 0 for k in before)  # 8 steps were taken
