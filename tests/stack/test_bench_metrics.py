"""The decoupled-vs-coupled benchmark's metrics (pure functions of projection rows)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


m = _load("coupling_metrics")


def beat(worker: str, role: str, t_s: float, busy: float, idle: float, state: str = "running") -> dict:
    return {"worker_id": worker, "role": role, "state": state, "t_ms": int(t_s * 1000), "busy_s": busy,
            "idle_s": idle, "uptime_s": t_s}


def update(t_s: float, samples: int, version: int, batch: str = "", duration: float = 1.0) -> dict:
    return {"t_ms": int(t_s * 1000), "num_samples": samples, "policy_version": version, "batch_id": batch,
            "duration_s": duration}


def traj(t_s: float, rid: str = "r", versions=(0,), origin: str = "online", status: str = "failure",
         request: str = "q", held_s: float = 1.0) -> dict:
    return {"t_ms": int(t_s * 1000), "rollout_id": rid, "request_id": request, "step_policy_versions": list(versions),
            "origin": origin, "mode": "train", "status": status, "reset_s": 0.1 * held_s, "env_s": 0.5 * held_s,
            "policy_wait_s": 0.3 * held_s, "eval_s": 0.1 * held_s}


def test_utilisation_takes_counter_deltas_inside_the_window_only():
    # 4 slots: idle for the first 10 s (start-up), then 3 of 4 slots busy.
    beats = [beat("env-0", "env", t, busy=max(0, t - 10) * 3, idle=min(t, 10) * 4 + max(0, t - 10) * 1)
             for t in range(0, 31, 2)]
    assert m.utilisation(beats, "env", 10_000, 30_000) == pytest.approx(0.75)
    # Including start-up would have said much less.
    assert m.utilisation(beats, "env", 0, 30_000) == pytest.approx(60 / 120)


def test_utilisation_sums_workers_and_ignores_other_roles_and_lonely_beats():
    beats = [beat("a", "rollout", 0, 0, 0), beat("a", "rollout", 10, 10, 0),     # 100 % busy
             beat("b", "rollout", 0, 0, 0), beat("b", "rollout", 10, 0, 10),     # idle
             beat("c", "rollout", 5, 1, 1),                                       # one beat: no delta
             beat("e", "env", 0, 0, 0), beat("e", "env", 10, 0, 80)]
    assert m.utilisation(beats, "rollout", 0, 10_000) == pytest.approx(0.5)
    assert m.utilisation(beats, "trainer", 0, 10_000) is None


def test_steady_window_starts_at_the_first_update_and_ends_before_the_stop():
    beats = [beat("env-0", "env", t, 0, 0) for t in range(0, 61)] + [beat("env-0", "env", 62, 0, 0, "stopped")]
    beats += [beat("rollout-0", "rollout", t, 0, 0) for t in range(5, 59)]
    assert m.steady_window(beats, [update(20, 8, 1), update(30, 8, 2)]) == (20_000, 58_000)
    with pytest.raises(m.WindowError, match="no update"):
        m.steady_window(beats, [])
    with pytest.raises(m.WindowError, match="empty"):
        m.steady_window(beats, [update(59, 8, 1)])


def test_train_throughput_counts_samples_after_the_first_update_over_first_to_last():
    ups = [update(10, 99, 1), update(20, 30, 2), update(30, 30, 3), update(45, 1000, 4)]
    # window [10, 40]: updates at 10 (its samples came before the window), 20 and 30.
    assert m.train_throughput(ups, 10_000, 40_000) == pytest.approx(60 / 20)
    assert m.train_throughput(ups[:1], 0, 40_000) is None


def test_per_minute_counts_online_training_trajectories_that_were_not_infra_errors():
    trajs = [traj(t) for t in (1, 2, 3, 4)] + [traj(5, origin="oracle"), traj(6, status="infra_error"),
                                               traj(31)]
    assert m.per_minute(trajs, 0, 30_000) == pytest.approx(8.0)
    trajs[0]["status"] = "success"
    assert m.success_rate(trajs, 0, 30_000) == pytest.approx(1 / 4)
    assert m.success_rate(trajs, 40_000, 50_000) is None


def test_trajectory_seconds_is_the_mean_slot_time_of_online_trajectories_in_the_window():
    trajs = [traj(1, held_s=2.0), traj(2, held_s=4.0), traj(3, held_s=50.0, origin="oracle"), traj(40, held_s=9.0)]
    assert m.trajectory_seconds(trajs, 0, 30_000) == pytest.approx(3.0)
    assert m.trajectory_seconds(trajs, 50_000, 60_000) is None


def test_staleness_is_trainer_version_at_the_gradient_minus_each_step_version():
    batches = [{"batch_id": "b1", "rollout_ids": ["r1", "r2", "oracle:x"]}]
    trajs = [traj(1, "r1", versions=(0, 1)), traj(1, "r2", versions=(2,)),
             traj(1, "oracle:x", versions=(0, 0, 0), origin="oracle")]
    # The update that published v4 took its gradient at v3: gaps 3, 2, 1 (the oracle's left out).
    assert m.mean_staleness([update(10, 3, 4, "b1")], batches, trajs, 0, 20_000) == pytest.approx(2.0)
    assert m.mean_staleness([update(10, 3, 1, "b1")], batches, [traj(1, "r1", versions=(0, 0))], 0, 20_000) == 0


def test_ratios_divide_decoupled_by_coupled_and_leave_missing_ones_out():
    r = m.ratios({"env_util": 0.99, "rollout_util": 0.8, "train_samples_per_s": 6.0},
                 {"env_util": 0.18, "rollout_util": 0.0, "train_samples_per_s": None})
    assert r == {"env_util": 5.5, "rollout_util": None, "train_samples_per_s": None}


def test_coupled_rounds_split_each_round_into_its_phases():
    requests = [{"request_id": "a", "t_ms": 0}, {"request_id": "b", "t_ms": 100},      # round 1
                {"request_id": "c", "t_ms": 20_000},                                  # round 2: no batch
                {"request_id": "d", "t_ms": 30_000}]                                  # round 3 (open)
    trajs = [traj(4, "ra", request="a"), traj(6, "rb", request="b"), traj(25, "rc", request="c")]
    batches = [{"batch_id": "b1", "t_ms": 7_000, "rollout_ids": ["ra", "rb"]}]
    ups = [update(12, 8, 1, "b1")]
    loaded = [{"worker_id": "r0", "version": 1, "t_ms": 15_000}, {"worker_id": "r1", "version": 1, "t_ms": 17_000}]
    first, second = m.coupled_rounds(requests, trajs, batches, ups, loaded)
    assert first == {"rollout": 6.0, "batch": 1.0, "train": 5.0, "sync": 5.0, "next": 3.0, "round": 20.0,
                     "trajectories": 2, "batched": 1}
    assert second == {"rollout": 5.0, "batch": 0.0, "train": 0.0, "sync": 0.0, "next": 5.0, "round": 10.0,
                      "trajectories": 1, "batched": 0}
    assert m.coupled_rounds(requests, trajs, batches, ups, loaded, t0=1) == [second]
    assert m.mean_phases([first, second]) == {"rollout": 5.5, "batch": 0.5, "train": 2.5, "sync": 2.5, "next": 4.0,
                                              "round": 15.0, "trajectories": 1.5, "batched": 0.5}


def test_sweep_points_cover_slots_and_tails_without_repeating_the_headline():
    b = _load("decoupled_vs_coupled")
    head = b.Point(slots=8)
    points = b.sweep_points(head, "4,8,16", "1,10,30")
    assert [(p.slots, p.tail) for p in points] == [(4, 10.0), (16, 10.0), (8, 1.0), (8, 30.0)]
    assert points[2].latency()["kind"] == "fixed" and "p99_s" not in points[2].latency()


def test_passes_interleave_the_sides_and_compare_medians() -> None:
    passes = _load("passes")
    order: list[str] = []
    values = {"a": [10.0, 30.0, 20.0, 1000.0, 25.0], "b": [5.0, 5.0, 6.0, 4.0, 50.0]}

    def side(name: str):  # type: ignore[no-untyped-def]
        def run(i: int) -> float:
            order.append(f"{name}{i}")
            return values[name][i]
        return run

    got = passes.interleave({"a": side("a"), "b": side("b")}, 5)
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3", "a4", "b4"]   # pass by pass
    assert got["a"].median == 25.0 and got["b"].median == 5.0                     # one outlier moves nothing
    assert passes.ratio(got, "a", "b") == 5.0
    assert got["a"].low == 10.0 and got["a"].high == 1000.0
    assert "only 2 passes" in passes.ratio_line(passes.interleave({"a": side("a"), "b": side("b")}, 2), "a", "b")
    assert "median (min 10, max 1,000" in passes.report(got, "x/s")
    with pytest.raises(ValueError, match="passes"):
        passes.interleave({"a": side("a")}, 0)
