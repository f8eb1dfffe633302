"""SASL/TLS settings: read from the environment once, handed to both Kafka client libraries."""

from __future__ import annotations

import pytest

from dart.bus.config import BusConfig, BusSecurity
from dart.config import build
from dart.errors import ConfigError

SCRAM = {"DART_KAFKA_SECURITY_PROTOCOL": "sasl_ssl", "DART_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
         "DART_KAFKA_USERNAME": "dart", "DART_KAFKA_PASSWORD": "s3cret"}


def test_loopback_default_is_plaintext_with_nothing_else() -> None:
    sec = BusSecurity.from_env({})
    assert sec.librdkafka() == {"security.protocol": "PLAINTEXT"}
    assert sec.aiokafka() == {"security_protocol": "PLAINTEXT"}


def test_sasl_scram_over_tls_reaches_both_clients_with_the_same_meaning() -> None:
    sec = BusSecurity.from_env(SCRAM)
    assert sec.librdkafka() == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                "sasl.username": "dart", "sasl.password": "s3cret"}
    aio = sec.aiokafka()
    assert {k: v for k, v in aio.items() if k != "ssl_context"} == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "dart", "sasl_plain_password": "s3cret"}
    assert aio["ssl_context"].check_hostname
    assert "s3cret" not in repr(sec)


async def test_every_client_the_bus_builds_gets_the_security_settings(monkeypatch) -> None:
    import logging

    from aiokafka import AIOKafkaConsumer
    from confluent_kafka import Producer as KafkaProducer

    for k, v in SCRAM.items():
        monkeypatch.setenv(k, v)
    cfg = BusConfig(bootstrap="127.0.0.1:1")
    assert cfg.librdkafka(**{"client.id": "x"})["sasl.mechanism"] == "SCRAM-SHA-512"
    assert cfg.aiokafka(group_id="g")["sasl_plain_password"] == "s3cret"
    # Both libraries accept the settings as given (they are checked at construction, before any connection).
    quiet = logging.getLogger("test.rdkafka.quiet")
    quiet.setLevel(logging.CRITICAL)
    KafkaProducer(cfg.librdkafka(**{"client.id": "x", "logger": quiet})).flush(0)
    AIOKafkaConsumer(**cfg.aiokafka(group_id="g"))


@pytest.mark.parametrize("env, field", [
    ({"DART_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "DART_KAFKA_SASL_MECHANISM"),
    ({"DART_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "DART_KAFKA_SASL_MECHANISM": "PLAIN"}, "DART_KAFKA_USERNAME"),
    ({"DART_KAFKA_SASL_MECHANISM": "PLAIN"}, "DART_KAFKA_SASL_MECHANISM"),
    ({"DART_KAFKA_SECURITY_PROTOCOL": "TLS"}, "DART_KAFKA_SECURITY_PROTOCOL"),
    ({"DART_KAFKA_CA_FILE": "/ca.pem"}, "DART_KAFKA_CA_FILE"),
    ({"DART_KAFKA_SECURITY_PROTOCOL": "SSL", "DART_KAFKA_CERT_FILE": "/c.pem"}, "DART_KAFKA_CERT_FILE"),
])
def test_incomplete_settings_name_the_variable_to_fix(env, field) -> None:
    with pytest.raises(ConfigError, match=field):
        BusSecurity.from_env(env)


def test_a_config_file_cannot_carry_broker_credentials() -> None:
    with pytest.raises(ConfigError, match=r"unknown field bus\.security"):
        build(BusConfig, {"security": {"password": "x"}}, path="bus")
