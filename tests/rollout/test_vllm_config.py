"""The vllm engine's settings and M-RoPE translation, pure (no vLLM needed; the engine itself runs
in tests/vllm_cpu on vLLM's CPU build)."""

from __future__ import annotations

import json

import pytest

from dart.errors import ConfigError
from dart.rollout.vllm_engine import VLLMEngineConfig, rope_overrides


def checkpoint(tmp_path, sections):
    rope = {"rope_type": "default", "rope_theta": 3.0, "mrope_section": sections}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"rope_parameters": rope}}))
    return tmp_path


def test_one_frequency_sections_become_vllms_interleaved_counts(tmp_path):
    # transformers cycles 16 one-frequency sections t, h, w, t, ...: t gets 6 of them, h and w 5
    got = rope_overrides(checkpoint(tmp_path, [1] * 16))
    assert got == {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 3.0,
                                                       "mrope_section": [6, 5, 5], "mrope_interleaved": True}}}
    assert rope_overrides(checkpoint(tmp_path, [1] * 8))["text_config"]["rope_parameters"]["mrope_section"] == [3, 3, 2]


def test_three_sections_or_no_local_config_need_no_override(tmp_path):
    assert rope_overrides(checkpoint(tmp_path, [2, 3, 3])) == {}
    assert rope_overrides(tmp_path / "not-a-checkpoint") == {}


def test_wider_interleaved_sections_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"mrope_section \[2, 2, 2, 2\]"):
        rope_overrides(checkpoint(tmp_path, [2, 2, 2, 2]))


def test_the_config_passes_only_what_it_sets_and_refuses_bad_values():
    assert VLLMEngineConfig().llm_kwargs() == {"dtype": "auto", "gpu_memory_utilization": 0.9, "enforce_eager": False}
    cfg = VLLMEngineConfig(max_model_len=4096, max_num_batched_tokens=32768)
    assert cfg.llm_kwargs()["max_model_len"] == 4096 and cfg.llm_kwargs()["max_num_batched_tokens"] == 32768
    for bad in ({"memory_utilization": 0.0}, {"max_batch_size": 0}, {"max_num_batched_tokens": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            VLLMEngineConfig(**bad)
