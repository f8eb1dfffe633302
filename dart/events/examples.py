"""One realistic instance of every event type, for tests, benchmarks and `dart demo`."""

from __future__ import annotations

import random

from dart.events.types import (
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
    now_ms,
)

RUN = "example-run"
DIGEST = "ab" * 32


def sampling(seed: int = 7) -> Sampling:
    return Sampling(temperature=0.7, top_p=0.9, max_new_tokens=500, seed=seed, frequency_penalty=1.0)


def action_chosen(*, tokens: int = 120, seed: int = 0, step_index: int = 3) -> ActionChosen:
    """An action-sized event: a UI-TARS answer of ``tokens`` tokens with its per-token arrays."""
    rng = random.Random(seed)
    return ActionChosen.new(
        run_id=RUN, producer="rollout-0", in_reply_to="obs-1", rollout_id="req-1.0", request_id="req-1",
        task_id="task-1", step_index=step_index,
        response_text="Thought: The Save button is at the top left; I’ll click it.\n"
                      "Action: click(start_box='(353,317)')",
        actions=[ParsedAction(kind="click", x=350.8, y=313.5)],
        response_token_ids=[rng.randrange(150_000) for _ in range(tokens)],
        logprobs=[-rng.randrange(192) / 64 for _ in range(tokens)],  # exact in float32
        entropies=[rng.randrange(256) / 64 for _ in range(tokens)],
        policy_version=12, prompt_hash=DIGEST, prompt_tokens=4_812, finish_reason="stop", engine="hf",
        queue_s=0.002, generate_s=0.41, sampling=sampling(seed),
    )


def all_examples() -> list[Event]:
    """One event of every type (DeadLetter holds another example's bytes)."""
    route = ReplyRoute(topic="dart.rollout.actions", partition=2, worker_id="env-0")
    events: list[Event] = [
        TaskRegistered.new(run_id=RUN, producer="cli", task_id="task-1", domain="os", instruction="Open a terminal",
                           backend="xdesktop", split="train", task_json='{"id": "task-1"}', source="examples/os"),
        RolloutRequested.new(run_id=RUN, producer="data-manager", request_id="req-1", task_id="task-1",
                             group_id="task-1/g3", rollout_index=2, group_size=8, max_steps=15, attempt=1,
                             mode="train", backend="synthetic", sampling=sampling(), scheduled_at_version=4),
        ObservationEmitted.new(run_id=RUN, producer="env-0", rollout_id="req-1.0", request_id="req-1",
                               task_id="task-1", group_id="task-1/g3", step_index=1, instruction="Open a terminal",
                               screenshot_digest=DIGEST, screen_width=1920, screen_height=1080,
                               history=[HistoryTurn(step_index=0, screenshot_digest=DIGEST,
                                                    response_text="Action: hotkey(key='ctrl alt t')")],
                               reply=route, sampling=sampling(), max_steps=15, mode="train", env_worker="env-0",
                               slot=3),
        action_chosen(),
        TrajectoryFinished.new(run_id=RUN, producer="env-0", rollout_id="req-1.0", request_id="req-1",
                               task_id="task-1", group_id="task-1/g3", rollout_index=2,
                               status=TrajectoryStatus.INFRA_ERROR, finish_reason="env_error", num_steps=2,
                               max_steps=15, step_policy_versions=[11, 12], error="VM did not answer",
                               attempt=1, env_worker="env-0", slot=3, reset_s=2.5, env_s=1.25,
                               policy_wait_s=0.75, eval_s=0.0, started_at=now_ms()),
        RewardAssigned.new(run_id=RUN, producer="env-0", rollout_id="req-1.0", task_id="task-1",
                           group_id="task-1/g3", reward=1.0, evaluator="osworld:compare_text_file",
                           evaluator_version="1", details='{"compare_text_file": 1.0}'),
        BatchAssembled.new(run_id=RUN, producer="data-manager", batch_id="b-0001", seq=1, manifest_digest=DIGEST,
                           manifest_bytes=12345, num_samples=40, num_groups=4, num_trajectories=16,
                           rollout_ids=["req-1.0", "req-2.0"], task_ids=["task-1"], min_policy_version=10,
                           max_policy_version=12, trainer_version=12, injected=1),
        WeightsPublished.new(run_id=RUN, producer="trainer", version=13, parent_version=12,
                             blobs=[BlobRef(name="model.safetensors", digest=DIGEST, size_bytes=1_600_000)],
                             sha256=DIGEST, train_step=13, batch_id="b-0001"),
        TrainStepCompleted.new(run_id=RUN, producer="trainer", step=13, policy_version=13, batch_id="b-0001",
                               loss=0.125, kl=0.0025, entropy=1.5, clip_frac=0.0625, tis_mean=0.96875,
                               logprob_mismatch=0.001, grad_norm=0.5, num_samples=40, num_tokens=4000,
                               duration_s=2.0, tokens_per_s=2000.0, metrics={"loss/policy": 0.1, "clip/high_frac": 0.03}),
        WorkerHeartbeat.new(run_id=RUN, producer="env-0", worker_id="env-0", role="env", state="running",
                            host="host-a", pid=4242, slots=8, slots_busy=7, busy_s=100.5, idle_s=3.25, uptime_s=14.0,
                            policy_version=None, health="ok", metrics={"vm/revert_s": 2.9}, info={"backend": "libvirt"}),
        WeightsLoaded.new(run_id=RUN, producer="rollout-0", worker_id="rollout-0", version=13, previous_version=12,
                          ok=True, fetch_s=0.05, swap_s=0.125),
    ]
    # Deferred: loads fastavro, needed only here.
    from dart.events.codec import encode

    events.append(DeadLetter.new(run_id=RUN, producer="data-manager", source_topic="dart.rewards", partition=1,
                                 offset=77, key=b"req-1.0", value=encode(events[5])[:20], stage="decode",
                                 error_type="DecodeError", error="corrupt RewardAssigned body",
                                 consumer_group="data-manager"))
    return events
