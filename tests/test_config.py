"""Config mistakes are refused at start-up with the field named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from dart.bus import BusConfig
from dart.config import build, field_docs, load_yaml, require
from dart.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Inner:
    slots: int = 4
    """Environment slots."""
    backend: Literal["synthetic", "xdesktop"] = "synthetic"

    def __post_init__(self) -> None:
        require(self.slots > 0, "slots", f"must be positive, got {self.slots}")


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str
    env: Inner = field(default_factory=Inner)
    rates: list[float] = field(default_factory=list)


def test_build_nested_config():
    cfg = build(Outer, {"name": "run", "env": {"slots": 8}, "rates": [1, 0.5]})
    assert cfg.env.slots == 8 and cfg.rates == [1.0, 0.5]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "r", "env": {"slotz": 3}}, "unknown field env.slotz"),
        ({"name": "r", "env": {"slots": "eight"}}, "env.slots: input should be a valid integer"),
        ({"name": "r", "env": {"backend": "vmware"}}, "env.backend: input should be 'synthetic' or 'xdesktop'"),
        ({"name": "r", "env": {"slots": 0}}, "env.slots: must be positive"),
        ({"env": {}}, "missing required field name"),
        ({"name": "r", "rates": [1, "x"]}, r"rates\[1\]: input should be a valid number"),
    ],
)
def test_mistakes_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        build(Outer, data)


def test_bus_config_refuses_a_bad_bootstrap():
    with pytest.raises(ConfigError, match=r"bus\.bootstrap"):
        build(BusConfig, {"bootstrap": "localhost"}, path="bus")


def test_field_docs_come_from_the_docstring_under_each_field():
    assert field_docs(Inner)["slots"] == "Environment slots."
    assert "Tansu" in field_docs(BusConfig)["session_timeout_ms"]


def test_load_yaml_refuses_non_mappings(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")


def test_a_partial_mapping_changes_only_the_fields_it_names_of_a_configured_default():
    from dart.stack.config import StackConfig

    cfg = build(StackConfig, {"trainer": {"loss": {"tis": "off"}}, "recipe": {"model": {"num_hidden_layers": 3}}})
    # the recipe's own loss (KL off, negatives halved) stays; only tis changes
    assert cfg.trainer.loss.tis == "off"
    assert cfg.trainer.loss.kl_coef == 0.0 and cfg.trainer.loss.negative_scale == 0.5
    assert cfg.recipe.model.rope_theta == 3.0 and cfg.recipe.model.num_hidden_layers == 3
    with pytest.raises(ConfigError, match=r"trainer\.loss\.tis"):
        build(StackConfig, {"trainer": {"loss": {"tis": "sometimes"}}})


def test_a_union_field_is_named_without_pydantics_branch_tags():
    from dart.data.config import DataConfig

    with pytest.raises(ConfigError, match=r"^data\.backend: input should be 'synthetic', 'xdesktop' or 'libvirt', got 5$"):
        build(DataConfig, {"backend": 5}, path="data")
