"""SQL over the projection and nothing else: each query returns plain records for the pure rules.

Every function takes a synchronous :class:`~dart.data.store.Store` (call them through
``AsyncStore.run`` from async code). Tables read with ``FINAL`` so an event delivered twice
and not merged yet never counts twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from dart.data.curation import GroupProgress, Outcome
from dart.data.rows import Row, group_rows
from dart.data.scheduler import Beat
from dart.data.store import Store
from dart.events import Event, HistoryTurn
from dart.events.manifest import PromptContext, Sample

POOL_ORIGINS = ("experience", "oracle")

_OUTCOME_COLS = """rollout_id, task_id, group_id, status, if(has_reward = 1, reward, NULL) AS reward,
    num_steps, min_policy_version, max_policy_version, toUnixTimestamp64Milli(event_time) AS finished_ms,
    rollout_index, attempt, origin"""


def _outcome(r: Sequence[Any]) -> Outcome:
    return Outcome(
        rollout_id=r[0], task_id=r[1], group_id=r[2], status=r[3],
        reward=None if r[4] is None else float(r[4]), num_steps=int(r[5]), min_version=int(r[6]),
        max_version=int(r[7]), finished_ms=int(r[8]), rollout_index=int(r[9]), attempt=int(r[10]),
        origin=r[11],
    )


def write_events(store: Store, events: Sequence[Event]) -> int:
    """Project events (one insert per table); returns the rows written."""
    return sum(store.insert_rows(table, rows) for table, rows in group_rows(events).items())


# ---------------------------------------------------------------- curation statistics


_LATEST_COLS = """event_id, event_time, rollout_id, request_id, task_id, group_id, rollout_index, status,
    finish_reason, num_steps, max_steps, min_policy_version, max_policy_version, attempt, mode, origin"""
"""The trajectory columns curation reads (not all: reading the arrays and timings too costs several times as much)."""


def latest_outcomes(db: str, *, trajectories: str, rewards: str | None = None) -> str:
    """The ``trajectory_rewards`` view (schema.py), its ``_LATEST_COLS``, over only the rollouts that have a trajectory
    row matching ``trajectories`` (and, if given, a reward row matching ``rewards``), as a subquery.

    Exact under any outer filter that implies those predicates on the latest row and its latest
    reward: that row (or reward) itself matches, so its rollout is among those kept, and a kept
    rollout keeps all its rows. Only those rollouts are sorted and joined, not every one of the
    run (at 10M steps the view rebuilds 500k latest rows per call).
    """
    ids = f"SELECT rollout_id FROM {db}.trajectories WHERE {trajectories}"
    if rewards is not None:
        ids += f" AND rollout_id IN (SELECT rollout_id FROM {db}.rewards WHERE {rewards})"
    return f"""(SELECT t.*, r.reward AS reward, r.evaluator AS evaluator, r.has_reward AS has_reward
        FROM (SELECT {_LATEST_COLS} FROM {db}.trajectories FINAL WHERE rollout_id IN ({ids})
              ORDER BY event_time DESC, event_id LIMIT 1 BY rollout_id) AS t
        LEFT JOIN (
            SELECT rollout_id, argMax(reward, event_time) AS reward, argMax(evaluator, event_time) AS evaluator,
                   1 AS has_reward
            FROM {db}.rewards FINAL WHERE rollout_id IN ({ids}) GROUP BY rollout_id
        ) AS r USING rollout_id)"""


def recent_outcomes(store: Store, *, mode: str, oldest_version: int, window: int) -> list[Outcome]:
    """Per task, the last ``window`` scored online non-infra trajectories of versions >= oldest_version."""
    # Only the rollouts with a row of a recent version are rebuilt: the window is a few versions
    # of a run (~1 % of its rollouts at 10M steps), and the latest row must itself be recent.
    recent = "max_policy_version >= {oldest:Int64}"
    rows = store.query(
        f"""SELECT {_OUTCOME_COLS} FROM {latest_outcomes(store.database, trajectories=recent)}
        WHERE mode = {{mode:String}} AND origin = 'online' AND status != 'infra_error' AND has_reward = 1
          AND {recent}
        ORDER BY event_time DESC, rollout_id DESC LIMIT {{window:UInt32}} BY task_id""",
        {"mode": mode, "oldest": oldest_version, "window": window},
    )
    return [_outcome(r) for r in rows]


def success_lengths(store: Store, *, threshold: float, since_ms: int | None = None,
                    online_only: bool = False) -> dict[str, list[int]]:
    """Per task, the longest successful trajectory: of any origin, or with ``online_only`` of the
    policy's own rollouts (``curation.lengths_from``).

    With ``since_ms``, only rollouts with a trajectory or reward row stamped since then: what is
    new since an earlier call (the caller keeps the running maximum, ``rule_inputs.Horizon``)."""
    db = store.database
    src = f"{db}.trajectory_rewards"
    params: dict[str, Any] = {"thr": threshold}
    origin = " AND origin = 'online'" if online_only else ""
    if since_ms is not None:
        since = "event_time >= fromUnixTimestamp64Milli({since:Int64})"
        src = latest_outcomes(db, trajectories=f"""({since} OR rollout_id IN (
            SELECT rollout_id FROM {db}.rewards WHERE {since}))""")
        params["since"] = since_ms
    rows = store.query(
        f"""SELECT task_id, max(num_steps) FROM {src}
        WHERE has_reward = 1 AND reward >= {{thr:Float64}} AND status != 'infra_error'{origin} GROUP BY task_id""",
        params,
    )
    return {r[0]: [int(r[1])] for r in rows}


def experience_pool(store: Store, *, threshold: float, per_task: int = 64) -> dict[str, list[Outcome]]:
    """Successful experience/oracle trajectories per task (a few rollouts of a run: filtered first)."""
    where = "origin IN {origins:Array(String)} AND status != 'infra_error'"
    rows = store.query(
        f"""SELECT {_OUTCOME_COLS}
        FROM {latest_outcomes(store.database, trajectories=where, rewards="reward >= {thr:Float64}")}
        WHERE {where} AND has_reward = 1 AND reward >= {{thr:Float64}}
        ORDER BY rollout_id LIMIT {{n:UInt32}} BY task_id""",
        {"origins": list(POOL_ORIGINS), "thr": threshold, "n": per_task},
    )
    out: dict[str, list[Outcome]] = defaultdict(list)
    for r in rows:
        out[r[1]].append(_outcome(r))
    return dict(out)


# ---------------------------------------------------------------- scheduling


def train_tasks(store: Store, *, split: str) -> list[tuple[str, str]]:
    """(task_id, backend) of the latest registration of each task in ``split``."""
    rows = store.query(
        f"""SELECT task_id, argMax(backend, event_time) AS backend, argMax(split, event_time) AS split
        FROM {store.database}.tasks FINAL GROUP BY task_id HAVING split = {{split:String}} ORDER BY task_id""",
        {"split": split},
    )
    return [(r[0], r[1]) for r in rows]


def in_flight(store: Store, *, mode: str, since_ms: int) -> int:
    """Requests since ``since_ms`` with no trajectory for their (request_id, attempt) yet."""
    db = store.database
    since = "event_time >= fromUnixTimestamp64Milli({since:Int64})"
    rows = store.query(
        f"""SELECT count() FROM {db}.requests FINAL
        WHERE mode = {{mode:String}} AND {since}
          AND (request_id, attempt) NOT IN (SELECT request_id, attempt FROM {db}.trajectories
              WHERE request_id IN (SELECT request_id FROM {db}.requests WHERE {since}))""",
        {"mode": mode, "since": since_ms},
    )
    return int(rows[0][0])


def finished_since(store: Store, *, mode: str, since_ms: int) -> int:
    """Rollouts of ``mode`` that finished (any status) since ``since_ms``, by their own time stamps."""
    rows = store.query(
        f"""SELECT uniqExact(rollout_id) FROM {store.database}.trajectories
        WHERE mode = {{mode:String}} AND event_time >= fromUnixTimestamp64Milli({{since:Int64}})""",
        {"mode": mode, "since": since_ms},
    )
    return int(rows[0][0])


def known_requests(store: Store, request_ids: Sequence[str]) -> set[str]:
    if not request_ids:
        return set()
    rows = store.query(
        f"SELECT DISTINCT request_id FROM {store.database}.requests WHERE request_id IN {{ids:Array(String)}}",
        {"ids": list(request_ids)},
    )
    return {r[0] for r in rows}


def last_scheduled(store: Store, *, mode: str) -> dict[str, int]:
    rows = store.query(
        f"""SELECT task_id, toUnixTimestamp64Milli(max(event_time)) FROM {store.database}.requests
        WHERE mode = {{mode:String}} GROUP BY task_id""",
        {"mode": mode},
    )
    return {r[0]: int(r[1]) for r in rows}


def heartbeats(store: Store) -> list[Beat]:
    rows = store.query(
        f"""SELECT worker_id, argMax(role, event_time), argMax(slots, event_time),
               toUnixTimestamp64Milli(max(event_time)), argMax(state, event_time)
        FROM {store.database}.heartbeats GROUP BY worker_id"""
    )
    return [Beat(r[0], r[1], int(r[2]), int(r[3]), r[4]) for r in rows]


def current_version(store: Store) -> int:
    """Latest published policy version (0 before the first)."""
    rows = store.query(f"SELECT max(version), count() FROM {store.database}.weights")
    return int(rows[0][0]) if rows and rows[0][1] else 0


def unconsumed_batches(store: Store) -> int:
    """Batches assembled that no TrainStepCompleted names yet."""
    rows = store.query(
        f"""SELECT uniqExact(batch_id) FROM {store.database}.batches
        WHERE batch_id NOT IN (SELECT batch_id FROM {store.database}.train_metrics)"""
    )
    return int(rows[0][0])


def last_batch(store: Store) -> str | None:
    """Id of the batch with the highest seq on the log (None before the first)."""
    rows = store.query(f"SELECT argMax(batch_id, seq), count() FROM {store.database}.batches")
    return rows[0][0] if rows and rows[0][1] else None


def weights_from_batch(store: Store, batch_id: str) -> int | None:
    """Policy version the trainer published from ``batch_id`` (None: not published yet)."""
    rows = store.query(
        f"SELECT max(version), count() FROM {store.database}.weights WHERE batch_id = {{b:String}}", {"b": batch_id})
    return int(rows[0][0]) if rows and rows[0][1] else None


def serving_versions(store: Store, workers: Sequence[str]) -> dict[str, int]:
    """Per worker, the newest policy version it reported serving: a successful WeightsLoaded,
    or the version in its latest heartbeat (a worker that started on it loads nothing); -1: none."""
    if not workers:
        return {}
    db = store.database
    rows = store.query(
        f"""SELECT worker_id, max(v) FROM (
            SELECT worker_id, version AS v FROM {db}.weights_loaded WHERE ok AND worker_id IN {{w:Array(String)}}
            UNION ALL
            SELECT worker_id, argMax(policy_version, event_time) AS v FROM {db}.heartbeats
            WHERE worker_id IN {{w:Array(String)}} AND policy_version IS NOT NULL GROUP BY worker_id)
        GROUP BY worker_id""",
        {"w": list(workers)},
    )
    out = dict.fromkeys(workers, -1)
    out.update({r[0]: int(r[1]) for r in rows})
    return out


# ---------------------------------------------------------------- batching


def used_rollouts(store: Store, since_ms: int = 0) -> tuple[set[str], int]:
    """Rollout ids in a projected batch stamped since ``since_ms``, and the highest batch seq
    (-1: none). A batch is stamped after the requests of its groups (both by the data manager)."""
    db = store.database
    used = {r[0] for r in store.query(
        f"SELECT DISTINCT arrayJoin(rollout_ids) FROM {db}.batches WHERE event_time >= fromUnixTimestamp64Milli({{s:Int64}})",
        {"s": since_ms})}
    rows = store.query(f"SELECT max(seq), count() FROM {db}.batches")
    return used, (int(rows[0][0]) if rows[0][1] else -1)


def batch_exists(store: Store, batch_id: str, rollout_ids: Sequence[str]) -> bool:
    """Whether this batch, or any of its rollouts, is already in a projected batch."""
    rows = store.query(
        f"""SELECT count() FROM {store.database}.batches
        WHERE batch_id = {{b:String}} OR hasAny(rollout_ids, {{ids:Array(String)}})""",
        {"b": batch_id, "ids": list(rollout_ids)},
    )
    return int(rows[0][0]) > 0


def open_groups(store: Store, *, mode: str, since_ms: int = 0) -> tuple[
        list[GroupProgress], dict[str, dict[int, int]], dict[str, Row]]:
    """Groups requested since ``since_ms`` none of whose rollouts is in a batch yet: their
    progress, the highest attempt requested per rollout index, and each group's request template
    (task, backend, max_steps). ``since_ms``: every group requested before it is known to be
    batched or closed (``rule_inputs.Horizon``); 0 reads the whole run."""
    db = store.database
    since = "event_time >= fromUnixTimestamp64Milli({since:Int64})"
    groups = store.query(
        f"""SELECT group_id, any(task_id), max(group_size), toUnixTimestamp64Milli(min(event_time)),
               groupArray((rollout_index, attempt)), any(backend), any(max_steps)
        FROM {db}.requests FINAL
        WHERE mode = {{mode:String}} AND {since} AND group_id NOT IN (
            SELECT group_id FROM {db}.trajectories
            WHERE rollout_id IN (SELECT arrayJoin(rollout_ids) FROM {db}.batches WHERE {since}))
        GROUP BY group_id""",
        {"mode": mode, "since": since_ms},
    )
    if not groups:
        return [], {}, {}
    ids = [g[0] for g in groups]
    outcomes: dict[str, list[Outcome]] = defaultdict(list)
    src = latest_outcomes(db, trajectories="group_id IN {ids:Array(String)}")
    for r in store.query(f"SELECT {_OUTCOME_COLS} FROM {src}", {"ids": ids}):
        outcomes[r[2]].append(_outcome(r))
    progress, requested, templates = [], {}, {}
    for gid, task, size, opened, pairs, backend, max_steps in groups:
        progress.append(GroupProgress(gid, task, int(size), int(opened), tuple(outcomes.get(gid, ()))))
        attempts: dict[int, int] = {}
        for index, attempt in pairs:
            attempts[int(index)] = max(attempts.get(int(index), -1), int(attempt))
        requested[gid] = attempts
        templates[gid] = {"task_id": task, "backend": backend, "max_steps": int(max_steps), "group_size": int(size)}
    return progress, requested, templates


def steps_of(store: Store, rollout_ids: Sequence[str]) -> dict[str, list[Sample]]:
    """Observation + the action that answered it, per step, for the given rollouts (in step order).

    A rollout run twice (a redo after a worker died) has two observations per step: the
    latest execution's wins. Each step is a :class:`Sample` before curation (reward 0, online)."""
    if not rollout_ids:
        return {}
    db = store.database
    rows = store.query(
        f"""SELECT o.rollout_id, o.step_index, o.instruction, o.screenshot_digest, o.screen_width,
               o.screen_height, o.history_step_index, o.history_screenshot_digest, o.history_response_text,
               a.prompt_hash, a.response_token_ids, a.logprobs, a.entropies, a.mean_entropy, a.policy_version,
               o.task_id, o.group_id
        FROM (SELECT event_id, event_time, rollout_id, step_index, instruction, screenshot_digest, screen_width, screen_height,
                     history_step_index, history_screenshot_digest, history_response_text, task_id, group_id
              FROM {db}.observations FINAL WHERE rollout_id IN {{ids:Array(String)}}) AS o
        INNER JOIN (SELECT in_reply_to, event_time, prompt_hash, response_token_ids, logprobs, entropies,
                           mean_entropy, policy_version
                    FROM {db}.actions FINAL WHERE rollout_id IN {{ids:Array(String)}}) AS a
            ON a.in_reply_to = o.event_id
        ORDER BY o.rollout_id, o.step_index, o.event_time DESC, a.event_time LIMIT 1 BY o.rollout_id, o.step_index""",
        {"ids": list(rollout_ids)},
    )
    out: dict[str, list[Sample]] = defaultdict(list)
    for r in rows:
        history = [HistoryTurn(step_index=int(i), screenshot_digest=d, response_text=t)
                   for i, d, t in zip(r[6], r[7], r[8], strict=True)]
        context = PromptContext(instruction=r[2], step_index=int(r[1]), screenshot_digest=r[3],
                                screen_width=int(r[4]), screen_height=int(r[5]), history=history)
        out[r[0]].append(Sample(
            rollout_id=r[0], step_index=int(r[1]), task_id=r[15], group_id=r[16], context=context, prompt_hash=r[9],
            response_token_ids=[int(t) for t in r[10]], rollout_logprobs=[float(x) for x in r[11]],
            entropies=[float(x) for x in r[12]], mean_entropy=float(r[13]), policy_version=int(r[14]),
        ))
    return dict(out)


def table_counts(store: Store, tables: Sequence[str]) -> dict[str, int]:
    """Rows per table after de-duplication (FINAL)."""
    return {t: int(store.query(f"SELECT count() FROM {store.database}.{t} FINAL")[0][0]) for t in tables}
