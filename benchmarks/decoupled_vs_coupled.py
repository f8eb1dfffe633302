"""Decoupled (DART) vs coupled (batch-wise) training: env, rollout and trainer utilisation through `dart up`.

The same stack runs twice — ``pipeline: coupled`` then ``pipeline: decoupled`` — with the same
synthetic tasks, the same tiny model (random init: the benchmark measures scheduling, not
learning), the same env slots, one rollout worker, one trainer and the same batch size
(``slots`` trajectories = ``slots / group_size`` groups per update). Env latency is VM-like and
heavy-tailed (Pareto by default: median 2 s, p99 20 s, capped at 60 s), run faster by a time
scale that is printed. Everything is measured from the run's own log (heartbeats, updates,
batches, trajectories in the ClickHouse projection) over a steady-state window; the metric
definitions are in ``benchmarks/coupling_metrics.py`` and are printed with the results.

    .venv/bin/python benchmarks/decoupled_vs_coupled.py                # headline point, ~5 min
    .venv/bin/python benchmarks/decoupled_vs_coupled.py --sweep        # slots x tail sweep + PNG
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coupling_metrics import PAPER_RATIOS, WindowError, coupled_rounds, mean_phases, measure, ratios

RESULTS = Path(__file__).resolve().parent / "results"
SFT_DEMOS, SFT_STEPS = 120, 240
METRIC_NAMES = {
    "env_util": "environment utilisation (busy slot-time / wall slot-time)",
    "rollout_util": "rollout engine utilisation (forward-pass time / wall time)",
    "train_samples_per_s": "training throughput (step-samples into updates per s)",
    "trajectories_per_min": "trajectories per minute",
    "staleness_mean": "mean staleness (trainer version - generating version)",
}
QUERIES = {
    "heartbeats": "SELECT worker_id, role, state, toUnixTimestamp64Milli(event_time) AS t_ms, busy_s, idle_s, "
                  "uptime_s FROM dart.heartbeats FINAL WHERE role IN ('env', 'rollout')",
    "updates": "SELECT step, policy_version, batch_id, num_samples, duration_s, "
               "toUnixTimestamp64Milli(event_time) AS t_ms FROM dart.train_metrics FINAL",
    "batches": "SELECT batch_id, rollout_ids, trainer_version, num_samples, injected, "
               "toUnixTimestamp64Milli(event_time) AS t_ms FROM dart.batches FINAL",
    "trajectories": "SELECT rollout_id, request_id, status, origin, mode, step_policy_versions, num_steps, reset_s, "
                    "env_s, policy_wait_s, eval_s, toUnixTimestamp64Milli(event_time) AS t_ms FROM dart.trajectories FINAL",
    "requests": "SELECT request_id, toUnixTimestamp64Milli(event_time) AS t_ms FROM dart.requests FINAL WHERE mode = 'train'",
    "loaded": "SELECT worker_id, version, toUnixTimestamp64Milli(event_time) AS t_ms FROM dart.weights_loaded FINAL WHERE ok",
}


@dataclass(frozen=True, kw_only=True)
class Point:
    """One benchmark point: env slots and the step-latency distribution (in VM seconds, before ``scale``)."""

    slots: int = 8
    kind: str = "pareto"
    median_s: float = 2.0
    p99_s: float = 20.0
    max_s: float = 60.0
    scale: float = 0.25
    reset_factor: float = 2.0

    @property
    def tail(self) -> float:
        """Tail weight: p99 / median (1 = fixed latency)."""
        return 1.0 if self.kind == "fixed" else self.p99_s / self.median_s

    @property
    def label(self) -> str:
        return f"s{self.slots}-t{self.tail:g}"

    def latency(self) -> dict[str, Any]:
        out = {"kind": self.kind, "median_s": self.median_s, "scale": self.scale, "reset_factor": self.reset_factor}
        return out if self.kind == "fixed" else {**out, "p99_s": self.p99_s, "max_s": self.max_s}

    def describe(self) -> str:
        if self.kind == "fixed":
            shape = f"fixed {self.median_s:g} s"
        else:
            shape = f"{self.kind} median {self.median_s:g} s, p99 {self.p99_s:g} s, cap {self.max_s:g} s"
        return (f"{self.slots} env slots; step latency {shape} x time scale {self.scale:g} "
                f"(as run: median {self.median_s * self.scale:g} s"
                + ("" if self.kind == "fixed" else f", p99 {self.p99_s * self.scale:g} s") + "); "
                f"a reset takes {self.reset_factor:g} step latencies")


def stack_mapping(p: Point, mode: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The `dart up` config of one run (the two modes differ only in ``pipeline``)."""
    groups = max(1, p.slots // args.group_size)
    return {
        "run_id": f"bench-{mode}", "workdir": str(workdir), "pipeline": mode, "rl_minutes": 60.0,
        "evaluate": False, "warm_model": str(args.warm_model),
        "recipe": {"train_tasks": SFT_DEMOS, "eval_tasks": 2, "sft_demos": SFT_DEMOS},
        # lr: the paper's 1e-6 keeps the policy (and so its success rate and the share of mixed
        # groups) the same through both runs: this measures the system, not learning.
        "trainer": {"optim": {"lr": 1e-6}},
        "env": {"slots": p.slots, "heartbeat_s": 1.0, "synthetic": {"latency": p.latency(), "seed": 0}},
        "rollout": {"heartbeat_s": 1.0, "max_concurrency": max(16, p.slots)},
        # NOTE: the coupled data manager counts a finished round's groups without the experience
        # pool, so a round of all-fail groups is never batched there; injection is off in both
        # modes so that both keep exactly the naturally mixed groups.
        # temperature / top_p: DART's rollout sampling; with them the warm start answers with
        # well-formed clicks and solves ~40 % of the tasks, so most groups are mixed.
        "data": {"curation": {"inject_experience": args.inject, "n_default": args.group_size,
                              "max_steps": args.max_steps},
                 "scheduler": {"capacity_factor": args.queue_factor, "temperature": 0.7, "top_p": 0.9,
                               "max_new_tokens": args.max_new_tokens},
                 "batcher": {"groups_per_batch": groups}},
    }


def warm_model(root: Path) -> Path:
    """The tiny policy after the recipe's SFT warm start on oracle demonstrations, built once for
    every run: its answers are well-formed UI-TARS clicks (which the env executes) and it solves
    part of the tasks, so groups are mixed. A random-init model's answers parse as no action, so
    no env step would ever run."""
    from dart.blobs import LocalBlobStore
    from dart.config import build
    from dart.recipe.config import make_tasks
    from dart.recipe.warmstart import warm_start
    from dart.stack.config import StackConfig

    cfg = build(StackConfig, {"recipe": {"train_tasks": SFT_DEMOS, "eval_tasks": 2, "sft_demos": SFT_DEMOS,
                                         "sft_steps": SFT_STEPS, "sft_target_success": None},
                              "data": {"batcher": {"groups_per_batch": 1}}})
    train, _ = make_tasks(cfg.recipe)
    with contextlib.redirect_stdout(sys.stderr):
        return warm_start(cfg, root / "warm-start", LocalBlobStore(root / "warm-start" / "blobs"), train)


def dump_projection(chdb: Path) -> dict[str, list[dict[str, Any]]]:
    """The rows every metric needs, read in a child process (chdb opens one path per process)."""
    out = subprocess.run([sys.executable, __file__, "--dump", str(chdb)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"reading {chdb} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _dump(chdb: str) -> None:
    from dart.data.store import Store

    store = Store.open_dsn(f"chdb://{chdb}")
    rows = {name: store.query_dicts(sql) for name, sql in QUERIES.items()}
    store.close()
    print(json.dumps(rows, default=str))


def run_mode(p: Point, mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One `dart up` run; returns its metrics (and where a coupled round's time went)."""
    from dart.config import build
    from dart.stack.config import StackConfig
    from dart.stack.up import up

    workdir = root / f"{p.label}-{mode}"
    cfg = build(StackConfig, stack_mapping(p, mode, workdir, args))
    workdir.mkdir(parents=True, exist_ok=True)
    started, load = time.monotonic(), os.getloadavg()[0]
    # More slots: more groups interleave on one rollout worker before the first batch is complete.
    warmup_s = args.warmup_s * max(1.0, p.slots / 16)
    with open(workdir / "up.log", "w") as log, contextlib.redirect_stdout(log):
        summary = up(cfg, stop_after_s=warmup_s + args.window_s)
    result = measure_run(workdir, mode)
    result.update(load_avg_before=round(load, 2), load_avg_after=round(os.getloadavg()[0], 2),
                  run_s=round(time.monotonic() - started, 1), infra_errors=summary.get("infra_errors"))
    return result


def measure_run(workdir: Path, mode: str) -> dict[str, Any]:
    """The metrics of a finished run from its projection (raises WindowError without a steady state)."""
    rows = dump_projection(workdir / "chdb")
    result: dict[str, Any] = {"mode": mode, **measure(rows)}
    t0, t1 = result.pop("window_ms")
    if mode == "coupled":
        rounds = coupled_rounds(rows["requests"], rows["trajectories"], rows["batches"], rows["updates"],
                                rows["loaded"], t0=t0, t1=t1)
        result["round_phases_s"] = mean_phases(rounds)
        result["rounds"] = len(rounds)
    return result


def run_point(p: Point, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    print(f"\n== {p.describe()}", flush=True)
    out: dict[str, Any] = {"point": {**asdict(p), "tail": p.tail}}
    for mode in args.modes.split(","):
        print(f"   {mode:9s} ...", end=" ", flush=True)
        try:
            out[mode] = m = run_mode(p, mode, args, root)
        except WindowError as exc:
            out[mode] = {"mode": mode, "error": str(exc)}
            print(f"no result: {exc}", flush=True)
            continue
        print(f"env {m['env_util']}, rollout {m['rollout_util']}, train {m['train_samples_per_s']} samples/s, "
              f"{m['trajectories_per_min']} traj/min, staleness {m['staleness_mean']} "
              f"({m['window_s']} s window, {m['run_s']} s run)", flush=True)
    out["ratios"] = ratios(out.get("decoupled", {}), out.get("coupled", {}))
    print(f"   decoupled / coupled: {out['ratios']}", flush=True)
    return out


def report(res: dict[str, Any]) -> str:
    """The headline table (markdown) with the definitions."""
    d, c, r = res["decoupled"], res["coupled"], res["ratios"]
    lines = ["| metric | coupled | decoupled | decoupled / coupled | paper |", "|---|---|---|---|---|"]
    for key, name in METRIC_NAMES.items():
        paper = f"{PAPER_RATIOS[key]}x" if key in PAPER_RATIOS else ""
        ratio = f"{r[key]}x" if r.get(key) is not None else ""
        lines.append(f"| {name} | {_fmt(c.get(key))} | {_fmt(d.get(key))} | {ratio} | {paper} |")
    phases = c.get("round_phases_s") or {}
    if phases:
        lines.append("")
        lines.append("Coupled round, mean seconds: " + ", ".join(f"{k} {v}" for k, v in phases.items()))
    return "\n".join(lines)


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) and x < 10 else f"{x}"


def plot_sweep(results: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    base = Point()
    for ax, (xkey, title, fixed) in zip(axes, (("slots", "env slots (tail p99/median = %g)", "tail"),
                                              ("tail", "latency tail p99/median (%g slots)", "slots")), strict=True):
        sel = [r for r in results if r["point"][fixed] == getattr(base, fixed)]
        sel.sort(key=lambda r: r["point"][xkey])
        xs = [r["point"][xkey] for r in sel]
        for key, label in (("env_util", "env utilisation"), ("rollout_util", "rollout utilisation"),
                           ("train_samples_per_s", "training throughput")):
            line, = ax.plot(xs, [r["ratios"].get(key) or float("nan") for r in sel], "o-", label=label)
            ax.axhline(PAPER_RATIOS[key], color=line.get_color(), ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set_xlabel(title % getattr(base, fixed))
        ax.set_ylabel("decoupled / coupled")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, title="dotted: paper", title_fontsize=8)
    fig.suptitle("DART decoupled vs coupled on 2 shared CPU cores (tiny model, synthetic VM-like latency)",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def sweep_points(head: Point, slots: str, tails: str) -> list[Point]:
    """Slots at the headline tail, then tails at the headline slots; the headline itself left out."""
    points = [replace(head, slots=int(s)) for s in slots.split(",")]
    points += [replace(head, kind="fixed") if float(t) == 1 else replace(head, p99_s=head.median_s * float(t))
               for t in tails.split(",")]
    out: list[Point] = []
    for p in points:
        if p.label != head.label and p.label not in {q.label for q in out}:
            out.append(p)
    return out


def run_sweep(head: Point, headline: dict[str, Any], args: argparse.Namespace, root: Path) -> None:
    """Every sweep point (resuming: points already in the sweep JSON without errors are kept)."""
    path = args.out / "decoupled_vs_coupled_sweep.json"
    done = {Point(**{k: v for k, v in r["point"].items() if k != "tail"}).label: r
            for r in (json.loads(path.read_text()) if path.exists() else [])
            if all("error" not in r.get(mode, {}) for mode in ("coupled", "decoupled"))}
    done.setdefault(head.label, headline)  # a sweep keeps its own measurement of the headline point
    args.window_s = args.sweep_window_s
    for p in sweep_points(head, args.sweep_slots, args.sweep_tails):
        if p.label not in done:
            done[p.label] = run_point(p, args, root)
            path.write_text(json.dumps(list(done.values()), indent=1))
    path.write_text(json.dumps(list(done.values()), indent=1))
    print(f"\nsweep plot: {plot_sweep(list(done.values()), args.out / 'decoupled_vs_coupled_sweep.png')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=Point.slots, help="env slots of the headline point")
    ap.add_argument("--scale", type=float, default=Point.scale, help="time scale of the env latency")
    ap.add_argument("--group-size", type=int, default=4, help="rollouts per task (GRPO group)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--max-steps", type=int, default=3, help="policy turns per trajectory")
    ap.add_argument("--warmup-s", type=float, default=45.0, help="seconds before the window (start-up)")
    ap.add_argument("--window-s", type=float, default=120.0, help="seconds of the measured window (about)")
    ap.add_argument("--queue-factor", type=float, default=2.0,
                    help="decoupled: rollouts in flight <= slots x this (requests queued ahead of free slots)")
    ap.add_argument("--inject", action="store_true",
                    help="inject experience into all-fail groups (off: the coupled pipeline cannot, see NOTE)")
    ap.add_argument("--modes", default="coupled,decoupled", help=argparse.SUPPRESS)
    ap.add_argument("--sweep", action="store_true", help="also sweep env slots and tail weight (slow)")
    ap.add_argument("--sweep-only", action="store_true", help="sweep only, with the headline JSON on disk")
    ap.add_argument("--sweep-slots", default="4,16,64", help="env slots of the sweep (at the headline tail)")
    ap.add_argument("--sweep-tails", default="1,3,30", help="p99/median of the sweep (at the headline slots)")
    ap.add_argument("--sweep-window-s", type=float, default=75.0, help="measured window of each sweep run")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and the PNG go")
    ap.add_argument("--workdir", type=Path, help="keep every run here (default: a temporary directory)")
    ap.add_argument("--warm-model", type=Path, help="policy directory to use instead of a fresh SFT warm start")
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dump:
        _dump(args.dump)
        return 0
    head = Point(slots=args.slots, scale=args.scale)
    print(f"{os.cpu_count()} CPU cores shared by broker, data manager, env worker, rollout worker and trainer "
          f"(and anything else on this machine: load average {os.getloadavg()[0]:.2f}).")
    print("\n".join(f"  {v}" for v in METRIC_NAMES.values()))
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dart-bench-") as tmp:
        tmp = str(args.workdir or tmp)
        t0 = time.monotonic()
        args.warm_model = args.warm_model or warm_model(Path(tmp))
        print(f"warm start: the recipe's SFT of the tiny model on {SFT_DEMOS} oracle demonstrations "
              f"({time.monotonic() - t0:.0f} s), shared by every run", flush=True)
        head_json = args.out / "decoupled_vs_coupled.json"
        if args.sweep_only:
            headline = json.loads(head_json.read_text())
        else:
            headline = run_point(head, args, Path(tmp))
            head_json.write_text(json.dumps(headline, indent=1))
            print("\n" + report(headline))
        if args.sweep or args.sweep_only:
            run_sweep(head, headline, args, Path(tmp))
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
