"""The projection on chdb: schema, row mapping, idempotence and the curation queries."""

from __future__ import annotations

import dataclasses

import pytest

from dart.data import projection
from dart.data.rows import ROWS, TABLES, masked_mean, to_row
from dart.data.schema import MIGRATIONS, Migration, pending
from dart.data.store import Store, StoreError, parse_dsn
from dart.errors import ConfigError
from dart.events import TrajectoryFinished
from tests.data.factories import T0, Traj, group, heartbeat, request, task

pytestmark = pytest.mark.clickhouse


def test_masked_mean_never_averages_padding() -> None:
    assert masked_mean([1.0, 2.0, 0.0, 0.0], 2) == 1.5
    assert masked_mean([1.0, 2.0], None) == 1.5
    assert masked_mean([], 0) == 0.0


def test_migrations_apply_once_and_in_order(store: Store) -> None:
    assert store.applied_versions() == {m.version for m in MIGRATIONS}
    assert store.migrate() == []
    nxt = MIGRATIONS[-1].version + 1
    extra = (*MIGRATIONS, Migration(nxt, "note column", ("ALTER TABLE {db}.tasks ADD COLUMN IF NOT EXISTS note String",)))
    assert store.migrate(extra) == [nxt]
    assert "note" in [r[0] for r in store.query(f"DESCRIBE TABLE {store.database}.tasks")]
    assert pending({1}, extra) == list(extra[1:])
    with pytest.raises(ValueError, match="increasing"):
        pending(set(), (extra[1], extra[0]))
    # a store made before the data manager kept its horizon gets the state table on its next start
    assert {m.version for m in MIGRATIONS} >= {1, 2, 3}


def test_every_row_function_matches_its_table_columns(store: Store) -> None:
    events, _ = group("t", [1.0])
    samples = {type(e): e for e in [*events, task("t"), heartbeat("w", 2)]}
    for cls, (table, _fn) in ROWS.items():
        columns = [r[0] for r in store.query(f"DESCRIBE TABLE {store.database}.{table}")]
        if cls in samples:
            assert list(to_row(samples[cls])[1]) == columns, table
    assert len(set(TABLES)) == 12


def test_redelivered_events_leave_identical_tables(store: Store) -> None:
    events, _ = group("t", [1.0, 0.0, None])
    projection.write_events(store, events)
    once = {t: store.query(f"SELECT * FROM {store.database}.{t} FINAL ORDER BY event_id") for t in TABLES}
    projection.write_events(store, events)
    projection.write_events(store, events[3:7])
    twice = {t: store.query(f"SELECT * FROM {store.database}.{t} FINAL ORDER BY event_id") for t in TABLES}
    assert once == twice
    assert projection.table_counts(store, ["requests", "trajectories", "rewards", "actions"]) == {
        "requests": 3, "trajectories": 3, "rewards": 2, "actions": 12}


def test_curation_queries_on_a_crafted_history(store: Store) -> None:
    db = store.database
    e1, t1 = group("a", [1.0, 0.0, 0.0, 1.0], version=3, t=T0)
    e2, _ = group("b", [0.0, 0.0], version=3, t=T0 + 10_000, steps=6)
    xp = Traj("b", "xp-group", reward=1.0, steps=3, status="success", origin="experience", mode="experience")
    rescored = Traj("a", t1[0].group_id, index=9, reward=0.0, steps=7, version=3, status="success", t=T0 + 5)
    events = [task("a"), task("b"), task("z", split="test"), *e1, *e2, *xp.events(), *rescored.events()]
    from dart.events import RewardAssigned
    # a re-score of the last rollout: the latest reward wins
    events.append(RewardAssigned(event_id="rs", event_time=T0 + 99_999, run_id="r", producer="eval",
                                 rollout_id=rescored.rollout_id, task_id="a", group_id=rescored.group_id,
                                 reward=1.0, evaluator="synthetic", evaluator_version="2"))
    projection.write_events(store, events)
    assert projection.train_tasks(store, split="train") == [("a", "synthetic"), ("b", "synthetic")]
    outs = projection.recent_outcomes(store, mode="train", oldest_version=0, window=3)
    by_task = {}
    for x in outs:
        by_task.setdefault(x.task_id, []).append(x)
    assert len(by_task["a"]) == 3 and len(by_task["b"]) == 2
    assert projection.success_lengths(store, threshold=0.5) == {"a": [7], "b": [3]}
    # the policy's own successes only: b's 3-step success is an experience trajectory
    assert projection.success_lengths(store, threshold=0.5, online_only=True) == {"a": [7]}
    pool = projection.experience_pool(store, threshold=0.5)
    assert list(pool) == ["b"] and pool["b"][0].rollout_id == xp.rollout_id
    groups, requested, templates = projection.open_groups(store, mode="train")
    assert sorted(len(g.outcomes) for g in groups) == [2, 5]
    assert all(templates[g.group_id]["task_id"] == g.task_id for g in groups)
    assert requested[e2[0].group_id] == {0: 0, 1: 0}
    steps = projection.steps_of(store, [t1[0].rollout_id])[t1[0].rollout_id]
    assert [s.step_index for s in steps] == [0, 1, 2, 3]
    assert [h.step_index for h in steps[3].context.history] == [0, 1, 2]
    assert steps[2].mean_entropy == pytest.approx(0.3) and steps[2].policy_version == 3
    # a step as curation finds it: its observation's task and group, not yet a reward or an origin of its own
    assert {(s.task_id, s.group_id) for s in steps} == {(t1[0].task_id, t1[0].group_id)}
    assert {(s.reward, s.origin, s.sft) for s in steps} == {(0.0, "online", False)}
    assert int(store.query(f"SELECT count() FROM {db}.steps")[0][0]) == 4 * 4 + 2 * 6 + 3 + 7


def test_load_queries(store: Store) -> None:
    events, _trajs = group("a", [1.0, 0.0], t=T0)
    pending_req = request("a", "g-open", 0, 1, t=T0 + 5000)
    projection.write_events(store, [*events, pending_req, heartbeat("env-1", 4, t=T0), heartbeat("env-2", 2, t=T0)])
    assert projection.in_flight(store, mode="train", since_ms=T0 - 1) == 1
    assert projection.in_flight(store, mode="train", since_ms=T0 + 6000) == 0
    assert projection.known_requests(store, [pending_req.request_id, "nope"]) == {pending_req.request_id}
    assert sum(b.slots for b in projection.heartbeats(store)) == 6
    assert projection.current_version(store) == 0 and projection.unconsumed_batches(store) == 0
    assert projection.used_rollouts(store) == (set(), -1)
    # The rate the slots empty the queue at: rollouts finished since a time (theirs end at T0 + 1000, + 1001)
    assert projection.finished_since(store, mode="train", since_ms=T0 + 1000) == 2
    assert projection.finished_since(store, mode="train", since_ms=T0 + 1001) == 1
    assert projection.finished_since(store, mode="train", since_ms=T0 + 1002) == 0
    assert projection.finished_since(store, mode="eval", since_ms=T0) == 0
    # a redelivered finish (a new event id, the same rollout) still counts once
    finish = next(e for e in events if isinstance(e, TrajectoryFinished))
    projection.write_events(store, [dataclasses.replace(finish, event_id="again")])
    assert projection.finished_since(store, mode="train", since_ms=T0) == 2


def test_bad_dsn_and_second_chdb_path_are_clear_errors(store: Store, tmp_path) -> None:
    with pytest.raises(StoreError, match="neither"):
        parse_dsn("mysql://x")
    assert parse_dsn("http://h:9000").port == 9000
    with pytest.raises(StoreError, match="one process per database"):
        Store.open_dsn(f"chdb://{tmp_path}/other")


def test_report_on_a_crafted_history(store: Store, chdb_path, tmp_path) -> None:
    import clickhouse_connect

    from dart.data.report import build_report, write_plots
    from dart.events import BatchAssembled, TrainStepCompleted

    e1, t1 = group("easy", [1.0, 1.0, 0.0, 1.0], version=2)
    e2, t2 = group("hard", [0.0, 0.0, 0.0, 1.0], version=3)
    batch = BatchAssembled(event_id="b", event_time=T0, run_id="r", producer="dm", batch_id="b1", seq=0,
                           manifest_digest="d", manifest_bytes=1, num_samples=8, num_groups=2, num_trajectories=2,
                           rollout_ids=[t1[0].rollout_id, t2[0].rollout_id], task_ids=["easy", "hard"],
                           min_policy_version=2, max_policy_version=3, trainer_version=4, injected=1)
    beats = [heartbeat("env-1", 4, t=T0), heartbeat("env-1", 4, t=T0 + 10_000), heartbeat("roll-1", 1, t=T0, role="rollout")]
    step = TrainStepCompleted(event_id="s", event_time=T0, run_id="r", producer="trainer", step=1, policy_version=4,
                              batch_id="b1", loss=-0.1, kl=0.0, entropy=0.5, clip_frac=0.1, tis_mean=0.9,
                              logprob_mismatch=0.01, grad_norm=0.2, num_samples=8, num_tokens=80, duration_s=1.0,
                              tokens_per_s=80.0, metrics={"clip/high_frac": 0.06, "clip/low_frac": 0.04,
                                                          "ratio/abs_dev": 0.02, "ratio/max": 1.3,
                                                          "tis/capped_frac": 0.25, "samples/dropped_ragged": 3,
                                                          "samples/dropped_prompt_hash": 1})
    projection.write_events(store, [*e1, *e2, batch, step, *beats])
    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb_path}", database=store.database)
    report = build_report(lambda sql: client.query(sql).result_rows)
    assert report.success_by_version == [(2, 4, 0.75), (3, 4, 0.25)]
    assert [(t, n, r) for t, n, r, _, _ in report.tasks] == [("hard", 4, 0.25), ("easy", 4, 0.75)]
    assert report.staleness == [(1, 4), (2, 4)]          # 4 steps at v3 (lag 1), 4 at v2 (lag 2)
    assert [(w, role, slots) for w, role, slots, *_ in report.workers] == [("env-1", "env", 4), ("roll-1", "rollout", 1)]
    text = report.text()
    assert "v2" in text and "success  75.0%" in text and "lag   1:        4 steps ( 50.0%)" in text
    # both groups are mixed: no zero-advantage group at either version
    assert report.groups == [(2, 1, 0, 0), (3, 1, 0, 0)] and report.zero_advantage() == [(2, 0.0), (3, 0.0)]
    (u,) = report.updates
    assert (u.step, u.version, u.entropy, u.clip_high, u.clip_low, u.ratio_abs_dev, u.tis_capped) == (
        1, 4, 0.5, 0.06, 0.04, 0.02, 0.25)
    assert (u.staleness_max, u.staleness_min) == (2, 1)   # trainer v4 on samples of v2..v3
    # samples the trainer could not use are in plain sight (an oracle injection dropped as ragged
    # went unseen for a whole run before)
    assert (u.dropped, u.injected) == (4, 1) and "(dropped 4, injected groups 1)" in text
    assert "zero advantage   0.0%" in text and "update    1 -> v4" in text
    assert sum(n for _, n, _ in report.success_by_time) == 8
    assert {p.name for p in write_plots(report, tmp_path)} == {
        "success_by_version.png", "success_by_time.png", "learning.png", "task_difficulty.png", "utilisation.png",
        "staleness.png"}


def test_report_shows_success_and_share_per_shared_instruction(store: Store, chdb_path) -> None:
    """A policy with a habit (the red button, whatever the instruction says) and a scheduler that
    moves to the tasks it solves: one instruction at 100 %, the other near 0, red's share growing."""
    import dataclasses

    import clickhouse_connect

    from dart.data.report import build_report

    tasks = [dataclasses.replace(task(t), instruction=text) for t, text in (
        ("red1", "Click red"), ("red2", "Click red"), ("blue1", "Click blue"), ("blue2", "Click blue"),
        ("solo", "an instruction of its own"))]
    history = [*tasks]
    for task_id, rewards, version in (("red1", [1.0, 1.0], 0), ("blue1", [0.0, 0.0], 0), ("solo", [1.0], 0),
                                      ("red2", [1.0, 1.0], 2), ("red2", [1.0, 1.0], 2), ("blue2", [0.0, 1.0], 2)):
        history += group(task_id, rewards, version=version, t=T0 + 1000 * version)[0]
    projection.write_events(store, history)
    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb_path}", database=store.database)
    report = build_report(lambda sql: client.query(sql).result_rows)
    # versions 0..2: the first half is v0-v1, the second v2; "solo" is its own task's instruction
    assert report.instructions == [("Click red", 2, 2, 1.0, 4, 1.0), ("Click blue", 2, 2, 0.0, 2, 0.5)]
    text = report.text()
    assert "Click red" in text and "first      2 runs ( 50%) success 100.0%  second      4 runs ( 67%)" in text
    assert "an instruction of its own" not in text


def test_a_redone_rollout_counts_once_and_its_latest_steps_win(store: Store) -> None:
    events, trajs = group("a", [1.0, 0.0])
    first = trajs[1]
    # a killed worker's request redone: same request and rollout ids, new event ids, later times
    redo = Traj("a", first.group_id, index=1, reward=0.0, steps=5, status="fail", t=first.t + 50_000,
                request_id=first.request_id, rollout_id=first.rollout_id,
                entropies=[[0.9, 0.9]] * 5)
    projection.write_events(store, [*events, *redo.events()])
    groups, _, _ = projection.open_groups(store, mode="train")
    (g,) = groups
    assert sorted(o.rollout_id for o in g.outcomes) == sorted(t.rollout_id for t in trajs)
    assert next(o for o in g.outcomes if o.rollout_id == first.rollout_id).num_steps == 5
    steps = projection.steps_of(store, [first.rollout_id])[first.rollout_id]
    assert len(steps) == 5 and all(s.mean_entropy == pytest.approx(0.9) for s in steps)


# The curation queries as they read the whole trajectory_rewards view before the rollout filter
# moved inside it (latest_outcomes): the reference the new queries must equal row for row.
_OLD = {
    "recent": """SELECT {cols} FROM {db}.trajectory_rewards
        WHERE mode = 'train' AND origin = 'online' AND status != 'infra_error' AND has_reward = 1
          AND max_policy_version >= {oldest}
        ORDER BY event_time DESC, rollout_id DESC LIMIT 3 BY task_id""",
    "lengths": """SELECT task_id, max(num_steps) FROM {db}.trajectory_rewards
        WHERE has_reward = 1 AND reward >= 0.5 AND status != 'infra_error' GROUP BY task_id""",
    "pool": """SELECT {cols} FROM {db}.trajectory_rewards
        WHERE origin IN ('experience', 'oracle') AND has_reward = 1 AND reward >= 0.5 AND status != 'infra_error'
        ORDER BY rollout_id LIMIT 64 BY task_id""",
    "open": """SELECT {cols} FROM {db}.trajectory_rewards WHERE group_id IN {groups}""",
}


def test_filtered_outcome_queries_return_what_the_whole_view_returns(store: Store) -> None:
    import random

    from dart.events import RewardAssigned

    rng = random.Random(5)
    history = []
    for i in range(60):
        rewards = [rng.choice([0.0, 1.0, 0.5, None]) for _ in range(4)]
        statuses = [rng.choice(["success", "fail", "timeout", "infra_error"]) for _ in rewards]
        events, trajs = group(f"t{i % 6}", rewards, t=T0 + i * 10_000, version=i // 6, statuses=statuses)
        history += events
        for tr in trajs:
            if rng.random() < 0.3:      # redone: the latest run of a rollout can fall in or out of every filter
                redo = Traj(tr.task_id, tr.group_id, index=tr.index, reward=rng.choice([0.0, 1.0, None]),
                            status=rng.choice(["success", "fail", "infra_error"]), version=rng.randrange(12),
                            t=tr.t + rng.choice([-5_000, 50_000]), request_id=tr.request_id,
                            rollout_id=tr.rollout_id, origin=rng.choice(["online", "experience", "oracle"]))
                history += [e for e in redo.events() if type(e).__name__ in ("TrajectoryFinished", "RewardAssigned")]
            if rng.random() < 0.2:      # re-scored later
                history.append(RewardAssigned(event_id=str(rng.random()), event_time=tr.t + 90_000, run_id="r",
                                              producer="eval", rollout_id=tr.rollout_id, task_id=tr.task_id,
                                              group_id=tr.group_id, reward=rng.choice([0.0, 1.0]),
                                              evaluator="again", evaluator_version="2"))
    projection.write_events(store, history)
    db, cols = store.database, projection._OUTCOME_COLS

    def old(name: str, **kw) -> list:
        return store.query(_OLD[name].format(db=db, cols=cols, **kw))

    def by_id(outcomes) -> list:
        return sorted(outcomes, key=lambda o: o.rollout_id)

    for oldest in (0, 4, 9):
        new = projection.recent_outcomes(store, mode="train", oldest_version=oldest, window=3)
        ref = [projection._outcome(r) for r in old("recent", oldest=oldest)]
        assert by_id(new) == by_id(ref) and len(ref) > 5
    assert projection.success_lengths(store, threshold=0.5) == {r[0]: [int(r[1])] for r in old("lengths")}
    pool = projection.experience_pool(store, threshold=0.5)
    assert by_id(o for os_ in pool.values() for o in os_) == by_id(projection._outcome(r) for r in old("pool")) and pool
    groups, _, _ = projection.open_groups(store, mode="train")
    ids = "(" + ", ".join(f"'{g.group_id}'" for g in groups) + ")"
    assert by_id(o for g in groups for o in g.outcomes) == by_id(projection._outcome(r) for r in old("open", groups=ids))



def test_a_task_only_an_oracle_solved_keeps_the_full_step_cap(store: Store) -> None:
    """Dynamic trajectory length follows the policy's own successes: an oracle's 4-step solution
    would cap the task at 6 steps, which a policy still making mistakes rarely meets (on the chain
    preset such tasks' groups stayed all-fail: 3 % success at their caps against 27 % at 16)."""
    import dataclasses

    from dart.data.config import CurationConfig, DataConfig
    from dart.data.rule_inputs import schedule_inputs

    solved, _ = group("a", [1.0, 0.0], t=T0, steps=8)
    unsolved, _ = group("b", [0.0, 0.0], t=T0, steps=20)
    oracle = Traj("b", "xp-b", reward=1.0, steps=4, status="success", origin="oracle", mode="experience")
    projection.write_events(store, [task("a"), task("b"), *solved, *unsolved, *oracle.events()])
    cfg = DataConfig(curation=CurationConfig(max_steps=30, steps_slack=1.5))
    caps = {t.task_id: t.max_steps for t in schedule_inputs(store, cfg, now_ms=T0 + 60_000, pending_requests=set())[0].tasks}
    assert caps == {"a": 12, "b": 30}
    anyone = dataclasses.replace(cfg, curation=dataclasses.replace(cfg.curation, lengths_from="any"))
    caps = {t.task_id: t.max_steps for t in schedule_inputs(store, anyone, now_ms=T0 + 60_000, pending_requests=set())[0].tasks}
    assert caps == {"a": 12, "b": 6}
    with pytest.raises(ConfigError, match="lengths_from"):
        CurationConfig(lengths_from="oracle")


def test_a_pass_from_the_horizon_decides_what_a_whole_read_decides(store: Store) -> None:
    """The scheduler's later passes read only groups requested since the oldest one still open
    (or kept and not batched yet) and outcomes new since the last pass; they decide the same."""
    import dataclasses

    from dart.data.config import CurationConfig, DataConfig, SchedulerConfig
    from dart.data.rule_inputs import Horizon, batch_inputs, schedule_inputs
    from dart.events import BatchAssembled

    cfg = DataConfig(scheduler=SchedulerConfig(capacity=16),
                     curation=CurationConfig(min_failed_steps=0, staleness_bound=100, inject_experience=False))
    closed, _ = group("a", [1.0, 1.0], t=T0)                     # all success: closed for good
    failed, _ = group("a", [0.0, 0.0], t=T0 + 5_000)             # all fail, no experience to inject: closed
    kept, kept_trajs = group("a", [1.0, 0.0], t=T0 + 10_000)     # complete and kept, not batched yet
    half, half_trajs = group("b", [None, None], t=T0 + 20_000)   # requested, nothing finished yet
    half = [e for e in half if type(e).__name__ == "RolloutRequested"]
    projection.write_events(store, [task("a"), task("b"), *closed, *failed, *kept, *half])
    horizon = Horizon()

    def both(now: int):  # a pass from the horizon and a whole read at the same moment
        ours, _ = schedule_inputs(store, cfg, now_ms=now, pending_requests=set(), horizon=horizon)
        whole, _ = schedule_inputs(store, cfg, now_ms=now, pending_requests=set())
        assert (ours.tasks, ours.load, ours.retries) == (whole.tasks, whole.load, whole.retries)
        horizon.open_since_ms = ours.open_since_ms
        return ours

    first = both(T0 + 60_000)
    assert first.open_since_ms == T0 + 10_000                    # the kept group holds it back
    assert first.load.ready_groups == 1 and {t.task_id: t.open_groups for t in first.tasks} == {"a": 0, "b": 1}
    assert first.batchable == 1                                   # the kept group; not the all-success one
    # the kept group is batched: the horizon moves to the group still running
    rollouts = [tr.rollout_id for tr in kept_trajs]
    projection.write_events(store, [BatchAssembled(
        event_id="b1", event_time=T0 + 61_000, run_id="r", producer="dm", batch_id="b-1", seq=0,
        manifest_digest="f" * 64, manifest_bytes=1, num_samples=8, num_groups=1, num_trajectories=2,
        rollout_ids=rollouts, task_ids=["a"], min_policy_version=0, max_policy_version=0, trainer_version=0)])
    assert both(T0 + 62_000).open_since_ms == T0 + 20_000
    assert batch_inputs(store, cfg, since_ms=T0 + 20_000).used == set(rollouts)   # stamped since
    assert batch_inputs(store, cfg, since_ms=T0 + 62_000).used == set()
    # it finishes with a longer success than any before: the running maximum takes it
    for tr in half_trajs:
        tr.reward, tr.status, tr.steps, tr.t = 1.0 - tr.index, ("success", "fail")[tr.index], 9, T0 + 63_000
        projection.write_events(store, [e for e in tr.events() if type(e).__name__ in ("TrajectoryFinished", "RewardAssigned")])
    third = both(T0 + 70_000)
    assert third.open_since_ms == T0 + 20_000 and third.load.ready_groups == 1
    assert horizon.lengths == {"a": 4, "b": 9}
    # a request stamped before the horizon is not read again (it is the caller's job, the data
    # manager's, never to move the horizon past a request it sent and has not seen projected)
    projection.write_events(store, [request("b", "g-late", 0, 1, t=T0 + 5_000)])
    late, _ = schedule_inputs(store, cfg, now_ms=T0 + 71_000, pending_requests=set(), horizon=horizon)
    assert {t.task_id: t.open_groups for t in late.tasks}["b"] == 0
    # where the batcher may put an experience-pool success into an all-fail group, that group
    # stays in view (and counts as batchable) until it is batched or stale
    pooled = dataclasses.replace(cfg, curation=dataclasses.replace(cfg.curation, inject_experience=True))
    whole, _ = schedule_inputs(store, pooled, now_ms=T0 + 72_000, pending_requests=set())
    assert whole.open_since_ms == T0 + 5_000 and whole.batchable == 2      # it, and the finished "b" group


def test_rates_lengths_and_the_pool_are_read_again_every_stats_every_s_or_on_a_new_version(store: Store) -> None:
    """``SlowStats``: the three slow queries of a pass (two thirds of its time) run every
    ``scheduler.stats_every_s`` or when the policy version moves; in between a pass decides on
    the numbers it kept. A fresh ``SlowStats`` (``every_ms=0``) reads on every pass."""
    from dart.data.config import CurationConfig, DataConfig, SchedulerConfig
    from dart.data.rule_inputs import Horizon, SlowStats, batch_inputs, schedule_inputs
    from tests.data.factories import weights

    cfg = DataConfig(scheduler=SchedulerConfig(capacity=16, stats_every_s=10.0),
                     curation=CurationConfig(min_failed_steps=0, staleness_bound=100, max_steps=30, steps_slack=1.5))
    first, _ = group("a", [1.0, 0.0], t=T0, steps=4)
    projection.write_events(store, [task("a"), *first])
    slow, horizon = SlowStats(every_ms=10_000), Horizon()

    def rates_caps(now: int, kept: SlowStats | None) -> tuple[dict, dict]:
        inputs, _ = schedule_inputs(store, cfg, now_ms=now, pending_requests=set(), horizon=horizon, slow=kept)
        return ({t.task_id: t.success_rate for t in inputs.tasks}, {t.task_id: t.max_steps for t in inputs.tasks})

    assert rates_caps(T0 + 60_000, slow) == ({"a": 0.5}, {"a": 6})
    second, _ = group("a", [1.0, 1.0], t=T0 + 61_000, steps=8)
    projection.write_events(store, second)
    assert rates_caps(T0 + 65_000, slow) == ({"a": 0.5}, {"a": 6})           # kept: 5 s old
    assert rates_caps(T0 + 65_000, None) == ({"a": 0.75}, {"a": 12})         # what a read says now
    assert rates_caps(T0 + 70_000, slow) == ({"a": 0.75}, {"a": 12})         # 10 s: read again
    third, _ = group("a", [0.0, 0.0], t=T0 + 71_000, steps=8)
    projection.write_events(store, [*third, weights(1, None, t=T0 + 71_500)])
    assert rates_caps(T0 + 72_000, slow) == rates_caps(T0 + 72_000, None)    # a new version: read again
    assert slow.rates_version == 1 and slow.rates_ms == T0 + 72_000
    # the experience pool, the batcher's slow read, the same way
    pooled = DataConfig(curation=CurationConfig(inject_experience=True))
    assert batch_inputs(store, pooled, now_ms=T0 + 80_000, slow=slow).pool == {}
    projection.write_events(store, Traj("a", "xp-a", reward=1.0, steps=3, status="success", origin="oracle",
                               mode="experience").events())
    assert batch_inputs(store, pooled, now_ms=T0 + 85_000, slow=slow).pool == {}
    assert list(batch_inputs(store, pooled, now_ms=T0 + 85_000).pool) == ["a"]
    assert list(batch_inputs(store, pooled, now_ms=T0 + 90_000, slow=slow).pool) == ["a"]
    with pytest.raises(ConfigError, match="stats_every_s"):
        SchedulerConfig(stats_every_s=-1)


def test_the_report_counts_staleness_over_the_policy_s_own_steps(store: Store, chdb_path) -> None:
    """An experience-pool trajectory in a batch has no policy version of this run (stamped 0):
    counted, a chain run that trained v36 read "staleness mean 13 max 36" with every online
    sample one or two versions old."""
    import clickhouse_connect

    from dart.data.report import STALENESS, build_report
    from dart.events import BatchAssembled

    online, trajs = group("a", [1.0, 0.0], version=4, steps=2)
    oracle = Traj("a", "xp-a", reward=1.0, steps=3, status="success", origin="oracle", mode="experience")
    batch = BatchAssembled(
        event_id="b1", event_time=T0 + 1_000, run_id="r", producer="dm", batch_id="b-1", seq=0,
        manifest_digest="f" * 64, manifest_bytes=1, num_samples=7, num_groups=1, num_trajectories=3,
        rollout_ids=[*(t.rollout_id for t in trajs), oracle.rollout_id], task_ids=["a"], min_policy_version=4,
        max_policy_version=4, trainer_version=5)
    projection.write_events(store, [task("a"), *online, *oracle.events(), batch])
    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb_path}", database=store.database)   # as `dart report`
    assert client.query(STALENESS).result_rows == [(1, 4)]          # 2 rollouts x 2 steps, one version old
    assert build_report(lambda sql: client.query(sql).result_rows).staleness == [(1, 4)]


async def test_the_store_thread_reports_calls_waits_and_run_times_per_kind(store):
    """``AsyncStore.usage``: what the data manager logs once a minute (a slow pass starves env slots)."""
    import asyncio
    import time

    from dart.data.store import AsyncStore

    a = AsyncStore(store)

    def slow() -> int:
        time.sleep(0.2)
        return 1

    try:
        results = await asyncio.gather(a.run(slow, kind="schedule"), a.run(slow, kind="schedule"),
                                       a.run(store.query, "SELECT 1"))
        assert results[:2] == [1, 1] and results[2] == [(1,)]
        usage = a.take_usage()
        assert set(usage) == {"schedule", "query"}
        calls, waited, ran = usage["schedule"]
        assert calls == 2 and 0.39 <= ran < 1.0
        # One thread: the second call waited for most of the first's 0.2 s (its wait starts when its
        # coroutine runs, a few ms after the first call's thread began: 0.187 s on a busy CI machine),
        # and the query for most of both. Without the single thread these would be ~0.
        assert waited >= 0.1
        assert usage["query"][1] >= 0.3
        assert a.take_usage() == {}
    finally:
        a.close()
