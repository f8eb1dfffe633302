"""Learning that holds: one `dart up` recipe over several seeds, beside a CPU hog, and with each
of DART's curation knobs turned off in turn (ablations).

Every run is a real `dart up` (broker, env workers, rollout worker, data manager, trainer as
processes; held-out evaluation of the warm start and of the final policy: every held-out task
once, greedy, each figure ± its standard error over tasks, :mod:`dart.recipe.measure`; a run made
before that measure, or by older code, is measured again so). A run's RL phase is bounded by its update budget (``max_updates``) with the
config's ``rl_minutes`` as a cap, so a busier machine gives the same number of updates, later.

    # the seeds table (make run's recipe), then seed 0 again beside one busy core
    .venv/bin/python benchmarks/learning.py --config configs/synthetic.yaml --seeds 0 1 2
    .venv/bin/python benchmarks/learning.py --config configs/synthetic.yaml --seeds 0 --stress
    # ablations on the multi-step preset: full dart and each knob off, 3 seeds each
    .venv/bin/python benchmarks/learning.py --ablate --config configs/chain.yaml --seeds 0 1 2

Runs go to ``--out`` (default ``runs/learning``), one directory per variant and seed; a run
whose ``summary.json`` exists is not run again (so a long sweep can be resumed; ``--collect``
runs nothing and tabulates what is there, each cell not run marked so; ``--repeats K`` makes K
runs of each, for the run-to-run spread). Within a seed,
every variant starts RL from the same warm start (the first variant's SFT). After each run the
published weight versions are evaluated at ``--curve-points`` moments for the
held-out-success-vs-wall-clock curve, on the same held-out episodes as the warm start and the
final policy (``recipe.held_out_episodes``: episodes cycle through the held-out tasks, so fewer
episodes would be another, easier or harder, subset of tasks). Output: a markdown
table (mean +- spread of the held-out gain per variant) and a PNG, in ``--out`` and in
``benchmarks/results/`` (``learning_<name>.md|png|json``).

Variants: ``preset`` is the config as given; ``full`` is full DART, every knob below on (the
``chain`` preset runs without the experience pool, which hurt there: ``full`` puts it back);
each knob's variant is ``full`` with that one knob turned off (``--base preset``: the config as
given with that one knob turned off, i.e. what each knob does in the shipped preset):

- ``no_experience``: no oracle trajectories in the pool, no injection into all-fail groups;
- ``no_dynamic_rollouts``: every task gets ``group_size`` rollouts (DART: fewer for easy tasks);
- ``no_dynamic_length``: every episode gets the recipe's ``max_steps`` (DART: per task, from
  its successful lengths);
- ``no_entropy_selection``: every step is trained on (DART: the 80 % highest-entropy steps);
- ``no_tis``: no truncated importance sampling against the rollout engine's log-probs;
- ``no_clip_higher``: the upper clip equals the lower one (DART: 0.28 over 0.1). The clip acts only
  with more than one optimiser step per batch; on a one-step recipe (both presets) ``--ablate``
  leaves this variant out and says why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dart.config import build, load_yaml  # noqa: E402
from dart.config import merge as deep_merge  # noqa: E402
from dart.config import parse_override as dotted  # noqa: E402
from dart.stack.config import StackConfig  # noqa: E402

KNOBS = ("no_experience", "no_dynamic_rollouts", "no_dynamic_length", "no_entropy_selection", "no_tis",
         "no_clip_higher")


FULL_EXPERIENCE_TASKS = 400
"""``full``'s experience pool where the config has none: oracle solutions of up to this many
training tasks (the chain preset's 400: all of them)."""


BASES = ("full", "preset")


def variant_overrides(name: str, base: StackConfig, *, start: str = "full") -> dict[str, Any]:
    """The config mapping for one variant: ``preset`` nothing, ``full`` every DART knob on, a
    knob's name ``start`` (``full`` or ``preset``) with that knob off."""
    if start not in BASES:
        raise SystemExit(f"unknown ablation base {start!r} (known: {', '.join(BASES)})")
    if name == "preset":
        return {}
    full: dict[str, Any] = {"data": {"curation": {"inject_experience": True, "adaptive_max_steps": True}},
                            "experience_tasks": base.experience_tasks or FULL_EXPERIENCE_TASKS}
    curation = {
        "no_experience": {"inject_experience": False},
        "no_dynamic_rollouts": {"n_min": base.data.curation.n_default},
        "no_dynamic_length": {"adaptive_max_steps": False},
        "no_entropy_selection": {"entropy_top_fraction": 1.0},
    }
    loss = {
        "no_tis": {"tis": "off"},
        "no_clip_higher": {"eps_high": base.trainer.loss.eps_low},
    }
    if name == "full":
        return full
    if start == "preset":
        full = {}
    if name in curation:
        out: dict[str, Any] = deep_merge(full, {"data": {"curation": curation[name]}})
        if name == "no_experience":
            out["experience_tasks"] = 0
        return out
    if name in loss:
        return deep_merge(full, {"trainer": {"loss": loss[name]}})
    raise SystemExit(f"unknown variant {name!r} (known: preset, full, {', '.join(KNOBS)})")


def ablation_names(base: StackConfig) -> tuple[list[str], str | None]:
    """``--ablate``'s variants for this config, and why one was left out: clip-higher acts only
    with more than one optimiser step per batch (with one, the PPO ratio is exactly 1), so on a
    one-step recipe its variant would be the same run again."""
    if base.trainer.clip_acts:
        return ["full", *KNOBS], None
    return ["full", *(k for k in KNOBS if k != "no_clip_higher")], (
        "no_clip_higher left out: this recipe takes one optimiser step per batch (ppo_epochs 1, "
        "ppo_minibatches 1), so the PPO ratio is exactly 1 and the clip range changes nothing; "
        "ask for it with --variants to run it anyway, or set trainer.ppo_minibatches above 1")


def shown_path(path: Path) -> str:
    """``path`` relative to the repository where it is inside it, else as given."""
    return str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)


def cpu_hog() -> subprocess.Popen:
    """One process that keeps one core busy (what `stress-ng --cpu 1` does)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_one(config: dict[str, Any], workdir: Path, *, stress: bool, log: Path) -> dict[str, Any]:
    """One `dart up` of ``config`` in ``workdir``; its summary."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "stack.yaml"
    path.write_text(yaml.safe_dump({**config, "workdir": str(workdir)}, sort_keys=False))
    hog = cpu_hog() if stress else None
    t0 = time.monotonic()
    try:
        with open(log, "w") as fh:
            rc = subprocess.run([sys.executable, "-m", "dart.cli", "up", str(path)], cwd=REPO, stdout=fh,
                                stderr=subprocess.STDOUT).returncode
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    summary_path = workdir / "summary.json"
    if rc != 0 or not summary_path.exists():
        raise SystemExit(f"dart up failed (exit {rc}) in {workdir}: see {log}")
    summary = json.loads(summary_path.read_text())
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    summary["stress"] = stress
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary


def curve(workdir: Path, cfg: StackConfig, summary: dict[str, Any], *, points: int,
          episodes: int) -> list[tuple[float, int, float]]:
    """(minutes into the RL phase, version, held-out success) at ``points`` published versions
    (the warm start, and the policy the run handed over, from the run's own evaluation: the last
    version, or the one its dev checks picked)."""
    from dart.blobs import LocalBlobStore
    from dart.data.cli import sql_client
    from dart.recipe.config import make_tasks
    from dart.recipe.episodes import evaluate
    from dart.stack.select import policy_at, published_versions

    client = sql_client(None, f"chdb://{workdir / 'chdb'}", "dart")
    try:
        (t0,) = client.query("SELECT toUnixTimestamp64Milli(min(event_time)) FROM requests").result_rows[0]
    finally:
        client.close()
    out = [(0.0, 0, float(summary["warm_success"]))]
    rows = published_versions(workdir)
    if not rows:
        return out
    last = len(rows) - 1
    handed_over = summary.get("selected_version", rows[last].version)
    picks = sorted({round(last * k / max(points - 1, 1)) for k in range(1, points)})
    _, held_out = make_tasks(cfg.recipe)
    store = LocalBlobStore(workdir / "blobs")
    for i in picks:
        p = rows[i]
        minutes = (p.at_ms - int(t0)) / 60000
        if p.version == handed_over:
            out.append((minutes, p.version, float(summary["rl_success"])))
            continue
        out.append((minutes, p.version, evaluate(policy_at(Path(summary["warm_model"]), store, p), held_out, episodes,
                                                 store=store, cfg=cfg, phase=10 + p.version)))
    return out


def fine_measure(workdir: Path, cfg: StackConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """A run measured before the fine held-out measure (or by older code), measured again: its warm
    start and final checkpoint on every held-out task of the current recipe, one greedy episode
    each, with standard errors over tasks (:mod:`dart.recipe.measure`). The run's own figures stay
    under ``coarse``; the per-task outcomes go to ``held_out.json``."""
    from dart.blobs import LocalBlobStore
    from dart.recipe.config import make_tasks
    from dart.recipe.episodes import evaluate
    from dart.recipe.measure import outcomes_to_json, paired_gain, success
    from dart.stack.up import latest_checkpoint, load_checkpoint_policy

    recipe = cfg.recipe
    _, held_out = make_tasks(recipe)
    store = LocalBlobStore(workdir / "blobs")
    outcomes: dict[str, list[tuple[dict[str, Any], bool]]] = {"warm": [], "rl": []}
    t0 = time.monotonic()
    for phase, (key, checkpoint) in enumerate((("warm", None), ("rl", latest_checkpoint(workdir / "checkpoints"))),
                                              start=1):
        evaluate(load_checkpoint_policy(Path(summary["warm_model"]), checkpoint), held_out,
                 recipe.held_out_episodes, store=store, cfg=cfg, phase=phase, outcomes=outcomes[key])
    warm, rl = success(outcomes["warm"]), success(outcomes["rl"])
    gain = paired_gain(outcomes["warm"], outcomes["rl"])
    (workdir / "held_out.json").write_text(json.dumps({k: outcomes_to_json(v) for k, v in outcomes.items()}))
    coarse = {k: summary.get(k) for k in ("warm_success", "rl_success", "delta")}
    coarse["eval_episodes"] = (summary.get("recipe") or {}).get("eval_episodes")
    return {"coarse": coarse, "warm_success": warm.value, "warm_se": warm.se, "rl_success": rl.value,
            "rl_se": rl.se, "delta": gain.value, "delta_se": gain.se, "eval_tasks": warm.tasks,
            "remeasured_s": round(time.monotonic() - t0, 1)}


def fine(summary: dict[str, Any]) -> bool:
    """Whether a run's figures carry standard errors over tasks (the fine measure)."""
    return summary.get("delta_se") is not None


def pm(value: float, se: float | None, *, signed: bool = False, pct: bool = False) -> str:
    """``+9.0 ± 1.4`` / ``42.5 % ± 1.7`` (no ``±`` for a run measured without standard errors)."""
    text = f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}" + (" %" if pct else "")
    return text + (f" ± {100 * se:.1f}" if se is not None else "")


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{100 * mean:+.1f}"
    return f"{100 * mean:+.1f} ± {100 * statistics.stdev(values):.1f} (min {100 * min(values):+.1f})"


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Per variant: mean warm start and RL policy, the held-out gain's mean ± sd over its runs (the
    run-to-run spread) and the mean standard error of one run's gain (the measure's own error);
    then every run with its figures ± their standard errors over tasks."""
    lines = ["| variant | runs (seeds) | warm start | RL policy | held-out gain (points, mean ± sd over runs) | "
             "measure's se of one gain | updates | RL minutes | capped |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        if not runs:
            continue
        warm = statistics.fmean(r["warm_success"] for r in runs)
        rl = statistics.fmean(r["rl_success"] for r in runs)
        ses = [r["delta_se"] for r in runs if fine(r)]
        lines.append(
            f"| {name} | {len(runs)} ({', '.join(str(r['seed']) for r in runs)}) | {warm:.1%} | {rl:.1%} | "
            f"{spread([r['delta'] for r in runs])} | {f'{100 * statistics.fmean(ses):.1f}' if ses else '-'} | "
            f"{statistics.fmean(r['updates'] for r in runs):.0f} | "
            f"{statistics.fmean(r['rl_s'] for r in runs) / 60:.1f} | "
            f"{sum(1 for r in runs if r.get('budget_note'))} of {len(runs)} |")
    lines.append("")
    lines.append("Per run (held-out success ± its standard error over tasks; the gain's is paired over the same "
                 "tasks): " + "; ".join(
        f"{name} seed {r['seed']}{' +hog' if r.get('stress') else ''}: "
        f"{pm(r['warm_success'], r.get('warm_se'), pct=True)} -> {pm(r['rl_success'], r.get('rl_se'), pct=True)} "
        f"({pm(r['delta'], r.get('delta_se'), signed=True)}), {r['updates']} updates in {r['rl_s'] / 60:.1f} min"
        + (f", v{r['selected_version']} kept by the dev checks" if r.get("selected_version") is not None else "")
        + (f", {r['eval_tasks']} tasks" if r.get("eval_tasks") else ", 200 episodes, no standard error")
        for name, runs in results.items() for r in runs))
    return "\n".join(lines)


def by_seed(results: dict[str, list[dict[str, Any]]], seeds: list[int]) -> str:
    """Held-out gain per variant and seed (a cell not run says so): each run's gain ± its standard
    error over tasks, and with two or more runs of a seed their mean ± sd (the run-to-run spread);
    then each variant's mean ± sd over its seeds' means and, from the second row on, its
    difference from the first row's mean on the seeds both have."""
    head = "| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± sd | vs first row, same seeds |"
    lines = [head, "|---|" + "---|" * len(seeds) + "---|---|"]
    first: dict[int, float] | None = None
    for name, runs in results.items():
        per: dict[int, list[dict[str, Any]]] = {}
        for r in runs:
            per.setdefault(r["seed"], []).append(r)
        gains = {s: statistics.fmean(r["delta"] for r in rs) for s, rs in per.items()}
        cells = []
        for s in seeds:
            if s not in per:
                cells.append("not run")
                continue
            cell = ", ".join(pm(r["delta"], r.get("delta_se"), signed=True) for r in per[s])
            if len(per[s]) > 1:
                cell += f" (mean {spread([r['delta'] for r in per[s]]).split(' (min')[0]})"
            cells.append(cell)
        mean = (f"{100 * statistics.fmean(gains.values()):+.1f}"
                + (f" ± {100 * statistics.stdev(gains.values()):.1f}" if len(gains) > 1 else "")) if gains else "-"
        if first is None:
            first, versus = gains, "-"
        else:
            both = [s for s in seeds if s in gains and s in first]
            versus = (f"{100 * statistics.fmean(gains[s] - first[s] for s in both):+.1f} on {len(both)} "
                      f"seed{'s' if len(both) != 1 else ''}") if both else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean} | {versus} |")
    return "\n".join(lines)


def plot(results: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, runs) in enumerate(results.items()):
        color = f"C{i}"
        for j, r in enumerate(runs):
            pts = r.get("curve") or []
            ax.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", color=color, alpha=0.8,
                    label=name if j == 0 else None)
            if pts:
                ax.annotate(f"s{r['seed']}", (pts[-1][0], pts[-1][2]), xytext=(4, 0), textcoords="offset points",
                            color=color, fontsize=7, va="center")
    ax.set(xlabel="minutes into the RL phase", ylabel="held-out success", ylim=(0, 1), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "synthetic.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ablate", action="store_true", help="full dart and each knob off in turn")
    p.add_argument("--variants", nargs="+",
                   help="only these variants (preset: the config as given; full: every knob on; " + ", ".join(KNOBS) + ")")
    p.add_argument("--base", choices=BASES, default="full",
                   help="what each knob's variant turns the knob off from: full dart (default) or the config as given")
    p.add_argument("--stress", action="store_true", help="a CPU-heavy process on one core beside every run")
    p.add_argument("--max-updates", type=int, help="override the config's update budget")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field, dotted (e.g. trainer.optim.lr=3e-4); repeatable")
    p.add_argument("--curve-points", type=int, default=4, help="evaluated moments per run (warm start included)")
    p.add_argument("--curve-episodes", type=int,
                   help="held-out episodes per intermediate point (default: the recipe's eval_episodes, the "
                        "same tasks as the end points; fewer is faster but another subset of tasks)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "learning")
    p.add_argument("--warm-from", type=Path,
                   help="start seed N from the warm start in DIR/<variant>-sN/warm where an earlier run left one "
                        "(SFT is deterministic per seed on one machine, not across machines: this skips repeating it)")
    p.add_argument("--name", help="name of the result files (default: the config's name, +ablate, +stress)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each variant and seed (the second and later in <variant>-sN-rK): the "
                        "run-to-run spread, reported beside each run's standard error over tasks")
    p.add_argument("--collect", action="store_true",
                   help="run nothing: tabulate the runs already in --out/NAME (link run directories in to "
                        "gather runs made under other names); a cell not run is marked so")
    args = p.parse_args()

    raw = load_yaml(args.config)
    if args.max_updates is not None:
        raw["max_updates"] = args.max_updates
    for item in args.set:
        raw = deep_merge(raw, dotted(item))
    base = build(StackConfig, raw)
    note = None
    if args.variants:
        names = args.variants
    elif args.ablate:
        names, note = ablation_names(base)
        if note:
            print(f"[learning] {note}", flush=True)
    else:
        names = ["preset"]
    tag = args.name or args.config.stem + ("-ablate" if args.ablate else "") + ("-stress" if args.stress else "")
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for seed in args.seeds:
        warm: str | None = None
        if args.warm_from is not None:
            found = sorted(args.warm_from.glob(f"*-s{seed}/warm/config.json"))
            warm = str(found[0].parent.resolve()) if found else None
        for name, k in ((n, k) for n in names for k in range(1, args.repeats + 1)):
            run = f"{name}-s{seed}" + (f"-r{k}" if k > 1 else "")
            workdir = (args.out / tag / run).resolve()
            config = deep_merge(deep_merge(raw, variant_overrides(name, base, start=args.base)), {"recipe": {"seed": seed}})
            config["run_id"] = run.replace("_", "-")
            if warm is not None:
                config["warm_model"] = warm
            summary_path = workdir / "summary.json"
            if summary_path.exists():
                summary = json.loads(summary_path.read_text())
                print(f"[learning] {name} seed {seed}: already run ({workdir})", flush=True)
            elif args.collect:
                print(f"[learning] {name} seed {seed}: not run ({workdir})", flush=True)
                continue
            else:
                print(f"[learning] {name} seed {seed}: dart up in {workdir}", flush=True)
                summary = run_one(config, workdir, stress=args.stress, log=workdir.with_suffix(".log"))
            if not fine(summary):
                print(f"[learning] {name} seed {seed}: measured without standard errors; measuring its warm "
                      "start and final policy again on every held-out task", flush=True)
                summary.update(fine_measure(workdir, build(StackConfig, config), summary))
                summary_path.write_text(json.dumps(summary, indent=2))
            if "curve" not in summary:
                summary["curve"] = curve(workdir, build(StackConfig, config), summary, points=args.curve_points,
                                         episodes=args.curve_episodes or build(StackConfig, config).recipe.held_out_episodes)
                summary_path.write_text(json.dumps(summary, indent=2))
            summary["seed"] = seed
            warm = warm or summary["warm_model"]
            results[name].append(summary)
            print(f"[learning] {run}: warm {pm(summary['warm_success'], summary.get('warm_se'), pct=True)} -> RL "
                  f"{pm(summary['rl_success'], summary.get('rl_se'), pct=True)} "
                  f"({pm(summary['delta'], summary.get('delta_se'), signed=True)} points), {summary['updates']} "
                  f"updates in {summary['rl_s'] / 60:.1f} min{'; ' + summary['budget_note'] if summary.get('budget_note') else ''}",
                  flush=True)
    text = table(results) + "\n\nHeld-out gain (points) per seed:\n\n" + by_seed(results, args.seeds)
    print(text)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = (f"# {tag}: `benchmarks/learning.py --config {shown_path(args.config)}"
              f"{' --ablate' if args.ablate else ''}{' --variants ' + ' '.join(args.variants) if args.variants else ''}"
              f"{''.join(' --set ' + x for x in args.set)}{' --collect' if args.collect else ''}{' --max-updates ' + str(args.max_updates) if args.max_updates is not None else ''}"
              f"{' --base ' + args.base if args.base != 'full' else ''}{' --stress' if args.stress else ''}"
              f"{f' --repeats {args.repeats}' if args.repeats > 1 else ''} --seeds "
              f"{' '.join(map(str, args.seeds))}`\n\n{stamp}, 2-core CPU machine, no GPU; held-out success over "
              f"{base.recipe.eval_tasks} held-out tasks, one greedy episode each ({base.recipe.held_out_episodes} "
              "episodes), ± its standard error over tasks; a gain's standard error is paired over the same tasks. "
              "Run-to-run spread: the sd over runs.\n\n" + (f"{note}.\n\n" if note else ""))
    for folder in (args.out / tag, REPO / "benchmarks" / "results"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"learning_{tag}.md").write_text(header + text + "\n")
        (folder / f"learning_{tag}.json").write_text(json.dumps(
            {n: [{k: r.get(k) for k in ("seed", "warm_success", "warm_se", "rl_success", "rl_se", "delta", "delta_se",
                                         "eval_tasks", "coarse", "updates", "rl_s", "budget_note", "stress", "curve",
                                         "total_s", "warm_eval_s", "rl_eval_s", "selected_version", "dev_checks")} for r in runs]
             for n, runs in results.items()}, indent=2))
        plot(results, folder / f"learning_{tag}.png", f"held-out success vs wall clock ({tag})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
