"""benchmarks/gpu_bench.py and benchmarks/weight_path.py on this CPU machine: every step runs at
tiny shapes (so neither can rot), and without a GPU the full benchmark measures nothing and says so."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_without_a_gpu_the_benchmark_says_so_and_measures_nothing(capsys, tmp_path):
    bench = _module("gpu_bench")
    assert bench.main(["--out", str(tmp_path / "gpu.json")]) == 3
    assert "no CUDA device is visible to torch: nothing measured" in capsys.readouterr().out
    assert not (tmp_path / "gpu.json").exists()


def test_the_tiny_run_goes_through_every_part_and_writes_one_json(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--tiny", "--out", str(out),
                           "--engine-set", "lr=1e-5", "--engine-set", "no_such_setting=1"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    fig = json.loads(out.read_text())
    train = fig["train"]["tiny"]
    assert train["language_params"] < train["params"]                     # the vision tower is not in N
    for kind in ("text", "screenshot"):
        assert train[kind]["tokens_per_s"] > 0 and len(train[kind]["update_s"]) == 1
    assert train["screenshot"]["gradient_checkpointing"]
    plain, after = fig["bf16_check"]["tiny"], fig["bf16_check"]["tiny with {'lr': '1e-5', 'no_such_setting': '1'}"]
    assert set(plain["changed"]) == {"self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"}
    assert all(0.0 <= v <= 1.0 for v in plain["changed"].values())
    assert after["ignored_settings"] == ["no_such_setting"]                # said, not silently dropped
    # ten times the learning rate moves more of a linear layer's elements (the same start, the same data)
    assert after["changed"]["self_attn.q_proj.weight"] > plain["changed"]["self_attn.q_proj.weight"]
    stages = fig["publish"]["tiny"]["stages_s"]
    assert list(stages) == ["host", "commit", "publish", "fetch", "load", "total"]
    assert stages["total"] == pytest.approx(sum(v for k, v in stages.items() if k != "total"), abs=0.01)
    limits = fig["publish"]["tiny"]["limits_s"]
    assert limits["device_to_pinned"] is None and limits["write_fsync"] > 0   # nothing pinned without CUDA
    assert fig["left_out"] == [] and fig["tiny"] and fig["device"] == "cpu"


def test_the_weight_path_benchmark_runs_both_paths_beside_its_references(tmp_path, capsys):
    bench = _module("weight_path")
    fig = bench.main(["--params", "tiny", "--passes", "1", "--workdir", str(tmp_path)])
    for side in ("before", "after"):
        assert set(fig[side]) == {*bench.STAGES, "total"} and fig[side]["total"]["s"] > 0
    assert set(fig["reference"]) == {"memcpy", "write+fsync", "read", "sha256"}
    assert "| total / memcpy |" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())                                   # its files are gone
