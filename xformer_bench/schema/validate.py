"""A composed configuration checked against the declarations: every key of every group node
and every top-level key, then whether the model preset is for the data's shape of input.  The
first problem is one :class:`~xformer_bench.errors.ConfigError` line naming the key and what it
may be."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from xformer_bench.errors import ConfigError
from xformer_bench.schema.attention import ATTENTION
from xformer_bench.schema.data import DATA, fitting, given
from xformer_bench.schema.group import Group
from xformer_bench.schema.keys import Key, Node, OptionOf, shown
from xformer_bench.schema.layers import ACTIVATION, EMBEDDING, FFN, HEAD, NORM, POSITION, STACK
from xformer_bench.schema.model import INPUTS, MODEL, MODIFICATION
from xformer_bench.schema.shapes import ANY, KINDS
from xformer_bench.schema.study import PLANNED, STUDY
from xformer_bench.schema.top import TOP
from xformer_bench.schema.training import LOGGER, TRAINER

GROUPS: dict[str, Group] = {group.name: group for group in (
    MODEL, ATTENTION, NORM, ACTIVATION, POSITION, FFN, STACK, EMBEDDING, HEAD, MODIFICATION,
    DATA, TRAINER, LOGGER)}
"""Every config group with keys (``sparse_pattern`` has none; ``experiment`` and
``study_rows`` set other groups' keys and the :data:`TOP_KEYS`)."""
TOP_KEYS: dict[str, Key] = {**TOP, **STUDY, **PLANNED}


def check_config(config: Mapping[str, Any]) -> None:
    """:class:`ConfigError` for the first key whose value its declaration refuses, or a key
    nothing declares; then for a preset given data of another shape."""
    for key, value in config.items():
        if key in GROUPS:
            _check_group(GROUPS[key], value)
        elif key in TOP_KEYS:
            _check(key, TOP_KEYS[key], value)
        else:
            raise ConfigError(f"{key} is not a config group or key of xbench: remove +{key}=... "
                              "(a new key is declared in xformer_bench/schema/)")
    check_option_settings(config.get("option_settings") or {})
    check_memory_evaluation(config)
    check_inputs(config)


MEMORY_EVALUATION = {"tgt_len": None, "lanes": None, "warm": False}
"""``eval`` keys that only a stack with memory reads, at the value that changes nothing."""


def check_memory_evaluation(config: Mapping[str, Any]) -> None:
    """:class:`ConfigError` for an ``eval`` key of a stack with memory (one whose option declares
    ``mem_len``) set on a stack without: it would be ignored, yet name another run."""
    stack = (config.get("stack") or {}).get("name")
    if stack is None or "mem_len" in (GROUPS["stack"].keys_of(stack) or {"mem_len": None}):
        return
    evaluation = config.get("eval") or {}
    for key, inert in MEMORY_EVALUATION.items():
        if evaluation.get(key, inert) != inert:
            remembering = ", ".join(o for o, keys in GROUPS["stack"].options.items()
                                    if "mem_len" in keys)
            raise ConfigError(f"eval.{key}={shown(evaluation[key])} is for a stack with memory "
                              f"(stack={remembering}); stack={stack} has none: drop it (or set "
                              f"eval.{key}={shown(inert)}), or choose such a stack")


def check_option_settings(declared: Mapping[str, Any]) -> None:
    """A study's ``option_settings: {GROUP: {OPTION: {KEY: VALUE}}}`` against the declarations:
    each option one of its group's, each key one of that option's, each value one its
    declaration accepts -- whichever option the run chose (a setting for an option no row of
    this sweep runs is still a typo to name)."""
    for group_name, by_option in declared.items():
        group = GROUPS.get(group_name)
        if group is None or not group.named or not isinstance(by_option, Mapping):
            raise ConfigError(f"option_settings.{group_name}: expected {{OPTION: {{KEY: VALUE}}}} "
                              "for a config group of named options")
        for option, settings in by_option.items():
            where = f"option_settings.{group_name}.{option}"
            if option not in group.options:
                nearest = difflib.get_close_matches(str(option), group.options, n=1)
                guess = f" (did you mean {nearest[0]}?)" if nearest else ""
                raise ConfigError(f"{where}: {option} is not an option of {group_name}{guess}")
            keys = group.keys_of(option) or {}
            for key, value in (settings or {}).items():
                if key not in keys or key in ("name", "label"):
                    own = ", ".join(k for k in keys if k not in ("name", "label"))
                    raise ConfigError(f"{where}.{key}: {group_name}={option} has no key {key!r} "
                                      f"(its keys: {own})")
                _check(f"{where}.{key}", keys[key], value)


def _check(path: str, spec: Key, value: Any) -> None:
    if not spec.accepts(value):
        raise ConfigError(spec.refusal(path, value))
    if isinstance(spec, OptionOf) and isinstance(value, dict):
        _check_group(GROUPS[spec.group], value, path)
    if isinstance(spec, Node) and isinstance(value, dict):
        for key in value:
            if key not in spec.keys:
                raise ConfigError(f"{path}.{key} is not a key of {path}; choose one of: "
                                  f"{', '.join(spec.keys)}")
        for key, declared in spec.keys.items():  # in the declaration's order
            if key in value:
                _check(f"{path}.{key}", declared, value[key])


def _check_group(group: Group, node: Any, path: str | None = None) -> None:
    """The node of an option of ``group`` (at ``path``: the group's own node by default)."""
    path = path or group.name
    if not isinstance(node, dict):
        raise ConfigError(f"{path}={shown(node)} must be one of its options (a mapping of "
                          f"its keys): write {group.name}=OPTION")
    if group.named and "name" in node:  # first: the other keys are those of the option named
        _check(f"{path}.name", group.common["name"], node["name"])
    option = node.get("name")
    keys = group.keys_of(option)
    for key, value in node.items():
        spec = (keys if keys is not None else group.common).get(key)
        if spec is None and keys is None:
            continue  # an option without a declaration: its registry refuses an unknown name
        if spec is None:
            where = f"{group.name}={option}" if group.named else group.name
            raise ConfigError(f"{path}.{key} is not a key of {where}; choose one of: "
                              f"{', '.join(sorted(keys))}")
        _check(f"{path}.{key}", spec, value)


def check_inputs(config: Mapping[str, Any]) -> None:
    """:class:`ConfigError` when the model preset is declared for inputs of another shape than
    the data gives (:data:`~.model.INPUTS`, :data:`~.data.GIVES`), naming data that fits."""
    preset = (config.get("model") or {}).get("name")
    wants = INPUTS.get(preset, ANY)
    data = config.get("data") or {}
    gives = given(data)
    if wants == ANY or gives is None or gives in wants:
        return
    raise ConfigError(
        f"model={preset} is for {' or '.join(KINDS[k] for k in wants)}, and data={data['name']} "
        f"gives {KINDS[gives]}: choose {' or '.join(fitting(wants))}, or another model")
