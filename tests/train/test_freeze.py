"""``freeze_vision``: the vision tower keeps its weights and runs without autograd; the LM learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dart.blobs import LocalBlobStore
from dart.errors import ConfigError
from dart.events.manifest import BatchManifest
from dart.train.config import EngineConfig, OptimConfig, TrainerConfig
from dart.train.freeze import freeze_vision_tower, vision_tower
from dart.train.trainer import Trainer
from tests.train.conftest import SMALL, make_manifest


@pytest.fixture
def batch(store, tiny_policy) -> BatchManifest:
    """Four one-step samples, their screenshots in the test's own blob store."""
    return make_manifest(store, tiny_policy, seq=0, groups=2, per_group=2, steps=1)


def trainer(tiny_dir: Path, store: LocalBlobStore, ckpt: Path, *, freeze: bool) -> Trainer:
    cfg = TrainerConfig(model=tiny_dir, checkpoint_dir=ckpt, blobs=str(store.root), prompt=SMALL,
                        freeze_vision=freeze, optim=OptimConfig(lr=2e-3),
                        engine=EngineConfig(micro_batch_samples=4, threads=1, gradient_checkpointing=True))
    return Trainer(cfg, store)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_a_frozen_vision_tower_keeps_its_weights_and_the_language_model_still_learns(
        tiny_dir, store, batch, tmp_path) -> None:
    t = trainer(tiny_dir, store, tmp_path / "ckpt", freeze=True)
    policy = t.engine.policy
    tower_before, lm_before = snapshot(vision_tower(policy)), snapshot(policy.model.language_model)
    assert t.update(t.prepare(batch)) is not None
    tower_after, lm_after = snapshot(vision_tower(policy)), snapshot(policy.model.language_model)
    assert all(torch.equal(tower_before[k], tower_after[k]) for k in tower_before)
    moved = [k for k in lm_before if not torch.equal(lm_before[k], lm_after[k])]
    assert len(moved) > len(lm_before) // 2, moved  # the language model did update
    assert all(p.grad is None and not p.requires_grad for p in vision_tower(policy).parameters())
    # The optimiser holds the trainable parameters only: none of the tower's.
    held = {id(p) for group in t.engine.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in policy.parameters() if p.requires_grad}
    assert not held & {id(p) for p in vision_tower(policy).parameters()}
    # The KL reference is the whole initial policy, its tower untouched by the freeze.
    assert t.ref is not None and "forward" not in vars(vision_tower(t.ref.scorer.policy))


def count_block_calls(model: torch.nn.Module) -> list[int]:
    """Runs of the vision blocks' attention (a block's own hooks stay outside its checkpoint)."""
    calls = [0]
    for block in vision_tower(model).blocks:
        block.attn.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_a_frozen_tower_runs_once_per_forward_pass_and_keeps_nothing_for_the_backward(
        tiny_dir, store, batch, tmp_path) -> None:
    runs = {}
    for freeze in (False, True):
        t = trainer(tiny_dir, store, tmp_path / f"ckpt-{freeze}", freeze=freeze)
        mb = t.prepare(batch).batches[0]
        calls = count_block_calls(t.engine.policy)
        features: list[torch.Tensor] = []
        vision_tower(t.engine.policy).register_forward_hook(
            lambda _m, _i, out, seen=features: seen.append(out.pooler_output))
        logp_B_T, _ = t.engine.forward(mb)
        logp_B_T.sum().backward()
        runs[freeze] = (calls[0], features[0].requires_grad)
    depth = len(vision_tower(t.engine.policy).blocks)
    # Trained: the gradient-checkpointed blocks run again in the backward pass. Frozen: once.
    assert runs == {False: (2 * depth, True), True: (depth, False)}


def test_freezing_a_model_without_a_vision_tower_is_refused_naming_the_key() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    text_only = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ConfigError, match="freeze_vision is set but Qwen2ForCausalLM has no vision tower"):
        freeze_vision_tower(text_only)
    assert all(p.requires_grad for p in text_only.parameters())
