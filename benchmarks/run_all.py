"""`make bench`: every benchmark at modest sizes, one table in ``benchmarks/results/latest.md``.

Each benchmark runs as its own process (its stdout is kept under ``results/raw/``); its key
figures are read from what it prints (or from its JSON) into a row: benchmark, headline
figure, baseline, ratio (headline / baseline) and goal, and the exact command. A bar chart of
the ratios against their goals goes to ``results/latest.png``. The decoupled-vs-coupled sweep
takes ~40 minutes, so it runs only with ``--sweep``; otherwise the last sweep on disk is linked
with the time it was measured.

    .venv/bin/python benchmarks/run_all.py [--only NAME,...] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
Row = dict[str, Any]


@dataclass(frozen=True)
class Bench:
    name: str
    argv: tuple[str, ...]
    parse: Callable[[str], list[Row]]
    """stdout -> rows (benchmark, headline, baseline, ratio, goal)."""
    timeout_s: int = 900

    @property
    def command(self) -> str:
        return " ".join((".venv/bin/python", f"benchmarks/{self.name}.py", *self.argv))


def num(pattern: str, text: str) -> float:
    """The first number captured by ``pattern`` in ``text`` (ValueError naming the pattern if absent)."""
    m = re.search(pattern, text)
    if m is None:
        raise ValueError(f"no match for {pattern!r} in the output")
    return float(m.group(1).replace(",", ""))


def row(benchmark: str, headline: str, baseline: str, ratio: float | None, goal: str = "") -> Row:
    return {"benchmark": benchmark, "headline": headline, "baseline": baseline,
            "ratio": None if ratio is None else round(ratio, 2), "goal": goal}


def parse_bus(out: str) -> list[Row]:
    raw, avro = num(r"raw :\s+([\d,]+) events/s median", out), num(r"avro:\s+([\d,]+) events/s median", out)
    return [row("event log: Avro vs raw bytes (stream through the dev broker)", f"{avro:,.0f} Avro events/s",
                f"{raw:,.0f} raw events/s", avro / raw, ">= 0.80")]


def parse_env(out: str) -> list[Row]:
    res = json.loads(out[out.index("{"): out.rindex("}") + 1])
    util, sync = res["utilization"], res["batch_sync_estimate"]
    return [row(f"env slot utilisation, {res['slots']} slots, rollout-wise scheduling", f"{util:.5f}",
                f"{sync:.3f} batch-wise (same trajectories)", util / sync, "util >= 0.95")]


def parse_rollout(out: str) -> list[Row]:
    one = num(r"one-at-a-time\s+([\d.]+)", out)
    many = num(r"micro-batch<=\d+\s+([\d.]+)", out)
    return [row("rollout worker: micro-batched hf engine (tiny model, CPU)", f"{many:.2f} actions/s",
                f"{one:.2f} actions/s one at a time", many / one, "> 1")]


def parse_ingest(out: str) -> list[Row]:
    rate = num(r"through the consumer \(ClickHouse decodes\)\s*:\s+([\d,]+) events/s median", out)
    raw = num(r"raw clickhouse insert \(same rows, one insert per table\)\s*:\s+([\d,]+) events/s median", out)
    queries = [float(x) for x in re.findall(r"^\s{2}\S.*?\s([\d.]+) ms$", out, flags=re.M)]
    steps = num(r"curation queries at (\d+) steps", out)
    rows = [row("data manager: log -> chdb projection", f"{rate:,.0f} events/s", f"{raw:,.0f} events/s raw insert",
                rate / raw)]
    if queries:
        rows.append(row(f"curation queries at {steps:,.0f} steps (slowest of {len(queries)})",
                        f"{max(queries):.1f} ms", "", None, "< 1 s per pass"))
    return rows


def parse_train(out: str) -> list[Row]:
    one = num(r"1 sample per pass:\s+(\d+) response tok/s", out)
    many = num(r"per micro-batch:\s+(\d+) response tok/s", out)
    pub = num(r"weight publish, synthetic:\s+[\d.]+ MB at\s+([\d.]+) MB/s", out)
    return [row("trainer update: micro-batched vs 1 sample per pass", f"{many:,.0f} response tok/s",
                f"{one:,.0f} tok/s", many / one, "> 1"),
            row("weight publish (safetensors + blob store)", f"{pub:.0f} MB/s", "", None)]


def parse_vm(out: str) -> list[Row]:
    res = json.loads(out.strip().splitlines()[-1])
    rev, rec = res["revert"]["median_s"], res["recreate"]["median_s"]
    return [row(f"VM reset: snapshot revert ({res['driver']})", f"{rev:.3f} s",
                f"{rec:.3f} s destroy + recreate", rec / rev, "> 1 (speed-up)")]


def parse_coupling(out: str) -> list[Row]:
    res = json.loads(out.strip().splitlines()[-1])   # the headline, printed last
    d, c, r = res["decoupled"], res["coupled"], res["ratios"]
    where = f"{res['point']['slots']} slots, tail p99/median {res['point']['tail']:g}"
    return [
        row(f"DART decoupled vs coupled: env utilisation ({where})", f"{d['env_util']:.3f}",
            f"{c['env_util']:.3f} coupled", r["env_util"], "ratio >= 5.5 (paper), util >= 0.95"),
        row("DART decoupled vs coupled: rollout engine utilisation", f"{d['rollout_util']:.3f}",
            f"{c['rollout_util']:.3f} coupled", r["rollout_util"], "ratio >= 1.6 (paper)"),
        row("DART decoupled vs coupled: training throughput", f"{d['train_samples_per_s']:.2f} samples/s",
            f"{c['train_samples_per_s']:.2f} samples/s coupled", r["train_samples_per_s"], "ratio >= 1.9 (paper)"),
    ]


def parse_log(out: str) -> list[Row]:
    res = json.loads(out.strip().splitlines()[-1])
    return [
        row("durable log: produce with the archiver following vs memory broker alone",
            f"{res['produce_archived_eps']:,.0f} events/s", f"{res['produce_memory_eps']:,.0f} events/s",
            res["produce_ratio"]),
        row("replay from the archive: read + typed decode vs plain fastavro read",
            f"{res['replay_decode_eps']:,.0f} events/s", f"{res['plain_read_eps']:,.0f} events/s",
            res["replay_ratio"], ">= 50,000 events/s and >= 0.5"),
    ]


BENCHES = (
    Bench("bus_throughput", ("--events", "10000", "--passes", "5"), parse_bus),
    Bench("env_utilization", ("--window-s", "15", "--requests", "300"), parse_env),
    Bench("rollout_throughput", ("--actions", "32", "--slots", "16"), parse_rollout),
    Bench("ingest", ("--events", "20000", "--steps", "200000"), parse_ingest),
    Bench("train_throughput", ("--samples", "16", "--updates", "2", "--publish-mb", "64"), parse_train),
    Bench("vm_reset", ("--rounds", "2"), parse_vm),
    Bench("log_archive", ("--events", "60000"), parse_log),
    Bench("decoupled_vs_coupled", ("--window-s", "120"), parse_coupling, timeout_s=1200),
)


def run(bench: Bench, raw_dir: Path) -> tuple[list[Row], float, str | None]:
    """(rows, seconds, error) of one benchmark; its output goes to raw_dir/NAME.txt."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(HERE / f"{bench.name}.py"), *bench.argv], capture_output=True,
                              text=True, timeout=bench.timeout_s, cwd=HERE.parent)
        out, code = proc.stdout, proc.returncode
        (raw_dir / f"{bench.name}.txt").write_text(out + "\n--- stderr (tail)\n" + proc.stderr[-4000:])
    except subprocess.TimeoutExpired:
        return [], time.monotonic() - t0, f"timed out after {bench.timeout_s} s"
    elapsed = time.monotonic() - t0
    try:
        rows = bench.parse(out)
    except (ValueError, KeyError, OSError) as exc:
        return [], elapsed, f"exit {code}; could not read its figures ({exc})"
    return rows, elapsed, None if code in (0, 1) else f"exit {code}"


def markdown(results: list[tuple[Bench, list[Row], float, str | None]], total_s: float, sweep: Path | None,
             partial: str = "") -> str:
    lines = [
        "# dart benchmarks — latest run",
        "",
        f"`make bench` on {time.strftime('%Y-%m-%d %H:%M %Z')}: {os.cpu_count()} CPU cores shared by every process "
        f"(and by other work on the machine; load average at the end {os.getloadavg()[0]:.1f}), no GPU. "
        f"Total {total_s / 60:.1f} min{partial}. Raw outputs: `benchmarks/results/raw/`.",
        "",
        "| benchmark | headline figure | baseline | ratio | goal | command |",
        "|---|---|---|---|---|---|",
    ]
    for bench, rows, elapsed, error in results:
        if error:
            lines.append(f"| {bench.name} | **failed: {error}** | | | | `{bench.command}` |")
        for r in rows:
            ratio = "" if r["ratio"] is None else f"{r['ratio']}x"
            lines.append(f"| {r['benchmark']} | {r['headline']} | {r['baseline']} | {ratio} | {r['goal']} | "
                         f"`{bench.command}` ({elapsed:.0f} s) |")
    lines += ["", "![ratios](latest.png)", ""]
    coupling = RESULTS / "decoupled_vs_coupled.json"
    if coupling.exists():
        res = json.loads(coupling.read_text())
        phases = res["coupled"].get("round_phases_s") or {}
        lines += ["## Decoupled vs coupled (DART's claim)", "", "| | coupled | decoupled | ratio | paper |",
                  "|---|---|---|---|---|"]
        for key, name in (("env_util", "env utilisation"), ("rollout_util", "rollout utilisation"),
                          ("train_samples_per_s", "training samples/s"), ("trajectories_per_min", "trajectories/min"),
                          ("staleness_mean", "mean staleness"), ("success_rate", "trajectory success rate"),
                          ("trajectory_s_mean", "mean trajectory s")):
            paper = {"env_util": "5.5x", "rollout_util": "1.6x", "train_samples_per_s": "1.9x"}.get(key, "")
            ratio = res["ratios"].get(key)
            lines.append(f"| {name} | {res['coupled'].get(key)} | {res['decoupled'].get(key)} | "
                         f"{'' if ratio is None else f'{ratio}x'} | {paper} |")
        if phases:
            lines += ["", "Mean coupled round (s): " + ", ".join(f"{k} {v}" for k, v in phases.items()) + "."]
        lines += ["", "Definitions and what limits each ratio here: `benchmarks/README.md`."]
    if sweep is not None and sweep.exists():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(sweep.stat().st_mtime))
        lines += ["", f"Sweep over env slots and latency tail (measured {when}; `--sweep` reruns it):", "",
                  f"![sweep]({sweep.name})"]
    return "\n".join(lines) + "\n"


def plot(results: list[tuple[Bench, list[Row], float, str | None]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for _, rs, _, _ in results for r in rs if r["ratio"] is not None]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    names = [r["benchmark"][:60] for r in rows]
    ax.barh(names, [r["ratio"] for r in rows], color="tab:blue")
    for i, r in enumerate(rows):
        goal = re.search(r"ratio >= ([\d.]+)|^>= ([\d.]+)", r["goal"])
        if goal:
            ax.plot([float(goal.group(1) or goal.group(2))] * 2, [i - 0.4, i + 0.4], color="tab:red", lw=2)
        ax.text(r["ratio"], i, f" {r['ratio']}x", va="center", fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio: decoupled / coupled, speed-up or share (red: goal)")
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated benchmark names (the others keep their rows from the last run)")
    ap.add_argument("--sweep", action="store_true", help="also run the decoupled-vs-coupled sweep (~40 min)")
    args = ap.parse_args()
    benches = [Bench(b.name, (*b.argv, "--sweep"), b.parse, 4 * 3600)
               if args.sweep and b.name == "decoupled_vs_coupled" else b for b in BENCHES]
    chosen = [b for b in benches if not args.only or b.name in args.only.split(",")]
    raw_dir = RESULTS / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results = []
    earlier = {r["name"]: r for r in (json.loads((RESULTS / "latest.json").read_text())
                                      if args.only and (RESULTS / "latest.json").exists() else [])}
    for bench in benches:
        if bench not in chosen:
            if bench.name in earlier:  # --only: the other rows stay as last measured
                r = earlier[bench.name]
                results.append((bench, r["rows"], r["seconds"], r["error"]))
            continue
        print(f"[bench] {bench.command}", flush=True)
        rows, elapsed, error = run(bench, raw_dir)
        results.append((bench, rows, elapsed, error))
        for r in rows:
            versus = f" vs {r['baseline']} -> {r['ratio']}x" if r["ratio"] is not None else ""
            print(f"    {r['benchmark']}: {r['headline']}{versus}", flush=True)
        print(f"    {'FAILED: ' + error if error else 'done'} in {elapsed:.0f} s", flush=True)
    total = time.monotonic() - t0
    plot(results, RESULTS / "latest.png")
    (RESULTS / "latest.json").write_text(json.dumps(
        [{"name": b.name, "command": b.command, "seconds": round(s, 1), "error": e, "rows": rs}
         for b, rs, s, e in results], indent=1))
    partial = f" (run with `--only {args.only}`: the other rows are from the run before)" if args.only else ""
    (RESULTS / "latest.md").write_text(markdown(results, total, RESULTS / "decoupled_vs_coupled_sweep.png", partial))
    print(f"[bench] {len(chosen)} benchmarks in {total / 60:.1f} min -> {RESULTS / 'latest.md'}")
    return 1 if any(e for *_, e in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
