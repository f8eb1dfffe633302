"""Batch rules on crafted groups (pure): which groups, which steps, which id."""

from __future__ import annotations

import json
from dataclasses import replace

from dart.data.batcher import batch_id_for, build_manifest, judge_groups, plan_batch
from dart.data.config import BatcherConfig, CurationConfig
from dart.data.curation import GroupProgress, Outcome
from dart.events.manifest import BatchManifest, PromptContext, Sample

CUR = CurationConfig(entropy_top_fraction=0.5, min_failed_steps=0)
BAT = BatcherConfig(groups_per_batch=2, group_timeout_s=60)


def o(rid, reward, *, group="g", index=0, steps=2, v=1, origin="online", task="t"):
    return Outcome(rid, task, group, "success" if (reward or 0) >= 0.5 else "fail", reward, steps, v, v, 0, index,
                   0, origin)


def grp(gid, rewards, opened, *, task="t"):
    outs = tuple(o(f"{gid}-{i}", r, group=gid, index=i, task=task) for i, r in enumerate(rewards))
    return GroupProgress(gid, task, len(rewards), opened, outs)


def plan(groups, used=frozenset(), pool=None, now=1000):
    return plan_batch(groups, used=set(used), pool=pool or {}, current_version=1, curation=CUR, batcher=BAT,
                      max_attempts=3, now_ms=now)


def test_oldest_complete_unused_surviving_groups_make_the_batch() -> None:
    groups = [grp("g4", [1.0, 0.0], 40), grp("g1", [1.0, 1.0], 10), grp("g2", [0.0, 1.0], 20),
              grp("g3", [1.0, 0.0], 30), grp("g0", [1.0, 0.0], 5)]
    p = plan(groups, used={"g0-1"})          # g0 already trained on, g1 all-success
    assert p is not None and [v.group_id for v in p.verdicts] == ["g2", "g3"]
    assert p.dropped == {"all_success": 1}
    assert p.rollout_ids == ["g2-0", "g2-1", "g3-0", "g3-1"]


def test_no_batch_until_enough_groups_are_complete() -> None:
    incomplete = GroupProgress("g9", "t", 3, 0, (o("x", 1.0), o("y", 0.0, index=1)))
    assert plan([grp("g1", [1.0, 0.0], 1), incomplete]) is None
    assert plan([grp("g1", [1.0, 0.0], 1), incomplete], now=60_000) is not None  # g9 timed out: judged as is


def test_judging_keeps_the_given_order_up_to_a_limit_and_injects_from_the_pool_by_task() -> None:
    """The one judging both batch assemblies use (the data manager's plan_batch, the recipe's batch_of):
    no sorting, completeness or used-rollout rules of its own."""
    groups = [grp("g3", [1.0, 0.0], 30), grp("g1", [0.0, 0.0], 10, task="pooled"), grp("g2", [1.0, 1.0], 20),
              grp("g0", [0.0, 0.0], 5)]
    oracle = o("oracle:1", 1.0, group="pool", origin="oracle", task="pooled")
    everything = judge_groups(groups, pool={"pooled": [oracle]}, current_version=1, curation=CUR, batcher=BAT)
    assert [v.group_id for v in everything.verdicts] == ["g3", "g1"]  # as given, not by age
    assert everything.dropped == {"all_success": 1, "all_fail": 1}   # g0's task has no experience
    assert [v.injected is not None for v in everything.verdicts] == [False, True]
    first = judge_groups(groups, pool={}, current_version=1, curation=CUR, batcher=BAT, limit=1)
    assert [v.group_id for v in first.verdicts] == ["g3"] and first.dropped == {}  # stopped at the limit


def test_batch_id_depends_on_content_only() -> None:
    assert batch_id_for("run", ["b", "a"]) == batch_id_for("run", ["a", "b"])
    assert batch_id_for("run", ["a"]) != batch_id_for("run", ["a", "b"])
    assert batch_id_for("run", ["a"]) != batch_id_for("other", ["a"])


def step(rid, i, mean_entropy, version=1):
    ctx = PromptContext(instruction="x", step_index=i, screenshot_digest=f"{rid}{i}", screen_width=10,
                        screen_height=10)
    return Sample(rollout_id=rid, step_index=i, task_id="t", group_id="g", context=ctx, prompt_hash=f"h{i}",
                  response_token_ids=[1, 2], rollout_logprobs=[-0.1, -0.2], entropies=[mean_entropy] * 2,
                  mean_entropy=mean_entropy, policy_version=version)


def test_manifest_has_selected_steps_rewards_and_injected_experience() -> None:
    xp = o("xp", 1.0, group="pool", origin="experience", steps=2)
    groups = [grp("g1", [1.0, 0.0], 1), grp("g2", [0.0, 0.0], 2)]
    p = plan(groups, pool={"t": [xp]})
    assert p is not None and p.verdicts[1].injected == xp
    steps = {
        "g1-0": [step("g1-0", 0, 0.9), step("g1-0", 1, 0.8)],
        "g1-1": [step("g1-1", 0, 0.1), step("g1-1", 1, 0.2)],
        "g2-0": [step("g2-0", 0, 0.7), step("g2-0", 1, 0.05, version=0)],
        "xp": [step("xp", 0, 0.0), step("xp", 1, 0.0)],
    }
    m = build_manifest(p, steps, run_id="run", seq=3, curation=CUR)
    keys = [(s.rollout_id, s.step_index) for s in m.samples]
    # online steps 6, top half = 3: g1-0/0 g1-0/1 g2-0/0; g1-1 keeps its best (step 1); xp kept whole
    assert keys == [("g1-0", 0), ("g1-0", 1), ("g1-1", 1), ("g2-0", 0), ("xp", 0), ("xp", 1)]
    xs = [s for s in m.samples if s.rollout_id == "xp"]
    assert {s.group_id for s in xs} == {"g2"} and {s.origin for s in xs} == {"experience"}
    assert all(s.sft for s in xs) and not any(s.sft for s in m.samples if s.origin == "online")
    assert [s.reward for s in m.samples] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert m.batch_id == batch_id_for("run", ["g1-0", "g1-1", "g2-0", "xp"]) and m.seq == 3
    assert m.stats["injected"] == 1.0 and m.stats["samples"] == 6.0 and m.stats["entropy_cutoff"] == 0.2
    assert m.stats["dropped_rollouts/replaced"] == 1.0
    assert BatchManifest.from_bytes(m.to_bytes()) == m


def test_a_manifest_written_before_samples_carried_mean_entropy_still_decodes() -> None:
    """Manifests in old runs' blob stores have no ``mean_entropy`` key: it reads as 0, the rest as written."""
    p = plan([grp("g1", [1.0, 0.0], 1), grp("g2", [0.0, 1.0], 2)])
    assert p is not None
    steps = {f"{g}-{i}": [step(f"{g}-{i}", 0, e)] for g, i, e in (("g1", 0, 0.9), ("g1", 1, 0.4), ("g2", 0, 0.3),
                                                                   ("g2", 1, 0.2))}
    m = build_manifest(p, steps, run_id="run", seq=1, curation=replace(CUR, entropy_top_fraction=1.0))
    body = json.loads(m.to_bytes())
    assert [s.pop("mean_entropy") for s in body["samples"]] == [0.9, 0.4, 0.3, 0.2]
    old = BatchManifest.from_bytes(json.dumps(body).encode())
    assert [s.mean_entropy for s in old.samples] == [0.0] * 4
    assert [replace(s, mean_entropy=0.0) for s in m.samples] == old.samples
    assert [(s.task_id, s.group_id, s.reward) for s in old.samples] == [("t", "g1", 1.0), ("t", "g1", 0.0),
                                                                          ("t", "g2", 0.0), ("t", "g2", 1.0)]
