"""Connection settings for the event log, and client settings that suit the dev broker."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from dart.bus.topics import CATALOGUE, Topics
from dart.config import require
from dart.errors import ConfigError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@dataclass(frozen=True, kw_only=True)
class BusSecurity:
    """How clients authenticate to the broker and encrypt the connection (SASL and TLS).

    Read from the environment only (``from_env``), never from config files, so a password
    never lands in a YAML file or a shell history. The default (PLAINTEXT, no SASL) is the
    loopback dev broker. Every Kafka client dart builds takes its settings from
    ``BusConfig.librdkafka`` (confluent-kafka) or ``BusConfig.aiokafka`` (aiokafka), which
    both read this one object: one path, so no client can be left unsecured.
    """

    protocol: Protocol = "PLAINTEXT"
    """Kafka security.protocol. Environment: DART_KAFKA_SECURITY_PROTOCOL."""
    sasl_mechanism: Mechanism | None = None
    """SASL mechanism (SASL_* protocols only). Environment: DART_KAFKA_SASL_MECHANISM."""
    username: str | None = None
    """SASL user. Environment: DART_KAFKA_USERNAME."""
    password: str | None = field(default=None, repr=False)
    """SASL password (kept out of repr and logs). Environment: DART_KAFKA_PASSWORD_FILE, a file
    holding it (the Docker-secrets convention: preferred, since a process's start-up
    environment stays readable in /proc/<pid>/environ), else DART_KAFKA_PASSWORD. A client
    must hold it in memory for as long as it connects (SASL sends it, or proves it, on every
    connection)."""
    ca_file: str | None = None
    """PEM CA bundle that signed the broker's certificate (TLS; None: the system store).
    Environment: DART_KAFKA_CA_FILE."""
    cert_file: str | None = None
    """Client certificate for mutual TLS. Environment: DART_KAFKA_CERT_FILE."""
    key_file: str | None = None
    """Client private key for mutual TLS. Environment: DART_KAFKA_KEY_FILE."""

    def __post_init__(self) -> None:
        require(self.protocol in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), "DART_KAFKA_SECURITY_PROTOCOL",
                f"must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, got {self.protocol!r}")
        if self.sasl:
            require(self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), "DART_KAFKA_SASL_MECHANISM",
                    f"must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with {self.protocol}, got {self.sasl_mechanism!r}")
            require(bool(self.username) and self.password is not None, "DART_KAFKA_USERNAME",
                    f"{self.protocol} needs DART_KAFKA_USERNAME and DART_KAFKA_PASSWORD")
        else:
            require(self.sasl_mechanism is None and self.username is None, "DART_KAFKA_SASL_MECHANISM",
                    f"SASL settings need DART_KAFKA_SECURITY_PROTOCOL=SASL_SSL or SASL_PLAINTEXT, not {self.protocol}")
        require(self.tls or not (self.ca_file or self.cert_file or self.key_file), "DART_KAFKA_CA_FILE",
                f"TLS files need DART_KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL, not {self.protocol}")
        require((self.cert_file is None) == (self.key_file is None), "DART_KAFKA_CERT_FILE",
                "mutual TLS needs both DART_KAFKA_CERT_FILE and DART_KAFKA_KEY_FILE")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BusSecurity:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(f"DART_KAFKA_{name}") or None

        password = env.get("DART_KAFKA_PASSWORD")
        if path := get("PASSWORD_FILE"):
            try:
                password = Path(path).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"DART_KAFKA_PASSWORD_FILE: cannot read {path}: {exc}") from exc
        return cls(protocol=(get("SECURITY_PROTOCOL") or "PLAINTEXT").upper(),  # type: ignore[arg-type]
                   sasl_mechanism=(m.upper() if (m := get("SASL_MECHANISM")) else None),  # type: ignore[arg-type]
                   username=get("USERNAME"), password=password,
                   ca_file=get("CA_FILE"), cert_file=get("CERT_FILE"), key_file=get("KEY_FILE"))

    def librdkafka(self) -> dict[str, Any]:
        """The confluent-kafka (librdkafka) properties."""
        out: dict[str, Any] = {"security.protocol": self.protocol}
        if self.sasl:
            out.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.username,
                        "sasl.password": self.password})
        if self.tls:
            out.update({k: v for k, v in (("ssl.ca.location", self.ca_file), ("ssl.certificate.location", self.cert_file),
                                          ("ssl.key.location", self.key_file)) if v})
        return out

    def aiokafka(self) -> dict[str, Any]:
        """The aiokafka keyword arguments (same meaning as ``librdkafka``)."""
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.sasl:
            out.update({"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.username,
                        "sasl_plain_password": self.password})
        if self.tls:
            # aiokafka wants an SSLContext; it verifies the broker's certificate and host name.
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
            out["ssl_context"] = context
        return out


@dataclass(frozen=True, kw_only=True)
class BusConfig:
    bootstrap: str = DEFAULT_BOOTSTRAP
    """Kafka bootstrap servers, host:port[,host:port]. Environment: DART_BOOTSTRAP."""
    prefix: str = "dart"
    """Topic name prefix; runs and tests that share a broker use different prefixes."""
    session_timeout_ms: int = 6000
    """Consumer-group session timeout. Tansu takes about half of it to finish a group join,
    so keep it small on the dev broker (2-6 s) and Kafka's default (45 s) in production."""
    heartbeat_interval_ms: int = 1000
    """Consumer-group heartbeat interval (must be well under session_timeout_ms)."""
    fetch_max_wait_ms: int = 20
    """How long a fetch may wait for data: small, because replies to env workers ride on it."""
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest record the clients accept (events stay small; blobs carry the payloads)."""
    security: BusSecurity = field(default_factory=BusSecurity.from_env, init=False)
    """SASL/TLS settings, always from the environment (DART_KAFKA_*, see ``BusSecurity``): not
    an init field, so a config file cannot carry a broker password."""

    partitions: dict[str, int] = field(default_factory=dict)
    """Partitions per topic suffix, over the catalogue's defaults (e.g. ``{"rollout.actions": 128}``:
    at least one per env worker, so that every worker gets a reply partition of its own). Used
    when topics are created; an existing topic keeps its partitions."""

    def __post_init__(self) -> None:
        require(bool(self.bootstrap.strip()), "bus.bootstrap", "must name at least one host:port")
        require(all(":" in h for h in self.bootstrap.split(",")), "bus.bootstrap",
                f"expected host:port[,host:port], got {self.bootstrap!r}")
        require(bool(self.prefix) and " " not in self.prefix, "bus.prefix", f"bad prefix {self.prefix!r}")
        require(self.heartbeat_interval_ms < self.session_timeout_ms, "bus.heartbeat_interval_ms",
                "must be smaller than session_timeout_ms")
        known = {spec.suffix for spec in CATALOGUE}
        for suffix, n in self.partitions.items():
            require(suffix in known, f"bus.partitions.{suffix}", f"not a catalogue topic (known: {sorted(known)})")
            require(n >= 1, f"bus.partitions.{suffix}", f"must be >= 1, got {n}")

    def partitions_of(self, suffix: str) -> int:
        """Partitions a catalogue topic is created with: ``partitions`` or else the catalogue's."""
        return self.partitions.get(suffix) or next(s.partitions for s in CATALOGUE if s.suffix == suffix)

    @cached_property
    def topics(self) -> Topics:
        return Topics(self.prefix)

    def group_id(self, group: str) -> str:
        """The broker's id of consumer group ``group`` of this run: ``<prefix>.<group>``. Runs (and
        tests) that share a broker never share a group, so one run's members never hold up another
        run's rebalance, an offset restore never meets another run's live members, and a Kafka
        ACL can grant a run its groups by prefix, as it does its topics."""
        return f"{self.prefix}.{group}"

    def librdkafka(self, **extra: Any) -> dict[str, Any]:
        """Properties for a confluent-kafka Producer/AdminClient: bootstrap + security + ``extra``
        (keys as librdkafka spells them, dots and all: pass them as a dict with ``**``)."""
        return {"bootstrap.servers": self.bootstrap, **self.security.librdkafka(), **extra}

    def aiokafka(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments for an aiokafka client: bootstrap + security + ``extra``."""
        return {"bootstrap_servers": self.bootstrap, **self.security.aiokafka(), **extra}

    @classmethod
    def from_env(cls, bootstrap: str | None = None, prefix: str | None = None) -> BusConfig:
        """Flags win over the environment (DART_BOOTSTRAP, DART_TOPIC_PREFIX), which wins over defaults."""
        return cls(
            bootstrap=bootstrap or os.environ.get("DART_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            prefix=prefix or os.environ.get("DART_TOPIC_PREFIX", "dart"),
        )
