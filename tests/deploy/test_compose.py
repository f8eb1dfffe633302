"""docker-compose.yml, validated by Debian's docker-compose (`config`) and read as data: one
image, shared blobs at one path, health checks, start order, no secrets, a GPU for the gpu
profile, and service commands/configs that the dart CLI itself accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.stack import (
    COMPOSE_FILE,
    CONFIG_DIR,
    PASSWORD_SENTINEL,
    REPO,
    docker_compose_file,
    load_healthcheck,
)

BLOBS_PATH = "/data/blobs"
# Services that read or write blobs: each mounts the `blobs` volume at BLOBS_PATH.
BLOB_USERS = ("data-manager", "env-worker", "rollout-worker", "rollout-worker-gpu", "trainer")


def dart_services(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services built from this repository's Dockerfile."""
    return {name: svc for name, svc in services.items()
            if Path(svc.get("build", {}).get("dockerfile", "")).name == "Dockerfile"}


def long_running(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that stay up (one-shots have restart: "no")."""
    return {name: svc for name, svc in services.items() if svc.get("restart") != "no"}


def mounts(svc: dict[str, Any]) -> dict[str, str]:
    """Named volume (or host path) -> container path, from the short volume syntax."""
    out = {}
    for spec in svc.get("volumes", []):
        source, target = spec.split(":")[:2]
        out[source] = target
    return out


def test_config_validates_with_and_without_the_gpu_profile(stack: dict[str, Any], gpu_stack: dict[str, Any]) -> None:
    # Both fixtures assert that `docker-compose [--profile gpu] config` exits 0.
    assert "rollout-worker-gpu" in gpu_stack["services"]
    assert {"kafka", "clickhouse", "topics-init", "data-manager", "env-worker", "rollout-worker", "trainer"} \
        <= set(stack["services"])


def test_config_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validator is real: a bad depends_on condition makes `config` fail."""
    broken = COMPOSE_FILE.read_text().replace("condition: service_healthy", "condition: service_ready", 1)
    path = tmp_path / "docker-compose.yml"
    path.write_text(broken)
    proc = docker_compose_file(path, "config", "--quiet")
    assert proc.returncode != 0 and "service_ready" in proc.stderr


def test_every_dart_service_runs_the_one_image(stack: dict[str, Any]) -> None:
    dart = dart_services(stack["services"])
    assert {"topics-init", "tasks-init", "model-init", "data-manager", "env-worker", "rollout-worker", "trainer"} <= set(dart)
    cpu = {name: svc for name, svc in dart.items() if "gpu" not in svc.get("profiles", [])}
    assert {svc["image"] for svc in cpu.values()} == {"dart:local"}
    assert all(svc["command"][0] in ("dart", "sh", "python") for svc in dart.values())
    # The gpu worker's image comes from the same Dockerfile and context, with the gpu extra.
    gpu = dart["rollout-worker-gpu"]
    assert gpu["build"]["context"] == cpu["trainer"]["build"]["context"] == str(REPO)
    assert gpu["build"]["args"]["EXTRAS"] == "gpu"
    assert gpu["image"] != "dart:local"


def test_blobs_are_one_named_volume_mounted_at_one_path(stack: dict[str, Any]) -> None:
    assert {"blobs", "models", "checkpoints", "kafka-data", "clickhouse-data"} <= set(stack["volumes"])
    for name in BLOB_USERS:
        assert mounts(stack["services"][name]).get("blobs") == BLOBS_PATH, name
    targets = {mounts(svc)["blobs"] for svc in stack["services"].values() if "blobs" in mounts(svc)}
    assert targets == {BLOBS_PATH}


def test_data_volumes_sit_where_each_program_writes(stack: dict[str, Any]) -> None:
    services = stack["services"]
    kafka = services["kafka"]
    assert mounts(kafka)["kafka-data"] == kafka["environment"]["KAFKA_LOG_DIRS"]
    assert mounts(services["clickhouse"])["clickhouse-data"] == "/var/lib/clickhouse"
    trainer_cfg = yaml.safe_load((CONFIG_DIR / "trainer.yaml").read_text())["train"]
    assert mounts(services["trainer"])["checkpoints"] == trainer_cfg["checkpoint_dir"]
    models = mounts(services["model-init"])["models"]
    for name, config in (("trainer", "trainer.yaml"), ("rollout-worker", "rollout-worker.yaml"),
                         ("rollout-worker-gpu", "rollout-worker-gpu.yaml")):
        assert mounts(services[name])["models"] == models, name
        section = yaml.safe_load((CONFIG_DIR / config).read_text())
        model = (section.get("train") or section.get("rollout"))["model"]
        assert model.startswith(models + "/"), f"{config}: model {model} is outside the models volume"


def test_configs_name_the_shared_blob_path() -> None:
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        for section in ("data", "rollout", "train", "env"):
            if isinstance(data.get(section), dict) and "blobs" in data[section]:
                assert data[section]["blobs"] == BLOBS_PATH, path.name


def test_every_long_running_service_has_a_health_check(stack: dict[str, Any], gpu_stack: dict[str, Any]) -> None:
    running = long_running(gpu_stack["services"])
    assert {"kafka", "clickhouse", "data-manager", "env-worker", "rollout-worker", "trainer",
            "rollout-worker-gpu"} <= set(running)
    for name, svc in running.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
    assert "kafka-broker-api-versions.sh" in " ".join(running["kafka"]["healthcheck"]["test"])
    assert "/ping" in " ".join(running["clickhouse"]["healthcheck"]["test"])


def test_dart_health_checks_look_for_their_own_command(stack: dict[str, Any], gpu_stack: dict[str, Any]) -> None:
    runs_command = load_healthcheck().runs_command
    for name, svc in long_running(dart_services(gpu_stack["services"])).items():
        test = svc["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "/opt/dart/deploy/compose/healthcheck.py"], name
        assert runs_command(svc["command"], test[3:]), f"{name}: {test[3:]} does not match {svc['command']}"


def test_start_order_waits_for_health_and_for_one_shots(stack: dict[str, Any], gpu_stack: dict[str, Any]) -> None:
    services = gpu_stack["services"]
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            expected = "service_completed_successfully" if services[dep].get("restart") == "no" else "service_healthy"
            assert cond["condition"] == expected, f"{name} -> {dep}"
            assert "healthcheck" in services[dep] or expected != "service_healthy", dep
    for name, svc in long_running(dart_services(gpu_stack["services"])).items():
        assert {"kafka", "topics-init"} <= set(svc["depends_on"]), name
    assert "clickhouse" in services["data-manager"]["depends_on"]
    for name in ("rollout-worker", "rollout-worker-gpu", "trainer"):
        assert "model-init" in services[name]["depends_on"], name
    assert services["topics-init"]["command"] == ["dart", "topics", "ensure", "--bootstrap", "kafka:9092"]
    assert {"kafka", "topics-init"} <= set(services["tasks-init"]["depends_on"])


def test_services_reach_the_broker_on_its_in_network_listener(stack: dict[str, Any]) -> None:
    kafka = stack["services"]["kafka"]["environment"]
    advertised = kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert "PLAINTEXT://kafka:9092" in advertised
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert kafka["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    from dart.bus.config import BusConfig

    assert int(kafka["KAFKA_MESSAGE_MAX_BYTES"]) >= BusConfig().max_message_bytes
    clients = {name: svc for name, svc in dart_services(stack["services"]).items() if "kafka" in svc.get("depends_on", {})}
    assert {"topics-init", "tasks-init", "data-manager", "env-worker", "rollout-worker", "trainer"} <= set(clients)
    for name, svc in clients.items():
        assert svc["environment"]["DART_BOOTSTRAP"] == "kafka:9092", name


def test_scaled_services_have_no_fixed_name_or_host_port(stack: dict[str, Any]) -> None:
    for name in ("env-worker", "rollout-worker"):
        svc = stack["services"][name]
        assert "container_name" not in svc and "ports" not in svc, name
    for name, svc in stack["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def published_ports(svc: dict[str, Any]) -> set[str]:
    """Container ports ``svc`` publishes on the host (short ``host:port:target`` or long form)."""
    return {str(p["target"]) if isinstance(p, dict) else str(p).rsplit(":", 1)[-1] for p in svc.get("ports", [])}


def test_kafka_is_not_published_on_the_host(stack: dict[str, Any]) -> None:
    """Issue 54: the broker's listeners are plaintext, for the compose network; one published on
    the host's loopback let any local user read and write every topic that feeds the trainer."""
    kafka = stack["services"]["kafka"]
    assert published_ports(kafka) == set() and "network_mode" not in kafka
    env = kafka["environment"]
    listeners = {spec.split("://")[0] for spec in env["KAFKA_LISTENERS"].split(",")}
    assert listeners == {"PLAINTEXT", "CONTROLLER"}
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    ports = {spec.rsplit(":", 1)[-1] for spec in env["KAFKA_LISTENERS"].split(",")}
    for name, svc in stack["services"].items():
        assert not published_ports(svc) & ports, f"{name} publishes a Kafka listener"


SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|API_KEY", re.IGNORECASE)
SUBSTITUTION = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:?-[^}]*)?\}$")


def test_no_plaintext_secrets(raw_compose: dict[str, Any], stack: dict[str, Any]) -> None:
    seen = 0
    for name, svc in raw_compose["services"].items():
        env = svc.get("environment") or {}
        assert isinstance(env, dict), f"{name}: use the mapping form for environment"
        for key, value in env.items():
            if SECRET_KEY.search(key):
                seen += 1
                assert SUBSTITUTION.match(str(value)), f"{name}.{key} must come from the environment, got {value!r}"
                assert str(value).endswith(":-}"), f"{name}.{key} must not carry a default value"
    assert seen >= 2
    # The password set in the environment reaches secrets-init alone, which passes it on as files.
    holders = {name for name, svc in stack["services"].items()
               if PASSWORD_SENTINEL in yaml.safe_dump(svc.get("environment", {}))}
    assert holders == {"secrets-init"}
    for path in CONFIG_DIR.glob("*.yaml"):
        text = path.read_text()
        assert not re.search(r"^\s*(password|secret|token)\s*:", text, re.MULTILINE | re.IGNORECASE), path.name
    assert PASSWORD_SENTINEL not in COMPOSE_FILE.read_text()


def test_gpu_profile_reserves_a_gpu_for_a_vllm_worker(stack: dict[str, Any], gpu_stack: dict[str, Any]) -> None:
    svc = gpu_stack["services"]["rollout-worker-gpu"]
    assert svc["profiles"] == ["gpu"]
    (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert device["count"] == "all" or int(device["count"]) >= 1
    config = yaml.safe_load((CONFIG_DIR / svc["command"][-1].rsplit("/", 1)[-1]).read_text())
    assert config["rollout"]["engine"] == "vllm"
    cpu = yaml.safe_load((CONFIG_DIR / "rollout-worker.yaml").read_text())
    assert cpu["rollout"]["engine"] == "hf"
    # Everything else runs without a profile: `docker compose up` alone is the whole CPU stack.
    others = {name for name, s in stack["services"].items() if s.get("profiles") and name != "rollout-worker-gpu"}
    assert not others
    assert all("deploy" not in s for name, s in stack["services"].items() if name != "rollout-worker-gpu")
