"""Event -> projection row: one pure function per event type.

Each function returns a dict whose keys are the table's columns (``schema.py``), in table
order. Why a shape of its own (a plain dict, not a dataclass): it is the insert into ClickHouse,
column for column; the columns keep the events' field names. No clock, no database: the same
event always gives the same row, which is what makes a replay of the log rebuild the same
projection.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from dart.events import (
    ActionChosen,
    BatchAssembled,
    DeadLetter,
    Event,
    ObservationEmitted,
    ParsedAction,
    RewardAssigned,
    RolloutRequested,
    Sampling,
    TaskRegistered,
    TrainStepCompleted,
    TrajectoryFinished,
    WeightsLoaded,
    WeightsPublished,
    WorkerHeartbeat,
)

Row = dict[str, Any]
_ACTION_FIELDS = tuple(f.name for f in fields(ParsedAction))  # asdict() is the slow part of a row


def masked_mean(values: Sequence[float], length: int | None = None) -> float:
    """Mean of the first ``length`` values (the real tokens; padding never counts); 0.0 if none."""
    n = len(values) if length is None else min(length, len(values))
    return float(sum(values[:n]) / n) if n > 0 else 0.0


def _envelope(e: Event) -> Row:
    return {"event_id": e.event_id, "event_time": e.event_time, "run_id": e.run_id, "producer": e.producer}


def _sampling(s: Sampling) -> Row:
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_new_tokens": s.max_new_tokens,
        "seed": s.seed,
        "frequency_penalty": s.frequency_penalty,
    }


def task_row(e: TaskRegistered) -> Row:
    return {
        **_envelope(e), "task_id": e.task_id, "domain": e.domain, "instruction": e.instruction,
        "backend": e.backend, "split": e.split, "task_json": e.task_json, "source": e.source,
    }


def request_row(e: RolloutRequested) -> Row:
    return {
        **_envelope(e), "request_id": e.request_id, "task_id": e.task_id, "group_id": e.group_id,
        "rollout_index": e.rollout_index, "group_size": e.group_size, "max_steps": e.max_steps,
        "attempt": e.attempt, "mode": e.mode, "backend": e.backend, **_sampling(e.sampling),
        "scheduled_at_version": e.scheduled_at_version,
    }


def observation_row(e: ObservationEmitted) -> Row:
    # Why a step has this shape: a ClickHouse table holds columns, so the history is three
    # parallel arrays here (``projection.steps_of`` zips them back into HistoryTurns).
    return {
        **_envelope(e), "rollout_id": e.rollout_id, "request_id": e.request_id, "task_id": e.task_id,
        "group_id": e.group_id, "step_index": e.step_index, "instruction": e.instruction,
        "screenshot_digest": e.screenshot_digest, "screen_width": e.screen_width,
        "screen_height": e.screen_height,
        "history_step_index": [h.step_index for h in e.history],
        "history_screenshot_digest": [h.screenshot_digest for h in e.history],
        "history_response_text": [h.response_text for h in e.history],
        "reply_topic": e.reply.topic, "reply_partition": e.reply.partition, "reply_worker": e.reply.worker_id,
        **_sampling(e.sampling), "max_steps": e.max_steps, "mode": e.mode, "env_worker": e.env_worker,
        "slot": e.slot,
    }


def action_row(e: ActionChosen) -> Row:
    return {
        **_envelope(e), "in_reply_to": e.in_reply_to, "rollout_id": e.rollout_id,
        "request_id": e.request_id, "task_id": e.task_id, "step_index": e.step_index,
        "response_text": e.response_text, "action_kinds": [a.kind for a in e.actions],
        "actions_json": json.dumps([{k: getattr(a, k) for k in _ACTION_FIELDS} for a in e.actions],
                                   separators=(",", ":")),
        "response_token_ids": list(e.response_token_ids), "logprobs": list(e.logprobs),
        "entropies": list(e.entropies), "num_tokens": len(e.response_token_ids),
        # Entropies may be padded past the response; only real tokens count.
        "mean_entropy": masked_mean(e.entropies, len(e.response_token_ids)),
        "policy_version": e.policy_version, "prompt_hash": e.prompt_hash,
        "prompt_tokens": e.prompt_tokens, "finish_reason": e.finish_reason, "engine": e.engine,
        "queue_s": e.queue_s, "generate_s": e.generate_s, **_sampling(e.sampling),
        "newer_version_seen": e.newer_version_seen,
    }


def trajectory_row(e: TrajectoryFinished) -> Row:
    versions = list(e.step_policy_versions)
    return {
        **_envelope(e), "rollout_id": e.rollout_id, "request_id": e.request_id, "task_id": e.task_id,
        "group_id": e.group_id, "rollout_index": e.rollout_index, "status": str(e.status),
        "finish_reason": e.finish_reason, "num_steps": e.num_steps, "max_steps": e.max_steps,
        "step_policy_versions": versions,
        "min_policy_version": min(versions) if versions else 0,
        "max_policy_version": max(versions) if versions else 0,
        "error": e.error, "attempt": e.attempt, "mode": e.mode, "origin": e.origin,
        "env_worker": e.env_worker, "slot": e.slot, "reset_s": e.reset_s, "env_s": e.env_s,
        "policy_wait_s": e.policy_wait_s, "eval_s": e.eval_s, "started_at": e.started_at,
    }


def reward_row(e: RewardAssigned) -> Row:
    return {
        **_envelope(e), "rollout_id": e.rollout_id, "task_id": e.task_id, "group_id": e.group_id,
        "reward": e.reward, "evaluator": e.evaluator, "evaluator_version": e.evaluator_version,
        "details": e.details,
    }


def batch_row(e: BatchAssembled) -> Row:
    return {
        **_envelope(e), "batch_id": e.batch_id, "seq": e.seq, "manifest_digest": e.manifest_digest,
        "manifest_bytes": e.manifest_bytes, "num_samples": e.num_samples, "num_groups": e.num_groups,
        "num_trajectories": e.num_trajectories, "rollout_ids": list(e.rollout_ids),
        "task_ids": list(e.task_ids), "min_policy_version": e.min_policy_version,
        "max_policy_version": e.max_policy_version, "trainer_version": e.trainer_version,
        "injected": e.injected,
    }


def weights_row(e: WeightsPublished) -> Row:
    return {
        **_envelope(e), "version": e.version, "parent_version": e.parent_version,
        "blob_names": [b.name for b in e.blobs], "blob_digests": [b.digest for b in e.blobs],
        "blob_sizes": [b.size_bytes for b in e.blobs], "sha256": e.sha256, "format": e.format,
        "train_step": e.train_step, "batch_id": e.batch_id,
    }


def train_metrics_row(e: TrainStepCompleted) -> Row:
    return {
        **_envelope(e), "step": e.step, "policy_version": e.policy_version, "batch_id": e.batch_id,
        "loss": e.loss, "kl": e.kl, "entropy": e.entropy, "clip_frac": e.clip_frac,
        "tis_mean": e.tis_mean, "logprob_mismatch": e.logprob_mismatch, "grad_norm": e.grad_norm,
        "num_samples": e.num_samples, "num_tokens": e.num_tokens, "duration_s": e.duration_s,
        "tokens_per_s": e.tokens_per_s, "metrics": dict(e.metrics),
    }


def heartbeat_row(e: WorkerHeartbeat) -> Row:
    return {
        **_envelope(e), "worker_id": e.worker_id, "role": e.role, "state": e.state, "host": e.host,
        "pid": e.pid, "slots": e.slots, "slots_busy": e.slots_busy, "busy_s": e.busy_s,
        "idle_s": e.idle_s, "uptime_s": e.uptime_s, "policy_version": e.policy_version,
        "health": e.health, "metrics": dict(e.metrics), "info": dict(e.info),
    }


def weights_loaded_row(e: WeightsLoaded) -> Row:
    return {
        **_envelope(e), "worker_id": e.worker_id, "version": e.version,
        "previous_version": e.previous_version, "ok": e.ok, "fetch_s": e.fetch_s,
        "swap_s": e.swap_s, "error": e.error,
    }


def dead_letter_row(e: DeadLetter) -> Row:
    # Bytes go into String columns as-is (ClickHouse strings are byte strings).
    return {
        **_envelope(e), "source_topic": e.source_topic, "partition": e.partition, "offset": e.offset,
        "key": e.key, "value": e.value, "stage": e.stage, "error_type": e.error_type,
        "error": e.error, "consumer_group": e.consumer_group,
    }


ROWS: dict[type[Event], tuple[str, Callable[[Any], Row]]] = {
    TaskRegistered: ("tasks", task_row),
    RolloutRequested: ("requests", request_row),
    ObservationEmitted: ("observations", observation_row),
    ActionChosen: ("actions", action_row),
    TrajectoryFinished: ("trajectories", trajectory_row),
    RewardAssigned: ("rewards", reward_row),
    BatchAssembled: ("batches", batch_row),
    WeightsPublished: ("weights", weights_row),
    TrainStepCompleted: ("train_metrics", train_metrics_row),
    WorkerHeartbeat: ("heartbeats", heartbeat_row),
    WeightsLoaded: ("weights_loaded", weights_loaded_row),
    DeadLetter: ("dead_letters", dead_letter_row),
}
"""Event type -> (table, row function)."""

TABLES: tuple[str, ...] = tuple(table for table, _ in ROWS.values())


def to_row(event: Event) -> tuple[str, Row]:
    """The (table, row) an event projects to; KeyError for a type with no table."""
    table, fn = ROWS[type(event)]
    return table, fn(event)


def group_rows(events: Sequence[Event]) -> dict[str, list[Row]]:
    """Rows of many events grouped by table (insert order kept)."""
    out: dict[str, list[Row]] = {}
    for event in events:
        table, row = to_row(event)
        out.setdefault(table, []).append(row)
    return out
