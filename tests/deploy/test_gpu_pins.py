"""The GPU pins agree: the ``gpu`` extra's vLLM, the torch pin and the transformers range in
pyproject.toml, and the GPU lock (deploy/gpu/constraints.txt). The installed vLLM's own
requirements are checked against these in its venv (tests/vllm_contract/test_pins.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(lines: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(line) for line in lines]
    return {r.name.lower(): r for r in reqs}


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "deploy" / "gpu" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line!r} is not an exact pin"
            pins[req.name.lower()] = spec.version
    return pins


def exact(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} must be an exact pin"
    return spec.version


def test_the_gpu_extra_pins_vllm_and_the_lock_holds_the_same_vllm_torch_and_transformers():
    main = requirements(project()["dependencies"])
    gpu = requirements(project()["optional-dependencies"]["gpu"])
    locked = lock()
    assert exact(gpu["vllm"]) == locked["vllm"]
    assert exact(main["torch"]) == locked["torch"]          # the CPU pin is the GPU pin's version
    assert locked["transformers"] in gpu["transformers"].specifier
    assert locked["transformers"] in main["transformers"].specifier
    # the gpu extra narrows the project's transformers range, never leaves it
    lowest = min(s.version for s in gpu["transformers"].specifier if s.operator in (">=", "=="))
    assert lowest in main["transformers"].specifier


def test_the_lock_pins_every_package_once_and_no_cpu_build_of_torch():
    text = (ROOT / "deploy" / "gpu" / "constraints.txt").read_text()
    names = [Requirement(x).name.lower() for x in text.splitlines() if x.strip() and not x.startswith("#")]
    assert len(names) == len(set(names)) and len(names) > 50
    assert "+cpu" not in text
