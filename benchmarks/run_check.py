"""What opening a run as data costs: `dart sql --run RUN_DIR` with the store check against the same
command with ``--trust-run`` (no check), and the check alone in-process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/run_check.py [--passes 5]

The run directory is built once: dart's schema (every migration), a few trajectories and a replay
database created and dropped, as a data manager leaves a store. Each pass runs both commands as a
user does (a fresh process each: chdb opens one path per process), interleaved
(``benchmarks/passes.py``); a third side times :func:`dart.data.storecheck.check_store` alone in a
fresh process (its in-memory parse engine included).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from passes import interleave, line, ratio

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def build(run: Path) -> None:
    script = textwrap.dedent(f"""
        from dart.data import projection
        from dart.data.store import Store
        from tests.data.factories import group, task
        store = Store.open_dsn("chdb://{run / 'chdb'}", database="dart")
        store.migrate()
        projection.write_events(store, [task("t-1"), *group("t-1", [1.0, 0.0, 1.0, 0.0])[0]])
        Store(store.client, "dart_replay_1", store.target).migrate()
        store.command("DROP DATABASE dart_replay_1")
        store.close()
    """)
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, check=True)


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=ENV, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dart-run-check-") as tmp:
        run = Path(tmp) / "run"
        build(run)
        sql = [sys.executable, "-m", "dart.cli", "sql", "SELECT count() FROM trajectories FINAL", "--run", str(run)]
        alone = [sys.executable, "-c", "import sys, time; t = time.perf_counter(); "
                 "from pathlib import Path; from dart.data.storecheck import check_store; "
                 f"check_store(Path({str(run / 'chdb')!r})); print(time.perf_counter() - t)"]
        sides = {
            "checked": lambda i: timed(sql),
            "trusted": lambda i: timed([*sql, "--trust-run"]),
            "check alone": lambda i: float(subprocess.run(alone, cwd=REPO, env=ENV, check=True, capture_output=True,
                                                          text=True).stdout),
        }
        got = interleave(sides, passes=args.passes)
    for name, summary in got.items():
        print(line(f"{name:12s}", summary, "s", ".2f"))
    print(f"`dart sql --run` with the check / without: {ratio(got, 'checked', 'trusted'):.2f}x")


if __name__ == "__main__":
    main()
