"""Event types and their Avro single-object wire format.

The types load with the package; the codec (fastavro, the schemas) on first use of ``decode``,
``encode``, ``registry`` or ``to_json_dict``: what only needs the types (the guest agent's wire
actions) does not pull it in.
"""

from typing import TYPE_CHECKING, Any

from dart.events.types import (
    EVENT_TYPES,
    ActionChosen,
    BatchAssembled,
    BlobRef,
    DeadLetter,
    Event,
    HistoryTurn,
    ObservationEmitted,
    ParsedAction,
    ReplyRoute,
    RewardAssigned,
    RolloutRequested,
    Sampling,
    TaskRegistered,
    TrainStepCompleted,
    TrajectoryFinished,
    TrajectoryStatus,
    WeightsLoaded,
    WeightsPublished,
    WorkerHeartbeat,
    new_event_id,
    now_ms,
)

if TYPE_CHECKING:
    from dart.events.codec import decode, encode, registry, to_json_dict

_CODEC = frozenset({"decode", "encode", "registry", "to_json_dict"})


def __getattr__(name: str) -> Any:
    if name in _CODEC:
        # Deferred: loads fastavro, needed only here.
        from dart.events import codec

        return getattr(codec, name)
    raise AttributeError(f"module 'dart.events' has no attribute {name!r}")


__all__ = [
    "EVENT_TYPES",
    "ActionChosen",
    "BatchAssembled",
    "BlobRef",
    "DeadLetter",
    "Event",
    "HistoryTurn",
    "ObservationEmitted",
    "ParsedAction",
    "ReplyRoute",
    "RewardAssigned",
    "RolloutRequested",
    "Sampling",
    "TaskRegistered",
    "TrainStepCompleted",
    "TrajectoryFinished",
    "TrajectoryStatus",
    "WeightsLoaded",
    "WeightsPublished",
    "WorkerHeartbeat",
    "decode",
    "encode",
    "new_event_id",
    "now_ms",
    "registry",
    "to_json_dict",
]
