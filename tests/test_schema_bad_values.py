"""Values just outside each key's declared range are refused, generated from the schema (issue
26): for every key of every group and option, and every key outside groups, each value the
declaration names as just outside (0 or -1 below a minimum, a float for an integer, a string for
a number, an unknown choice, null where null is not allowed) is one ``error:`` line naming the
key and its range, and each value on the edge of the range is accepted.

The values are put into an already-composed config (a composition costs 0.1 s, a check
microseconds); a handful of command lines prove the wiring: exit status 2, one line, no
traceback, no record."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from omegaconf import OmegaConf

from conftest import compose_config, xbench
from xformer_bench.config import CONF_DIR
from xformer_bench.errors import ConfigError
from xformer_bench.preflight import command_line_error
from xformer_bench.schema import GROUPS, TOP_KEYS, check_config, coverage
from xformer_bench.schema.keys import Key, Node, shown
from xformer_bench.schema.study import PLANNED

GLOBAL_PACKAGES = ("model", "modification")
"""Groups whose YAMLs are ``# @package _global_``: the option's node is under its group."""


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return compose_config("stack=recurrent")  # a stack with memory: every eval.* key is read


def option_node(group: str, option: str, base: dict[str, Any]) -> dict[str, Any]:
    """The node ``group=option`` composes to, from its YAML (its own interpolations resolved);
    a preset or a trainer option on top of the default's keys, which it inherits."""
    loaded = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
    raw = loaded.get(group, {}) if group in GLOBAL_PACKAGES else loaded
    node = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_container(raw)), resolve=True)
    node.pop("defaults", None)
    inherits = group == "model" or not GROUPS[group].named
    return {**base[group], **node} if inherits else node


def cases(base: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], tuple[str, ...], Key]]:
    """``(where, config, path, declaration)``: every declared key, in a config that holds it
    (an option's own keys in a config of that option; a group's common keys in the config of
    its default option)."""
    for key, spec in TOP_KEYS.items():
        yield key, base, (key,), spec
        for sub, declared in (spec.keys.items() if isinstance(spec, Node) else ()):
            yield key, base, (key, sub), declared
    for name, group in GROUPS.items():
        chosen = (base.get(name) or {}).get("name", next(iter(group.options), None))
        for option in group.options or [None]:
            if option is not None and not group.options[option] and option != chosen:
                continue  # no keys of its own: the group's are tried on the chosen option
            node = option_node(name, option, base) if option else base[name]
            config = {**base, name: node}
            for key, spec in group.keys_of(node.get("name")).items():
                yield f"{name}={option}", config, (name, key), spec
                for sub, declared in (spec.keys.items() if isinstance(spec, Node) else ()):
                    yield f"{name}={option}", config, (name, key, sub), declared


def with_value(config: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    if len(path) == 1:
        return {**config, path[0]: value}
    return {**config, path[0]: with_value(config.get(path[0]) or {}, path[1:], value)}


def test_every_option_as_shipped_passes(base):
    for where, config, path, spec in cases(base):
        check_config(config)  # raises, naming the key, if a YAML's default is out of range


def test_every_value_just_outside_a_range_is_one_line_naming_key_and_range(base):
    failures, tried, keys = [], 0, set()
    for where, config, path, spec in cases(base):
        key = ".".join(path)
        keys |= {(key, None), (key, where.partition("=")[2])}
        for value in spec.outside():
            tried += 1
            try:
                check_config(with_value(config, path, value))
            except ConfigError as error:
                line = str(error)
                if "\n" in line or not line.startswith(f"{key}={shown(value)} ") \
                        or spec.allowed() not in line:
                    failures.append(f"{where}: {key}={shown(value)}: {line}")
            else:
                failures.append(f"{where}: {key}={shown(value)} accepted")
        for value in spec.inside():
            try:
                check_config(with_value(config, path, value))
            except ConfigError as error:
                failures.append(f"{where}: {key}={shown(value)} (in range) refused: {error}")
    assert not failures, "\n".join(failures[:20])
    declared = {(".".join(path), option) for path, option in coverage.declared_paths()}
    assert declared - keys == set() and tried > 1000  # every key of conf/, and xbench's own
    assert {(key, None) for key in PLANNED} <= keys


@pytest.mark.parametrize("override", [
    "trainer.accumulate_grad_batches=0", "trainer.log_every_n_steps=0",
    "trainer.checkpoint_every=0", "trainer.val_checks=-1", "trainer.gradient_clip_val=-1",
    "optim.label_smoothing=1.5", "optim.betas=[0.9,1.5]", "model.dropout=1",
    "position=learned position.max_len=0", "data=imagenet data.flip=2",
    "optim.lr=inf",  # once accepted: it trained, and its NaN loss was a "diverged" record
])
def test_a_numeric_key_out_of_range_on_the_command_line_is_one_line(override):
    *choices, setting = override.split()
    error = command_line_error([*choices, setting])
    key, _, value = setting.partition("=")
    assert error is not None and str(error).startswith(f"{key}={value.replace(',', ', ')} ")
    assert "\n" not in str(error) and " must be " in str(error)


def test_end_to_end_exit_2_one_line_no_traceback_no_record(tmp_path):
    result = xbench("trainer.accumulate_grad_batches=0", f"paths.results_dir={tmp_path}/results",
                    cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr
    assert errors[0].startswith("error: trainer.accumulate_grad_batches=0 must be a positive "
                                "integer")
    assert not (tmp_path / "results").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("name", ["../escape", "a/b", ".."])
def test_an_experiment_name_that_is_not_one_folder_is_refused(name):
    """``experiment_name=../escape`` once wrote its record outside ``paths.results_dir``."""
    error = command_line_error([f"experiment_name={name}"])
    assert error is not None and str(error).startswith(f"experiment_name={name} must be a "
                                                       "folder name")
    assert command_line_error(["experiment_name=my_compare"]) is None
