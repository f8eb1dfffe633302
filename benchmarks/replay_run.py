"""`dart replay RUN_DIR` end to end, as a user runs it, with two source trees pass by pass.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replay_run.py RUN_DIR --before /tmp/before [--passes 5]

``--before`` is another checkout (e.g. ``git archive <commit> | tar -x -C /tmp/before``); the
after side is this checkout. Each pass starts a fresh ``python -m dart.cli replay RUN_DIR``
process (the replay goes into a new database of the run's own store, dropped at the end) and reads
the events/s it prints (the rebuild alone) and the process's wall time; both sides must report
every table equal. Medians and spreads of the interleaved passes (``benchmarks/passes.py``), and
the ratio of medians.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import passes

ROOT = Path(__file__).resolve().parents[1]
RATE = re.compile(r"\(([\d,]+) events/s\)")


def replay_once(tree: Path, run_dir: Path) -> tuple[float, float]:
    """(events/s the command printed, wall seconds of the process); fails unless all tables are equal."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "dart.cli", "replay", str(run_dir)], capture_output=True, text=True,
                         env=env, cwd="/", timeout=900)
    wall = time.monotonic() - t0
    rate = RATE.search(out.stdout)
    if out.returncode != 0 or rate is None:
        raise SystemExit(f"dart replay with {tree} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    rows = [line.split() for line in out.stdout.splitlines() if line.endswith((" yes", " NO"))]
    if not rows or any(r[-1] != "yes" for r in rows):
        raise SystemExit(f"dart replay with {tree}: not every table equal:\n{out.stdout[-2000:]}")
    return float(rate[1].replace(",", "")), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, help="a finished run's directory (its log/ and chdb/)")
    ap.add_argument("--before", type=Path, required=True, help="the other source tree")
    ap.add_argument("--passes", type=int, default=passes.MIN_PASSES)
    args = ap.parse_args()
    walls: dict[str, list[float]] = {"before": [], "after": []}

    def side(tree: Path, name: str):  # type: ignore[no-untyped-def]
        def run(_i: int) -> float:
            rate, wall = replay_once(tree, args.run_dir)
            walls[name].append(wall)
            return rate
        return run

    print(f"dart replay {args.run_dir}: before = {args.before}, after = {ROOT}; load {os.getloadavg()[0]:.1f}")
    rates = passes.interleave({"before": side(args.before, "before"), "after": side(ROOT, "after")}, args.passes,
                              on_pass=passes.pass_line("events/s"))
    print(passes.report(rates, "events/s"))
    print(passes.ratio_line(rates, "after", "before"))
    wall = {name: passes.Summary(tuple(v)) for name, v in walls.items()}
    print(passes.report(wall, "s wall (the whole command)", ".1f"))
    print(f"load average at the end {os.getloadavg()[0]:.1f} (2-core machine: figures move with it)")


if __name__ == "__main__":
    main()
