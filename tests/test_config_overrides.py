"""Every command that reads a config takes `[CONFIG] [KEY=VALUE ...]`: a dotted override reaches
the field it names, and an unknown key is refused by name before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from dart.cli import build_parser, main
from dart.config import build, parse_override, with_overrides
from dart.errors import ConfigError


def stack_cfg(args: argparse.Namespace) -> Any:
    from dart.stack.cli import load_stack_config

    return load_stack_config(args)


def env_cfg(args: argparse.Namespace) -> Any:
    from dart.env.worker_cli import worker_config_from_args

    return worker_config_from_args(args)


def rollout_cfg(args: argparse.Namespace) -> Any:
    from dart.rollout.cli import worker_config_from_args

    return worker_config_from_args(args)


def train_cfg(args: argparse.Namespace) -> Any:
    from dart.train.cli import train_section
    from dart.train.config import TrainerConfig

    return build(TrainerConfig, train_section(args), path="train")


def data_cfg(args: argparse.Namespace) -> Any:
    from dart.data.cli import data_config

    return data_config(args)


def archiver_cfg(args: argparse.Namespace) -> Any:
    from dart.log.cli import archiver_config

    return archiver_config(args)


def metrics_cfg(args: argparse.Namespace) -> Any:
    from dart.metrics.cli import metrics_config
    from dart.rundir import open_run, run_path

    path = run_path(args)
    return metrics_config(args, open_run(path) if path else None)


# command: (what its file holds, a dotted override, how to read the overridden value, the builder)
COMMANDS: dict[str, tuple[dict[str, Any], str, Any, Any]] = {
    "up": ({"run_id": "t"}, "trainer.loss.tis=token", lambda c: c.trainer.loss.tis, stack_cfg),
    "eval": ({"run_id": "t"}, "env.slots=32", lambda c: c.env.slots, stack_cfg),
    "env-worker": ({"env": {"slots": 2}}, "env.slots=32", lambda c: c.slots, env_cfg),
    "rollout-worker": ({"rollout": {"model": "m"}}, "rollout.hf.max_batch_size=32", lambda c: c.hf.max_batch_size,
                       rollout_cfg),
    "train": ({"train": {"model": "m", "checkpoint_dir": "c"}}, "train.optim.lr=3e-4", lambda c: c.optim.lr,
              train_cfg),
    "data-manager": ({"data": {}}, "data.scheduler.interval_s=32", lambda c: c.scheduler.interval_s, data_cfg),
    "archiver": ({"archiver": {"log_dir": "log"}}, "archiver.flush_interval_s=32",
                 lambda c: c.flush_interval_s, archiver_cfg),
    "metrics": ({"metrics": {"out_dir": "tb"}}, "metrics.images_per_version=32", lambda c: c.images_per_version, metrics_cfg),
}
EXPECTED = {"up": "token", "eval": 32, "env-worker": 32, "rollout-worker": 32, "train": 3e-4, "data-manager": 32.0,
            "archiver": 32.0, "metrics": 32}


def commands_taking_a_config() -> set[str]:
    """Every `dart` command whose parser has the shared config argument."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name for name, p in sub.choices.items() if any(a.dest == "config_items" for a in p._actions)}


def test_every_command_taking_a_config_is_checked_here():
    assert commands_taking_a_config() == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_dotted_override_reaches_its_field(command, tmp_path):
    data, override, read, builder = COMMANDS[command]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    args = build_parser().parse_args([command, str(path), override])
    assert read(builder(args)) == EXPECTED[command]
    # --config FILE is the same file, and a flag-less run without a file still takes overrides
    args = build_parser().parse_args([command, "--config", str(path), override])
    assert read(builder(args)) == EXPECTED[command]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_key_is_refused_by_name(command, tmp_path, capsys):
    data, override, _, _ = COMMANDS[command]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    key = override.split("=")[0].rsplit(".", 1)[0] + ".no_such_knob"
    rc = main([command, str(path), f"{key}=1"])
    assert rc == 2
    assert f"unknown field {key}" in capsys.readouterr().err


def test_a_bad_value_names_the_key_and_the_value(tmp_path, capsys):
    assert main(["env-worker", "env.slots=many"]) == 2
    err = capsys.readouterr().err
    assert "env.slots: input should be a valid integer" in err and "'many'" in err


def test_overrides_parse_values_as_a_config_file_would():
    assert parse_override("trainer.optim.lr=3e-4") == {"trainer": {"optim": {"lr": 3e-4}}}
    assert parse_override("env.slots=32") == {"env": {"slots": 32}}
    assert parse_override("warm_model=null") == {"warm_model": None}
    assert parse_override("recipe.sft_templates=[a, b]") == {"recipe": {"sft_templates": ["a", "b"]}}
    assert parse_override("run_id=") == {"run_id": ""}
    assert with_overrides({"env": {"slots": 2, "workers": 1}}, ["env.slots=4"]) == {"env": {"slots": 4, "workers": 1}}
    for bad in ("env.slots", "=3", "env..slots=3"):
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            parse_override(bad)


def test_one_config_file_comes_before_the_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env: {}\n")
    for argv in ([str(path), str(path)], ["env.slots=3", str(path)]):
        args = build_parser().parse_args(["env-worker", *argv])
        with pytest.raises(ConfigError, match="one config file"):
            env_cfg(args)


def test_up_flags_are_overrides_and_the_dotted_ones_win(tmp_path):
    args = build_parser().parse_args(["up", "--seed", "3", "--workdir", str(tmp_path), "recipe.seed=5"])
    cfg = stack_cfg(args)
    assert cfg.recipe.seed == 5 and cfg.trainer.seed == 5 and cfg.workdir == Path(tmp_path)


def test_metrics_takes_a_run_directory_beside_its_overrides(tmp_path):
    run = tmp_path / "run"
    (run / "log").mkdir(parents=True)
    (run / "blobs").mkdir()
    args = build_parser().parse_args(["metrics", str(run), "metrics.images_per_version=0", "--out", str(tmp_path / "tb")])
    cfg = metrics_cfg(args)
    assert "metrics.images_per_version=0" in args.config_items and str(run) not in args.config_items
    assert cfg.images_per_version == 0
    assert cfg.out_dir == tmp_path / "tb" and cfg.blobs == str(run / "blobs")
    # a run directory that is not there is still named as one (not read as a config file)
    assert main(["metrics", str(tmp_path / "nope"), "metrics.images_per_version=0"]) == 1
