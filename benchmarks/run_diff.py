"""What two `dart up` runs did differently, rollout by rollout, from their stores: the question
"does this code change cost learning?" answered without whole runs' worth of noise.

    .venv/bin/python benchmarks/run_diff.py RUN_A RUN_B [--versions 1] [--held-out-at VERSION ...]

For each run: the requests (tasks, group sizes, step caps, sampling temperature / top-p / seeds),
the rollouts of the first policy versions (tokens of every step), trajectories (steps, finish
reasons, success per policy version), the batches (groups, samples, staleness, what curation
dropped) and the trainer's updates (loss, entropy, gradient norm). Then the pairs: a rollout of
A and one of B of the same task, rollout index and sampling seed, both on policy version 0 (the
same warm start), must be token-identical when the two codes sample alike; the first
difference is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def query(run: Path, sql: str) -> list[tuple[Any, ...]]:
    from dart.data.cli import sql_client

    client = sql_client(None, f"chdb://{run / 'chdb'}", "dart")
    try:
        return list(client.query(sql).result_rows)
    finally:
        client.close()


def profile(run: Path, versions: int) -> dict[str, Any]:
    """What one run did, as comparable numbers."""
    out: dict[str, Any] = {}
    out["requests"] = query(run, """SELECT count(), uniqExact(group_id), avg(group_size), avg(max_steps),
        groupUniqArray(temperature), groupUniqArray(top_p), groupUniqArray(max_new_tokens), uniqExact(seed)
        FROM requests FINAL WHERE attempt = 0""")[0]
    out["group_sizes"] = dict(query(run, """SELECT group_size, count() FROM
        (SELECT group_id, any(group_size) AS group_size FROM requests FINAL GROUP BY group_id)
        GROUP BY group_size ORDER BY group_size"""))
    out["traj"] = query(run, """SELECT count(), avg(num_steps), avg(reward >= 1), countIf(status = 'infra_error')
        FROM trajectory_rewards""")[0]
    out["finish"] = dict(query(run, "SELECT finish_reason, count() FROM trajectory_rewards GROUP BY finish_reason"))
    out["success_by_version"] = query(run, """SELECT min_policy_version, count(), round(avg(reward >= 1), 3),
        round(avg(num_steps), 2) FROM trajectory_rewards GROUP BY min_policy_version ORDER BY min_policy_version""")
    out["batches"] = query(run, """SELECT count(), avg(num_groups), avg(num_trajectories), avg(num_samples),
        avg(trainer_version - min_policy_version), avg(trainer_version - max_policy_version), sum(injected)
        FROM batches FINAL""")[0]
    out["train"] = query(run, """SELECT count(), avg(loss), avg(entropy), avg(grad_norm), avg(num_samples),
        avg(clip_frac), avg(duration_s) FROM train_metrics FINAL""")[0]
    out["first_tasks"] = [r[0] for r in query(run, """SELECT task_id FROM
        (SELECT group_id, any(task_id) AS task_id, min(event_time) AS t FROM requests FINAL GROUP BY group_id)
        ORDER BY t, group_id LIMIT 64""")]
    out["early"] = {(r[0], r[1], r[2], r[3]): (list(r[4]), r[5]) for r in query(run, f"""
        SELECT q.task_id, q.rollout_index, q.seed, a.step_index, a.response_token_ids, a.response_text
        FROM requests AS q FINAL
        JOIN actions AS a FINAL ON a.request_id = q.request_id
        WHERE q.attempt = 0 AND a.policy_version < {versions}""")}
    return out


def policy_at(run: Path, version: int) -> Any:
    """The run's policy at weight ``version`` (0: its warm start), from its blob store."""
    import json

    from dart.agent.model import load_policy
    from dart.blobs import LocalBlobStore
    from dart.stack import select

    warm = Path(json.loads((run / "summary.json").read_text())["warm_model"])
    if version == 0:
        return load_policy(warm)
    return select.policy_at(warm, LocalBlobStore(run / "blobs"), select.published_version(run, version))


def held_out_at(runs: list[Path], version: int) -> None:
    """Both runs' policies at one weight version on every held-out task: each rate ± its standard
    error over tasks, and B - A paired over the same tasks (equal updates, whatever the speed)."""
    from dart.blobs import LocalBlobStore
    from dart.config import build, load_yaml
    from dart.recipe.config import Recipe, make_tasks
    from dart.recipe.episodes import evaluate
    from dart.recipe.measure import paired_gain, success
    from dart.stack.config import StackConfig

    cfg = build(StackConfig, load_yaml(runs[0] / "stack.yaml"))
    recipe = dataclasses.replace(cfg.recipe, eval_tasks=Recipe().eval_tasks, eval_episodes=None)
    cfg = dataclasses.replace(cfg, recipe=recipe)
    _, held_out = make_tasks(recipe)
    outcomes = []
    for run in runs:
        out: list[tuple[dict[str, Any], bool]] = []
        evaluate(policy_at(run, version), held_out, recipe.held_out_episodes, store=LocalBlobStore(run / "blobs"),
                 cfg=cfg, phase=2, outcomes=out)
        outcomes.append(out)
        print(f"{run.name} at version {version}: {success(out).points()} over {success(out).tasks} tasks", flush=True)
    print(f"B - A at version {version}: {paired_gain(outcomes[0], outcomes[1]).points(signed=True)} points (paired)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, nargs=2, help="two run directories (each with chdb/)")
    p.add_argument("--versions", type=int, default=1, help="pair rollouts of policy versions below this")
    p.add_argument("--held-out-at", type=int, nargs="*", default=[], metavar="VERSION",
                   help="also measure both runs' policies at these weight versions on every held-out task")
    args = p.parse_args()
    a, b = (profile(r, args.versions) for r in args.runs)
    for key in ("requests", "group_sizes", "traj", "finish", "batches", "train"):
        print(f"{key:<12} A {a[key]}\n{'':<12} B {b[key]}")
    print("success by policy version (version, trajectories, success, steps):")
    for row_a, row_b in zip(a["success_by_version"], b["success_by_version"], strict=False):
        print(f"  A {row_a}   B {row_b}")
    same_order = sum(x == y for x, y in zip(a["first_tasks"], b["first_tasks"], strict=False))
    print(f"first {len(a['first_tasks'])} groups' tasks in the same order: {same_order}")
    common = sorted(set(a["early"]) & set(b["early"]))
    same = [k for k in common if a["early"][k][0] == b["early"][k][0]]
    print(f"steps of version < {args.versions} with the same task, rollout index, seed and step: {len(common)} "
          f"(A has {len(a['early'])}, B {len(b['early'])}); token-identical: {len(same)}")
    for k in [k for k in common if k not in same][:3]:
        print(f"  differs: {k}\n    A {a['early'][k][1]!r}\n    B {b['early'][k][1]!r}")
    if common:
        lengths = [len(a["early"][k][0]) for k in common]
        print(f"  mean response length {statistics.fmean(lengths):.1f} tokens")
    for version in args.held_out_at:
        held_out_at(args.runs, version)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
