"""The weight-sync table before and after a change: two source trees, pass by pass, interleaved.

    git archive main | tar -x -C /tmp/main-tree
    PYTHONPATH=$PWD .venv/bin/python benchmarks/weight_sync_ab.py --before /tmp/main-tree --after . \\
        --sizes 160m,1.0b --passes 5

Each pass runs each tree's own ``benchmarks/weight_sync.py`` (N = 1, one version per path: blobs,
then direct) in a fresh process whose ``PYTHONPATH`` is that tree (its rollout workers too), the
before side first, then the after side (``passes.interleave``'s order), so a busy moment of the
shared machine falls on both. Around the tree's ``version_dir`` (the trainer's checkpoint writer:
state dict to ``model.safetensors``, fsynced) this script times the checkpoint write itself, so
a tree whose script does not report it is measured the same way.

Per size and path: median, min and max over the passes of the checkpoint write, the publication
step (``WeightTransfer.publish``), the slowest fetch and swap, publish → serving, and two rates of
the version's bytes: over the publication step alone (the table's publish column) and over
checkpoint write + publication (state dict to a stored version). Ratio after/before of the
medians. Results: ``--out`` (.json, .md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import passes

REPO = Path(__file__).resolve().parents[1]

_SHIM = """
import asyncio, json, sys, time
tree, out, times_path, *args = sys.argv[1:]
sys.path[:0] = [tree, tree + "/benchmarks"]
sys.argv = ["weight_sync.py", *args, "--out", out]
import weight_sync as ws
times, inner = [], ws.version_dir
def timed(*a, **kw):
    t0 = time.perf_counter()
    made = inner(*a, **kw)
    times.append(time.perf_counter() - t0)
    return made
ws.version_dir = timed
asyncio.run(ws.main())
with open(times_path, "w") as fh:
    json.dump(times, fh)
"""

METRICS = {
    # name: (unit, figure of a row, higher is better)
    "checkpoint write": ("s", lambda r: r["write_s"], False),
    "publish": ("s", lambda r: r["publish_s"], False),
    "publish rate": ("MB/s", lambda r: r["bytes"] / 1e6 / r["publish_s"], True),
    "write + publish rate": ("MB/s", lambda r: r["bytes"] / 1e6 / (r["write_s"] + r["publish_s"]), True),
    "slowest fetch": ("s", lambda r: r["fetch_s"], False),
    "swap": ("s", lambda r: r["swap_s"], False),
    "published → serving": ("s", lambda r: r["serving_s"], False),
}


def one_run(tree: Path, sizes: str, workdir: Path, log: Path) -> list[dict]:
    """The rows of one ``weight_sync.py`` run of ``tree``, each with its checkpoint write timed here."""
    with tempfile.TemporaryDirectory(prefix="ws-ab-") as tmp:
        out, times = Path(tmp) / "ws", Path(tmp) / "times.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        with log.open("ab") as fh:
            subprocess.run([sys.executable, "-c", _SHIM, str(tree), str(out), str(times), "--sizes", sizes,
                            "--workers", "1", "--versions", "1", "--workdir", str(workdir)],
                           cwd=tree, env=env, stdout=fh, stderr=subprocess.STDOUT, check=True)
        rows = json.loads(out.with_suffix(".json").read_text())["rows"]
        written = json.loads(times.read_text())
    if len(written) != len(rows):
        raise RuntimeError(f"{tree}: {len(rows)} rows but {len(written)} checkpoint writes")
    return [{**row, "write_s": w} for row, w in zip(rows, written, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="source tree of the code before (git archive)")
    ap.add_argument("--after", type=Path, default=REPO)
    ap.add_argument("--sizes", default="160m,1.0b")
    ap.add_argument("--passes", type=int, default=passes.MIN_PASSES)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dart-weight-sync"))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "weight_sync_ab")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    rows: dict[str, list[dict]] = {side: [] for side in trees}
    loads: list[float] = []
    started = time.time()

    def side(name: str):  # type: ignore[no-untyped-def]
        def run(i: int) -> float:
            got = one_run(trees[name], args.sizes, args.workdir, args.workdir / f"ab-{name}.log")
            rows[name] += [{**r, "pass": i} for r in got]
            loads.append(os.getloadavg()[0])
            for r in got:
                print(f"  pass {i + 1} {name} {r['size']} {r['path']}: write {r['write_s']:.2f} s, publish "
                      f"{r['publish_s']:.2f} s, fetch {r['fetch_s']:.2f} s, swap {r['swap_s']:.2f} s, serving "
                      f"{r['serving_s']:.2f} s", flush=True)
            return 0.0
        return run

    passes.interleave({name: side(name) for name in trees}, args.passes)
    lines = ["| model | path | figure | before: median (min–max) | after: median (min–max) | after / before |",
             "|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["size"], r["path"]) for r in rows["after"]))
    summary = []
    for size, path in keys:
        for metric, (unit, figure, _) in METRICS.items():
            got = {s: passes.Summary(tuple(figure(r) for r in rows[s] if (r["size"], r["path"]) == (size, path)))
                   for s in trees}
            fmt = ".0f" if unit == "MB/s" else ".2f"
            cells = [f"{got[s].median:{fmt}} {unit} ({got[s].low:{fmt}}–{got[s].high:{fmt}})" for s in trees]
            lines.append(f"| {size} | {path} | {metric} | {cells[0]} | {cells[1]} | "
                         f"{passes.ratio(got, 'after', 'before'):.2f} |")
            summary.append({"size": size, "path": path, "figure": metric, "unit": unit,
                            **{s: got[s].as_dict(3) for s in trees}})
    text = "\n".join(lines)
    print(text)
    meta = {"command": "benchmarks/weight_sync_ab.py " + " ".join(sys.argv[1:]), "started": started,
            "wall_s": time.time() - started, "load_1min": {"min": min(loads), "max": max(loads)},
            "machine": f"{os.cpu_count()} CPU cores (shared), no GPU"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({**meta, "summary": summary, "rows": rows}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# Weight sync before / after\n\n`PYTHONPATH=$PWD .venv/bin/python {meta['command']}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {meta['machine']}, "
        f"1-min load {min(loads):.1f}–{max(loads):.1f}, {meta['wall_s'] / 60:.1f} min); "
        f"{args.passes} passes per side, interleaved, N = 1 worker, one version per path and pass.\n\n{text}\n")


if __name__ == "__main__":
    main()
