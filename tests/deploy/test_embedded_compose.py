"""deploy/compose/embedded.yml (the stack with nothing from a registry) against docker-compose.yml:
both as `docker-compose config` resolves them, every difference named here. A change to one file
that is not made to the other, or not listed below, fails; so does a difference nobody meant."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.deploy.stack import CONFIG_DIR, REPO, resolved

EMBEDDED_FILE = CONFIG_DIR / "embedded.yml"
BROKER = "127.0.0.1:39092"
DART_ENV = {"DART_BOOTSTRAP": BROKER, "DART_TOPIC_PREFIX": "dart"}
HEALTHY = {"condition": "service_healthy"}
DONE = {"condition": "service_completed_successfully"}
STARTED = {"condition": "service_started"}
AFTER_RESTORE = {"broker": HEALTHY, "log-restore": DONE}
# Writers depend on the archiver: `down` stops them before it, so it archives all they wrote.
WRITER = {**AFTER_RESTORE, "archiver": STARTED}
ETC_DART = f"{CONFIG_DIR}:/etc/dart:ro"

# Services only one file has.
ONLY_FULL = {"kafka", "clickhouse", "rollout-worker-gpu", "prometheus"}  # registry images; the gpu profile needs a GPU
ONLY_EMBEDDED = {"broker", "log-restore"}  # the dev broker, and its rebuild from the archive volume
# Every (service, key) whose value differs between the files that both have, with the embedded value.
# `network_mode` and `environment` differ everywhere (host networking; the broker on loopback).
DIFFERENT: dict[tuple[str, str], Any] = {
    ("topics-init", "command"): ["dart", "topics", "ensure"],  # the broker from $DART_BOOTSTRAP
    ("topics-init", "depends_on"): {"broker": HEALTHY},
    ("tasks-init", "depends_on"): {"broker": HEALTHY, "log-restore": DONE},
    ("data-manager", "command"): ["dart", "data-manager", "--config", "/etc/dart/data-manager.yaml",
                                  "--dsn", "chdb:///data/chdb/store"],  # embedded chdb, not ClickHouse
    ("data-manager", "volumes"): [ETC_DART, "blobs:/data/blobs:rw", "data-manager-secrets:/run/dart-secrets:ro",
                                  "projection:/data/chdb:rw"],
    ("data-manager", "depends_on"): {**WRITER, "secrets-init": DONE},
    ("archiver", "depends_on"): AFTER_RESTORE,
    ("env-worker", "depends_on"): WRITER,
    ("rollout-worker", "depends_on"): {**WRITER, "model-init": DONE},
    ("trainer", "depends_on"): {**WRITER, "model-init": DONE},
}
# Environment variables only the full file sets (passwords reach no dart service's environment).
ENV_ONLY_FULL: dict[str, set[str]] = {}
# ... and every service's Prometheus port: Prometheus (a registry image) is only in the full file, and
# on host networking one fixed port for every service would clash.
ENV_ONLY_FULL_EVERYWHERE = {"DART_METRICS_PORT", "DART_METRICS_HOST"}
VOLUMES_ONLY_FULL = {"kafka-data", "clickhouse-data", "prometheus-data"}
VOLUMES_ONLY_EMBEDDED = {"projection"}


def embedded_config() -> dict[str, Any]:
    """`docker-compose -f deploy/compose/embedded.yml config`, run as a user would (project directory:
    the file's own, so its relative paths resolve from there)."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (apt-get install -y docker-compose): cannot validate")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DART_", "CLICKHOUSE_", "KAFKA_"))}
    proc = subprocess.run([exe, "-f", str(EMBEDDED_FILE), "config"], capture_output=True, text=True,
                          timeout=60, env=clean, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def full_config() -> dict[str, Any]:
    return resolved("--profile", "gpu")


def normalised(svc: dict[str, Any]) -> dict[str, Any]:
    """A service with what the files write alike but docker-compose prints apart made equal."""
    out = dict(svc)
    out["volumes"] = [v.replace(f"{REPO}/deploy/compose:", f"{CONFIG_DIR}:") for v in svc.get("volumes", [])]
    return out


def differences(full: dict[str, Any], embedded: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """(service, key) -> the embedded file's value, for every key whose value differs."""
    out = {}
    for name in sorted(set(full["services"]) & set(embedded["services"])):
        a, b = normalised(full["services"][name]), normalised(embedded["services"][name])
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out[(name, key)] = b.get(key)
    return out


def test_the_embedded_file_validates_and_runs_every_service_on_the_host_network() -> None:
    emb = embedded_config()
    assert set(emb["services"]) == {"broker", "secrets-init", "topics-init", "log-restore", "tasks-init",
                                    "model-init", "data-manager", "archiver", "env-worker", "rollout-worker",
                                    "trainer"}
    for name, svc in emb["services"].items():
        # One image, built here from the repository's Dockerfile; no registry image anywhere.
        assert svc["image"] == "dart:local", name
        assert svc["build"]["context"] == str(REPO) and svc["build"]["dockerfile"] == "Dockerfile", name
        assert svc["network_mode"] == "host" and "ports" not in svc, name
        assert svc["command"][0] in ("dart", "python", "sh"), name
    # Every dart service that talks to the broker finds it on loopback.
    for name in ("broker", "topics-init", "log-restore", "tasks-init", "data-manager", "archiver", "env-worker",
                 "rollout-worker", "trainer"):
        assert emb["services"][name]["environment"] == DART_ENV, name
    assert emb["services"]["broker"]["command"] == ["dart", "broker", "--port", BROKER.rsplit(":", 1)[1]]


def test_every_difference_from_docker_compose_yml_is_named() -> None:
    full, emb = full_config(), embedded_config()
    assert set(full["services"]) - set(emb["services"]) == ONLY_FULL
    assert set(emb["services"]) - set(full["services"]) == ONLY_EMBEDDED
    assert set(full["volumes"]) - set(emb["volumes"]) == VOLUMES_ONLY_FULL
    assert set(emb["volumes"]) - set(full["volumes"]) == VOLUMES_ONLY_EMBEDDED

    found = differences(full, emb)
    everywhere = {k for k in found if k[1] in ("network_mode", "environment")}
    for name, key in everywhere:
        svc = emb["services"][name]
        if key == "network_mode":
            assert svc["network_mode"] == "host", name
        else:  # the same variables, the broker's address changed (on loopback, not kafka:9092)
            dropped = {"DART_BOOTSTRAP"} | ENV_ONLY_FULL.get(name, set()) | ENV_ONLY_FULL_EVERYWHERE
            same = {k: v for k, v in full["services"][name]["environment"].items() if k not in dropped}
            assert {k: v for k, v in svc["environment"].items() if k != "DART_BOOTSTRAP"} == same, name
            assert svc["environment"]["DART_BOOTSTRAP"] == BROKER, name
    rest = {k: v for k, v in found.items() if k not in everywhere}
    unnamed = {k: v for k, v in rest.items() if k not in DIFFERENT or DIFFERENT[k] != v}
    gone = DIFFERENT.keys() - rest.keys()
    assert not unnamed and not gone, f"differences not named here: {unnamed}; named but not found: {gone}"


def test_the_services_both_files_have_share_their_configs_and_commands() -> None:
    """Besides the named differences, one stack: the same configs mounted, the same one-shots."""
    full, emb = full_config(), embedded_config()
    for name in ("secrets-init", "model-init", "env-worker", "rollout-worker", "trainer", "archiver", "tasks-init"):
        assert emb["services"][name]["command"] == full["services"][name]["command"], name
    # The data manager reads the same config; only its store is named on the command line.
    assert emb["services"]["data-manager"]["command"][:4] == full["services"]["data-manager"]["command"]


def test_the_broker_is_rebuilt_from_the_archive_before_anything_writes() -> None:
    """The dev broker keeps its log in memory: every service that produces waits for log-restore,
    which reads the archiver's volume; the archiver writes that volume."""
    emb = embedded_config()["services"]
    restore = emb["log-restore"]
    assert restore["command"] == ["dart", "log", "import", "/data/log"]
    assert "event-archive:/data/log:ro" in restore["volumes"]
    assert "event-archive:/data/log:rw" in emb["archiver"]["volumes"]
    for name, svc in emb.items():
        if name in ("broker", "topics-init", "log-restore", "secrets-init", "model-init"):
            continue
        assert svc["depends_on"].get("log-restore") == DONE, name
        if svc.get("restart") != "no" and name != "archiver":  # stopped before the archiver
            assert svc["depends_on"].get("archiver") == STARTED, name


def test_every_named_volume_mount_point_is_made_by_the_image_for_its_user() -> None:
    """A fresh named volume is owned by root unless the image has its mount point: the Dockerfile
    makes each one (in both files) and gives it to the runtime user."""
    text = (REPO / "Dockerfile").read_text()
    made = re.search(r"mkdir -p ([^;]+);", text)[1].split()
    owned = re.search(r"chown dart:dart ([^;]+);", text)[1].split()
    targets = set()
    for config in (full_config(), embedded_config()):
        for svc in config["services"].values():
            # secrets-init runs as root and sets the owner and mode of what it mounts itself.
            if svc["image"].startswith("dart:") and svc.get("user") != "0:0":
                targets |= {v.split(":")[1] for v in svc.get("volumes", []) if not v.startswith("/")}
    assert targets == {"/data/blobs", "/data/models", "/data/checkpoints", "/data/log", "/data/chdb",
                       "/run/dart-secrets"}
    assert targets <= set(made) and targets <= set(owned)
    assert re.search(r"^USER dart$", text, re.MULTILINE)


def test_dockerfile_layers_dependencies_before_code_and_takes_a_base() -> None:
    # Instructions only: comments may mention commands in any order.
    text = "\n".join(line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.startswith("#"))
    assert "ARG BASE=python:3.11-slim-bookworm" in text
    assert re.findall(r"^FROM .*", text, re.MULTILINE) == ["FROM ${BASE} AS requirements", "FROM ${BASE}"]
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "ARG TORCH_VERSION=2.13.0" in text
    order = ['pip install "torch==${TORCH_VERSION}"', "COPY --from=requirements", "pip install -r",
             "COPY dart ", "pip install --no-deps --no-build-isolation ."]
    assert [text.index(s) for s in order] == sorted(text.index(s) for s in order)
    # Nothing of the code is copied before the dependency layer: only pyproject.toml, to list them.
    before = text[: text.index("pip install -r")]
    assert re.findall(r"^COPY (?:--from=\S+ )?(\S+)", before, re.MULTILINE) == ["pyproject.toml", "/tmp/requirements.txt"]
    assert "torch.version.cuda" in text and "'nvidia-'" in text  # no CUDA in the CPU image
    for pkg in ("xvfb", "xdotool", "openbox", "mousepad", "libreoffice-calc"):
        assert pkg in text
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for name in copied.split():
            assert (REPO / name).exists() and name not in ignored, name
    assert {".venv", ".git", "tests"} <= ignored
