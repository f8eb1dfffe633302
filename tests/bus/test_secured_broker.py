"""The dev broker secured, for real: TLS (the strongest setup the shipped tansu 0.6.0 runs)
and SASL (a broker that refuses; no user can be created on memory storage).

Configured clients (confluent-kafka and aiokafka, built from ``BusConfig``) produce and
consume over TLS; a client without TLS, or trusting another CA, is refused; ``dart doctor``
probes with the same settings; with ``--authentication`` a client with no or wrong
credentials is refused."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dart.bus.broker import BrokerTls, DevBroker, broker_answers, tansu_binary, throwaway_tls
from dart.bus.config import BusConfig, BusSecurity

pytestmark = [pytest.mark.kafka,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for the throwaway CA")]
ROOT = Path(__file__).resolve().parents[2]
QUIET = logging.getLogger("test.rdkafka.quiet")
QUIET.setLevel(logging.CRITICAL)


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory) -> Iterator[DevBroker]:
    tls = throwaway_tls(tmp_path_factory.mktemp("tls"))
    with DevBroker(tls=tls) as broker:
        yield broker


def secured(monkeypatch, broker: DevBroker, prefix: str) -> BusConfig:
    assert broker.tls is not None
    monkeypatch.setenv("DART_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("DART_KAFKA_CA_FILE", str(broker.tls.ca_file))
    monkeypatch.setenv("DART_KAFKA_CERT_FILE", str(broker.tls.client_cert_file))
    monkeypatch.setenv("DART_KAFKA_KEY_FILE", str(broker.tls.client_key_file))
    return BusConfig(bootstrap=broker.bootstrap, prefix=prefix)


def refused(bootstrap: str, **extra) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1500, "logger": QUIET,
                         "log.connection.close": False, **extra})
    try:
        admin.list_topics(timeout=3)
    except KafkaException:
        return True
    return False


async def test_configured_clients_produce_and_consume_over_tls(tls_broker, monkeypatch) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    cfg = secured(monkeypatch, tls_broker, f"tls-{uuid.uuid4().hex[:6]}")
    assert cfg.security.protocol == "SSL"
    topic = f"{cfg.prefix}.t"
    admin = AdminClient(cfg.librdkafka(logger=QUIET))
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)
    p = Producer(cfg.librdkafka(logger=QUIET))
    for i in range(3):
        p.produce(topic, key=b"k", value=f"confluent-{i}".encode())
    assert p.flush(10) == 0
    aio_producer = AIOKafkaProducer(**cfg.aiokafka())
    await aio_producer.start()
    try:
        await aio_producer.send_and_wait(topic, b"aiokafka-0", key=b"k")
    finally:
        await aio_producer.stop()
    consumer = AIOKafkaConsumer(topic, **cfg.aiokafka(group_id=f"{cfg.prefix}-g", auto_offset_reset="earliest",
                                                      session_timeout_ms=6000, heartbeat_interval_ms=1000))
    await consumer.start()
    try:
        got: list[bytes] = []
        async with asyncio.timeout(30):
            while len(got) < 4:
                batch = await consumer.getmany(timeout_ms=500)
                got += [m.value for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()
    assert got == [b"confluent-0", b"confluent-1", b"confluent-2", b"aiokafka-0"]
    c = Consumer(cfg.librdkafka(**{"group.id": f"{cfg.prefix}-c", "auto.offset.reset": "earliest",
                                   "session.timeout.ms": 6000, "logger": QUIET}))
    c.subscribe([topic])
    seen = []
    try:
        for _ in range(60):
            m = c.poll(0.5)
            if m is not None and not m.error():
                seen.append(m.value())
            if len(seen) == 4:
                break
    finally:
        c.close()
    assert seen == got


async def test_a_client_without_tls_or_trusting_another_ca_is_refused(tls_broker, tmp_path) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    assert broker_answers(tls_broker.bootstrap, security=tls_broker.client_security())
    assert refused(tls_broker.bootstrap)                                     # plaintext
    other = throwaway_tls(tmp_path / "other", name="other")
    assert refused(tls_broker.bootstrap, **{"security.protocol": "SSL", "ssl.ca.location": str(other.ca_file)})
    assert refused(tls_broker.bootstrap, **{"security.protocol": "SSL"})     # the system store does not trust it
    assert not broker_answers(tls_broker.bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=tls_broker.bootstrap, request_timeout_ms=3000)
    with pytest.raises(KafkaConnectionError):
        async with asyncio.timeout(20):
            await producer.start()
    await producer.stop()


def test_the_tls_front_is_the_only_way_in(tls_broker, tmp_path) -> None:
    """Issue 44: tansu's plaintext port is in a network namespace of its own (nothing on this
    host's loopback answers there), the relay socket is its owner's only, and a client must show
    a certificate signed by the broker's CA (trusting the CA is not enough)."""
    assert tls_broker.tls is not None and tls_broker.inner_port is not None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", tls_broker.inner_port)) != 0  # nothing listens here
    assert refused(f"127.0.0.1:{tls_broker.inner_port}")
    sock = tls_broker.relay_socket
    assert sock is not None and stat.S_ISSOCK(sock.stat().st_mode)
    assert sock.stat().st_mode & 0o777 == 0o600 and sock.parent.stat().st_mode & 0o777 == 0o700
    ca = str(tls_broker.tls.ca_file)
    assert refused(tls_broker.bootstrap, **{"security.protocol": "SSL", "ssl.ca.location": ca})  # no client cert
    other = throwaway_tls(tmp_path / "other", name="other")  # a client certificate from another CA
    assert refused(tls_broker.bootstrap, **{"security.protocol": "SSL", "ssl.ca.location": ca,
                                            "ssl.certificate.location": str(other.client_cert_file),
                                            "ssl.key.location": str(other.client_key_file)})
    assert broker_answers(tls_broker.bootstrap, security=tls_broker.client_security())


def test_dart_doctor_probes_the_broker_with_the_security_settings(tls_broker) -> None:
    assert tls_broker.tls is not None
    base = {k: v for k, v in os.environ.items() if not k.startswith("DART_KAFKA_")}
    base.update(PYTHONPATH=str(ROOT), DART_BOOTSTRAP=tls_broker.bootstrap)

    def doctor(**env: str) -> str:
        done = subprocess.run([sys.executable, "-m", "dart.cli", "doctor"], env={**base, **env}, capture_output=True,
                              text=True, timeout=120)
        return done.stdout + done.stderr

    with_tls = doctor(DART_KAFKA_SECURITY_PROTOCOL="SSL", DART_KAFKA_CA_FILE=str(tls_broker.tls.ca_file),
                      DART_KAFKA_CERT_FILE=str(tls_broker.tls.client_cert_file),
                      DART_KAFKA_KEY_FILE=str(tls_broker.tls.client_key_file))
    assert f"broker answers on {tls_broker.bootstrap} (SSL)" in with_tls
    assert f"no broker answers on {tls_broker.bootstrap} (PLAINTEXT)" in doctor()


def test_with_authentication_a_client_with_no_or_wrong_credentials_is_refused(tmp_path) -> None:
    with DevBroker(authentication=True, log_path=tmp_path / "broker.log") as broker:
        assert refused(broker.bootstrap)  # no credentials
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
            sasl = BusSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, username="dart", password="wrong")
            assert refused(broker.bootstrap, **sasl.librdkafka()), mechanism
            assert not broker_answers(broker.bootstrap, security=sasl)
        # What keeps SASL from logging anyone in here: a user cannot be created on memory storage.
        made = subprocess.run([str(tansu_binary()), "user", "create", "--broker", f"tcp://{broker.bootstrap}",
                               "--mechanism", "scram256", "dart", "dart-password"], capture_output=True, text=True,
                              timeout=30)
        assert made.returncode != 0 and "early eof" in made.stdout + made.stderr


def test_the_dev_broker_switches_to_tls_with_one_variable(tmp_path) -> None:
    env: dict[str, str] = {"DART_DEV_BROKER_TLS": "1"}
    broker = DevBroker(log_path=tmp_path / "broker.log")
    broker.use_tls_from_env(env)
    assert isinstance(broker.tls, BrokerTls) and broker.tls.ca_file.exists()
    assert env["DART_KAFKA_SECURITY_PROTOCOL"] == "SSL" and env["DART_KAFKA_CA_FILE"] == str(broker.tls.ca_file)
    assert oct(broker.tls.key_file.stat().st_mode & 0o777) == "0o600"
    with broker:
        assert broker_answers(broker.bootstrap, security=BusSecurity.from_env(env))
        assert refused(broker.bootstrap)


@pytest.mark.slow
def test_a_short_dart_up_runs_on_the_tls_dev_broker(tmp_path) -> None:
    """`dart up` with DART_DEV_BROKER_TLS=1 (its one switch): every service reaches the broker
    over TLS only (the advertised port serves nothing else) and the run finishes trajectories."""
    config = tmp_path / "up.yaml"
    config.write_text(
        f"run_id: tlsup\nworkdir: {tmp_path / 'run'}\nrl_minutes: 1.5\nmax_trajectories: 2\nevaluate: false\n"
        "recipe: {train_tasks: 2, eval_tasks: 2, eval_episodes: 2, sft_demos: 2, sft_steps: 1}\n"
        "data: {batcher: {groups_per_batch: 1}, curation: {n_default: 2}, scheduler: {max_new_tokens: 8}}\n"
        "env: {slots: 2}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DART_KAFKA_")}
    env.update(PYTHONPATH=str(ROOT), DART_DEV_BROKER_TLS="1")
    done = subprocess.run([sys.executable, "-m", "dart.cli", "up", str(config)], env=env, capture_output=True,
                          text=True, timeout=280)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert " (TLS), pid " in out  # the dev broker answered a TLS metadata request
    import json

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["trajectories"] >= 2 and summary["infra_errors"] == 0
    assert (tmp_path / "run" / "tls" / "dart-dev-ca.pem").exists()
