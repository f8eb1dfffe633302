"""`dart up`'s live display reads the run's progress through the projection's own queries."""

from __future__ import annotations

from dart.data.progress import Snapshot, snapshot_from
from dart.data.store import Store


def test_the_progress_queries_run_on_the_projection_and_an_empty_run_shows_nothing_done(store: Store):
    store.command(f"USE {store.database}")  # the display's client opens the run's database the same way
    snap = snapshot_from(store.query)
    assert not snap.error
    assert (snap.trajectories, snap.successes, snap.updates, snap.batches, snap.by_version) == (0, 0, 0, 0, [])
    assert snap.served == -1  # no rollout worker has loaded weights yet
    assert isinstance(snap, Snapshot)
