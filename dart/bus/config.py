"""Connection settings for the event log, and client settings that suit the dev broker."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property

from dart.bus.topics import CATALOGUE, Topics
from dart.config import require

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


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

    @classmethod
    def from_env(cls, bootstrap: str | None = None, prefix: str | None = None) -> BusConfig:
        """Flags win over the environment (DART_BOOTSTRAP, DART_TOPIC_PREFIX), which wins over defaults."""
        return cls(
            bootstrap=bootstrap or os.environ.get("DART_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            prefix=prefix or os.environ.get("DART_TOPIC_PREFIX", "dart"),
        )
