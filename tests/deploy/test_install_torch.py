"""deploy/install-torch.sh, the first thing `make run` installs: torch's CPU build from pip's own
sources where they have it, else from PyTorch's CPU index, else whatever PyPI gives, said.

Each branch runs the real script with real pip (``--dry-run --report``) in a fresh virtualenv,
against PEP 503 ``file://`` indexes built here: the CPU index holds this machine's CPU wheel
(symlinked from /opt/wheels), the stand-in for PyPI a wheel named torch that, like PyPI's Linux
one, requires nvidia-* packages (a fake: the real one is several GB). pip's configuration is
hidden (PIP_CONFIG_FILE=/dev/null) as on a machine that has never seen /opt/wheels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "deploy" / "install-torch.sh"
VERSION = "2.13.0"
LOCAL_WHEELS = Path("/opt/wheels")


def cpu_wheel() -> Path:
    found = sorted(LOCAL_WHEELS.glob(f"torch-{VERSION}+cpu-*.whl")) if LOCAL_WHEELS.is_dir() else []
    if not found:
        pytest.skip(f"no torch-{VERSION}+cpu wheel in {LOCAL_WHEELS}: the CPU index cannot be built offline")
    return found[0]


def simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index (one project page per wheel's project) as a file:// URL."""
    for wheel in wheels:
        project = root / wheel.name.split("-")[0].lower()
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.name).symlink_to(wheel.resolve())
        links = "".join(f'<a href="{w.name}">{w.name}</a>' for w in sorted(project.glob("*.whl")))
        (project / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>")
    root.mkdir(parents=True, exist_ok=True)
    return root.as_uri()


def fake_cuda_torch(directory: Path) -> Path:
    """A wheel named torch VERSION that requires CUDA packages, as PyPI's Linux x86-64 one does."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"torch-{VERSION}-py3-none-any.whl"
    info = f"torch-{VERSION}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("torch/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {VERSION}\n"
                                       "Requires-Dist: nvidia-cublas==13.1.1.3; platform_system == \"Linux\"\n"
                                       "Requires-Dist: filelock\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with pip and no torch, as `make install` starts from."""
    where = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    return where


def install(venv: Path, tmp_path: Path, env: dict[str, str], *pip_args: str) -> tuple[subprocess.CompletedProcess,
                                                                                          list[dict]]:
    """The script with ``--dry-run --report``: its output and what pip would install."""
    report = tmp_path / "report.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # no find-links from here
    out = subprocess.run(["bash", str(SCRIPT), str(venv), VERSION, "--dry-run", "--ignore-installed", "--report",
                          str(report), *pip_args], capture_output=True, text=True, timeout=300,
                         env={**base, "PIP_CONFIG_FILE": "/dev/null", **env})
    assert out.returncode == 0, out.stdout + out.stderr
    return out, json.loads(report.read_text())["install"]


def names(items: list[dict]) -> list[str]:
    return [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items]


def test_a_cpu_build_pips_own_configuration_offers_is_taken(venv, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / cpu_wheel().name).symlink_to(cpu_wheel())
    conf = tmp_path / "pip.conf"  # this machine's way: a find-links directory holding torch-*+cpu
    conf.write_text(f"[global]\nfind-links = {wheels}\nno-index = true\n")
    out, items = install(venv, tmp_path, {"PIP_CONFIG_FILE": str(conf),
                                          "DART_TORCH_INDEX": (tmp_path / "never-asked").as_uri()}, "--no-deps")
    assert "the CPU build pip's configuration offers" in out.stdout
    assert names(items) == [f"torch=={VERSION}+cpu"]


def test_without_a_local_cpu_build_the_cpu_index_is_used(venv, tmp_path):
    cpu_index = simple_index(tmp_path / "cpu", [cpu_wheel()])
    pypi = simple_index(tmp_path / "pypi", [fake_cuda_torch(tmp_path / "dl")])
    out, items = install(venv, tmp_path, {"PIP_INDEX_URL": pypi, "DART_TORCH_INDEX": cpu_index,
                                          "DART_PYPI_INDEX": pypi}, "--no-deps")
    assert f"the CPU build from {cpu_index}" in out.stdout
    assert names(items) == [f"torch=={VERSION}+cpu"]


def test_an_unreachable_cpu_index_installs_what_pip_gives_and_says_how_to_get_the_cpu_build(venv, tmp_path):
    pypi = simple_index(tmp_path / "pypi", [fake_cuda_torch(tmp_path / "dl")])
    blocked = "https://192.0.2.1/whl/cpu"  # TEST-NET-1: never routed, the probe must give up fast
    out, items = install(venv, tmp_path, {"PIP_INDEX_URL": pypi, "DART_TORCH_INDEX": blocked,
                                          "DART_TORCH_PROBE_TIMEOUT_S": "2"}, "--no-deps")
    assert names(items) == [f"torch=={VERSION}"]
    assert f"WARNING: {blocked} cannot be reached" in out.stdout and "the CUDA build" in out.stdout
    assert f"--index-url {blocked} torch=={VERSION}" in out.stdout


def pypi_answers() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/filelock/", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_the_whole_resolution_from_the_cpu_index_and_pypi_has_no_nvidia_package(venv, tmp_path):
    """What a user elsewhere gets: torch from the CPU index, its dependencies from the real PyPI."""
    if not pypi_answers():
        pytest.skip("pypi.org does not answer from here: the dependencies cannot be resolved")
    cpu_index = simple_index(tmp_path / "cpu", [cpu_wheel()])
    _, items = install(venv, tmp_path, {"DART_TORCH_INDEX": cpu_index})
    got = names(items)
    assert f"torch=={VERSION}+cpu" in got and "sympy" in {n.split("==")[0] for n in got}, got
    assert not [n for n in got if n.startswith(("nvidia", "triton", "cuda"))], got


def test_the_makefile_installs_torch_with_the_script_and_a_cuda_build_does_not_fail_it():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "bash deploy/install-torch.sh $(VENV) $(TORCH_VERSION)" in makefile
    assert "a CUDA torch was installed" not in makefile and "sys.exit" not in makefile
    assert "https://download.pytorch.org/whl/cpu" in SCRIPT.read_text()
