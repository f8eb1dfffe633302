"""Pure scheduling helpers of the env worker: how busy the slots were, what status a finished
trajectory gets, and whether a failed request is tried again (which offsets may be committed is
:class:`dart.bus.OffsetWatermark`'s). No clock, broker or backend here;
callers pass the time in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dart.events import TrajectoryStatus


@dataclass
class SlotClock:
    """Busy and idle slot-seconds of N slots. A slot is busy while it holds a trajectory
    (reset, env steps, waiting for the policy, evaluation, emitting the results)."""

    slots: int
    start: float
    _busy_since: dict[int, float] = field(default_factory=dict)
    _busy_total: float = 0.0

    def begin(self, slot: int, now: float) -> None:
        if slot in self._busy_since:
            raise ValueError(f"slot {slot} is already busy")
        self._busy_since[slot] = now

    def end(self, slot: int, now: float) -> None:
        since = self._busy_since.pop(slot, None)
        if since is None:
            raise ValueError(f"slot {slot} is not busy")
        self._busy_total += max(0.0, now - since)

    @property
    def busy_slots(self) -> int:
        return len(self._busy_since)

    def totals(self, now: float) -> tuple[float, float]:
        """(busy, idle) slot-seconds since ``start``, counting trajectories still running."""
        busy = self._busy_total + sum(max(0.0, now - t) for t in self._busy_since.values())
        wall = self.slots * max(0.0, now - self.start)
        return busy, max(0.0, wall - busy)


def utilization(busy_s: float, idle_s: float) -> float:
    """busy / (busy + idle); 0 when no time passed."""
    total = busy_s + idle_s
    return busy_s / total if total > 0 else 0.0


def trajectory_status(*, reward: float, ran_out: bool, success_threshold: float) -> TrajectoryStatus:
    """Status of a trajectory the environment finished: ``timeout`` if the step limit ended it
    (its reward still counts: the state is scored as it is), else ``success`` when the reward
    reaches ``success_threshold`` (1.0 by default: the task fully done), else ``fail``.
    Infra errors never come here: they have no reward."""
    if ran_out:
        return TrajectoryStatus.TIMEOUT
    return TrajectoryStatus.SUCCESS if reward >= success_threshold else TrajectoryStatus.FAIL


def next_attempt(attempt: int, max_attempts: int) -> int | None:
    """The attempt number to re-queue an infra-failed request with, or None when it has had
    ``max_attempts`` tries (attempts count from 0)."""
    nxt = attempt + 1
    return nxt if nxt < max_attempts else None
