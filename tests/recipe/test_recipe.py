"""The learnability recipe: pure helpers, the episode loop with scripted engines, and a
minuscule end-to-end run (build -> SFT -> eval -> RL -> eval) on the real tiny model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dart.agent.actions import Click
from dart.agent.uitars import parse_actions
from dart.config import build
from dart.env.synthetic import generate_tasks, oracle_plan, screen_of
from dart.errors import ConfigError
from dart.events import Sampling
from dart.events.manifest import PromptContext, Sample
from dart.recipe.config import Recipe, make_tasks
from dart.recipe.episodes import Trajectory, eval_schedule, run_episode, sampling_seed
from dart.recipe.learn import batch_of, run_recipe
from dart.recipe.warmstart import demo_tasks, oracle_text, template_of
from dart.rollout.engine import GenerateRequest, Generation
from dart.stack.config import StackConfig

TINY = generate_tasks(6, preset="tiny", seed=0)
CLICK_TASK = next(t for t in TINY if len(oracle_plan(t)) == 1)
TWO_STEP_TASK = next(t for t in generate_tasks(40, preset="tiny", seed=0) if len(oracle_plan(t)) == 2)
SMALL = {"data": {"batcher": {"groups_per_batch": 2}}}
"""Two tasks an update: what a recipe of a few training tasks needs."""


def tree(recipe: dict | None = None, **sections: dict) -> StackConfig:
    """A run's config tree: the recipe's knobs and the services' sections laid over its preset."""
    return build(StackConfig, {"recipe": recipe or {}, **sections})


def test_recipe_refuses_a_group_of_one_and_too_many_demos() -> None:
    with pytest.raises(ConfigError, match=r"data\.curation\.n_min"):
        tree(data={"curation": {"n_default": 1}})
    with pytest.raises(ConfigError, match="sft_demos"):
        Recipe(train_tasks=10, sft_demos=11)


def test_recipe_refuses_negative_sft_steps_and_steps_without_demos() -> None:
    with pytest.raises(ConfigError, match="sft_steps"):
        Recipe(sft_steps=-1)
    with pytest.raises(ConfigError, match="sft_demos: SFT steps need"):
        Recipe(sft_demos=0, sft_steps=5)
    assert Recipe(sft_demos=0, sft_steps=0).sft_steps == 0  # no warm start: the random policy


def test_demo_tasks_are_the_first_sft_demos_of_the_listed_templates() -> None:
    train = generate_tasks(30, preset="tiny", seed=0)
    kinds = [template_of(t) for t in train]
    assert {"click_color", "check_then_ok"} <= set(kinds)
    only = demo_tasks(train, Recipe(train_tasks=30, sft_demos=4, sft_templates=("check_then_ok",)))
    assert only == [t for t in train if template_of(t) == "check_then_ok"][:4]
    assert demo_tasks(train, Recipe(train_tasks=30, sft_demos=5)) == train[:5]


def test_withheld_words_give_no_demonstrations() -> None:
    train = generate_tasks(60, preset="tiny", seed=0)
    demos = demo_tasks(train, Recipe(train_tasks=60, sft_demos=60, sft_withhold=("Yellow",)))
    assert demos == [t for t in train if "yellow" not in t["instruction"]]
    assert len(demos) < len(train)  # some tasks did name yellow
    both = demo_tasks(train, Recipe(train_tasks=60, sft_demos=60, sft_withhold=("yellow", "box")))
    assert both == [t for t in demos if not t["instruction"].startswith("Check the box")]
    # Whole words only: withholding "red" keeps a task that names no red, whatever its other words.
    assert all("red" not in t["instruction"].split()
               for t in demo_tasks(train, Recipe(train_tasks=60, sft_demos=60, sft_withhold=("red",))))


def test_recipe_refuses_a_target_success_outside_0_1() -> None:
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ConfigError, match="sft_target_success"):
            Recipe(sft_target_success=bad)
    assert Recipe(sft_target_success=1.0).sft_target_success == 1.0


def test_an_all_fail_group_gets_the_oracle_solution_in_place_of_one_failure(tmp_path: Path) -> None:
    from dart.agent.model import load_policy
    from dart.agent.tiny import build_tiny
    from dart.blobs import LocalBlobStore

    policy = load_policy(build_tiny(tmp_path / "tiny", seed=0))
    by_id = {t["id"]: t for t in (CLICK_TASK, TWO_STEP_TASK)}
    trajectories = [_traj("fail", "a", 0.0, TWO_STEP_TASK["id"]), _traj("fail", "b", 0.0, TWO_STEP_TASK["id"]),
                    _traj("mixed", "c", 1.0, CLICK_TASK["id"]), _traj("mixed", "d", 0.0, CLICK_TASK["id"])]
    manifest = batch_of(trajectories, update=3, cfg=tree(), policy=policy,
                        store=LocalBlobStore(tmp_path / "blobs"), tasks=by_id)
    oracle = [s for s in manifest.samples if s.origin == "oracle"]
    assert [s.step_index for s in oracle] == [0, 1]  # the two oracle steps of the failed task
    assert {(s.group_id, s.rollout_id, s.task_id, s.reward, s.sft, s.policy_version) for s in oracle} == {
        ("fail", "oracle:fail", TWO_STEP_TASK["id"], 1.0, True, 3)}
    # the data manager's rule: the injected success replaces the group's last failure
    assert {s.rollout_id for s in manifest.samples} == {"a", "oracle:fail", "c", "d"}
    assert manifest.stats["injected"] == 1.0 and manifest.stats["dropped_rollouts/replaced"] == 1.0


def test_oracle_text_parses_back_to_the_oracle_action() -> None:
    action = oracle_plan(CLICK_TASK)[0]
    cfg = tree()
    text = oracle_text(action, (112, 112), cfg)
    assert text.startswith("Action: click(start_box='(")
    assert "Thought" not in text
    prompt = cfg.rollout.prompt
    (parsed,) = parse_actions(text, screen=(112, 112), convention=cfg.rollout.convention,
                              min_pixels=prompt.min_pixels, max_pixels=prompt.max_pixels)
    assert isinstance(parsed, Click)
    assert (parsed.x, parsed.y) == (pytest.approx(action.x, abs=0.5), pytest.approx(action.y, abs=0.5))


def test_oracle_text_refuses_pixel_bounds_the_renderer_does_not_use() -> None:
    small = {"prompt": {"min_pixels": 56 * 56, "max_pixels": 56 * 56}}
    # A run given its policy writes no oracle answer: its config takes qwen25vl with any bounds.
    given = tree(warm_model="runs/x/warm", rollout={**small, "convention": "qwen25vl"})
    with pytest.raises(ConfigError, match=r"rollout\.convention: oracle answer .* pixel"):
        oracle_text(Click(x=83.0, y=29.0), (112, 112), given)
    relative = tree(rollout={**small, "convention": "qwen2vl"})
    assert oracle_text(Click(x=83.0, y=29.0), (112, 112), relative) == "Action: click(start_box='(741,259)')"


def test_sft_chunks_are_fresh_shuffles_every_pass_whole_ones_only_when_asked() -> None:
    import itertools
    import random

    from dart.train.sft import sft_chunks

    chunks = list(itertools.islice(sft_chunks(10, 4, random.Random(0), whole_only=True), 6))
    assert all(len(c) == 4 for c in chunks)  # 10 items: two chunks a pass, the short third left out
    first, second = chunks[0] + chunks[1], chunks[2] + chunks[3]
    assert len(set(first)) == len(set(second)) == 8 and first != second
    kept = list(itertools.islice(sft_chunks(10, 4, random.Random(0)), 6))  # `--sft` epochs keep the short one
    assert [len(c) for c in kept] == [4, 4, 2, 4, 4, 2] and sorted(kept[0] + kept[1] + kept[2]) == list(range(10))
    assert kept[:2] == chunks[:2]  # the same shuffle: whole_only only leaves the short chunk out
    with pytest.raises(ValueError, match="chunk size"):
        next(sft_chunks(2, 3, random.Random(0), whole_only=True))


def test_sft_stops_at_the_first_check_that_reaches_its_target(tmp_path: Path, monkeypatch) -> None:
    """The check is a seam: scripted success rates stand in for greedy episodes of the policy."""
    import dart.recipe.warmstart as warmstart
    from dart.blobs import LocalBlobStore

    scripted, calls = iter([0.2, 0.6, 0.9]), []

    def fake_evaluate(policy, tasks, episodes, *, store, cfg, phase=0):
        calls.append(([t["id"] for t in tasks], episodes))
        return next(scripted)

    monkeypatch.setattr(warmstart, "evaluate", fake_evaluate)
    cfg = tree(dict(train_tasks=6, eval_tasks=3, sft_demos=4, sft_steps=50, sft_micro_batch=2, sft_target_success=0.5,
                    sft_check_every=3, sft_check_episodes=4), **SMALL)
    train, held_out = make_tasks(cfg.recipe)
    lines: list[str] = []
    warm = warmstart.warm_start(cfg, tmp_path, LocalBlobStore(tmp_path / "blobs"), train, log=lines.append)
    assert (warm / "model.safetensors").is_file()
    assert len(calls) == 2  # steps 3 and 6; the second reached 0.6 >= 0.5
    assert lines[-2:] == ["sft step 6: training-task success 0.600 (target 0.5)", "sft step 6: warm start reached its target"]
    checked = {i for ids, _ in calls for i in ids}
    assert checked <= {t["id"] for t in train} and not checked & {t["id"] for t in held_out}
    assert all(n == 4 for _, n in calls)


def test_sft_checks_closer_once_success_leaves_zero(tmp_path: Path, monkeypatch) -> None:
    """Coarse checks every 6 steps while success is 0, every 2 once a check scored above zero
    (and still every 2 after a later check at zero)."""
    import dart.recipe.warmstart as warmstart
    from dart.blobs import LocalBlobStore

    scripted = iter([0.0, 0.0, 0.1, 0.0, 0.2, 0.4])

    def fake_evaluate(policy, tasks, episodes, *, store, cfg, phase=0):
        return next(scripted)

    monkeypatch.setattr(warmstart, "evaluate", fake_evaluate)
    cfg = tree(dict(train_tasks=6, eval_tasks=3, sft_demos=4, sft_steps=50, sft_micro_batch=2, sft_target_success=0.3,
                    sft_check_every=6, sft_fine_check_every=2, sft_check_episodes=4), **SMALL)
    train, _ = make_tasks(cfg.recipe)
    lines: list[str] = []
    warmstart.warm_start(cfg, tmp_path, LocalBlobStore(tmp_path / "blobs"), train, log=lines.append)
    checks = [line.split(":")[0] for line in lines if "training-task success" in line]
    assert checks == ["sft step 6", "sft step 12", "sft step 18", "sft step 20", "sft step 22", "sft step 24"]
    assert lines[-1] == "sft step 24: warm start reached its target"
    with pytest.raises(ConfigError, match="sft_fine_check_every"):
        Recipe(sft_fine_check_every=0)


def test_sft_that_misses_its_target_keeps_the_best_checks_weights(tmp_path: Path, monkeypatch) -> None:
    """Checks at steps 3, 6, 9 score 0.2, 0.4, 0.0 (target 0.9): the warm start is step 6's model."""
    import torch

    import dart.recipe.warmstart as warmstart
    from dart.agent.model import load_policy
    from dart.blobs import LocalBlobStore

    scripted, at_check = iter([0.2, 0.4, 0.0]), []

    def fake_evaluate(policy, tasks, episodes, *, store, cfg, phase=0):
        at_check.append({k: v.detach().clone() for k, v in policy.model.state_dict().items()})
        return next(scripted)

    monkeypatch.setattr(warmstart, "evaluate", fake_evaluate)
    cfg = tree(dict(train_tasks=6, eval_tasks=3, sft_demos=4, sft_steps=9, sft_micro_batch=2, sft_target_success=0.9,
                    sft_check_every=3, sft_check_episodes=4, sft_lr=1e-2), **SMALL)
    train, _ = make_tasks(cfg.recipe)
    lines: list[str] = []
    warm = warmstart.warm_start(cfg, tmp_path, LocalBlobStore(tmp_path / "blobs"), train, log=lines.append)
    assert lines[-1] == "sft: target 0.9 not reached; keeping step 6 (training-task success 0.400, the last check 0.000)"
    saved = load_policy(warm).model.state_dict()
    moved = [k for k in saved if not torch.equal(at_check[1][k], at_check[2][k])]
    assert moved, "SFT changed no weight between steps 6 and 9: the test would prove nothing"
    assert all(torch.allclose(saved[k].float(), at_check[1][k].float()) for k in moved)


def test_eval_schedule_cycles_tasks_in_order() -> None:
    tasks = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    assert [t["id"] for t in eval_schedule(tasks, 7)] == ["a", "b", "c", "a", "b", "c", "a"]
    with pytest.raises(ValueError, match="no evaluation tasks"):
        eval_schedule([], 3)


def test_sampling_seeds_differ_per_episode_and_step_and_repeat_per_key() -> None:
    seeds = {sampling_seed(0, 1, e, i) for e in range(50) for i in range(3)}
    assert len(seeds) == 150
    assert sampling_seed(0, 1, 2, 3) == sampling_seed(0, 1, 2, 3)
    assert all(0 <= s < 2**31 for s in seeds)


def _traj(group: str, rid: str, reward: float, task_id: str = "t") -> Trajectory:
    """A one-step trajectory (its step's screenshot is never read: batches are only built here)."""
    ctx = PromptContext(instruction="click", step_index=0, screenshot_digest="0" * 64, screen_width=112,
                        screen_height=112)
    step = Sample(rollout_id=rid, step_index=0, task_id=task_id, group_id=group, context=ctx, prompt_hash="h",
                  response_token_ids=[1, 2], rollout_logprobs=[-0.5, -0.5], entropies=[0.3, 0.3], mean_entropy=0.3,
                  policy_version=0)
    return Trajectory(task_id=task_id, group_id=group, rollout_id=rid, steps=[step], reward=reward,
                      finish_reason="env_done")


def test_the_batch_keeps_only_groups_with_a_success_and_a_failure_as_the_data_manager_does() -> None:
    trajectories = [_traj("all-ok", "a", 1.0), _traj("all-ok", "b", 1.0), _traj("mixed", "c", 1.0),
                    _traj("mixed", "d", 0.0), _traj("all-bad", "e", 0.0), _traj("all-bad", "f", 0.0)]
    manifest = batch_of(trajectories, update=0, cfg=tree())
    assert [s.rollout_id for s in manifest.samples] == ["c", "d"]
    assert [s.reward for s in manifest.samples] == [1.0, 0.0]
    assert (manifest.stats["dropped_groups/all_success"], manifest.stats["dropped_groups/all_fail"]) == (1.0, 1.0)
    kept_all = batch_of(trajectories, update=0, cfg=tree({"drop_uniform_groups": False}))
    assert [s.rollout_id for s in kept_all.samples] == ["a", "b", "c", "d", "e", "f"]


@dataclass
class ScriptedEngine:
    """A fake engine (no model): answers each request with the next scripted text."""

    answers: list[str]
    requests: list[GenerateRequest] = field(default_factory=list)

    async def generate(self, request: GenerateRequest) -> Generation:
        self.requests.append(request)
        text = self.answers[min(len(self.requests) - 1, len(self.answers) - 1)]
        return Generation(text=text, token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3], entropies=[0.5] * 3,
                          finish_reason="stop", prompt_token_ids=[7, 8, 9], policy_version=0)


def _episode(task: dict, answers: list[str], tmp_path: Path, **sections: dict) -> tuple[Trajectory, ScriptedEngine]:
    from dart.blobs import LocalBlobStore

    engine = ScriptedEngine(answers)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=8, seed=1)
    traj = asyncio.run(run_episode(engine, task, store=LocalBlobStore(tmp_path / "blobs"), cfg=tree(**sections),
                                   sampling=lambda i: sampling, group_id="g", rollout_id="r"))
    return traj, engine


def test_episode_of_scripted_oracle_answers_succeeds_with_history(tmp_path: Path) -> None:
    screen = screen_of(TWO_STEP_TASK)
    answers = [oracle_text(a, (screen["width"], screen["height"]), tree()) for a in oracle_plan(TWO_STEP_TASK)]
    traj, engine = _episode(TWO_STEP_TASK, answers, tmp_path)
    assert (traj.reward, traj.finish_reason, len(traj.steps)) == (1.0, "env_done", 2)
    assert [s.context.step_index for s in traj.steps] == [0, 1]
    assert traj.steps[1].context.history[0].response_text == answers[0]
    assert len(engine.requests[1].images) == 2  # the history screenshot, then the current one


def test_episode_of_garbage_answers_runs_out_of_steps_with_reward_zero(tmp_path: Path) -> None:
    traj, _ = _episode(CLICK_TASK, ["no action here"], tmp_path, data={"curation": {"max_steps": 2}})
    assert (traj.reward, traj.finish_reason, len(traj.steps)) == (0.0, "max_steps", 2)


def test_episode_ends_at_a_terminal_action(tmp_path: Path) -> None:
    traj, _ = _episode(CLICK_TASK, ["Action: finished(content='done')"], tmp_path)
    assert (traj.reward, traj.finish_reason, len(traj.steps)) == (0.0, "finished", 1)


TWO_OF_TWO = {"batcher": {"groups_per_batch": 2}, "curation": {"n_default": 2}, "scheduler": {"max_new_tokens": 8}}
"""Two tasks an update, two rollouts each, 8 tokens an answer."""


def test_minuscule_recipe_runs_end_to_end(tmp_path: Path) -> None:
    cfg = tree(dict(train_tasks=6, eval_tasks=3, sft_demos=4, sft_steps=2, updates=2, eval_episodes=4,
                    drop_uniform_groups=False), data=TWO_OF_TWO)
    lines: list[str] = []
    out = run_recipe(cfg, tmp_path / "run", log=lines.append)
    assert {"warm_success", "rl_success", "delta", "eval_episodes", "train_success", "sft_s", "eval_warm_s",
            "rl_s", "eval_rl_s", "total_s"} <= out.keys()
    assert out["eval_episodes"] == 4
    assert 0.0 <= out["warm_success"] <= 1.0 and 0.0 <= out["rl_success"] <= 1.0
    assert out["delta"] == pytest.approx(out["rl_success"] - out["warm_success"])
    assert len(out["train_success"]) == 2
    assert out["updates"][0]["samples"] > 0  # mixed or not, every group trained (drop_uniform_groups off)
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert lines[0] == "sft step 2/2: nll " + lines[0].rsplit(" ", 1)[-1]  # the warm start reports its loss
    assert lines[1].startswith("warm start: held-out success") and lines[-1].startswith("RL: held-out success")


def test_held_out_curve_every_n_updates_ends_at_the_final_number(tmp_path: Path) -> None:
    cfg = tree(dict(train_tasks=6, eval_tasks=3, sft_demos=4, sft_steps=2, updates=2, eval_episodes=4,
                    drop_uniform_groups=False, eval_every=1), data=TWO_OF_TWO)
    lines: list[str] = []
    out = run_recipe(cfg, tmp_path / "run", log=lines.append)
    assert [u for u, _ in out["held_out_curve"]] == [1, 2]
    # The last point is the final policy on the same tasks, greedy: the end number exactly.
    assert out["held_out_curve"][-1][1] == out["rl_success"]
    assert sum(line.startswith("update 2/2: held-out success") for line in lines) == 1


def test_recipe_refuses_a_negative_eval_every() -> None:
    with pytest.raises(ConfigError, match="eval_every"):
        Recipe(eval_every=-1)


def test_evaluation_outcomes_give_success_per_instruction(tmp_path: Path) -> None:
    from dart.blobs import LocalBlobStore
    from dart.recipe.episodes import evaluate_async, success_by_instruction

    clicks = [t for t in generate_tasks(60, preset="tiny", seed=0) if len(oracle_plan(t)) == 1]
    a = clicks[0]
    b = next(t for t in clicks if t["instruction"] != a["instruction"]
             and oracle_plan(t)[0] != oracle_plan(a)[0])
    screen = screen_of(a)
    # Every answer is a's solution: a is solved, b (another colour in another place) is not.
    engine = ScriptedEngine([oracle_text(oracle_plan(a)[0], (screen["width"], screen["height"]), tree())])
    outcomes: list[tuple[dict, bool]] = []
    rate = asyncio.run(evaluate_async(engine, [a, b], 4, store=LocalBlobStore(tmp_path / "blobs"),
                                      cfg=tree(data={"curation": {"max_steps": 1, "min_steps": 1}}),
                                      outcomes=outcomes))
    assert rate == 0.5
    assert [(t["id"], solved) for t, solved in outcomes] == [(a["id"], True), (b["id"], False)] * 2
    assert success_by_instruction(outcomes, min_tasks=1) == {a["instruction"]: (1, 1.0), b["instruction"]: (1, 0.0)}
    assert success_by_instruction(outcomes, min_tasks=2) == {}  # one task each: not a shared instruction


def test_success_by_instruction_counts_distinct_tasks_and_orders_by_them() -> None:
    from dart.recipe.episodes import success_by_instruction

    red = [{"id": f"r{i}", "instruction": "Click the red button."} for i in range(3)]
    blue = [{"id": f"b{i}", "instruction": "Click the blue button."} for i in range(2)]
    # red: 3 tasks, episodes r0 r1 r2 r0 -> 3 of 4 solved; blue: 2 tasks, 1 of 2 solved.
    outcomes = [(red[0], True), (red[1], False), (red[2], True), (red[0], True), (blue[0], False), (blue[1], True)]
    assert success_by_instruction(outcomes, min_tasks=2) == {"Click the red button.": (3, 0.75),
                                                             "Click the blue button.": (2, 0.5)}
    assert list(success_by_instruction(outcomes, min_tasks=3)) == ["Click the red button."]


def test_summary_prints_held_out_success_per_instruction(capsys) -> None:
    from dart.stack.up import _print_summary

    summary = {"pipeline": "decoupled", "total_s": 60.0, "workdir": "runs/x", "warm_success": 0.5,
               "rl_success": 0.575, "delta": 0.075,
               "held_out_by_instruction": [{"instruction": "Click the yellow button.", "tasks": 42, "warm": 1.0,
                                            "rl": 1.0},
                                           {"instruction": "Click the blue button.", "tasks": 56, "warm": 0.304,
                                            "rl": 0.429}]}
    _print_summary(summary)
    out = capsys.readouterr().out
    assert "Click the yellow button." in out and "42 tasks  100% -> 100%" in out
    assert "56 tasks   30% ->  43%" in out


def test_step_contexts_give_each_step_the_turns_before_it() -> None:
    from dart.events.manifest import step_contexts

    ctxs = step_contexts("go", (10, 20), [("d0", "a0"), ("d1", "a1"), ("d2", "a2")])
    assert [c.step_index for c in ctxs] == [0, 1, 2]
    assert [c.screenshot_digest for c in ctxs] == ["d0", "d1", "d2"]
    assert [[(h.step_index, h.screenshot_digest, h.response_text) for h in c.history] for c in ctxs] == [
        [], [(0, "d0", "a0")], [(0, "d0", "a0"), (1, "d1", "a1")]]
    assert (ctxs[2].instruction, ctxs[2].screen_width, ctxs[2].screen_height) == ("go", 10, 20)
