"""Does a check on dev tasks pick the version the held-out tasks would? Finished runs, re-measured.

For each run directory (what `dart up` or `benchmarks/learning.py` left), every ``--every``-th
published policy version and the last one are measured on the recipe's dev tasks
(:func:`dart.recipe.config.make_dev_tasks`: training-split tasks never trained on) and on every
held-out task, one greedy episode each; the table gives both per version, the version the dev
check keeps (:func:`dart.stack.select.pick_best`), and the held-out success of that version
against the last one's.

    .venv/bin/python benchmarks/dev_check.py runs/learning/synthetic-48/preset-s2 --dev-tasks 600

A run without its own ``stack.yaml`` (a `make run` directory) is read with ``--config``'s recipe
and the seed in its ``summary.json``. Output: a markdown table on stdout, and ``--json`` if given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def measure_run(workdir: Path, *, config: Path, dev_tasks: int, every: int) -> dict[str, Any]:
    import yaml

    from dart.blobs import LocalBlobStore
    from dart.config import build
    from dart.recipe.config import make_dev_tasks, make_tasks
    from dart.recipe.episodes import evaluate
    from dart.stack.config import StackConfig
    from dart.stack.select import pick_best, policy_at, published_versions, versions_to_check

    summary = json.loads((workdir / "summary.json").read_text())
    own = workdir / "stack.yaml"
    data = yaml.safe_load((own if own.exists() else config).read_text())
    cfg = build(StackConfig, data)
    recipe = dataclasses.replace(cfg.recipe, seed=int(summary.get("recipe", {}).get("seed", cfg.recipe.seed)),
                                 dev_tasks=dev_tasks)
    cfg = dataclasses.replace(cfg, recipe=recipe)
    _, held_out = make_tasks(recipe)
    dev = make_dev_tasks(recipe)
    published = {p.version: p for p in published_versions(workdir)}
    store = LocalBlobStore(workdir / "blobs")
    rows = []
    for version in versions_to_check(list(published), every):
        policy = policy_at(Path(summary["warm_model"]), store, published[version])
        t0 = time.monotonic()
        d = evaluate(policy, dev, len(dev), store=store, cfg=cfg, phase=100 + version)
        h = evaluate(policy, held_out, len(held_out), store=store, cfg=cfg, phase=900 + version)
        rows.append({"version": version, "dev": d, "held_out": h})
        print(f"{workdir}: v{version} dev {100 * d:.1f} % held-out {100 * h:.1f} % "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    kept = pick_best([(r["version"], r["dev"]) for r in rows]) if rows else None
    by_version = {r["version"]: r for r in rows}
    return {"run": str(workdir), "warm": summary.get("warm_success"), "checks": rows, "kept": kept,
            "kept_held_out": by_version[kept]["held_out"] if rows else None,
            "last_held_out": rows[-1]["held_out"] if rows else None}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| run | checks (version: dev → held-out, %) | kept | held-out gain of the kept / of the last |",
             "|---|---|---|---|"]
    for r in results:
        checks = ", ".join(f"v{c['version']}: {100 * c['dev']:.1f} → {100 * c['held_out']:.1f}" for c in r["checks"])
        gain = (f"{100 * (r['kept_held_out'] - r['warm']):+.1f} / {100 * (r['last_held_out'] - r['warm']):+.1f}"
                if r["kept"] is not None and r["warm"] is not None else "-")
        lines.append(f"| {r['run']} | {checks or 'no trained version'} | "
                     f"{'v' + str(r['kept']) if r['kept'] is not None else '-'} | {gain} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "synthetic.yaml",
                   help="the recipe of a run without its own stack.yaml")
    p.add_argument("--dev-tasks", type=int, default=600)
    p.add_argument("--every", type=int, default=15)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    missing = [str(r) for r in args.runs if not (r / "summary.json").exists()]
    if missing:
        print(f"not a finished run (no summary.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    results = [measure_run(r, config=args.config, dev_tasks=args.dev_tasks, every=args.every) for r in args.runs]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
