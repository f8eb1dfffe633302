"""The commit watermark of :class:`dart.bus.UnorderedConsumer` (pure; the consumer itself runs
against a real broker in tests/env/test_worker.py: redone requests after a kill, rebalances)."""

from __future__ import annotations

import random

import pytest

from dart.bus import OffsetWatermark


def test_watermark_commits_only_the_contiguous_done_prefix():
    w = OffsetWatermark()
    for off in (10, 11, 12, 13):
        w.track(0, off)
    assert w.commit_point(0) == 10
    assert w.complete(0, 12) is None  # 10 and 11 still running
    assert w.complete(0, 11) is None
    assert w.complete(0, 10) == 13  # 10..12 done, 13 still running
    assert w.complete(0, 13) == 14
    assert w.complete(0, 13) is None  # a duplicate completion changes nothing
    assert w.commit_point(1) is None


def test_watermark_random_out_of_order_completion_never_skips_unfinished_work():
    rng = random.Random(0)
    w = OffsetWatermark()
    offsets = list(range(100, 160, 2))  # gaps between offsets (compaction, markers) are fine
    for off in offsets:
        w.track(3, off)
    order = offsets[:]
    rng.shuffle(order)
    done: set[int] = set()
    last = 100
    for off in order:
        done.add(off)
        point = w.complete(3, off)
        if point is not None:
            assert point > last
            last = point
        unfinished = [o for o in offsets if o not in done]
        assert w.commit_point(3) == (min(unfinished) if unfinished else offsets[-1] + 1)
        assert all(o in done for o in offsets if o < w.commit_point(3))
    assert last == offsets[-1] + 1


def test_watermark_forgets_revoked_partitions_and_rejects_reordered_tracking():
    w = OffsetWatermark()
    w.track(0, 5)
    w.track(1, 7)
    w.forget([0])
    assert w.complete(0, 5) is None and w.commit_point(0) is None
    assert w.in_flight() == 1
    with pytest.raises(ValueError, match="out of order"):
        w.track(1, 6)
