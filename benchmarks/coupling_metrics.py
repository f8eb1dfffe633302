"""Metrics of the decoupled-vs-coupled benchmark, computed from projection rows (pure: rows in, numbers out).

Every figure is measured over one steady-state window ``[t0, t1]`` (milliseconds since the
epoch, the events' own ``event_time``): ``t0`` is the trainer's first update (broker start,
consumer-group joins, model loads and the first round are behind it), ``t1`` the last
heartbeat every env and rollout worker sent while still running (the stop is not measured).

- **env utilisation** = busy slot-seconds / wall slot-seconds of every env worker in the
  window. A slot is busy while it holds a trajectory: reset, env steps, waiting for the
  policy's answer, evaluation and emitting the results (the env worker's own ``busy_s``).
- **rollout utilisation** = seconds the rollout engine ran forward passes / wall seconds, summed
  over rollout workers (the worker's own ``busy_s``; idle = waiting for observations or weights).
- **training throughput** = step-samples that went into updates per second: the samples of
  the window's updates after its first, over the time from its first to its last update (an
  unbiased rate for a periodic trainer; a window that starts mid-round would not be).
- **trajectories per minute** = online training trajectories finished in the window (infra
  errors excluded) per minute.
- **mean staleness** = over every online step-sample trained in the window: (the version the
  trainer's weights had when it took the gradient) - (the version that generated the step);
  0 is on-policy.

Rows are plain dicts with the projection's column names; times are ``t_ms``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from statistics import mean
from typing import Any

Row = Mapping[str, Any]

PAPER_RATIOS = {"env_util": 5.5, "rollout_util": 1.6, "train_samples_per_s": 1.9}
"""DART (arXiv 2509.23866), decoupled / coupled: environment utilisation, rollout GPU
utilisation, training throughput."""


class WindowError(ValueError):
    """The run gave no usable steady-state window (too short, or the trainer never updated)."""


def steady_window(beats: Sequence[Row], updates: Sequence[Row]) -> tuple[int, int]:
    """(t0, t1): the trainer's first update to the last heartbeat every env/rollout worker sent running."""
    if not updates:
        raise WindowError("the trainer made no update: no steady state to measure (run longer)")
    t0 = min(u["t_ms"] for u in updates)
    last: dict[str, int] = {}
    for b in beats:
        if b["role"] in ("env", "rollout") and b["state"] not in ("stopping", "stopped"):
            last[b["worker_id"]] = max(last.get(b["worker_id"], 0), b["t_ms"])
    if not last:
        raise WindowError("no env or rollout heartbeats")
    t1 = min(last.values())
    if t1 <= t0:
        raise WindowError(f"the window is empty (first update at {t0}, workers last heard at {t1})")
    return t0, t1


def utilisation(beats: Iterable[Row], role: str, t0: int, t1: int) -> float | None:
    """Sum over ``role`` workers of delta busy_s / delta (busy_s + idle_s) between their first
    and last heartbeat inside [t0, t1] (cumulative counters, so start-up never counts)."""
    per_worker: dict[str, list[Row]] = {}
    for b in beats:
        if b["role"] == role and t0 <= b["t_ms"] <= t1:
            per_worker.setdefault(b["worker_id"], []).append(b)
    busy = total = 0.0
    for rows in per_worker.values():
        rows = sorted(rows, key=lambda r: r["uptime_s"])
        if len(rows) < 2:
            continue
        a, z = rows[0], rows[-1]
        d_busy = z["busy_s"] - a["busy_s"]
        busy += d_busy
        total += d_busy + (z["idle_s"] - a["idle_s"])
    return busy / total if total > 0 else None


def train_throughput(updates: Sequence[Row], t0: int, t1: int) -> float | None:
    """Samples per second into the updates inside [t0, t1], first-to-last update (None: < 2 updates)."""
    inside = sorted((u for u in updates if t0 <= u["t_ms"] <= t1), key=lambda u: u["t_ms"])
    if len(inside) < 2:
        return None
    span_s = (inside[-1]["t_ms"] - inside[0]["t_ms"]) / 1000
    return sum(u["num_samples"] for u in inside[1:]) / span_s if span_s > 0 else None


def per_minute(trajectories: Iterable[Row], t0: int, t1: int) -> float:
    """Online training trajectories (not infra errors) finished in (t0, t1] per minute."""
    n = sum(1 for t in trajectories if t0 < t["t_ms"] <= t1 and t["origin"] == "online" and t["mode"] == "train"
            and t["status"] != "infra_error")
    return n / ((t1 - t0) / 60000)


def success_rate(trajectories: Iterable[Row], t0: int, t1: int) -> float | None:
    """Share of online training trajectories finished in (t0, t1] that succeeded (infra errors left out)."""
    done = [t["status"] == "success" for t in trajectories if t0 < t["t_ms"] <= t1 and t["origin"] == "online"
            and t["mode"] == "train" and t["status"] != "infra_error"]
    return sum(done) / len(done) if done else None


def trajectory_seconds(trajectories: Iterable[Row], t0: int, t1: int) -> float | None:
    """Mean time an online trajectory finished in (t0, t1] held its slot (reset + env + policy + evaluation)."""
    held = [t["reset_s"] + t["env_s"] + t["policy_wait_s"] + t["eval_s"] for t in trajectories
            if t0 < t["t_ms"] <= t1 and t["origin"] == "online" and t["status"] != "infra_error"]
    return mean(held) if held else None


def mean_staleness(updates: Iterable[Row], batches: Iterable[Row], trajectories: Iterable[Row],
                   t0: int, t1: int) -> float | None:
    """Mean of (trainer version at the gradient - generating version) over online step-samples
    of the updates in [t0, t1]. An update that published version v took its gradient at v - 1."""
    rollouts_of = {b["batch_id"]: b["rollout_ids"] for b in batches}
    versions_of = {t["rollout_id"]: t["step_policy_versions"] for t in trajectories if t["origin"] == "online"}
    gaps = [u["policy_version"] - 1 - v
            for u in updates if t0 <= u["t_ms"] <= t1
            for rid in rollouts_of.get(u["batch_id"], ())
            for v in versions_of.get(rid, ())]
    return mean(gaps) if gaps else None


def measure(rows: Mapping[str, Sequence[Row]]) -> dict[str, Any]:
    """Every metric of one run from its projection rows (keys: heartbeats, updates, batches, trajectories)."""
    beats, updates = rows["heartbeats"], rows["updates"]
    t0, t1 = steady_window(beats, updates)
    inside = [u for u in updates if t0 <= u["t_ms"] <= t1]
    return {
        "window_s": round((t1 - t0) / 1000, 1),
        "env_util": _round(utilisation(beats, "env", t0, t1)),
        "rollout_util": _round(utilisation(beats, "rollout", t0, t1)),
        "train_samples_per_s": _round(train_throughput(updates, t0, t1)),
        "trajectories_per_min": round(per_minute(rows["trajectories"], t0, t1), 1),
        "staleness_mean": _round(mean_staleness(updates, rows["batches"], rows["trajectories"], t0, t1)),
        "success_rate": _round(success_rate(rows["trajectories"], t0, t1), 3),
        "trajectory_s_mean": _round(trajectory_seconds(rows["trajectories"], t0, t1), 2),
        "updates": len(inside),
        "trainer_busy": _round(sum(u["duration_s"] for u in inside[1:]) / ((t1 - t0) / 1000)),
        "window_ms": [t0, t1],
    }


def ratios(decoupled: Mapping[str, Any], coupled: Mapping[str, Any]) -> dict[str, float | None]:
    """decoupled / coupled for each metric the paper reports (None where either is missing or 0)."""
    out: dict[str, float | None] = {}
    for key in PAPER_RATIOS:
        d, c = decoupled.get(key), coupled.get(key)
        out[key] = round(d / c, 2) if d is not None and c else None
    return out


def coupled_rounds(requests: Sequence[Row], trajectories: Sequence[Row], batches: Sequence[Row],
                   updates: Sequence[Row], loaded: Sequence[Row], *, t0: int = 0, t1: int = 2**62,
                   gap_ms: int = 250) -> list[dict[str, float]]:
    """Where the time of each coupled round goes (seconds per phase), for the rounds that start
    in [t0, t1] and are complete on the log.

    Round k starts when its requests are sent (requests closer than ``gap_ms`` are one round):
    ``rollout`` until its last trajectory finished, ``batch`` until the batch holding its
    trajectories is on the log, ``train`` until the update that trained on it is reported,
    ``sync`` until every rollout worker loaded that version, ``next`` until the next round's
    requests. A round none of whose groups survived curation is not trained on
    (``batched`` 0; batch, train and sync 0).
    """
    starts: list[tuple[int, set[str]]] = []
    for r in sorted(requests, key=lambda r: r["t_ms"]):
        if not starts or r["t_ms"] - starts[-1][0] > gap_ms:
            starts.append((r["t_ms"], set()))
        starts[-1][1].add(r["request_id"])
    finish: dict[str, int] = {}
    rollouts: dict[str, set[str]] = {}
    for t in trajectories:
        if t["origin"] == "online":
            finish[t["request_id"]] = max(finish.get(t["request_id"], 0), t["t_ms"])
            rollouts.setdefault(t["request_id"], set()).add(t["rollout_id"])
    batch_of = {rid: b for b in sorted(batches, key=lambda b: -b["t_ms"]) for rid in b["rollout_ids"]}
    update_of = {u["batch_id"]: u for u in updates}
    workers = {w["worker_id"] for w in loaded}
    out = []
    for (start, ids), (nxt, _) in itertools.pairwise(starts):
        if not t0 <= start <= t1 or not all(i in finish for i in ids):
            continue
        done = max(finish[i] for i in ids)
        round_ = {"rollout": (done - start) / 1000, "batch": 0.0, "train": 0.0, "sync": 0.0,
                  "next": (nxt - done) / 1000, "round": (nxt - start) / 1000, "trajectories": len(ids),
                  "batched": 0}
        mine = [batch_of[r] for i in ids for r in rollouts[i] if r in batch_of]
        if mine:
            batch = min(mine, key=lambda b: b["t_ms"])
            update = update_of.get(batch["batch_id"])
            synced = [min((w["t_ms"] for w in loaded if w["worker_id"] == wid
                           and update is not None and w["version"] >= update["policy_version"]), default=None)
                      for wid in workers]
            if update is None or not synced or None in synced:
                continue
            sync = max(s for s in synced if s is not None)
            round_.update(batch=(batch["t_ms"] - done) / 1000, train=(update["t_ms"] - batch["t_ms"]) / 1000,
                          sync=(sync - update["t_ms"]) / 1000, next=(nxt - sync) / 1000, batched=1)
        out.append(round_)
    return out


def mean_phases(rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean seconds per phase over rounds (empty when there were none)."""
    if not rounds:
        return {}
    return {k: round(mean(r[k] for r in rounds), 2) for k in rounds[0]}


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)
