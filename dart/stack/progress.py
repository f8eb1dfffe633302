"""The live progress display of `dart up`: what every service is doing, from the projection.

Everything shown is a snapshot of the data manager's projection (:mod:`dart.data.progress`, its
queries through the SQL endpoint), so the display shows exactly what `dart sql` would:
per-service state, trajectories per minute, success rate per policy version, env and rollout
utilisation, staleness of the batches, trainer updates.
"""

from __future__ import annotations

import sys
import time

from dart.data.progress import Progress, Snapshot

__all__ = ["Display", "Progress", "Snapshot", "render"]

def render(snap: Snapshot, services: dict[str, str], *, elapsed_s: float, budget_s: float,
           events: list[str], max_updates: int = 0) -> str:
    """The display as text (pure, so a test can read it)."""
    planned = f", update {snap.updates} of {max_updates}" if max_updates else ""
    lines = [f"dart up — RL phase {elapsed_s / 60:4.1f} / {budget_s / 60:.1f} min{planned}"]
    lines.append("services: " + "  ".join(f"{name} {state}" for name, state in services.items()))
    if snap.error:
        lines.append(f"projection: {snap.error}")
        return "\n".join(lines + events[-3:])
    util = "  ".join(f"{role} {u:5.1%}" for role, u in snap.utilisation.items()) or "-"
    lines.append(f"trajectories {snap.trajectories} ({snap.per_minute}/min, {snap.infra_errors} infra errors)  "
                 f"utilisation: {util}")
    versions = "  ".join(f"v{v}: {s:5.1%} of {n}" for v, n, s in snap.by_version) or "-"
    lines.append(f"success by policy version: {versions}")
    lines.append(f"trainer: {snap.updates} updates, serving v{snap.version}, loss {snap.loss:+.4f}, "
                 f"{snap.tokens_per_s:.0f} tok/s  batches {snap.batches}, staleness mean "
                 f"{snap.staleness_mean:.2f} max {snap.staleness_max} versions")
    return "\n".join(lines + [f"  {e}" for e in events[-3:]])


class Display:
    """Redraws in place on a terminal; prints a block every ``every_s`` seconds otherwise."""

    def __init__(self, every_s: float = 15.0) -> None:
        self.tty = sys.stdout.isatty()
        self.every_s = 2.0 if self.tty else every_s
        self._last = 0.0
        self._height = 0

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.every_s

    def show(self, text: str) -> None:
        self._last = time.monotonic()
        if self.tty:
            if self._height:
                sys.stdout.write(f"\x1b[{self._height}F\x1b[J")
            self._height = text.count("\n") + 1
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
