"""Write deploy/gpu/constraints.txt: the GPU worker's lock, what the ``gpu`` extra's vLLM pin
resolves to on PyPI (pip's resolver in a dry run; only metadata is downloaded).

    python3 deploy/gpu/lock.py        # or: make gpu-lock

Run it after changing the ``gpu`` extra's pins; tests/deploy/test_gpu_pins.py then checks the
two agree. The lock is for CPython 3.11 on Linux x86_64 (the GPU hosts'): it refuses to run elsewhere.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "deploy" / "gpu" / "constraints.txt"
HEADER = """\
# The GPU worker's lock: vLLM and everything it resolves to on CPython 3.11, Linux x86_64
# (CUDA wheels from PyPI). The `gpu` extra in pyproject.toml pins vllm, torch and the
# transformers range; this file pins the rest, so two GPU hosts get the same packages:
#
#   pip install -c deploy/gpu/constraints.txt -e '.[gpu]'
#
# Written by deploy/gpu/lock.py (`make gpu-lock`); tests/deploy/test_gpu_pins.py checks it agrees
# with pyproject.toml, and tests/vllm_contract/test_pins.py with the installed vLLM's requirements.
"""


def gpu_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = [r for r in project["dependencies"] if r.replace(" ", "").startswith("torch==")]
    return [*project["optional-dependencies"]["gpu"], *torch]


def main() -> int:
    # markers (python_version, platform_machine) resolve for the interpreter running pip, and
    # pip's --platform/--python-version miss wheels tagged for older manylinux: run it on the
    # GPU hosts' kind of interpreter instead
    if sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64" or sys.platform != "linux":
        print(f"gpu-lock: run with CPython 3.11 on Linux x86_64 (this is {platform.python_version()} "
              f"on {sys.platform} {platform.machine()})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        # --isolated: PyPI only (no local CPU wheel, no site constraints or find-links)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "-q",
             "--report", str(report), *gpu_requirements()],
            check=True,
        )
        installs = json.loads(report.read_text())["install"]
    pins = sorted({(i["metadata"]["name"].lower().replace("_", "-"), i["metadata"]["version"]) for i in installs})
    OUT.write_text(HEADER + "".join(f"{name}=={version}\n" for name, version in pins))
    print(f"{OUT.relative_to(ROOT)}: {len(pins)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
