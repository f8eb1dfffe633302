"""The metrics sink's fold: events in their canonical order -> TensorBoard records, and the buffer
that puts live events in that order.

Pure: no clock, no log, no files. Every record's step is a policy version and its wall time the
``event_time`` of the event that made it, so the same events give the same records however they were
read (see `dart.metrics.sink` for the reading and the writing). The one outside input is the
screenshot loader the pictures are drawn from, handed in (None: no pictures).

Scalars (step = policy version):

- ``train/*``: each update's loss, KL, entropy, clip fraction, importance weights, grad norm,
  step time, tokens per second (TrainStepCompleted); ``update/*``: every entry of its metrics
  map (clip/high_frac, ratio/abs_dev, ratio/max, time/prepare_s, ...).
- ``batch/*``: staleness (trainer version - oldest step version), samples, injected successes.
- ``weights/*``: seconds between published versions; each worker's fetch and swap seconds.
- per version window (the events between the publication of ``v`` and of ``v + 1``):
  ``rollout/*`` (trajectories, success rate, infra errors, mean staleness, trajectories per
  minute, mean reward of those trajectories, per-step queue and generation seconds), ``success_by_instruction/*``,
  ``utilisation/<role>`` (busy share from the heartbeats' counters), ``log/dead_letters``.

Images: every ``image_every_versions`` versions the first ``images_per_version`` online training
trajectories that finished in the window, drawn as `dart trace` draws its strip (each step's
screenshot with its actions, its thought and action under it).
"""

from __future__ import annotations

import heapq
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from dart.events import (
    ActionChosen,
    BatchAssembled,
    DeadLetter,
    Event,
    ObservationEmitted,
    ParsedAction,
    RewardAssigned,
    TaskRegistered,
    TrainStepCompleted,
    TrajectoryFinished,
    WeightsLoaded,
    WeightsPublished,
    WorkerHeartbeat,
)

MAX_OPEN_ROLLOUTS = 20_000
"""Steps of at most this many unfinished rollouts are held for pictures (the oldest go first)."""
DEDUPED = (TrajectoryFinished, RewardAssigned, TrainStepCompleted, BatchAssembled, WeightsPublished, WeightsLoaded,
           DeadLetter)
"""Events counted once per event_id (a producer retry can put a record on the log twice); the others
are idempotent in the fold (steps are keyed by index, heartbeats are counter deltas)."""


@dataclass(frozen=True, slots=True)
class Scalar:
    tag: str
    step: int
    value: float
    wall_ms: int


@dataclass(frozen=True, slots=True)
class Picture:
    tag: str
    step: int
    png: bytes
    width: int
    height: int
    wall_ms: int


Record = Scalar | Picture


def order_key(event: Event) -> tuple[int, str]:
    """The canonical order of the fold."""
    return (event.event_time, event.event_id)


@dataclass
class _Step:
    digest: str = ""
    screen: tuple[int, int] = (0, 0)
    instruction: str = ""
    response_text: str = ""
    actions: tuple[ParsedAction, ...] = ()
    policy_version: int | None = None
    mean_logprob: float = 0.0
    mean_entropy: float = 0.0
    num_tokens: int = 0


@dataclass
class _Window:
    """What happened while policy ``version`` was the newest."""

    version: int
    opened_ms: int
    trajectories: int = 0
    successes: int = 0
    infra_errors: int = 0
    staleness: list[int] = field(default_factory=list)
    by_instruction: dict[str, list[int]] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    busy: dict[str, float] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)
    queue_s: list[float] = field(default_factory=list)
    generate_s: list[float] = field(default_factory=list)
    dead_letters: int = 0
    images: int = 0


def _mean(values: list[float] | list[int]) -> float:
    return float(sum(values)) / len(values)


class Fold:
    """Events in canonical order -> TensorBoard records."""

    def __init__(self, *, load_png: Callable[[str], bytes | None] | None = None, image_every_versions: int = 1,
                 images_per_version: int = 2) -> None:
        self.load_png = load_png
        self.image_every = image_every_versions
        self.images_per_version = images_per_version if load_png is not None else 0
        self.instructions: dict[str, str] = {}
        self.window: _Window | None = None
        self.published_ms: dict[int, int] = {}
        self.beats: dict[str, tuple[float, float, float]] = {}
        self.steps: dict[str, dict[int, _Step]] = {}
        self.seen: set[str] = set()
        self.online: set[str] = set()
        """Rollouts that finished as online training trajectories (their rewards count)."""
        self.last_ms = 0
        self.folded = 0

    def feed(self, event: Event) -> list[Record]:
        if isinstance(event, DEDUPED):
            if event.event_id in self.seen:
                return []
            self.seen.add(event.event_id)
        self.folded += 1
        self.last_ms = max(self.last_ms, event.event_time)
        if self.window is None:
            self.window = _Window(version=0, opened_ms=event.event_time)
        out: list[Record] = []
        w = self.window
        t = event.event_time
        if isinstance(event, TaskRegistered):
            self.instructions[event.task_id] = event.instruction
        elif isinstance(event, ObservationEmitted):
            if event.mode == "train":
                steps = self.steps.setdefault(event.rollout_id, {})
                steps[event.step_index] = _Step(digest=event.screenshot_digest,
                                                screen=(event.screen_width, event.screen_height),
                                                instruction=event.instruction)
                while len(self.steps) > MAX_OPEN_ROLLOUTS:
                    del self.steps[next(iter(self.steps))]
        elif isinstance(event, ActionChosen):
            self._action(event, w)
        elif isinstance(event, TrajectoryFinished):
            out += self._trajectory(event, w)
        elif isinstance(event, RewardAssigned):
            if event.rollout_id in self.online:  # not the experience pool's or evaluation's rewards
                w.rewards.append(event.reward)
        elif isinstance(event, WorkerHeartbeat):
            self._heartbeat(event, w)
        elif isinstance(event, DeadLetter):
            w.dead_letters += 1
        elif isinstance(event, TrainStepCompleted):
            out += self._train_step(event)
        elif isinstance(event, BatchAssembled):
            v = event.trainer_version
            out += [Scalar("batch/staleness_max", v, float(v - event.min_policy_version), t),
                    Scalar("batch/samples", v, float(event.num_samples), t),
                    Scalar("batch/injected", v, float(event.injected), t)]
        elif isinstance(event, WeightsLoaded):
            if event.ok:
                out += [Scalar(f"weights/fetch_s/{event.worker_id}", event.version, event.fetch_s, t),
                        Scalar(f"weights/swap_s/{event.worker_id}", event.version, event.swap_s, t)]
        elif isinstance(event, WeightsPublished):
            out += self._published(event, w)
        return out

    def finish(self) -> list[Record]:
        """The records of the window still open (at the end of the log)."""
        if self.window is None:
            return []
        out = self._close(self.window, self.last_ms)
        self.window = None
        return out

    # ------------------------------------------------------------ per event type

    def _action(self, event: ActionChosen, w: _Window) -> None:
        w.queue_s.append(event.queue_s)
        w.generate_s.append(event.generate_s)
        steps = self.steps.get(event.rollout_id)
        step = steps.get(event.step_index) if steps is not None else None
        if step is None:
            return
        n = len(event.response_token_ids)
        step.response_text = event.response_text
        step.actions = tuple(event.actions)
        step.policy_version = event.policy_version
        step.num_tokens = n
        step.mean_logprob = float(sum(event.logprobs[:n]) / n) if n else 0.0
        step.mean_entropy = float(sum(event.entropies[:n]) / n) if n else 0.0

    def _trajectory(self, event: TrajectoryFinished, w: _Window) -> list[Record]:
        steps = self.steps.pop(event.rollout_id, None)
        if event.mode != "train" or event.origin != "online":
            return []
        if event.status == "infra_error":
            w.infra_errors += 1
            return []
        w.trajectories += 1
        self.online.add(event.rollout_id)
        ok = int(event.status == "success")
        w.successes += ok
        if event.step_policy_versions:
            w.staleness.append(w.version - min(event.step_policy_versions))
        instruction = self.instructions.get(event.task_id)
        if instruction is not None:
            counts = w.by_instruction.setdefault(instruction, [0, 0])
            counts[0] += 1
            counts[1] += ok
        if (steps and w.images < self.images_per_version and w.version % self.image_every == 0):
            picture = self._picture(event, steps, w)
            w.images += 1
            return [picture]
        return []

    def _heartbeat(self, event: WorkerHeartbeat, w: _Window) -> None:
        last = self.beats.get(event.worker_id)
        busy, idle = event.busy_s, event.idle_s
        if last is not None and event.uptime_s >= last[2]:
            busy, idle = busy - last[0], idle - last[1]
        self.beats[event.worker_id] = (event.busy_s, event.idle_s, event.uptime_s)
        w.busy[event.role] = w.busy.get(event.role, 0.0) + max(0.0, busy)
        w.idle[event.role] = w.idle.get(event.role, 0.0) + max(0.0, idle)

    def _train_step(self, e: TrainStepCompleted) -> list[Record]:
        v, t = e.policy_version, e.event_time
        fields = {"loss": e.loss, "kl": e.kl, "entropy": e.entropy, "clip_frac": e.clip_frac, "tis_mean": e.tis_mean,
                  "logprob_mismatch": e.logprob_mismatch, "grad_norm": e.grad_norm, "step_s": e.duration_s,
                  "tokens_per_s": e.tokens_per_s, "samples": float(e.num_samples), "tokens": float(e.num_tokens),
                  "step": float(e.step)}
        out: list[Record] = [Scalar(f"train/{k}", v, float(x), t) for k, x in fields.items()]
        out += [Scalar(f"update/{k}", v, float(x), t) for k, x in sorted(e.metrics.items())]
        return out

    def _published(self, event: WeightsPublished, w: _Window) -> list[Record]:
        out: list[Record] = []
        t = event.event_time
        previous = self.published_ms.get(event.version - 1)
        self.published_ms[event.version] = t
        if previous is not None:
            out.append(Scalar("weights/interval_s", event.version, (t - previous) / 1000, t))
        if event.version > w.version:
            out += self._close(w, t)
            self.window = _Window(version=event.version, opened_ms=t)
        return out

    def _close(self, w: _Window, at_ms: int) -> list[Record]:
        v = w.version
        out = [Scalar("rollout/trajectories", v, float(w.trajectories), at_ms),
               Scalar("rollout/infra_errors", v, float(w.infra_errors), at_ms),
               Scalar("log/dead_letters", v, float(w.dead_letters), at_ms)]
        minutes = (at_ms - w.opened_ms) / 60_000
        if minutes > 0:
            out.append(Scalar("rollout/per_minute", v, w.trajectories / minutes, at_ms))
        if w.trajectories:
            out.append(Scalar("rollout/success_rate", v, w.successes / w.trajectories, at_ms))
        if w.staleness:
            out.append(Scalar("rollout/staleness_mean", v, _mean(w.staleness), at_ms))
        if w.rewards:
            out.append(Scalar("rollout/reward_mean", v, _mean(w.rewards), at_ms))
        if w.generate_s:
            out += [Scalar("rollout/step_generate_s", v, _mean(w.generate_s), at_ms),
                    Scalar("rollout/step_queue_s", v, _mean(w.queue_s), at_ms)]
        for instruction, (n, ok) in sorted(w.by_instruction.items()):
            out.append(Scalar(f"success_by_instruction/{instruction}", v, ok / n, at_ms))
        for role in sorted(w.busy):
            total = w.busy[role] + w.idle.get(role, 0.0)
            if total > 0:
                out.append(Scalar(f"utilisation/{role}", v, w.busy[role] / total, at_ms))
        return out

    def _picture(self, event: TrajectoryFinished, steps: dict[int, _Step], w: _Window) -> Picture:
        # Deferred: loads Pillow, needed only here.
        from dart.data.trace import PANEL_W, StepView, TraceView, step_image, strip

        ordered = [steps[i] for i in sorted(steps)]
        views = tuple(StepView(step_index=i, screenshot_digest=s.digest, screen=s.screen,
                               response_text=s.response_text, actions=s.actions, policy_version=s.policy_version,
                               mean_logprob=s.mean_logprob, mean_entropy=s.mean_entropy, num_tokens=s.num_tokens)
                      for i, s in zip(sorted(steps), ordered, strict=True))
        view = TraceView(rollout_id=event.rollout_id, task_id=event.task_id, instruction=ordered[0].instruction,
                         status=str(event.status), reward=None, num_steps=event.num_steps, origin=event.origin,
                         steps=views)
        assert self.load_png is not None
        image = strip(view, [step_image(s, self.load_png(s.screenshot_digest), width=PANEL_W) for s in views])
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return Picture(f"trajectory/{w.images}", w.version, buf.getvalue(), image.width, image.height,
                       event.event_time)


# ---------------------------------------------------------------- live order


class Reorder:
    """Events held ``lateness_ms`` and released in canonical order (a heap keyed on it)."""

    def __init__(self, lateness_ms: int) -> None:
        self.lateness_ms = lateness_ms
        self._heap: list[tuple[tuple[int, str], Event]] = []
        self._released: tuple[int, str] = (0, "")
        self.late = 0

    def push(self, event: Event) -> list[Event]:
        """Hold ``event``; an event older than one already released comes straight back (late)."""
        key = order_key(event)
        if key < self._released:
            self.late += 1
            return [event]
        heapq.heappush(self._heap, (key, event))
        return []

    def due(self, now_ms: int) -> Iterator[Event]:
        """Events whose time is ``lateness_ms`` past, oldest first."""
        while self._heap and self._heap[0][0][0] <= now_ms - self.lateness_ms:
            key, event = heapq.heappop(self._heap)
            self._released = key
            yield event

    def drain(self) -> Iterator[Event]:
        return self.due(2**62)

    def __len__(self) -> int:
        return len(self._heap)
