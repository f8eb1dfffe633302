"""Which policy a run hands over (dart.stack.select): pure rules with hand-picked values, and the
dev tasks are new to training and not held out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dart.agent.model import load_policy
from dart.config import build
from dart.recipe.config import Recipe, make_dev_tasks, make_tasks
from dart.rundir import RunMissing
from dart.stack.config import StackConfig
from dart.stack.select import (
    Published,
    pick_best,
    published_version,
    select_version,
    selected_version,
    versions_to_check,
)
from dart.stack.up import rl_policy


def test_checks_fall_every_n_updates_and_on_the_last_version():
    assert versions_to_check(range(0, 46), 15) == [15, 30, 45]
    assert versions_to_check(range(0, 61), 15) == [15, 30, 45, 60]
    # a budget that is not a multiple: the last version is checked as well
    assert versions_to_check(range(0, 38), 15) == [15, 30, 37]
    # fewer updates than one interval: only the last; nothing trained: nothing to check
    assert versions_to_check([0, 1, 2], 15) == [2]
    assert versions_to_check([0], 15) == []
    with pytest.raises(ValueError):
        versions_to_check([1], 0)


def test_the_best_dev_success_wins_and_a_tie_goes_to_the_later_version():
    assert pick_best([(15, 0.557), (30, 0.607), (45, 0.588), (60, 0.583)]) == 30
    assert pick_best([(15, 0.50), (30, 0.55), (45, 0.55)]) == 45
    with pytest.raises(ValueError):
        pick_best([])


def test_select_version_checks_only_the_named_versions():
    published = [Published(v, 1000 * v, f"sha-{v}") for v in range(0, 61)]
    dev = {15: 0.477, 30: 0.467, 45: 0.485, 60: 0.613}
    seen: list[int] = []

    def dev_success(p: Published) -> float:
        seen.append(p.version)
        return dev[p.version]

    chosen = select_version(published, every=15, dev_success=dev_success)
    assert chosen is not None
    assert seen == [15, 30, 45, 60]
    assert (chosen.version, chosen.last) == (60, 60)
    assert chosen.describe(600) == ("dev check on 600 tasks: v15 47.7 %, v30 46.7 %, v45 48.5 %, v60 61.3 %; "
                                    "v60 kept")
    assert select_version([Published(0, 0, "sha-0")], every=15, dev_success=dev_success) is None


def test_dev_tasks_are_training_split_tasks_never_trained_on_and_not_held_out():
    recipe = Recipe(train_tasks=50, sft_demos=50, eval_tasks=40, dev_tasks=30)
    train, held_out = make_tasks(recipe)
    dev = make_dev_tasks(recipe)
    ids = [t["id"] for t in dev]
    assert len(ids) == len(set(ids)) == 30
    assert not set(ids) & {t["id"] for t in train}
    assert not set(ids) & {t["id"] for t in held_out}
    assert {t["config"][0]["parameters"]["split"] for t in dev} == {"train"}
    assert make_dev_tasks(Recipe(train_tasks=50, sft_demos=50, eval_tasks=40)) == []


def test_a_negative_dev_task_count_is_refused_with_the_field_named():
    from dart.config import ConfigError

    with pytest.raises(ConfigError, match="dev_tasks"):
        Recipe(dev_tasks=-1)
    with pytest.raises(ConfigError, match="check_every"):
        Recipe(check_every=0)


def test_a_version_missing_from_the_blob_store_hands_over_the_last_checkpoint(tiny_dir, blobs, tmp_path, capsys):
    """The dev check reads every version from the blob store; a blob gone (deleted, another
    store) stops the check with one line, and the run hands over its last checkpoint instead
    of ending after RL without a held-out figure."""
    cfg = build(StackConfig, {"run_id": "sel", "workdir": str(tmp_path / "run"),
                              "recipe": {"train_tasks": 6, "eval_tasks": 2, "sft_demos": 4, "dev_tasks": 3,
                                         "check_every": 1},
                              "data": {"batcher": {"groups_per_batch": 1}}})
    checkpoint = tmp_path / "ckpt-2"
    checkpoint.mkdir()
    own = load_policy(tiny_dir).model.state_dict()
    trained = {k: v + 0.5 if v.is_floating_point() else v.clone() for k, v in own.items()}
    save_file(trained, checkpoint / "model.safetensors")
    summary: dict = {}
    missing = "ab" * 32
    policy = rl_policy(cfg, tmp_path / "run", blobs, Path(tiny_dir), checkpoint, summary,
                       published=[Published(1, 0, missing), Published(2, 0, missing)])
    served = policy.model.state_dict()
    assert all(torch.equal(served[k], trained[k]) for k in trained)
    assert missing in summary["dev_check_error"] and "selected_version" not in summary
    out = capsys.readouterr().out
    assert f"dev check stopped (no blob {missing}" in out and "the last checkpoint is handed over" in out


def test_the_handed_over_version_is_read_from_a_finished_runs_summary_and_a_missing_part_is_named(tmp_path):
    with pytest.raises(RunMissing, match=r"summary\.json: a finished run's summary"):
        selected_version(tmp_path)
    (tmp_path / "summary.json").write_text('{"selected_version": 30, "last_version": 45}')
    assert selected_version(tmp_path) == 30
    (tmp_path / "summary.json").write_text('{"final_checkpoint": "x"}')  # no dev check: the last checkpoint
    assert selected_version(tmp_path) is None
    with pytest.raises(RunMissing, match=r"no store .*chdb"):
        published_version(tmp_path, 3)
    assert not (tmp_path / "chdb").exists()  # a read creates nothing
