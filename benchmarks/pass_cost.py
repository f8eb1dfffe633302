"""What one data-manager pass costs on a real run's store: a scheduler pass and a batcher pass
as the data manager runs them late in that run (from the horizon), with the slow statistics
(success rates, longest successes, experience pool) read on the pass against kept from an
earlier one (``scheduler.stats_every_s``).

    .venv/bin/python benchmarks/pass_cost.py runs/learning/synthetic-fast/full-s0 [--repeat 7]

The run's ``chdb`` directory is copied first (a data manager may own it); prints the median
of ``--repeat`` passes of each kind and the ratios.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ingest import timed as median_ms  # noqa: E402  (benchmarks/ingest.py: median ms of repeated calls)

from dart.data.config import CurationConfig, DataConfig  # noqa: E402
from dart.data.rule_inputs import Horizon, SlowStats, batch_inputs, schedule_inputs  # noqa: E402
from dart.data.store import Store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a run directory (holds chdb/)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(args.run / "chdb", Path(tmp) / "chdb", symlinks=True)   # data/<db> links into store/
        store = Store.open_dsn(f"chdb://{Path(tmp) / 'chdb'}")
        db = store.database
        counts = {t: store.query(f"SELECT count() FROM {db}.{t}")[0][0] for t in ("requests", "trajectories", "actions")}
        end = int(store.query(f"SELECT toUnixTimestamp64Milli(max(event_time)) FROM {db}.requests")[0][0])
        cfg = DataConfig(curation=CurationConfig(inject_experience=True))
        since = schedule_inputs(store, cfg, now_ms=end, pending_requests=set())[0].open_since_ms
        print(f"{args.run}: {counts['requests']} requests, {counts['trajectories']} trajectories, "
              f"{counts['actions']} actions; a late pass reads groups requested in the last {(end - since) / 1000:.0f} s")

        def late() -> Horizon:
            return Horizon(open_since_ms=since, lengths_read_ms=end)

        kept = SlowStats(every_ms=10**12)
        schedule_inputs(store, cfg, now_ms=end, pending_requests=set(), horizon=late(), slow=kept)
        batch_inputs(store, cfg, since_ms=since, now_ms=end, slow=kept)
        rows = [
            ("scheduler pass", median_ms(lambda: schedule_inputs(
                store, cfg, now_ms=end, pending_requests=set(), horizon=late()), args.repeat),
             median_ms(lambda: schedule_inputs(
                store, cfg, now_ms=end, pending_requests=set(), horizon=late(), slow=kept), args.repeat)),
            ("batcher pass", median_ms(lambda: batch_inputs(store, cfg, since_ms=since), args.repeat),
             median_ms(lambda: batch_inputs(store, cfg, since_ms=since, now_ms=end, slow=kept), args.repeat)),
        ]
        print(f"{'median of ' + str(args.repeat):<16} {'statistics read':>16} {'kept':>8} {'ratio':>7}")
        for name, read, kept_ms in rows:
            print(f"{name:<16} {read:>13.1f} ms {kept_ms:>5.1f} ms {read / kept_ms:>6.2f}x")


if __name__ == "__main__":
    main()
