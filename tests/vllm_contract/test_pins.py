"""The installed vLLM is the ``gpu`` extra's pin, and its own requirements agree with the torch
pin and the gpu extra's transformers range (runs in .venv-vllm: ``make contract-test``)."""

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


def vllm_requirements() -> dict[str, Requirement]:
    reqs = [Requirement(r) for r in md.requires("vllm") or []]
    return {r.name.lower(): r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})}


def test_the_installed_vllm_is_the_pinned_one():
    _, gpu = project_requirements()
    assert md.version("vllm") in gpu["vllm"].specifier


def test_vllm_wants_exactly_the_torch_pin():
    main, _ = project_requirements()
    assert str(vllm_requirements()["torch"].specifier) == str(main["torch"].specifier)


def test_the_gpu_extra_transformers_range_is_vllms_own():
    _, gpu = project_requirements()
    assert gpu["transformers"].specifier == vllm_requirements()["transformers"].specifier
    assert md.version("transformers") in gpu["transformers"].specifier
