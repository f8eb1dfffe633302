"""deploy/prometheus/prometheus.yml, read as data against docker-compose.yml (the Prometheus image
cannot be pulled here): a scrape job per long-running dart service of the compose file, found by
DNS so that every replica of a scaled service is scraped, on the port the services serve on."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.stack import REPO
from tests.deploy.test_compose import dart_services, long_running

PROMETHEUS = REPO / "deploy" / "prometheus" / "prometheus.yml"
PORT = 9400
"""DART_METRICS_PORT of the compose services (dart.bus.prom serves /metrics there)."""


def jobs() -> dict[str, dict[str, Any]]:
    cfg = yaml.safe_load(PROMETHEUS.read_text())
    names = [job["job_name"] for job in cfg["scrape_configs"]]
    assert len(names) == len(set(names)), "job names must be unique"
    return {job["job_name"]: job for job in cfg["scrape_configs"]}


def scraped_services(raw_compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return long_running(dart_services(raw_compose["services"]))


def test_every_long_running_dart_service_is_a_job_found_by_dns_on_the_metrics_port(raw_compose):
    cfg = yaml.safe_load(PROMETHEUS.read_text())
    assert float(cfg["global"]["scrape_timeout"].rstrip("s")) < float(cfg["global"]["scrape_interval"].rstrip("s"))
    found = jobs()
    services = scraped_services(raw_compose)
    assert {"data-manager", "env-worker", "rollout-worker", "trainer", "archiver"} <= set(services)
    assert set(found) - {"prometheus"} == set(services)
    for name in services:
        (sd,) = found[name]["dns_sd_configs"]
        assert (sd["names"], sd["type"], sd["port"]) == ([name], "A", PORT), name


def test_the_compose_services_serve_metrics_where_prometheus_scrapes(raw_compose):
    for name, svc in scraped_services(raw_compose).items():
        env = svc.get("environment") or {}
        assert str(env.get("DART_METRICS_PORT")) == str(PORT) and env.get("DART_METRICS_HOST") == "0.0.0.0", name
    prometheus = raw_compose["services"]["prometheus"]
    assert any(v.startswith("./deploy/prometheus/prometheus.yml:") for v in prometheus["volumes"])
