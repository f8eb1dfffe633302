"""What a run has done so far, from the projection: the queries behind `dart up`'s live display
(and its summary): trajectories and their success per policy version, env and rollout
utilisation, trainer updates, the versions the rollout workers serve, batch staleness.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import clickhouse_connect

Query = Callable[[str], Any]
"""SQL in, rows out (a clickhouse-connect client's ``query(sql).result_rows``)."""

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
            url = self.marker.read_text().strip()
            host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
            self._client = clickhouse_connect.get_client(host=host, port=int(port), database="dart",
                                                         connect_timeout=2, send_receive_timeout=10)
        return self._client

    def snapshot(self) -> Snapshot:
        try:
            client = self._connect()
            return snapshot_from(lambda sql: client.query(sql).result_rows)
        except Exception as exc:  # the display must never take the run down
            self._client = None
            return Snapshot(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}")


def snapshot_from(query: Query) -> Snapshot:
    """The progress of a run from the projection, through ``query`` (SQL in, rows out)."""
    snap = Snapshot()
    rows = {name: query(sql) for name, sql in QUERIES.items()}
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
