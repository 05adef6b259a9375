"""One name everywhere: YAML stem == registry key == module name, and every YAML builds."""

from __future__ import annotations

import pytest
import yaml

from conftest import compose_config
from xformer_bench.config import CONF_DIR
from xformer_bench.registry import REGISTRIES, UnknownVariantError

COMPONENT_GROUPS = ["attention", "norm", "activation", "position", "ffn", "data", "embedding",
                    "head"]


def _yaml_stems(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", COMPONENT_GROUPS)
def test_registry_and_conf_folder_agree(group):
    assert REGISTRIES[group].names() == _yaml_stems(group)


@pytest.mark.parametrize("group", COMPONENT_GROUPS)
def test_each_variant_lives_in_the_module_of_its_name(group):
    registry = REGISTRIES[group]
    for name in registry.names():
        assert registry.get(name).__module__ == f"{registry.package}.{name}"


@pytest.mark.parametrize("group", COMPONENT_GROUPS)
def test_each_yaml_names_itself_and_has_a_label(group):
    for path in (CONF_DIR / group).glob("*.yaml"):
        spec = yaml.safe_load(path.read_text())
        assert spec["name"] == path.stem, path
        assert spec.get("label"), f"{path} needs a label for tables"


def test_unknown_variant_lists_the_choices():
    with pytest.raises(UnknownVariantError, match="unknown attention 'nope'; choose one of: .*full"):
        REGISTRIES["attention"].get("nope")


def test_model_preset_sets_defaults_and_the_command_line_wins():
    config = compose_config("model=vanilla")
    assert config["attention"]["name"] == "full" and config["model"]["name"] == "vanilla"
    config = compose_config("model=vanilla", "position=learned", "activation=relu")
    assert config["position"]["name"] == "learned" and config["activation"]["name"] == "relu"


def test_every_attention_option_names_its_family():
    from pathlib import Path

    from omegaconf import OmegaConf

    from xformer_bench.attention import FAMILIES
    from xformer_bench.config import CONF_DIR

    for path in sorted((Path(CONF_DIR) / "attention").glob("*.yaml")):
        family = OmegaConf.load(path).get("family")
        assert family in FAMILIES, f"{path.name}: family {family!r} is not one of {sorted(FAMILIES)}"
