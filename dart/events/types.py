"""Typed records for every event on the log.

Each class mirrors ``schemas/<Name>.avsc`` field for field (a test holds them together).
Records are frozen: an event is a fact, and facts do not change after they are written.
Build one with ``Cls.new(run_id=..., producer=..., **fields)`` to get a fresh ``event_id``
and ``event_time``.
"""

from __future__ import annotations

import array
import hashlib
import time
import uuid
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar, Self

# Per-token arrays travel as packed little-endian bytes: an Avro array of numbers is written and
# read one element at a time, which made encode+decode slower than the broker itself.
PACKED_INT32 = {"avro": "packed_int32"}
PACKED_FLOAT32 = {"avro": "packed_float32"}


def now_ms() -> int:
    """Wall-clock time in ms since the epoch (the unit of ``event_time``)."""
    return int(time.time() * 1000)


def new_event_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """Envelope carried by every event."""

    SCHEMA: ClassVar[str] = ""
    event_id: str
    """UUID of this event; consumers are idempotent on it."""
    event_time: int
    """Creation time, ms since the epoch (Avro timestamp-millis)."""
    run_id: str
    """Training run the event belongs to."""
    producer: str
    """Worker id of the producing process."""

    @classmethod
    def new(cls, *, run_id: str, producer: str, **fields: Any) -> Self:
        """A new event with a fresh id and the current time."""
        return cls(event_id=new_event_id(), event_time=now_ms(), run_id=run_id, producer=producer, **fields)


# ---------------------------------------------------------------- nested records


@dataclass(frozen=True, kw_only=True, slots=True)
class Sampling:
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    """Per-request seed; never one fixed seed for every request."""
    frequency_penalty: float = 0.0

    def at_step(self, step_index: int) -> Sampling:
        """The sampling of turn ``step_index`` of this request's trajectory: the same settings
        with a seed of the turn's own (:func:`step_seed`)."""
        return replace(self, seed=step_seed(self.seed, step_index))


def step_seed(seed: int, step_index: int) -> int:
    """A 31-bit seed for turn ``step_index`` of a trajectory sampled under ``seed``.

    Every turn needs its own: with one seed for all of them, an engine that seeds a generator per
    request draws the same random numbers at every turn, and a trajectory becomes one draw
    repeated (a rollout that takes the likeliest answer at its first turn takes it at every turn),
    not a sample of the policy. Deterministic, so a replayed run draws the same numbers."""
    digest = hashlib.blake2b(f"{seed}:{step_index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedAction:
    """A typed action in screen pixels; ``kind == 'invalid'`` carries the reason in ``text``."""

    kind: str
    x: float | None = None
    y: float | None = None
    end_x: float | None = None
    end_y: float | None = None
    text: str | None = None
    direction: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplyRoute:
    topic: str
    partition: int
    worker_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryTurn:
    step_index: int
    screenshot_digest: str
    response_text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class BlobRef:
    name: str
    digest: str
    size_bytes: int


class TrajectoryStatus(StrEnum):
    SUCCESS = "success"
    FAIL = "fail"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"
    """The environment failed: re-queued and kept out of training, never a reward of 0."""


# ---------------------------------------------------------------- events


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskRegistered(Event):
    SCHEMA: ClassVar[str] = "dart.v1.TaskRegistered"
    task_id: str
    domain: str
    instruction: str
    backend: str
    split: str = "train"
    task_json: str
    source: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutRequested(Event):
    SCHEMA: ClassVar[str] = "dart.v1.RolloutRequested"
    request_id: str
    task_id: str
    group_id: str
    rollout_index: int
    group_size: int
    max_steps: int
    attempt: int = 0
    mode: str = "train"
    backend: str = "synthetic"
    sampling: Sampling
    scheduled_at_version: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ObservationEmitted(Event):
    """A step's question on the log: its :class:`~dart.events.manifest.PromptContext` plus where it
    belongs (rollout, group) and where to reply. Why a shape of its own: it is the Avro record."""

    SCHEMA: ClassVar[str] = "dart.v1.ObservationEmitted"
    rollout_id: str
    request_id: str
    task_id: str
    group_id: str
    step_index: int
    instruction: str
    screenshot_digest: str
    screen_width: int
    screen_height: int
    history: list[HistoryTurn]
    reply: ReplyRoute
    sampling: Sampling
    max_steps: int
    mode: str = "train"
    env_worker: str
    slot: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ActionChosen(Event):
    """A step's answer on the log: a :class:`~dart.agent.decide.Decision` flattened, with the
    engine's timings. Why a shape of its own: it is the Avro record (the projection's columns keep
    its field names, and so does the manifest's ``Sample``, ``logprobs`` -> ``rollout_logprobs`` aside)."""

    SCHEMA: ClassVar[str] = "dart.v1.ActionChosen"
    in_reply_to: str
    rollout_id: str
    request_id: str
    task_id: str
    step_index: int
    response_text: str
    actions: list[ParsedAction]
    response_token_ids: array.array = field(metadata=PACKED_INT32)
    """array('i'); lists are accepted and converted."""
    logprobs: array.array = field(metadata=PACKED_FLOAT32)
    """array('f'): log-probs of the raw policy distribution (temperature 1), float32."""
    entropies: array.array = field(metadata=PACKED_FLOAT32)
    policy_version: int
    prompt_hash: str
    prompt_tokens: int
    finish_reason: str
    engine: str
    queue_s: float
    generate_s: float
    sampling: Sampling
    newer_version_seen: int | None = None

    def __post_init__(self) -> None:
        # Packed arrays stay arrays: decoding a step's per-token arrays into lists cost more than the
        # broker round trip.
        for name, code in (("response_token_ids", "i"), ("logprobs", "f"), ("entropies", "f")):
            value = getattr(self, name)
            if type(value) is not array.array or value.typecode != code:
                object.__setattr__(self, name, array.array(code, value))


@dataclass(frozen=True, kw_only=True, slots=True)
class TrajectoryFinished(Event):
    SCHEMA: ClassVar[str] = "dart.v1.TrajectoryFinished"
    rollout_id: str
    request_id: str
    task_id: str
    group_id: str
    rollout_index: int
    status: TrajectoryStatus
    finish_reason: str
    num_steps: int
    max_steps: int
    step_policy_versions: list[int]
    error: str | None = None
    attempt: int = 0
    mode: str = "train"
    origin: str = "online"
    env_worker: str
    slot: int
    reset_s: float
    env_s: float
    policy_wait_s: float
    eval_s: float
    started_at: int


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardAssigned(Event):
    SCHEMA: ClassVar[str] = "dart.v1.RewardAssigned"
    rollout_id: str
    task_id: str
    group_id: str
    reward: float
    evaluator: str
    evaluator_version: str
    details: str = "{}"


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchAssembled(Event):
    SCHEMA: ClassVar[str] = "dart.v1.BatchAssembled"
    batch_id: str
    seq: int
    manifest_digest: str
    manifest_bytes: int
    num_samples: int
    num_groups: int
    num_trajectories: int
    rollout_ids: list[str]
    task_ids: list[str]
    min_policy_version: int
    max_policy_version: int
    trainer_version: int
    injected: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightsPublished(Event):
    SCHEMA: ClassVar[str] = "dart.v1.WeightsPublished"
    version: int
    parent_version: int
    blobs: list[BlobRef]
    sha256: str
    format: str = "safetensors"
    train_step: int
    batch_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainStepCompleted(Event):
    SCHEMA: ClassVar[str] = "dart.v1.TrainStepCompleted"
    step: int
    policy_version: int
    batch_id: str
    loss: float
    kl: float
    entropy: float
    clip_frac: float
    tis_mean: float
    logprob_mismatch: float
    grad_norm: float
    num_samples: int
    num_tokens: int
    duration_s: float
    tokens_per_s: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerHeartbeat(Event):
    SCHEMA: ClassVar[str] = "dart.v1.WorkerHeartbeat"
    worker_id: str
    role: str
    state: str
    host: str
    pid: int
    slots: int
    slots_busy: int
    busy_s: float
    idle_s: float
    uptime_s: float
    policy_version: int | None = None
    health: str = "ok"
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightsLoaded(Event):
    SCHEMA: ClassVar[str] = "dart.v1.WeightsLoaded"
    worker_id: str
    version: int
    previous_version: int
    ok: bool
    fetch_s: float
    swap_s: float
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetter(Event):
    SCHEMA: ClassVar[str] = "dart.v1.DeadLetter"
    source_topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes
    stage: str
    error_type: str
    error: str
    consumer_group: str


EVENT_TYPES: tuple[type[Event], ...] = (
    TaskRegistered,
    RolloutRequested,
    ObservationEmitted,
    ActionChosen,
    TrajectoryFinished,
    RewardAssigned,
    BatchAssembled,
    WeightsPublished,
    TrainStepCompleted,
    WorkerHeartbeat,
    WeightsLoaded,
    DeadLetter,
)
