"""Where the config lives and what it is made of: the config groups (the folders of conf/) and
the resolved run config for a list of overrides, composed exactly as ``xbench`` does (for
scripts and tests; the CLI itself composes through ``@hydra.main``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xformer_bench.resolvers import register as _register_resolvers

_register_resolvers()  # before anything composes conf/ (its YAMLs use ${vaswani_lr:...})

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

NOT_CHOICES = ("hydra", "experiment", "sparse_pattern", "study_rows")
"""Folders of conf/ that are not a run's choice: Hydra's own settings, study declarations, a
study's settings per row (``study_rows/<study>/<attention>.yaml``, picked by the experiment
and attention choices), and pointers a dataset sets for a preset (``sparse_pattern``: its
effect is the attention choice)."""
PLUMBING_GROUPS = ("data", "trainer", "logger")
"""Choices that do not shape the model: the dataset (a table column), how it trains and logs."""
CANONICAL_ORDER = ("model", "attention", "norm", "activation", "position", "ffn")
"""Display order of the groups named here; any other group follows, alphabetically."""


def group_order(group: str) -> tuple[int, str]:
    """Sort key: :data:`CANONICAL_ORDER` first, any other group after, alphabetically."""
    known = CANONICAL_ORDER.index(group) if group in CANONICAL_ORDER else len(CANONICAL_ORDER)
    return known, group


def choice_groups() -> tuple[str, ...]:
    """Every config group a run chooses an option of -- the one list records, run ids, W&B and
    tables use: the folders of conf/ less :data:`NOT_CHOICES`, model-shaping groups first
    (:data:`CANONICAL_ORDER`, then any new one), then :data:`PLUMBING_GROUPS`.  A new group is
    one new folder of YAMLs; nothing else lists it."""
    folders = {p.name for p in CONF_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml"))}
    shaping = sorted(folders - set(NOT_CHOICES) - set(PLUMBING_GROUPS), key=group_order)
    return (*shaping, *(g for g in PLUMBING_GROUPS if g in folders))


def compose_config(*overrides: str) -> dict[str, Any]:
    """The resolved config (a plain dict) the CLI would build for ``overrides``; inside a
    running ``xbench`` job, composed by that job's Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    if GlobalHydra.instance().is_initialized():
        cfg = compose(config_name="config", overrides=list(overrides))
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):  # read now
            cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"d_model": 128}}`` -> ``{"model.d_model": 128}`` (an empty node stays a
    leaf, ``{}``: a key with no settings is not a key that is absent)."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
