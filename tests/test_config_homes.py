"""One home per fact and per default in a run's config tree (:class:`dart.stack.config.StackConfig`).

A service's settings live in its own config class with their defaults; the recipe's choices for
them are a preset of the tree that sets none to its own default; a fact that more than one process
holds is set by one key, and a process's different copy is refused naming the field; and the drift
cases that had two keys for one fact (issue 55) are gone.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from dart.config import as_mapping, build, load_yaml, merge, nested
from dart.data.config import DataConfig
from dart.env.config import EnvWorkerConfig
from dart.errors import ConfigError
from dart.recipe.config import Recipe
from dart.recipe.preset import preset
from dart.rollout.config import RolloutWorkerConfig
from dart.stack.config import EnvSection, RolloutSection, RunConfig, StackConfig, TasksSection
from dart.stack.services import service_configs
from dart.train.config import TrainerConfig

REPO = Path(__file__).resolve().parents[1]
SERVICES = {"env": EnvWorkerConfig, "rollout": RolloutWorkerConfig, "trainer": TrainerConfig, "data": DataConfig}
STACK_OWN = (RunConfig, Recipe, TasksSection, EnvSection, RolloutSection)
"""The tree's own classes: what is not a service's config."""

DIFFERENT_FACTS = {
    ("Recipe", "seed", "SyntheticConfig"): "env.synthetic.seed seeds the synthetic backend's latency and crashes",
    ("Recipe", "model", "RolloutWorkerConfig"): "recipe.model is the tiny model's size; the services' the policy's path",
    ("Recipe", "model", "TrainerConfig"): "recipe.model is the tiny model's size; the services' the policy's path",
    ("Recipe", "model", "OpenAIEngineConfig"): "recipe.model is the tiny model's size; openai.model a served name",
    ("EnvSection", "workers", "TransferConfig"): "a section's process count; transfer.workers a weights group's size",
    ("RolloutSection", "workers", "TransferConfig"): "a section's process count; transfer.workers a weights group's size",
}
"""Field names the tree's own classes share with a service's config class that name different facts."""


def config_classes(cls: type, seen: dict[str, type] | None = None) -> dict[str, type]:
    """``cls`` and every config dataclass inside it, by name."""
    seen = {} if seen is None else seen
    if cls.__name__ in seen:
        return seen
    seen[cls.__name__] = cls
    for hint in typing.get_type_hints(cls).values():
        for tp in (hint, *typing.get_args(hint)):
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                config_classes(tp, seen)
    return seen


def own_fields(cls: type) -> set[str]:
    """The fields ``cls`` declares itself (not those of a config class it extends)."""
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    return {f.name for f in dataclasses.fields(cls)} - inherited


def shared_names(cfg: StackConfig) -> set[str]:
    """The last part of every field the tree checks against its one key (``trainer.seed`` -> ``seed``)."""
    return {field.rsplit(".", 1)[-1] for field, *_ in cfg.shared_facts()}


def test_a_field_of_the_tree_and_of_a_service_is_one_checked_fact_or_a_named_other_fact() -> None:
    services: dict[str, type] = {}
    for cls in SERVICES.values():
        config_classes(cls, services)
    checked = shared_names(build(StackConfig, {"tasks": {"source": "osworld"}, "evaluate": False,
                                               "env": {"backend": "xdesktop"}}))
    twice = [(own.__name__, name, other) for own in STACK_OWN for name in sorted(own_fields(own))
             for other, cls in sorted(services.items()) if name in own_fields(cls)]
    unexplained = [t for t in twice if t[1] not in checked and t not in DIFFERENT_FACTS]
    assert not unexplained, f"a name in the tree's own classes and in a service's: one fact, two keys? {unexplained}"
    assert set(DIFFERENT_FACTS) <= set(twice), "an explained pair no longer exists: drop it from DIFFERENT_FACTS"


@pytest.mark.parametrize("source", ["synthetic", "osworld"])
def test_every_fact_several_processes_hold_is_refused_when_one_copy_differs(source: str) -> None:
    base: dict[str, Any] = {} if source == "synthetic" else {
        "tasks": {"source": "osworld"}, "evaluate": False, "env": {"backend": "xdesktop"}}
    facts = build(StackConfig, base).shared_facts()
    assert {"trainer.seed", "trainer.max_updates", "data.pipeline", "trainer.prompt", "rollout.model",
            "env.run_id", "data.blobs"} <= {field for field, *_ in facts}
    for field, _, _, key in facts:
        other = {"prompt": {"max_turns": 3}, "max_updates": 7, "seed": 7, "pipeline": "coupled"}.get(
            field.rsplit(".", 1)[-1], "/elsewhere")
        with pytest.raises(ConfigError, match=rf"^{field}: differs from .*; set {key.replace('*', '[*]')} "):
            build(StackConfig, merge(base, nested(field, other)))


def _defaults_under(cls: type, mapping: dict[str, Any], path: str) -> list[str]:
    """The keys of ``mapping`` (laid over ``cls``) that set a field to ``cls``'s own default."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    same = []
    for name, value in mapping.items():
        assert name in fields, f"{path}.{name}: not a field of {cls.__name__}"
        inner = next((t for t in (hints[name], *typing.get_args(hints[name]))
                      if dataclasses.is_dataclass(t) and isinstance(t, type)), None)
        if inner is not None and isinstance(value, dict):
            same += _defaults_under(inner, value, f"{path}.{name}")
            continue
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if default is not dataclasses.MISSING and json.dumps(value, default=str) == json.dumps(
                as_mapping(default) if dataclasses.is_dataclass(default) else default, default=str):
            same.append(f"{path}.{name}")
    return same


def test_the_recipe_preset_sets_no_service_field_to_that_services_own_default(tmp_path: Path) -> None:
    # a run unlike the defaults, so values the preset takes from the run differ from the services' defaults
    tree = preset(Recipe(seed=7), run_id="r", workdir=tmp_path, pipeline="coupled", model_dir=tmp_path / "m",
                  max_updates=5, downloads=tmp_path / "d")
    assert set(tree) == set(SERVICES)
    same = [f for name, cls in SERVICES.items() for f in _defaults_under(cls, tree[name], name)]
    assert not same, f"the preset repeats a service's default (its one home is the service's class): {same}"


def test_the_root_and_the_recipe_give_no_config_class_a_literal_setting() -> None:
    """A constant passed to a config class in the composition root or the recipe is a default with
    a second home: it belongs in the class or in the preset."""
    found = []
    for path in [*sorted((REPO / "dart" / "stack").glob("*.py")), *sorted((REPO / "dart" / "recipe").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith("Config"):
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {node.func.id}({k.arg}=...)"  # type: ignore[attr-defined]
                          for k in node.keywords if isinstance(k.value, ast.Constant)]
    assert not found, found


def test_an_older_configs_moved_keys_are_refused_naming_their_home() -> None:
    from dart.stack.config import MOVED

    for old, new in MOVED.items():
        with pytest.raises(ConfigError, match=rf"^{old}: moved to {new.split()[0]}"):
            build(StackConfig, nested(old, 1))
    assert not {old.split(".")[1] for old in MOVED if old.startswith("recipe.")} & {f.name for f in dataclasses.fields(Recipe)}


def test_the_recipe_holds_nothing_a_service_holds() -> None:
    services: dict[str, type] = {}
    for cls in SERVICES.values():
        config_classes(cls, services)
    every_service_field = {name for cls in services.values() for name in own_fields(cls)}
    assert own_fields(Recipe) & every_service_field <= {"seed", "model"}  # DIFFERENT_FACTS and trainer.seed


# ------------------------------------------------------------------ the three drift cases of issue 55


def synthetic(*overrides: dict[str, Any]) -> StackConfig:
    data = load_yaml(REPO / "configs" / "synthetic.yaml")
    for extra in overrides:
        data = merge(data, extra)
    return build(StackConfig, data)


def test_the_entropy_step_fraction_has_one_key_the_data_manager_s() -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.loss\.entropy_top_frac: moved to data\.curation\.entropy_top_fraction"):
        synthetic({"trainer": {"loss": {"entropy_top_frac": 0.5}}})
    with pytest.raises(ConfigError, match=r"^recipe\.loss: moved to trainer\.loss"):
        synthetic({"recipe": {"loss": {"entropy_top_frac": 0.5}}})
    cfg = synthetic({"data": {"curation": {"entropy_top_fraction": 0.5}}})
    configs = service_configs(cfg)
    assert configs["data-manager"][1].curation.entropy_top_fraction == 0.5
    assert "entropy_top_frac" not in json.dumps(as_mapping(configs["trainer"][1]))


def test_ppo_epochs_is_the_trainers_and_what_the_summary_records_is_what_the_trainer_ran(tmp_path: Path) -> None:
    from dart.bus import BusConfig
    from dart.stack.up import start_services

    class Recorded:
        """A supervisor that starts nothing: the specs it was given."""

        def __init__(self) -> None:
            self.specs: list[Any] = []

        def start(self, spec: Any) -> None:
            self.specs.append(spec)

    assert synthetic().trainer.ppo_epochs == 2  # configs/synthetic.yaml sets the trainer's key
    with pytest.raises(ConfigError, match=r"^recipe\.ppo_epochs: moved to trainer\.ppo_epochs .*; set trainer\.ppo_epochs$"):
        synthetic({"recipe": {"ppo_epochs": 1}})
    cfg = synthetic({"trainer": {"ppo_epochs": 1}, "workdir": str(tmp_path), "tensorboard": False})
    (tmp_path / "config").mkdir()
    supervisor = Recorded()
    started = start_services(cfg, supervisor, tmp_path, BusConfig(bootstrap="127.0.0.1:9", prefix="t"))  # type: ignore[arg-type]
    # what `dart up` puts in summary.json ("services") is the object each process reads from its file
    recorded = {name: as_mapping(obj) for name, (_, obj) in started.items()}
    assert recorded["trainer"]["ppo_epochs"] == 1
    assert recorded["trainer"] == load_yaml(tmp_path / "config" / "trainer.yaml")["train"]
    assert {spec.name for spec in supervisor.specs} == set(started)


def test_the_convention_is_the_rollout_workers_and_the_warm_start_writes_in_it() -> None:
    from dart.agent.actions import Click
    from dart.agent.uitars import parse_actions
    from dart.recipe.warmstart import oracle_text

    with pytest.raises(ConfigError, match=r"^recipe\.convention: moved to rollout\.convention"):
        synthetic({"recipe": {"convention": "qwen25vl"}})
    # qwen25vl with the recipe's small screens: the warm start could not write it, refused at start-up
    with pytest.raises(ConfigError, match=r"^rollout\.convention: qwen25vl's frame"):
        synthetic({"rollout": {"convention": "qwen25vl"}})
    # with UI-TARS' pixel bounds it is taken, and the warm start's answers are in that frame
    cfg = synthetic({"rollout": {"convention": "qwen25vl", "prompt": {"min_pixels": 100 * 28 * 28}}})
    text = oracle_text(Click(x=500.0, y=300.0), (1000, 600), cfg)
    (parsed,) = parse_actions(text, screen=(1000, 600), convention="qwen25vl", min_pixels=100 * 28 * 28,
                              max_pixels=cfg.rollout.prompt.max_pixels)
    assert (round(parsed.x), round(parsed.y)) == (500, 300)  # type: ignore[union-attr]
    assert oracle_text(Click(x=500.0, y=300.0), (1000, 600), synthetic()) == "Action: click(start_box='(500,500)')"
