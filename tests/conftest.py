"""Suite-wide fixtures: one real broker per session (the same code as `dart broker`), a
unique topic prefix per test, a blob store per test, one tiny random Qwen2.5-VL per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from dart.blobs import LocalBlobStore
from dart.bus import BusConfig, DevBroker, ensure_topics

# Property-based suites (hypothesis) stay bounded in `make test`; `make fuzz` runs them with the
# "fuzz" profile. Suites set no max_examples of their own, so the profile decides.
settings.register_profile("default", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=int(os.environ.get("FUZZ_EXAMPLES", "20000")), deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DART_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with DevBroker(log_path=log) as b:
        yield b


@pytest.fixture
def bus(broker: DevBroker) -> BusConfig:
    """A BusConfig on the session broker with a topic prefix of its own, topics created."""
    cfg = BusConfig(bootstrap=broker.bootstrap, prefix=f"t{uuid.uuid4().hex[:10]}", session_timeout_ms=3000,
                    heartbeat_interval_ms=500)
    ensure_topics(cfg)
    return cfg


@pytest.fixture
def blobs(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from dart.agent.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def policy(tiny_dir):
    from dart.agent.model import load_policy

    return load_policy(tiny_dir)


@pytest.fixture
def store(blobs: LocalBlobStore) -> LocalBlobStore:
    """The per-test blob store, under the name the prompt, model and engine tests use."""
    return blobs


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = SHARED / "data"
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (set DART_SHARED)")
    return path
