"""The trainer on the tiny Qwen2.5-VL: updates, dropped samples, checkpoints, published weights."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import pytest
import torch

from dart.agent.model import load_policy
from dart.agent.weight_format import check_state_dict, state_dict_from_bytes, weights_sha256
from dart.blobs import LocalBlobStore
from dart.errors import ConfigError
from dart.events.manifest import BatchManifest
from dart.train.batch import collate, micro_batches, prepare_samples
from dart.train.checkpoint import checkpoints, is_full, read_state
from dart.train.config import EngineConfig, OptimConfig, TrainerConfig
from dart.train.engine import ResponseScorer
from dart.train.loss import LossConfig
from dart.train.master_weights import LOW, SplitMasterAdamW
from dart.train.trainer import Trainer
from dart.train.weight_publish import put_weights
from tests.train.conftest import SMALL, make_manifest


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> LocalBlobStore:
    return LocalBlobStore(tmp_path_factory.mktemp("blobs"))


@pytest.fixture(scope="module")
def batch(store, tiny_policy) -> BatchManifest:
    return make_manifest(store, tiny_policy, seq=0, groups=2, per_group=3, steps=2)


def config(tiny_dir: Path, store: LocalBlobStore, ckpt: Path, **overrides) -> TrainerConfig:
    base = TrainerConfig(model=tiny_dir, checkpoint_dir=ckpt, blobs=str(store.root), prompt=SMALL,
                         optim=OptimConfig(lr=2e-3), engine=EngineConfig(micro_batch_samples=4, threads=1))
    return dataclasses.replace(base, **overrides)


def sample_logps(model, batch: BatchManifest, store, policy) -> torch.Tensor:
    """Mean response log-prob of every sample under ``model``."""
    samples, _ = prepare_samples(batch, tokenizer=policy.tokenizer, image_processor=policy.image_processor,
                                 load_image=store.get, prompt_cfg=SMALL)
    mb = collate(samples, torch.ones(len(samples), dtype=torch.bool), pad_id=policy.pad_token_id)
    with torch.no_grad():
        logp, _ = ResponseScorer(model)(**mb.model_inputs())
    return (logp * mb.mask_B_T).sum(-1) / mb.mask_B_T.sum(-1)


def test_batched_scoring_with_padding_equals_one_sample_at_a_time(batch, store, tiny_policy) -> None:
    samples, dropped = prepare_samples(batch, tokenizer=tiny_policy.tokenizer,
                                       image_processor=tiny_policy.image_processor, load_image=store.get,
                                       prompt_cfg=SMALL)
    assert not dropped and len(samples) == 12
    scorer = ResponseScorer(tiny_policy.model)
    keep = torch.ones(len(samples), dtype=torch.bool)
    together = collate(samples, keep, pad_id=tiny_policy.pad_token_id)
    assert len(set(together.attention_mask_B_L.sum(-1).tolist())) > 1  # really padded
    with torch.no_grad():
        logp_all, _ = scorer(**together.model_inputs())
        for i, sample in enumerate(samples):
            logp_one, _ = scorer(**collate([sample], keep[i : i + 1], pad_id=tiny_policy.pad_token_id).model_inputs())
            n = len(samples[i].response_token_ids)
            torch.testing.assert_close(logp_all[i, :n], logp_one[0], atol=2e-5, rtol=0)
    # The rollout log-probs were the model's own, perturbed by N(0, 0.05): the trainer sees them.
    gap = (logp_all - together.rollout_logprobs_B_T).abs() * together.mask_B_T
    assert 0.0 < float(gap.sum() / together.mask_B_T.sum()) < 0.2


def test_updates_on_a_fixed_batch_raise_good_and_lower_bad_responses(tiny_dir, store, batch, tiny_policy,
                                                                     tmp_path) -> None:
    cfg = config(tiny_dir, store, tmp_path / "ckpt", loss=LossConfig(kl_coef=0.0))
    trainer = Trainer(cfg, store)
    adv = trainer.prepare(batch).adv_B
    before = sample_logps(trainer.engine.policy, batch, store, tiny_policy)
    objective = []
    for _ in range(4):
        report = trainer.update(trainer.prepare(batch))
        assert report is not None and report.metrics["samples/kept"] == 12
        objective.append(float(-(adv * sample_logps(trainer.engine.policy, batch, store, tiny_policy)).mean()))
    after = sample_logps(trainer.engine.policy, batch, store, tiny_policy)
    # The surrogate -mean(A * logp) falls with every update ...
    assert objective == sorted(objective, reverse=True) and objective[-1] < objective[0] - 0.02
    # ... because positive-advantage responses gain probability and negative ones lose it.
    assert float(((after - before) * adv.sign()).mean()) > 0.02
    assert report.step == 4 and report.policy_version == 4 and report.num_tokens == 78


def test_prompt_mismatches_and_broken_samples_are_dropped_counted_and_never_crash(
        tiny_dir, store, batch, tmp_path) -> None:
    s = batch.samples
    bad = [dataclasses.replace(s[0], prompt_hash="0" * 64),
           dataclasses.replace(s[1], context=dataclasses.replace(s[1].context, screenshot_digest="f" * 64)),
           dataclasses.replace(s[2], rollout_logprobs=s[2].rollout_logprobs[:-1])]
    manifest = dataclasses.replace(batch, samples=bad + s[3:])
    trainer = Trainer(config(tiny_dir, store, tmp_path / "ckpt"), store)
    prepared = trainer.prepare(manifest)
    assert [(d.rollout_id, d.step_index, d.reason) for d in prepared.dropped] == [
        (s[0].rollout_id, 0, "prompt_hash"), (s[1].rollout_id, 1, "unreadable"), (s[2].rollout_id, 0, "ragged")]
    report = trainer.update(prepared)
    assert report is not None
    m = report.metrics
    assert (m["samples/dropped_prompt_hash"], m["samples/dropped_unreadable"], m["samples/dropped_ragged"]) == (1, 1, 1)
    assert m["samples/kept"] == 9 and report.num_samples == 9
    # A batch whose every sample is broken is consumed without an update.
    nothing = dataclasses.replace(batch, seq=1, batch_id="b1",
                                  samples=[dataclasses.replace(x, prompt_hash="0" * 64) for x in s])
    assert trainer.update(trainer.prepare(nothing)) is None
    assert (trainer.state.step, trainer.state.seq) == (1, 1)


def test_published_weights_load_into_an_hf_model_and_change_its_outputs(tiny_dir, store, batch, tiny_policy,
                                                                      tmp_path) -> None:
    trainer = Trainer(config(tiny_dir, store, tmp_path / "ckpt"), store)
    v0 = trainer.publish()
    assert (v0.version, v0.parent_version, v0.train_step) == (0, -1, 0)
    trainer.update(trainer.prepare(batch))
    trainer.checkpoint()
    v1 = trainer.publish()
    assert (v1.version, v1.parent_version, v1.train_step, v1.batch_id) == (1, 0, 1, batch.batch_id)
    assert [b.name for b in v1.blobs] == ["model.safetensors", "config.json"]
    assert v1.sha256 == weights_sha256(list(reversed(v1.blobs))) != v0.sha256

    fresh = load_policy(tiny_dir)
    state = state_dict_from_bytes(store.get(v1.blobs[0].digest))
    check_state_dict(fresh.model, state)
    before = sample_logps(fresh.model, batch, store, tiny_policy)
    fresh.model.load_state_dict(state, strict=True)
    after = sample_logps(fresh.model, batch, store, tiny_policy)
    assert float((after - before).abs().max()) > 1e-3
    torch.testing.assert_close(after, sample_logps(trainer.engine.policy, batch, store, tiny_policy))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_restarted_trainer_resumes_weights_optimizer_and_position(tiny_dir, store, batch, tmp_path, dtype) -> None:
    cfg = config(tiny_dir, store, tmp_path / "ckpt", keep_checkpoints=2,
                 engine=EngineConfig(micro_batch_samples=4, threads=1, dtype=dtype))
    first = Trainer(cfg, store)
    for seq in range(3):
        first.update(first.prepare(dataclasses.replace(batch, seq=seq, batch_id=f"b{seq}")))
        first.checkpoint()
    assert [p.name for p in checkpoints(cfg.checkpoint_dir)] == ["step-00000002", "step-00000003"]
    assert (cfg.checkpoint_dir / "latest").read_text().strip() == "step-00000003"
    assert read_state(cfg.checkpoint_dir / "step-00000003").seq == 2
    second = Trainer(cfg, store)
    assert second.state == first.state
    assert_same_training_state(first, second)
    # One more update from each gives the same weights: the optimiser moments came back too.
    nxt = dataclasses.replace(batch, seq=3, batch_id="b3")
    first.update(first.prepare(nxt))
    second.update(second.prepare(nxt))
    for name, value in first.engine.policy.state_dict().items():
        torch.testing.assert_close(value, second.engine.policy.state_dict()[name], atol=1e-6, rtol=0)


def assert_same_training_state(first: Trainer, second: Trainer) -> None:
    """Equal weights, and in bfloat16 equal float32 masters (each weight's low 16 bits came back
    with the optimiser state, exactly)."""
    for name, value in first.engine.policy.state_dict().items():
        assert torch.equal(value, second.engine.policy.state_dict()[name]), name
    optimizer = first.engine.optimizer
    if isinstance(optimizer, SplitMasterAdamW):
        params = dict(second.engine.policy.named_parameters())
        for name, p in first.engine.policy.named_parameters():
            master = optimizer.master(p)
            assert torch.equal(master, second.engine.optimizer.master(params[name])), name
            if p.grad is None and LOW in optimizer.state.get(p, {}):
                assert not torch.equal(master, p.detach().float()), f"{name}: no low bits to restore"


def test_between_full_checkpoints_a_restart_resumes_from_the_last_full_one_and_trains_the_rest_again(
        tiny_dir, store, batch, tmp_path) -> None:
    cfg = config(tiny_dir, store, tmp_path / "ckpt", keep_checkpoints=2, full_checkpoint_every=2,
                 keep_full_checkpoints=1)
    root = cfg.checkpoint_dir
    batches = [dataclasses.replace(batch, seq=seq, batch_id=f"b{seq}") for seq in range(4)]
    first = Trainer(cfg, store)
    layouts = []
    for b in batches[:3]:
        first.update(first.prepare(b))
        first.checkpoint()
        layouts.append([(p.name, is_full(p)) for p in checkpoints(root)])
        assert first.durable == is_full(first.last_checkpoint)
    # Step 0 and 2 full, 1 and 3 weights only; the newest two kept, and the newest full one.
    assert layouts == [[("step-00000000", True), ("step-00000001", False)],
                       [("step-00000001", False), ("step-00000002", True)],
                       [("step-00000002", True), ("step-00000003", False)]]
    weights_only = root / "step-00000003"
    assert sorted(p.name for p in weights_only.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors",
                                                               "model.safetensors.chunks", "state.json"]
    v3 = first.publish()  # a version is published from its weights-only checkpoint
    assert v3.version == 3 and v3.sha256 == weights_sha256(put_weights(store, weights_only))

    # Killed here: the restart takes step 2 (after batch b1), drops step 3 and trains b2 again.
    second = Trainer(cfg, store)
    assert (second.state.step, second.state.seq) == (2, 1) and second.durable
    assert [p.name for p in checkpoints(root)] == ["step-00000002"]
    assert (root / "latest").read_text().strip() == "step-00000002"
    for b in batches[2:]:
        assert not second.already_consumed(b)
        second.update(second.prepare(b))
    first.update(first.prepare(batches[3]))
    assert second.state == first.state
    for name, value in first.engine.policy.state_dict().items():
        torch.testing.assert_close(value, second.engine.policy.state_dict()[name], atol=1e-6, rtol=0)

    # A clean stop leaves a full checkpoint at the last update: nothing to train again.
    second.checkpoint(full=False)
    assert not is_full(second.last_checkpoint) and not second.durable
    second.make_durable()
    assert is_full(second.last_checkpoint) and second.last_checkpoint.name == "step-00000004" and second.durable
    assert Trainer(cfg, store).state == second.state


def test_a_checkpoint_dir_with_only_weights_only_checkpoints_is_refused(tiny_dir, store, batch, tmp_path) -> None:
    cfg = config(tiny_dir, store, tmp_path / "ckpt", full_checkpoint_every=5)
    trainer = Trainer(cfg, store)
    trainer.update(trainer.prepare(batch))
    trainer.checkpoint()
    shutil.rmtree(cfg.checkpoint_dir / "step-00000000")
    with pytest.raises(ConfigError, match=r"train\.checkpoint_dir .* 1 weights-only checkpoints and no full one"):
        Trainer(cfg, store)


def test_micro_batches_group_similar_lengths_and_keep_each_sample_and_its_mask(batch, store, tiny_policy) -> None:
    samples, _ = prepare_samples(batch, tokenizer=tiny_policy.tokenizer, image_processor=tiny_policy.image_processor,
                                 load_image=store.get, prompt_cfg=SMALL)
    keep = torch.tensor([i % 3 != 0 for i in range(len(samples))])
    parts = micro_batches(samples, keep, size=5, pad_id=tiny_policy.pad_token_id)
    assert [p.adv_B.numel() for p in parts] == [5, 5, 2]
    lengths = [int(n) for p in parts for n in p.attention_mask_B_L.sum(-1)]
    assert lengths == sorted(lengths)
    # Every sample exactly once, with its own advantage and mask bit.
    seen = sorted((float(a), bool(k)) for p in parts for a, k in zip(p.adv_B, p.step_mask_B, strict=True))
    assert seen == sorted((s.advantage, bool(k)) for s, k in zip(samples, keep, strict=True))
    assert sum(p.num_tokens for p in parts) == sum(len(s.response_token_ids)
                                                   for s, k in zip(samples, keep, strict=True) if k)


def test_a_sampled_vision_placeholder_token_drops_that_step_not_the_batch(batch, store, tiny_policy) -> None:
    # A small policy sampling at temperature 1 can emit <|image_pad|>; fed back it would claim an
    # image slot with no image and fail the forward pass of the whole micro-batch.
    pad = tiny_policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    bad = dataclasses.replace(batch.samples[1], response_token_ids=[*batch.samples[1].response_token_ids[:-1], pad])
    manifest = dataclasses.replace(batch, samples=[batch.samples[0], bad, *batch.samples[2:]])
    samples, dropped = prepare_samples(manifest, tokenizer=tiny_policy.tokenizer,
                                       image_processor=tiny_policy.image_processor, load_image=store.get,
                                       prompt_cfg=SMALL)
    assert [(d.rollout_id, d.step_index, d.reason) for d in dropped] == [(bad.rollout_id, bad.step_index,
                                                                          "vision_token")]
    assert str(pad) in dropped[0].detail and len(samples) == len(batch.samples) - 1
    with torch.no_grad():  # the rest still scores
        ResponseScorer(tiny_policy.model)(**collate(samples, torch.ones(len(samples), dtype=torch.bool),
                                                    pad_id=tiny_policy.pad_token_id).model_inputs())


def test_micro_batches_spread_each_group_over_many_micro_batches(batch, store, tiny_policy) -> None:
    # A group's rollouts arrive together and have one length; PPO mini-batches of contiguous
    # samples would make each optimiser step about one task. Ties are broken by a hash instead.
    samples, _ = prepare_samples(batch, tokenizer=tiny_policy.tokenizer, image_processor=tiny_policy.image_processor,
                                 load_image=store.get, prompt_cfg=SMALL)
    one = samples[0]
    same_length = [dataclasses.replace(one, rollout_id=f"g{g}:r{r}", step_index=0, advantage=float(g))
                   for g in range(4) for r in range(4)]
    parts = micro_batches(same_length, torch.ones(16, dtype=torch.bool), size=4, pad_id=tiny_policy.pad_token_id)
    groups = [sorted({int(a) for a in p.adv_B}) for p in parts]
    assert all(len(g) >= 2 for g in groups), groups  # no micro-batch is one group
    again = micro_batches(same_length, torch.ones(16, dtype=torch.bool), size=4, pad_id=tiny_policy.pad_token_id)
    assert [p.adv_B.tolist() for p in again] == [p.adv_B.tolist() for p in parts]  # deterministic


def test_the_trainer_weighs_steps_by_trajectory_length_when_asked(tiny_dir, store, batch, tmp_path) -> None:
    # Drop one step of the first trajectory: 11 samples, 6 trajectories, mean length 11/6.
    first = batch.samples[0].rollout_id
    short = dataclasses.replace(batch, samples=[s for i, s in enumerate(batch.samples) if i != 1])
    assert sum(s.rollout_id == first for s in short.samples) == 1
    plain = Trainer(config(tiny_dir, store, tmp_path / "a"), store).prepare(short).adv_B
    weighted = Trainer(config(tiny_dir, store, tmp_path / "b", loss=LossConfig(step_weight="trajectory")),
                       store).prepare(short).adv_B
    n_bar = 11 / 6
    expected = [a * (n_bar / (1 if s.rollout_id == first else 2)) for a, s in zip(plain.tolist(), short.samples, strict=True)]
    assert weighted.tolist() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(Exception, match=r"loss\.step_weight"):
        LossConfig(step_weight="token")


def test_experience_without_rollout_log_probs_is_trained_and_online_steps_without_them_are_not(
        tiny_dir, store, batch, tmp_path) -> None:
    """The data manager injects oracle successes with no sampler log-probs into all-fail groups:
    the trainer keeps them (importance weight 1), while an online step without them is ragged."""
    first = batch.samples[0].rollout_id
    samples = [dataclasses.replace(s, rollout_logprobs=[], origin="oracle", sft=True) if s.rollout_id == first
               else s for s in batch.samples]
    samples[-1] = dataclasses.replace(samples[-1], rollout_logprobs=[])
    trainer = Trainer(config(tiny_dir, store, tmp_path / "c"), store)
    prepared = trainer.prepare(dataclasses.replace(batch, samples=samples))
    assert [(d.rollout_id, d.reason) for d in prepared.dropped] == [(samples[-1].rollout_id, "ragged")]
    assert sum(b.adv_B.numel() for b in prepared.batches) == len(samples) - 1
    report = trainer.update(prepared)
    assert report is not None and math.isfinite(report.metrics["loss/total"])
