"""The package as users install it: the wheel `pip wheel` builds holds the schemas, the shipped
configs and the license, and once installed in a fresh virtualenv (no checkout on its path) dart
runs from any directory: `dart doctor`, every event type through the codec, a short `dart up`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from dart.bus.broker import broker_answers, free_port
from dart.resources import SOURCES

REPO = Path(__file__).resolve().parents[2]
# What the wheel is built from (an sdist holds the same, MANIFEST.in).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "dart", "schemas",
                "configs", "deploy/libvirt")

pytestmark = pytest.mark.slow


def shipped_files() -> dict[str, Path]:
    """Path inside the wheel -> the repository file it must be a copy of."""
    out = {}
    for name, (source, pattern) in SOURCES.items():
        for path in (REPO / source).glob(pattern):
            out[f"dart/_data/{name}/{path.relative_to(REPO / source).as_posix()}"] = path
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (the checkout stays free of build/ and egg-info)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(root / "dist"), str(src)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = (root / "dist").glob("dart_rl-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed --no-deps; the dependencies are borrowed from the
    running interpreter's site-packages by a .pth line (the checkout itself is not on its path)."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def run(venv: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DART_BOOTSTRAP", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_holds_the_schemas_configs_and_license(wheel: Path) -> None:
    expected = shipped_files()
    # Every schema (current and history), every shipped config, the libvirt template.
    assert sum(k.startswith("dart/_data/schemas/history/") for k in expected) == 12
    assert sum(k.startswith("dart/_data/schemas/") for k in expected) == 24
    assert "dart/_data/configs/synthetic.yaml" in expected
    assert "dart/_data/libvirt/domain.xml.tmpl" in expected
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert expected.keys() <= names, sorted(expected.keys() - names)
        for inside, path in expected.items():
            assert z.read(inside) == path.read_bytes(), inside
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert b"Apache License" in z.read(license_name)
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License: Apache-2.0" in metadata or "License-Expression: Apache-2.0" in metadata
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_installed_dart_runs_outside_the_checkout(venv: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dart = str(venv / "bin" / "dart")

    # The package, its schemas and its default config come from the virtualenv, not the checkout.
    probe = run(venv, elsewhere, str(venv / "bin" / "python"), "-c", (
        "import json, dart, dart.events.codec as c, dart.stack.cli as s, dart.env.libvirt.config as v\n"
        "print(json.dumps([dart.__file__, str(c.SCHEMA_DIR), str(s.DEFAULT_CONFIG), str(v.DEPLOY_TEMPLATE)]))"))
    assert probe.returncode == 0, probe.stderr
    site = str(venv / "lib")
    paths = json.loads(probe.stdout)
    assert all(p.startswith(site) for p in paths), paths
    assert paths[1].endswith("dart/_data/schemas") and paths[2].endswith("dart/_data/configs/synthetic.yaml")

    # Every event type encodes and decodes (current schemas), and a history schema's bytes decode.
    codec = run(venv, elsewhere, str(venv / "bin" / "python"), "-c", (
        "from dart.events.codec import decode, encode, registry\n"
        "from dart.events.examples import all_examples\n"
        "from dart.events.types import EVENT_TYPES\n"
        "events = all_examples()\n"
        "assert {type(e) for e in events} == set(EVENT_TYPES), 'an event type has no example'\n"
        "for e in events:\n"
        "    assert decode(encode(e)) == e, type(e).__name__\n"
        "print(len(events), len(registry().names_by_fingerprint()))"))
    assert codec.returncode == 0, codec.stderr
    events, fingerprints = map(int, codec.stdout.split())
    assert events == 12 and fingerprints == 24  # 12 current schemas + 12 in history/

    # `dart doctor` against a dev broker started by the installed package.
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    broker = subprocess.Popen([dart, "broker", "--port", str(port)], cwd=elsewhere, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not broker_answers(f"127.0.0.1:{port}") and time.monotonic() < deadline:
            time.sleep(0.2)
        doctor = run(venv, elsewhere, dart, "doctor", "--bootstrap", f"127.0.0.1:{port}")
    finally:
        broker.terminate()
        broker.wait(timeout=10)
    lines = {line.split()[1]: line.split()[0] for line in doctor.stdout.splitlines()[1:-1] if line.startswith("  ")
             and line.split()[0] in ("ok", "MISSING")}
    assert {lines.get(k) for k in ("tansu", "broker", "chdb", "torch")} == {"ok"}, doctor.stdout
    assert "torch 2.13.0+cpu (CPU)" in doctor.stdout

    # A short `dart up` (warm start, one RL update, no evaluation), its run directory where it was asked.
    (elsewhere / "tiny.yaml").write_text(
        "run_id: wheel\nworkdir: run\nrl_minutes: 3\nmax_updates: 1\nevaluate: false\nexperience_tasks: 4\n"
        "recipe: {train_tasks: 6, eval_tasks: 2, sft_demos: 4, sft_steps: 2}\n"
        "data: {batcher: {groups_per_batch: 1}, curation: {n_default: 2}, scheduler: {max_new_tokens: 16}}\n"
        "env: {slots: 4}\n")
    up = run(venv, elsewhere, dart, "up", "tiny.yaml", timeout=240)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    summary = json.loads((elsewhere / "run" / "summary.json").read_text())
    assert summary["updates"] == 1 and summary["policy_version"] == 1 and summary["trajectories"] > 0
    assert summary["infra_errors"] == 0
    verify = run(venv, elsewhere, dart, "log", "verify", "run")
    assert verify.returncode == 0, verify.stdout + verify.stderr
