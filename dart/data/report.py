"""`dart report`: success per policy version and over wall-clock time, per-task difficulty, env
and rollout utilisation (from heartbeats), staleness of trained samples, and the learning
signals of every update (entropy, zero-advantage groups, clip fractions, importance-ratio
spread, log-prob mismatch); as text and PNG plots.

Queries use unqualified table names: the client's database selects the projection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Query = Callable[[str], Sequence[Sequence[Any]]]

SUCCESS_BY_VERSION = """
SELECT max_policy_version AS version, count() AS n, avg(reward >= 0.5) AS success_rate
FROM trajectory_rewards
WHERE has_reward = 1 AND status != 'infra_error' AND origin = 'online' AND mode = 'train'
GROUP BY version ORDER BY version"""

TASK_DIFFICULTY = """
SELECT task_id, count() AS n, avg(reward >= 0.5) AS success_rate, avg(num_steps) AS mean_steps,
       countIf(status = 'infra_error') AS infra_errors
FROM trajectory_rewards WHERE origin = 'online' AND mode = 'train' AND (has_reward = 1 OR status = 'infra_error')
GROUP BY task_id ORDER BY success_rate, task_id"""

UTILISATION = """
SELECT worker_id, argMax(role, event_time) AS last_role, argMax(slots, event_time) AS last_slots,
       argMax(busy_s, event_time) AS last_busy_s, argMax(idle_s, event_time) AS last_idle_s,
       avg(if(slots > 0, slots_busy / slots, 0)) AS mean_slot_use
FROM heartbeats FINAL GROUP BY worker_id ORDER BY last_role, worker_id"""

UTILISATION_SERIES = """
SELECT role, toUnixTimestamp(toStartOfInterval(event_time, INTERVAL 10 SECOND)) AS t,
       sum(slots_busy) / greatest(sum(slots), 1) AS slot_use
FROM heartbeats FINAL GROUP BY role, t ORDER BY role, t"""

STALENESS = """
SELECT b.trainer_version - a.policy_version AS lag, count() AS steps
FROM (SELECT trainer_version, arrayJoin(rollout_ids) AS rollout_id FROM batches FINAL) AS b
INNER JOIN (SELECT rollout_id, policy_version FROM actions FINAL
            WHERE rollout_id IN (SELECT rollout_id FROM trajectories WHERE origin = 'online')) AS a
    ON a.rollout_id = b.rollout_id
GROUP BY lag ORDER BY lag"""


SUCCESS_BY_TIME = """
SELECT toUnixTimestamp(toStartOfInterval(event_time, INTERVAL 30 SECOND)) AS t, count() AS n,
       avg(reward >= 0.5) AS success_rate
FROM trajectory_rewards
WHERE has_reward = 1 AND status != 'infra_error' AND origin = 'online' AND mode = 'train'
GROUP BY t ORDER BY t"""

# One row per trainer update: what tells whether RL can move the policy (entropy, clipping,
# importance ratios, log-prob mismatch) and how old its samples were. Keys an older trainer
# did not write read as 0.
LEARNING = """
SELECT m.step, m.policy_version, toUnixTimestamp(m.event_time) AS t, m.entropy, m.clip_frac,
       m.metrics['clip/high_frac'], m.metrics['clip/low_frac'], m.metrics['ratio/abs_dev'],
       m.metrics['ratio/max'], m.metrics['tis/capped_frac'], m.logprob_mismatch, m.grad_norm,
       m.num_samples, b.trainer_version - b.min_policy_version, b.trainer_version - b.max_policy_version,
       m.metrics['samples/dropped_prompt_hash'] + m.metrics['samples/dropped_unreadable']
         + m.metrics['samples/dropped_ragged'] + m.metrics['samples/dropped_vision_token'], b.injected
FROM (SELECT * FROM train_metrics FINAL) AS m
LEFT JOIN (SELECT batch_id, any(trainer_version) AS trainer_version, any(min_policy_version) AS min_policy_version,
                  any(max_policy_version) AS max_policy_version, any(injected) AS injected
           FROM batches FINAL GROUP BY batch_id) AS b USING batch_id
ORDER BY m.step"""

# GRPO groups by the newest policy version in them: a group whose rollouts all succeeded or
# all failed has advantage 0 everywhere and teaches nothing (unless the experience pool fills it).
GROUPS = """
SELECT version, count() AS groups, countIf(lo = hi AND hi = 1) AS all_success, countIf(lo = hi AND hi = 0) AS all_fail
FROM (SELECT group_id, max(max_policy_version) AS version, min(reward >= 0.5) AS lo, max(reward >= 0.5) AS hi,
             count() AS n
      FROM trajectory_rewards
      WHERE has_reward = 1 AND status != 'infra_error' AND origin = 'online' AND mode = 'train'
      GROUP BY group_id HAVING n >= 2)
GROUP BY version ORDER BY version"""

# Tasks that share an instruction (a synthetic preset's "Click the red button on each page.", one
# OSWorld instruction in many setups): success and share of the run's trajectories in the first
# and the second half of its policy versions. A policy with a habit (always the red button) shows
# as one instruction at 100 % and the rest near 0, and a rising "success per version" that is
# the scheduler moving to the easy instruction shows as its share growing, not its success.
INSTRUCTIONS = """
SELECT k.instruction, uniqExact(r.task_id) AS tasks,
       countIf(r.max_policy_version * 2 <= m.top) AS n1, avgIf(r.reward >= 0.5, r.max_policy_version * 2 <= m.top),
       countIf(r.max_policy_version * 2 > m.top) AS n2, avgIf(r.reward >= 0.5, r.max_policy_version * 2 > m.top)
FROM trajectory_rewards AS r
INNER JOIN (SELECT task_id, any(instruction) AS instruction FROM tasks GROUP BY task_id) AS k USING task_id
CROSS JOIN (SELECT max(max_policy_version) AS top FROM trajectory_rewards
            WHERE has_reward = 1 AND origin = 'online' AND mode = 'train') AS m
WHERE r.has_reward = 1 AND r.status != 'infra_error' AND r.origin = 'online' AND r.mode = 'train'
GROUP BY k.instruction HAVING tasks >= 2
ORDER BY n1 + n2 DESC, k.instruction LIMIT 20"""


@dataclass(frozen=True)
class UpdateRow:
    """One trainer update's learning signals (``LEARNING``)."""

    step: int
    version: int
    t: int
    entropy: float
    clip_frac: float
    clip_high: float
    clip_low: float
    ratio_abs_dev: float
    ratio_max: float
    tis_capped: float
    mismatch: float
    grad_norm: float
    samples: int
    staleness_max: int
    staleness_min: int
    dropped: int = 0
    """Samples of the batch the trainer could not train on (a prompt that differs, ragged arrays, ...)."""
    injected: int = 0
    """Experience-pool successes the data manager put into all-fail groups of the batch."""


@dataclass
class Report:
    success_by_version: list[tuple[int, int, float]] = field(default_factory=list)
    tasks: list[tuple[str, int, float, float, int]] = field(default_factory=list)
    workers: list[tuple[str, str, int, float, float, float]] = field(default_factory=list)
    utilisation_series: list[tuple[str, int, float]] = field(default_factory=list)
    staleness: list[tuple[int, int]] = field(default_factory=list)
    success_by_time: list[tuple[int, int, float]] = field(default_factory=list)
    updates: list[UpdateRow] = field(default_factory=list)
    groups: list[tuple[int, int, int, int]] = field(default_factory=list)
    instructions: list[tuple[str, int, int, float, int, float]] = field(default_factory=list)
    """(instruction, tasks, runs and success in the first half of the versions, the same in the second)."""

    def zero_advantage(self) -> list[tuple[int, float]]:
        """(version, fraction of that version's groups with one reward for all rollouts)."""
        return [(v, (s + f) / g) for v, g, s, f in self.groups if g]

    def text(self) -> str:
        out = ["== success rate per policy version (online train trajectories)"]
        out += [f"  v{v:<5} {n:>7} trajectories  success {r:6.1%}" for v, n, r in self.success_by_version] or ["  (none)"]
        out.append("== success rate over wall-clock time (30 s buckets)")
        t0 = self.success_by_time[0][0] if self.success_by_time else 0
        out += [f"  {(t - t0) / 60:5.1f} min {n:>7} trajectories  success {r:6.1%}"
                for t, n, r in self.success_by_time] or ["  (none)"]
        out.append("== GRPO groups per policy version (zero advantage: every rollout got the same reward)")
        out += [f"  v{v:<5} {g:>6} groups  all success {s / g:6.1%}  all fail {f / g:6.1%}  "
                f"zero advantage {(s + f) / g:6.1%}" for v, g, s, f in self.groups if g] or ["  (none)"]
        out.append("== learning signals per update (entropy, clipped tokens, |ratio - 1|, log-prob mismatch, "
                   "staleness of the batch)")
        out += [f"  update {u.step:>4} -> v{u.version:<4} entropy {u.entropy:6.3f}  clip {u.clip_frac:6.2%} "
                f"(high {u.clip_high:5.2%} low {u.clip_low:5.2%})  |ratio-1| {u.ratio_abs_dev:6.4f} max "
                f"{u.ratio_max:6.2f}  tis capped {u.tis_capped:5.2%}  mismatch {u.mismatch:6.4f}  grad "
                f"{u.grad_norm:6.3f}  samples {u.samples:>5} (dropped {u.dropped}, injected groups {u.injected})  "
                f"staleness {u.staleness_min}-{u.staleness_max}"
                for u in self.updates] or ["  (none)"]
        out.append("== task difficulty (hardest first)")
        out += [f"  {t:<40} {n:>6} runs  success {r:6.1%}  mean steps {s:5.1f}  infra errors {e}"
                for t, n, r, s, e in self.tasks] or ["  (none)"]
        out.append("== instructions that tasks share (runs, their share of the half and success, "
                   "first and second half of the policy versions)")
        n1_all = sum(i[2] for i in self.instructions) or 1
        n2_all = sum(i[4] for i in self.instructions) or 1
        out += [f"  {text[:48]:<48} {k:>4} tasks  first {n1:>6} runs ({n1 / n1_all:4.0%}) {_rate(n1, s1)}"
                f"  second {n2:>6} runs ({n2 / n2_all:4.0%}) {_rate(n2, s2)}"
                for text, k, n1, s1, n2, s2 in self.instructions] or ["  (every task has an instruction of its own)"]
        out.append("== worker utilisation (busy / (busy + idle), mean slot use)")
        out += [f"  {role:<8} {w:<28} slots {slots:>3}  busy {_frac(b, i):6.1%}  slot use {u:6.1%}"
                for w, role, slots, b, i, u in self.workers] or ["  (none)"]
        out.append("== staleness of trained steps (trainer version - sample version)")
        total = sum(n for _, n in self.staleness)
        out += [f"  lag {lag:>3}: {n:>8} steps ({n / total:6.1%})" for lag, n in self.staleness] or ["  (none)"]
        return "\n".join(out)


def _rate(n: int, rate: float) -> str:
    return f"success {rate:6.1%}" if n else "success      -"


def _frac(busy: float, idle: float) -> float:
    return busy / (busy + idle) if busy + idle > 0 else 0.0


def build_report(query: Query) -> Report:
    """Run the report queries (``query(sql) -> rows``)."""
    return Report(
        success_by_version=[(int(v), int(n), float(r)) for v, n, r in query(SUCCESS_BY_VERSION)],
        tasks=[(t, int(n), float(r), float(s), int(e)) for t, n, r, s, e in query(TASK_DIFFICULTY)],
        workers=[(w, role, int(sl), float(b), float(i), float(u)) for w, role, sl, b, i, u in query(UTILISATION)],
        utilisation_series=[(role, int(t), float(u)) for role, t, u in query(UTILISATION_SERIES)],
        staleness=[(int(lag), int(n)) for lag, n in query(STALENESS)],
        success_by_time=[(int(t), int(n), float(r)) for t, n, r in query(SUCCESS_BY_TIME)],
        updates=[UpdateRow(int(r[0]), int(r[1]), int(r[2]), *(float(x or 0.0) for x in r[3:12]), int(r[12]),
                           int(r[13] or 0), int(r[14] or 0), int(r[15] or 0), int(r[16] or 0))
                 for r in query(LEARNING)],
        groups=[(int(v), int(g), int(s), int(f)) for v, g, s, f in query(GROUPS)],
        instructions=[(str(t), int(k), int(n1), float(s1) if n1 else 0.0, int(n2), float(s2) if n2 else 0.0)
                      for t, k, n1, s1, n2, s2 in query(INSTRUCTIONS)],
    )


def write_plots(report: Report, out: Path) -> list[Path]:
    """One PNG per section (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([v for v, _, _ in report.success_by_version], [r for _, _, r in report.success_by_version], marker="o")
    ax.set(xlabel="policy version", ylabel="success rate", ylim=(0, 1), title="Success rate per policy version")
    save(fig, "success_by_version.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    t0 = report.success_by_time[0][0] if report.success_by_time else 0
    ax.plot([(t - t0) / 60 for t, _, _ in report.success_by_time], [r for _, _, r in report.success_by_time],
            marker=".")
    ax.set(xlabel="minutes since the first trajectory", ylabel="success rate", ylim=(0, 1),
           title="Success rate over wall-clock time (30 s buckets)")
    save(fig, "success_by_time.png")

    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    steps = [u.step for u in report.updates]

    def panel(ax: Any, title: str, series: dict[str, list[float]], xs: list[int] | None = None,
              xlabel: str = "update") -> None:
        for label, ys in series.items():
            ax.plot(steps if xs is None else xs, ys, marker=".", label=label)
        ax.set(title=title, xlabel=xlabel)
        if len(series) > 1:
            ax.legend(fontsize=8)

    panel(axes[0][0], "Entropy (mean over response tokens)", {"entropy": [u.entropy for u in report.updates]})
    panel(axes[0][1], "Clipped token fraction", {"all": [u.clip_frac for u in report.updates],
                                                 "high (A>0)": [u.clip_high for u in report.updates],
                                                 "low (A<0)": [u.clip_low for u in report.updates]})
    panel(axes[0][2], "Importance ratio spread", {"mean |ratio - 1|": [u.ratio_abs_dev for u in report.updates],
                                                  "TIS capped frac": [u.tis_capped for u in report.updates]})
    zero = report.zero_advantage()
    panel(axes[1][0], "Zero-advantage groups", {"fraction": [z for _, z in zero]}, xs=[v for v, _ in zero],
          xlabel="policy version")
    axes[1][0].set_ylim(0, 1)
    panel(axes[1][1], "Staleness of the batch (versions)", {"oldest sample": [u.staleness_max for u in report.updates],
                                                             "newest sample": [u.staleness_min for u in report.updates]})
    panel(axes[1][2], "Gradient norm / log-prob mismatch", {"grad norm": [u.grad_norm for u in report.updates],
                                                             "mismatch": [u.mismatch for u in report.updates]})
    save(fig, "learning.png")

    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.25 * len(report.tasks) + 1)))
    ax.barh([t for t, *_ in report.tasks], [r for _, _, r, _, _ in report.tasks])
    ax.set(xlabel="success rate", xlim=(0, 1), title="Task difficulty")
    save(fig, "task_difficulty.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for role in sorted({r for r, _, _ in report.utilisation_series}):
        pts = [(t, u) for r, t, u in report.utilisation_series if r == role]
        t0 = pts[0][0]
        ax.plot([(t - t0) / 60 for t, _ in pts], [u for _, u in pts], label=role)
    ax.set(xlabel="minutes", ylabel="busy slots / slots", ylim=(0, 1.05), title="Utilisation (heartbeats)")
    if report.utilisation_series:
        ax.legend()
    save(fig, "utilisation.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([lag for lag, _ in report.staleness], [n for _, n in report.staleness])
    ax.set(xlabel="policy versions behind the trainer", ylabel="trained steps", title="Sample staleness")
    save(fig, "staleness.png")
    return paths
