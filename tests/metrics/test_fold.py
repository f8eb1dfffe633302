"""The metrics fold alone (`dart.metrics.fold`): hand-made events in, records out, every value
computed by hand here. No broker, no files, no clock."""

from __future__ import annotations

from dart.events import BatchAssembled, DeadLetter
from dart.metrics.fold import Fold, Reorder, Scalar, order_key
from tests.data.factories import RUN, T0, loaded, uid, weights


def batch(trainer_version: int, oldest: int, *, t: int, samples: int = 8, injected: int = 0) -> BatchAssembled:
    return BatchAssembled(event_id=uid(), event_time=t, run_id=RUN, producer="data", batch_id=f"b{t}", seq=0,
                          manifest_digest="d", manifest_bytes=1, num_samples=samples, num_groups=2,
                          num_trajectories=samples, rollout_ids=[], task_ids=[], min_policy_version=oldest,
                          max_policy_version=trainer_version, trainer_version=trainer_version, injected=injected)


def dead(t: int) -> DeadLetter:
    return DeadLetter(event_id=uid(), event_time=t, run_id=RUN, producer="data", source_topic="x.trajectories",
                      partition=0, offset=3, value=b"?", stage="decode", error_type="ValueError", error="bad",
                      consumer_group="g")


def scalars(records) -> list[tuple[str, int, float, int]]:
    return [(r.tag, r.step, r.value, r.wall_ms) for r in records if isinstance(r, Scalar)]


def test_a_batch_gives_its_staleness_samples_and_injected_at_the_trainer_version_and_its_own_time():
    fold = Fold()
    assert scalars(fold.feed(batch(5, 2, t=T0 + 7, samples=12, injected=3))) == [
        ("batch/staleness_max", 5, 3.0, T0 + 7), ("batch/samples", 5, 12.0, T0 + 7), ("batch/injected", 5, 3.0, T0 + 7)]


def test_a_failed_weight_load_writes_nothing_and_a_good_one_its_fetch_and_swap_seconds():
    fold = Fold()
    assert fold.feed(loaded("rollout-0", 3, ok=False, t=T0)) == []
    assert scalars(fold.feed(loaded("rollout-1", 3, t=T0 + 5))) == [("weights/fetch_s/rollout-1", 3, 0.1, T0 + 5),
                                                                     ("weights/swap_s/rollout-1", 3, 0.2, T0 + 5)]


def test_a_window_closes_when_a_newer_version_is_published_and_counts_its_dead_letters_and_rate():
    fold = Fold()
    out = [*fold.feed(weights(0, None, t=T0)), *fold.feed(dead(T0 + 1000)), *fold.feed(dead(T0 + 2000))]
    assert out == []  # nothing is written while v0 is the newest
    closed = scalars(fold.feed(weights(1, "b1", t=T0 + 30_000)))
    # v0's window: opened at T0, closed 30 s later with no trajectory and two dead letters.
    assert closed == [("weights/interval_s", 1, 30.0, T0 + 30_000), ("rollout/trajectories", 0, 0.0, T0 + 30_000),
                      ("rollout/infra_errors", 0, 0.0, T0 + 30_000), ("log/dead_letters", 0, 2.0, T0 + 30_000),
                      ("rollout/per_minute", 0, 0.0, T0 + 30_000)]
    # The window left open at the end is written at the time of the last event folded.
    assert scalars(fold.finish()) == [("rollout/trajectories", 1, 0.0, T0 + 30_000),
                                      ("rollout/infra_errors", 1, 0.0, T0 + 30_000),
                                      ("log/dead_letters", 1, 0.0, T0 + 30_000)]
    assert fold.finish() == [] and fold.folded == 4


def test_a_publication_of_an_older_version_does_not_reopen_its_window():
    fold = Fold()
    fold.feed(weights(2, "b2", t=T0))
    late = scalars(fold.feed(weights(1, "b1", t=T0 + 500)))
    assert late == []  # no v0 publication to measure from, and v2's window stays open
    assert fold.window is not None and fold.window.version == 2


def test_the_same_events_give_the_same_records_in_two_folds():
    events = [weights(0, None, t=T0), batch(0, 0, t=T0 + 1), dead(T0 + 2), weights(1, "b1", t=T0 + 60_000)]
    runs = []
    for _ in range(2):
        fold = Fold()
        runs.append([r for e in events for r in fold.feed(e)] + fold.finish())
    assert runs[0] == runs[1] and len(runs[0]) == 3 + 1 + 4 + 3


def test_events_at_the_same_millisecond_are_released_in_event_id_order():
    a, b = dead(T0), dead(T0)
    reorder = Reorder(lateness_ms=0)
    reorder.push(max(a, b, key=order_key))
    reorder.push(min(a, b, key=order_key))
    assert [e.event_id for e in reorder.due(T0)] == sorted([a.event_id, b.event_id]) and len(reorder) == 0
