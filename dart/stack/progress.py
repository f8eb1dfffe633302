"""The live progress display of `dart up`: what every service is doing, from the projection.

Everything shown is a query over the data manager's ClickHouse projection (through its SQL
endpoint), so the display shows exactly what `dart sql` would: per-service state,
trajectories per minute, success rate per policy version, env and rollout utilisation,
staleness of the batches, trainer updates.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

QUERIES = {
    "totals": """
        SELECT count(), countIf(status = 'success'), countIf(status = 'infra_error'),
               countIf(event_time > now() - INTERVAL 60 SECOND)
        FROM trajectories FINAL WHERE mode = 'train' AND origin = 'online'""",
    "by_version": """
        SELECT max_policy_version AS v, count(), avg(status = 'success')
        FROM trajectories FINAL WHERE mode = 'train' AND origin = 'online' AND status != 'infra_error'
        GROUP BY v ORDER BY v DESC LIMIT 4""",
    "utilisation": """
        SELECT r, sum(busy) / nullIf(sum(busy + idle), 0) FROM (
            SELECT worker_id, any(role) AS r, argMax(busy_s, uptime_s) AS busy, argMax(idle_s, uptime_s) AS idle
            FROM heartbeats FINAL WHERE role IN ('env', 'rollout') GROUP BY worker_id)
        GROUP BY r ORDER BY r""",
    "trainer": """
        SELECT count(), max(policy_version), argMax(loss, step), argMax(tokens_per_s, step)
        FROM train_metrics FINAL""",
    "served": """
        SELECT count(), min(v) FROM (SELECT worker_id, max(version) AS v FROM weights_loaded FINAL WHERE ok
                            GROUP BY worker_id)""",
    "staleness": """
        SELECT count(), avg(trainer_version - min_policy_version), max(trainer_version - min_policy_version)
        FROM batches FINAL""",
}


@dataclass
class Snapshot:
    at: float = field(default_factory=time.monotonic)
    trajectories: int = 0
    successes: int = 0
    infra_errors: int = 0
    per_minute: int = 0
    by_version: list[tuple[int, int, float]] = field(default_factory=list)
    utilisation: dict[str, float] = field(default_factory=dict)
    updates: int = 0
    version: int = 0
    loss: float = 0.0
    tokens_per_s: float = 0.0
    batches: int = 0
    staleness_mean: float = 0.0
    staleness_max: int = 0
    served: int = -1
    """The oldest version a rollout worker serves (the lowest of each worker's newest load; -1: no loads seen)."""
    error: str = ""


class Progress:
    """Reads the projection through the data manager's SQL endpoint (``<chdb path>.http``)."""

    def __init__(self, chdb_path: Path) -> None:
        self.marker = Path(f"{chdb_path}.http")
        self._client: Any = None

    def _connect(self) -> Any:
        if self._client is None:
            if not self.marker.exists():
                raise ConnectionError("the data manager's SQL endpoint is not up yet")
            import clickhouse_connect

            url = self.marker.read_text().strip()
            host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
            self._client = clickhouse_connect.get_client(host=host, port=int(port), database="dart",
                                                         connect_timeout=2, send_receive_timeout=10)
        return self._client

    def snapshot(self) -> Snapshot:
        snap = Snapshot()
        try:
            client = self._connect()
            rows = {name: client.query(sql).result_rows for name, sql in QUERIES.items()}
        except Exception as exc:  # the display must never take the run down
            self._client = None
            snap.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
            return snap
        (t,) = rows["totals"] or [(0, 0, 0, 0)]
        snap.trajectories, snap.successes, snap.infra_errors, snap.per_minute = (int(x or 0) for x in t)
        snap.by_version = [(int(v), int(n), float(s or 0.0)) for v, n, s in rows["by_version"]]
        snap.utilisation = {str(role): float(u or 0.0) for role, u in rows["utilisation"]}
        (tr,) = rows["trainer"] or [(0, 0, 0.0, 0.0)]
        snap.updates, snap.version = int(tr[0] or 0), int(tr[1] or 0)
        snap.loss, snap.tokens_per_s = float(tr[2] or 0.0), float(tr[3] or 0.0)
        (sv,) = rows["served"] or [(0, 0)]
        snap.served = int(sv[1] or 0) if sv[0] else -1
        (st,) = rows["staleness"] or [(0, 0.0, 0)]
        snap.batches, snap.staleness_mean, snap.staleness_max = int(st[0] or 0), float(st[1] or 0.0), int(st[2] or 0)
        return snap


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
