"""The metrics sink's fold, by hand-made event histories: the numbers it writes, and that they do not
depend on the order the log hands the events over in (partitions, topics, arrival)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dart.bus.topics import Topics
from dart.events import TrainStepCompleted, WorkerHeartbeat, encode
from dart.log.segments import archive_record, write_segment
from dart.metrics.fold import Fold, Reorder, Scalar, order_key
from dart.metrics.sink import MetricsConfig, TensorBoardOut, from_archive
from tests.data.factories import RUN, T0, Traj, group, task, uid, weights


def beat(worker: str, t: int, busy: float, idle: float, role: str = "env") -> WorkerHeartbeat:
    return WorkerHeartbeat(event_id=uid(), event_time=t, run_id=RUN, producer=worker, worker_id=worker, role=role,
                           state="running", host="h", pid=1, slots=4, slots_busy=0, busy_s=busy, idle_s=idle,
                           uptime_s=busy + idle)


def train_step(version: int, t: int) -> TrainStepCompleted:
    return TrainStepCompleted(event_id=uid(), event_time=t, run_id=RUN, producer="trainer", step=version,
                              policy_version=version, batch_id=f"b{version}", loss=0.25 * version, kl=0.0,
                              entropy=1.5, clip_frac=0.1, tis_mean=1.0, logprob_mismatch=0.0, grad_norm=0.3,
                              num_samples=4, num_tokens=12, duration_s=0.2, tokens_per_s=60.0,
                              metrics={"clip/high_frac": 0.05, "ratio/abs_dev": 0.02})


def history() -> list:
    """Two versions: v0 sees a success and a failure of task a, v1 a stale failure of task b."""
    events = [task("a", t=T0), task("b", t=T0), weights(0, None, t=T0 + 10)]
    g, _ = group("a", [1.0, 0.0], t=T0 + 100)
    events += g
    events += [beat("env-0", T0 + 50, 1.0, 1.0), beat("env-0", T0 + 1500, 4.0, 2.0)]
    events += [train_step(1, T0 + 1800), weights(1, "b1", t=T0 + 2000)]
    events += Traj("b", "g2", status="fail", reward=0.0, version=0, t=T0 + 2100).events()
    infra = Traj("b", "g3", status="infra_error", reward=None, version=1, t=T0 + 2200).events()
    return events + infra


def by_tag(records) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in records:
        if isinstance(r, Scalar):
            out.setdefault(r.tag, {})[r.step] = r.value
    return out


def fold_all(events, **kw) -> list:
    fold = Fold(**kw)
    out = [r for e in sorted(events, key=order_key) for r in fold.feed(e)]
    return out + fold.finish()


def test_the_fold_writes_each_version_window_and_each_update_at_its_policy_version():
    s = by_tag(fold_all(history()))
    assert s["rollout/trajectories"] == {0: 2, 1: 1}  # the infra error is not a trajectory of the policy
    assert s["rollout/infra_errors"] == {0: 0, 1: 1}
    assert s["rollout/success_rate"] == {0: 0.5, 1: 0.0}
    assert s["rollout/reward_mean"] == {0: 0.5, 1: 0.0}
    assert s["rollout/staleness_mean"] == {0: 0.0, 1: 1.0}  # finished under v1 with v0's actions
    assert s["rollout/per_minute"][0] == pytest.approx(2 / (2000 / 60_000))  # 2 in the 2 s before v1
    assert s["success_by_instruction/do a"] == {0: 0.5}
    assert s["success_by_instruction/do b"] == {1: 0.0}
    assert s["utilisation/env"] == {0: pytest.approx(4.0 / 6.0)}  # the counters' growth, first beat included
    assert s["train/loss"] == {1: 0.25} and s["update/ratio/abs_dev"] == {1: 0.02}
    assert s["weights/interval_s"] == {1: pytest.approx(1.99)}
    assert s["rollout/step_generate_s"][0] == pytest.approx(0.01)


def test_a_record_on_the_log_twice_counts_once_and_a_restarted_worker_counts_from_0():
    events = history()
    again = [e for e in events if type(e).__name__ in ("TrajectoryFinished", "RewardAssigned")]
    restarted = beat("env-0", T0 + 1600, 0.5, 0.5)  # uptime went back: a new process, its counters from 0
    s = by_tag(fold_all([*events, *again, restarted]))
    assert s["rollout/trajectories"] == {0: 2, 1: 1}
    assert s["rollout/reward_mean"] == {0: 0.5, 1: 0.0}
    assert s["utilisation/env"] == {0: pytest.approx(4.5 / 7.0)}


def test_pictures_at_every_kth_version_of_the_first_trajectories_drawn_as_dart_trace_draws_them():
    records = fold_all(history(), load_png=lambda digest: None, image_every_versions=1, images_per_version=1)
    pictures = [r for r in records if not isinstance(r, Scalar)]
    assert [(p.tag, p.step) for p in pictures] == [("trajectory/0", 0), ("trajectory/0", 1)]
    assert all(p.png.startswith(b"\x89PNG") and p.width > 300 for p in pictures)
    every_2 = fold_all(history(), load_png=lambda digest: None, image_every_versions=2, images_per_version=3)
    assert [(p.tag, p.step) for p in every_2 if not isinstance(p, Scalar)] == [("trajectory/0", 0),
                                                                             ("trajectory/1", 0)]


def test_held_events_come_out_in_event_time_order_and_a_late_one_is_counted():
    events = history()
    shuffled = random.Random(3).sample(events, len(events))
    reorder = Reorder(lateness_ms=1000)
    assert all(reorder.push(e) == [] for e in shuffled)
    first = list(reorder.due(T0 + 1500))  # events up to T0 + 500
    assert first == sorted([e for e in events if e.event_time <= T0 + 500], key=order_key)
    rest = list(reorder.drain())
    assert first + rest == sorted(events, key=order_key)
    old = replace(events[0], event_id=uid())
    assert reorder.push(old) == [old] and reorder.late == 1


def write_archive(log_dir: Path, events, seed: int, prefix: str = "t", partitions: int = 2) -> None:
    """``events`` as an archive: each topic's events spread over ``partitions`` partitions in a shuffled order."""
    topics = Topics(prefix)
    parts: dict[tuple[str, int], list] = {}
    rng = random.Random(seed)
    for e in rng.sample(events, len(events)):
        topic = topics.for_event(type(e))
        parts.setdefault((topic, rng.randrange(partitions)), []).append(e)
    for (topic, p), evs in parts.items():
        write_segment(log_dir, topic, p, [archive_record(topic, p, i, e.event_time, None, None, encode(e),
                                                         type(e).__name__) for i, e in enumerate(evs)], fsync=False)


def read_back(directory: Path) -> tuple[dict, dict]:
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    return ({t: [(e.step, e.value, e.wall_time) for e in acc.Scalars(t)] for t in tags["scalars"]},
            {t: [(e.step, e.encoded_image_string) for e in acc.Images(t)] for t in tags["images"]})


def test_any_layout_of_the_log_gives_the_same_tensorboard_records(tmp_path, monkeypatch):
    events = history()
    monkeypatch.setattr("dart.metrics.sink.blob_loader", lambda root: (lambda digest: None) if root else None)
    results = []
    for seed in (1, 2):
        write_archive(tmp_path / f"log{seed}", events, seed)
        cfg = MetricsConfig(out_dir=tmp_path / f"tb{seed}", blobs="blobs", images_per_version=1)
        done = from_archive(tmp_path / f"log{seed}", cfg)
        assert done["events"] == sum(type(e).__name__ != "RolloutRequested" for e in events)  # not followed
        results.append(read_back(tmp_path / f"tb{seed}"))
    # ... and the same as folding the events one by one in their order, as the live sink does.
    out = TensorBoardOut(tmp_path / "direct")
    out.write(fold_all(events, load_png=lambda digest: None, images_per_version=1))
    out.close()
    assert results[0] == results[1] == read_back(tmp_path / "direct")
    scalars, images = results[0]
    assert scalars["train/loss"] == [(1, 0.25, (T0 + 1800) / 1000)]  # wall time = the event's own time
    assert sorted(images) == ["trajectory/0"] and [s for s, _ in images["trajectory/0"]] == [0, 1]


def test_a_restarted_sink_writes_its_files_again_from_the_start(tmp_path):
    records = fold_all(history())
    for _ in range(2):  # the second writer is a restart: the first one's file goes
        out = TensorBoardOut(tmp_path / "tb")
        out.write(records)
        out.close()
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
    scalars, _ = read_back(tmp_path / "tb")
    assert scalars["rollout/success_rate"] == [(0, 0.5, (T0 + 2000) / 1000), (1, 0.0, (T0 + 3200) / 1000)]
