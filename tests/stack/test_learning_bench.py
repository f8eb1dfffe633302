"""benchmarks/learning.py: each ablation turns exactly its knob off, and the result builds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dart.config import as_mapping, build, load_yaml
from dart.config import merge as deep_merge
from dart.errors import ConfigError
from dart.stack.config import StackConfig
from dart.stack.services import service_configs

REPO = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("learning_bench", REPO / "benchmarks" / "learning.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["learning_bench"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


def built(name: str, tmp_path: Path, start: str = "full") -> tuple[StackConfig, dict]:
    raw = load_yaml(REPO / "configs" / "chain.yaml")
    cfg = build(StackConfig, deep_merge(raw, bench.variant_overrides(name, build(StackConfig, raw), start=start)))
    sections = {name: {section: as_mapping(obj)} for name, (section, obj) in service_configs(cfg).items()}
    return cfg, sections


def knobs_off(cfg: StackConfig, sections: dict) -> set[str]:
    curation = sections["data-manager"]["data"]["curation"]
    loss = sections["trainer"]["train"]["loss"]
    knobs = {
        "no_experience": (cfg.experience_tasks == 0) and curation.get("inject_experience") is False,
        "no_dynamic_rollouts": curation.get("n_min") == curation["n_default"],
        "no_dynamic_length": curation.get("adaptive_max_steps") is False,
        "no_entropy_selection": curation["entropy_top_fraction"] == 1.0,
        "no_tis": loss["tis"] == "off",
        "no_clip_higher": loss["eps_high"] == loss["eps_low"] == 0.1,
    }
    return {k for k, off in knobs.items() if off}


@pytest.mark.parametrize("name", bench.KNOBS)
def test_from_the_preset_each_knob_variant_is_the_shipped_config_less_that_knob(name, tmp_path):
    cfg, sections = built(name, tmp_path, start="preset")
    # the chain preset ships without the experience pool, so that knob is off in every variant
    assert knobs_off(cfg, sections) == {"no_experience", name}
    assert cfg.experience_tasks == 0
    assert sections["trainer"]["train"]["loss"]["step_weight"] == "trajectory"


def test_an_unknown_ablation_base_is_refused_by_name():
    raw = load_yaml(REPO / "configs" / "chain.yaml")
    with pytest.raises(SystemExit, match="unknown ablation base 'fast'"):
        bench.variant_overrides("no_tis", build(StackConfig, raw), start="fast")


@pytest.mark.parametrize("name", ["preset", "full", *bench.KNOBS])
def test_each_variant_changes_only_its_knob(name, tmp_path):
    cfg, sections = built(name, tmp_path)
    curation = sections["data-manager"]["data"]["curation"]
    loss = sections["trainer"]["train"]["loss"]
    # the chain preset itself runs without the experience pool; full dart puts it back
    expected = {"preset": {"no_experience"}, "full": set()}.get(name, {name})
    assert knobs_off(cfg, sections) == expected
    if name not in ("preset", "no_experience"):
        assert cfg.experience_tasks == bench.FULL_EXPERIENCE_TASKS and curation["inject_experience"] is True
    # the rest of the recipe is the config's own: the loss keeps KL off and halved negatives
    assert loss["kl_coef"] == 0.0 and loss["negative_scale"] == 0.5
    assert cfg.recipe.preset == "chain" and cfg.max_updates == 40


def test_the_table_gives_mean_and_spread_of_the_gain():
    runs = [{"seed": s, "warm_success": 0.3, "rl_success": 0.3 + d, "delta": d, "updates": 40, "rl_s": 600}
            for s, d in ((0, 0.10), (1, 0.20), (2, 0.15))]
    text = bench.table({"full": runs})
    assert "| full | 3 (0, 1, 2) | 30.0% | 45.0% | +15.0 ± 5.0 (min +10.0) | - | 40 | 10.0 | 0 of 3 |" in text
    assert "full seed 0: 30.0 % -> 40.0 % (+10.0), 40 updates in 10.0 min, 200 episodes, no standard error" in text


def test_the_tables_put_each_runs_standard_error_beside_its_figures_and_the_spread_apart():
    def run(seed: int, delta: float, se: float) -> dict:
        return {"seed": seed, "warm_success": 0.425, "warm_se": 0.0164, "rl_success": 0.425 + delta, "rl_se": 0.0166,
                "delta": delta, "delta_se": se, "eval_tasks": 899, "updates": 45, "rl_s": 540}

    runs = [run(0, 0.10, 0.014), run(0, 0.12, 0.016), run(1, 0.15, 0.015)]
    text = bench.table({"preset": runs})
    # the run-to-run spread (sd of 10, 12, 15 = 2.5) and the measure's error of one gain (mean 1.5) apart
    assert "| preset | 3 (0, 0, 1) | 42.5% | 54.8% | +12.3 ± 2.5 (min +10.0) | 1.5 | 45 | 9.0 | 0 of 3 |" in text
    assert "preset seed 0: 42.5 % ± 1.6 -> 52.5 % ± 1.7 (+10.0 ± 1.4), 45 updates in 9.0 min, 899 tasks" in text
    lines = bench.by_seed({"preset": runs}, [0, 1, 2]).splitlines()
    # seed 0: two runs, each ± its standard error, and their mean ± sd; the row's mean is over seeds' means
    assert lines[2] == ("| preset | +10.0 ± 1.4, +12.0 ± 1.6 (mean +11.0 ± 1.4) | +15.0 ± 1.5 | not run "
                        "| +13.0 ± 2.8 | - |")


def test_set_overrides_a_dotted_field_with_a_typed_value():
    assert bench.dotted("trainer.optim.lr=3e-4") == {"trainer": {"optim": {"lr": 3e-4}}}
    assert bench.dotted("max_updates=90") == {"max_updates": 90}
    assert bench.dotted("trainer.loss.tis=sequence") == {"trainer": {"loss": {"tis": "sequence"}}}
    assert bench.dotted("env.nice=[1, 2]") == {"env": {"nice": [1, 2]}}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        bench.dotted("trainer.optim.lr")


def test_the_per_seed_table_marks_cells_not_run_and_compares_on_shared_seeds_only():
    runs = {
        "preset": [{"seed": 0, "delta": 0.22}, {"seed": 1, "delta": 0.17}, {"seed": 2, "delta": 0.23}],
        "no_tis": [{"seed": 1, "delta": 0.295}],
        "no_clip_higher": [{"seed": 0, "delta": 0.10}, {"seed": 2, "delta": 0.20}],
        "no_dynamic_length": [],
    }
    lines = bench.by_seed(runs, [0, 1, 2]).splitlines()
    assert lines[0] == "| variant | seed 0 | seed 1 | seed 2 | mean ± sd | vs first row, same seeds |"
    # preset: mean of 22.0, 17.0, 23.0 = 20.67; sd = sqrt(20.67 / 2) = 3.21
    assert lines[2] == "| preset | +22.0 | +17.0 | +23.0 | +20.7 ± 3.2 | - |"
    # no_tis on seed 1 only: 29.5 - 17.0 = +12.5 on one seed
    assert lines[3] == "| no_tis | not run | +29.5 | not run | +29.5 | +12.5 on 1 seed |"
    # seeds 0 and 2: (10 - 22) and (20 - 23) -> mean -7.5; sd of 10, 20 = 7.07
    assert lines[4] == "| no_clip_higher | +10.0 | not run | +20.0 | +15.0 ± 7.1 | -7.5 on 2 seeds |"
    assert lines[5] == "| no_dynamic_length | not run | not run | not run | - | - |"


def test_ablate_leaves_clip_higher_out_where_one_step_per_batch_makes_the_ratio_1():
    raw = load_yaml(REPO / "configs" / "chain.yaml")
    names, note = bench.ablation_names(build(StackConfig, raw))
    assert names == ["full", "no_experience", "no_dynamic_rollouts", "no_dynamic_length", "no_entropy_selection",
                     "no_tis"]
    assert note is not None and "one optimiser step per batch" in note
    stepped = build(StackConfig, deep_merge(raw, {"trainer": {"ppo_minibatches": 4}}))
    assert bench.ablation_names(stepped) == (["full", *bench.KNOBS], None)
