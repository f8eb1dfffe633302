"""benchmarks/gpu_smoke.py on this CPU machine: the vllm engine is not here, so the smoke says
so and measures nothing; its steps (references, swaps, the check that answers follow the
weights) run with the CPU hf engine standing in for vLLM."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke_module():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_gpu_smoke_without_vllm_says_so_and_measures_nothing(capsys, tmp_path):
    smoke = _smoke_module()
    out = tmp_path / "gpu.json"
    assert smoke.main(["--out", str(out)]) == smoke.SKIPPED
    assert "skipped, nothing measured: vLLM is not installed" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or __import__("torch").cuda.is_available(),
                    reason="a CUDA device is here")
def test_the_hf_engine_on_cuda_without_a_gpu_says_so_and_measures_nothing(capsys, tmp_path):
    smoke = _smoke_module()
    out = tmp_path / "gpu.json"
    assert smoke.main(["--engine", "hf", "--device", "cuda", "--out", str(out)]) == smoke.SKIPPED
    assert "skipped, nothing measured: no CUDA device" in capsys.readouterr().out
    assert not out.exists()


def test_gpu_smoke_steps_with_the_cpu_hf_engine_standing_in_for_vllm():
    smoke = _smoke_module()
    result = asyncio.run(smoke.smoke("hf", n=4, swaps=2, log=lambda _: None))
    assert result["answers_differ_between_weights"] > 0   # else a swap could not be seen
    assert [r["weights"] for r in result["rows"]] == ["A", "B", "A"]
    assert all(r["agreement"] == 1.0 for r in result["rows"])   # same engine, same weights: same tokens
    assert result["swaps_took"] and result["swap_s_median"] > 0


def test_a_swap_that_does_not_take_fails_the_smoke(monkeypatch, capsys):
    smoke = _smoke_module()
    make = smoke.make_engine

    def engine_that_ignores_swaps(kind, model_dir, device="cpu", vllm_args=None):
        engine = make("hf", model_dir, device)

        async def swap(version, state):
            return 0.001   # reports a swap, loads nothing

        engine.swap_weights = swap
        return engine

    monkeypatch.setattr(smoke, "make_engine", engine_that_ignores_swaps)
    monkeypatch.setattr(smoke, "missing_gpu_parts", lambda engine="vllm", device="cuda": None)
    assert smoke.main(["--engine", "hf", "--requests", "4", "--swaps", "1"]) == 1
    assert "FAILED: the answers do not follow the weights" in capsys.readouterr().out
