from __future__ import annotations

import pytest
import torch

from dart.agent.model import load_policy, load_policy_with, score_response
from dart.agent.prompt import blob_image_loader, build_messages, encode_prompt
from dart.agent.tiny import build_tiny
from dart.agent.weight_format import check_state_dict, state_dict_from_bytes, state_dict_to_bytes
from dart.errors import BlobCorrupted, ConfigError
from tests.agent.screens import SMALL, context


def test_tiny_model_is_small_qwen2_5_vl(policy):
    n = sum(p.numel() for p in policy.model.parameters())
    assert 2e5 < n < 8e5
    assert type(policy.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    vocab = policy.tokenizer.get_vocab()
    for tok in ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|box_start|>"):
        assert tok in vocab
    assert policy.model.config.image_token_id == vocab["<|image_pad|>"]
    assert set(policy.stop_token_ids) == {vocab["<|im_end|>"], vocab["<|endoftext|>"]}


def test_same_seed_same_bytes_other_seed_other_weights(tiny_dir, tmp_path):
    again = build_tiny(tmp_path / "again", seed=0)
    other = build_tiny(tmp_path / "other", seed=1)
    assert (again / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()


def test_load_policy_names_missing_directory(tmp_path):
    with pytest.raises(ConfigError, match="dart model tiny"):
        load_policy(tmp_path / "nope")


def test_weight_blob_round_trip_and_checks(policy):
    blob = state_dict_to_bytes(policy.model)
    state = state_dict_from_bytes(blob)
    check_state_dict(policy.model, state)
    assert all(torch.equal(state[k], v) for k, v in policy.model.state_dict().items())
    with pytest.raises(BlobCorrupted):
        state_dict_from_bytes(blob[: len(blob) // 2])
    state.pop(next(iter(state)))
    with pytest.raises(BlobCorrupted, match="missing"):
        check_state_dict(policy.model, state)


def test_load_policy_with_other_weights_serves_them_and_refuses_what_does_not_fit(tiny_dir):
    other = load_policy(tiny_dir)  # the same model; its weights shifted below
    shifted = {k: v + 0.25 if v.is_floating_point() else v for k, v in other.model.state_dict().items()}
    other.model.load_state_dict(shifted)
    blob = state_dict_to_bytes(other.model)
    served = load_policy_with(tiny_dir, blob).model.state_dict()
    assert all(torch.equal(served[k], shifted[k]) for k in shifted)
    own = load_policy_with(tiny_dir, None).model.state_dict()
    assert not torch.equal(own["lm_head.weight"], shifted["lm_head.weight"])
    first = next(k for k, v in shifted.items() if v.is_floating_point())
    other.model.state_dict()[first].fill_(float("nan"))
    with pytest.raises(BlobCorrupted, match="non-finite"):
        load_policy_with(tiny_dir, state_dict_to_bytes(other.model))


def test_score_matches_generate_logits(policy, store):
    ctx = context(store, steps=1)
    inputs = encode_prompt(
        policy.tokenizer, policy.image_processor, *build_messages(ctx, blob_image_loader(store), SMALL)
    )
    out = policy.model.generate(
        **inputs.model_kwargs(),
        max_new_tokens=8,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    response = out.sequences[0, inputs.num_tokens :].tolist()
    manual = [
        torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, response, strict=True)
    ]
    logprobs, entropies = score_response(policy.model, inputs, response)
    assert max(abs(a - b) for a, b in zip(manual, logprobs, strict=True)) < 1e-4
    assert all(
        0 < e <= torch.log(torch.tensor(float(policy.model.config.text_config.vocab_size))) + 1e-4
        for e in entropies
    )
