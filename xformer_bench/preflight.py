"""The command line, checked before Hydra runs it: a bad override is one line naming its fix.

Hydra reports a bad override in several lines (an unknown option with every option on a line of
its own, a missing key with a hint about ``+``, a syntax error with a link) and exits 1.  Here
the overrides are parsed and composed once with Hydra's compose API, as ``xbench`` will compose
them (a tenth of a second; no torch), and the first problem becomes one :class:`ConfigError`:

* an override that does not parse (``model.d_model``, ``model.d_model=[1,``): how to write one;
* an unknown option of a group (``attention=flashy``, ``experiment=narang_foo``): the options,
  the nearest first;
* an unknown key or group (``model.d_modle=64``, ``atention=full``): the nearest key of the same
  node (:mod:`difflib`), or that node's keys;
* several values without ``-m`` (``seed=0,1``): add ``-m``, or write a list;
* a key under a swept group that one of its options lacks (``-m attention=strided,fixed
  attention.summary=8``): the option (:mod:`xformer_bench.swept_group_keys`);
* a value that does not resolve (``data.seq_len=${nope}``);
* a machine that cannot give what ``trainer.*`` asks for (:mod:`xformer_bench.hardware`);
* a value its key's declaration refuses, a key nothing declares, a model preset given data of
  another shape (:mod:`xformer_bench.schema`);
* a folder the run would write that cannot be written (results, resume points, the run
  directory: ``hydra.run.dir``, or ``hydra.sweep.dir`` with ``-m``);
* a user config folder (``--config-dir``, ``XBENCH_CONF``) that is not there, or that holds a
  file at a path of conf/'s (:func:`xformer_bench.config.check_user_conf`).

With ``-m`` each swept key is composed at its first value; every value of a swept group is then
checked against the group's options, every value of a swept key against its declaration, and
every value of a swept ``trainer.*`` key against the machine (a later job's preset and folders:
:func:`xformer_bench.job.run_job`).  Hydra's own flags (``--help``, ``--cfg``, ``--info``,
``-cn`` ...) and sweeps a sweeper plugin enumerates (``interval(...)``) are left to Hydra.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import (ConfigCompositionException, HydraException, MissingConfigException,
                          OverrideParseException)
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from xformer_bench.config import check_user_conf, initialize_conf, take_config_dirs, user_conf
from xformer_bench.errors import ConfigError
from xformer_bench.hardware import check_trainer_hardware
from xformer_bench.schema import check_config, check_folders
from xformer_bench.swept_group_keys import check_keys_of_swept_options

MULTIRUN_FLAGS = ("-m", "--multirun")
SIMILARITY = 0.75
"""How close (:func:`difflib.get_close_matches`) a name must be to be offered as the fix."""
OVERRIDE_SYNTAX = ("write KEY=VALUE (a list as KEY=[a,b]; quote a value with spaces or special "
                   "characters: KEY='a value')")


def command_line_error(argv: Sequence[str]) -> ConfigError | None:
    """The first problem of ``argv`` (xbench's arguments, without the program) as one
    :class:`ConfigError` whose message names the fix; None when it composes, or when a Hydra
    flag other than ``-m`` and the ones that only show the config (:func:`shown_only`) leaves
    the command line to Hydra."""
    try:
        folders, argv = take_config_dirs(shown_only(argv))  # --config-dir: checked as XBENCH_CONF
        with user_conf(folders):
            check_user_conf()
            if any(arg.startswith("-") and arg not in MULTIRUN_FLAGS for arg in argv):
                return None
            multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
            with initialize_conf():
                _check([arg for arg in argv if arg not in MULTIRUN_FLAGS], multirun)
    except ConfigError as error:
        return error
    return None


SHOWING_FLAGS = {"--cfg": 1, "-c": 1, "--package": 1, "-p": 1, "--resolve": 0, "--dry-run": 0}
"""Flags that show what a command line would run and change nothing it composes (with the
number of values each takes): the command line behind them is checked as if run."""


def shown_only(argv: Sequence[str]) -> list[str]:
    """``argv`` less :data:`SHOWING_FLAGS` and their values."""
    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
        elif arg.split("=", 1)[0] in SHOWING_FLAGS:
            skip = 0 if "=" in arg else SHOWING_FLAGS[arg]
        else:
            kept.append(arg)
    return kept


def _check(arguments: list[str], multirun: bool) -> None:
    """Parse, compose (each sweep at its first value), resolve, then check the machine and
    every swept value that can be checked without composing again."""
    loader = GlobalHydra.instance().config_loader()
    try:
        overrides = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
    except OverrideParseException as error:
        raise ConfigError(f"cannot parse override '{error.override}' ({_parse_reason(error)}): "
                          f"{OVERRIDE_SYNTAX}") from error
    sweeps = [o for o in overrides if o.is_sweep_override()]
    if any(not o.is_discrete_sweep() for o in sweeps):
        return  # interval(...): a sweeper plugin's to enumerate
    if sweeps and not multirun:
        sweep = sweeps[0]
        raise ConfigError(f"{sweep.input_line} gives several values: add -m (--multirun) to run "
                          f"one job per value, or write {sweep.get_key_element()}=[...] for one "
                          "list value")
    groups = set(loader.list_groups("")) - {"hydra"}
    first_job = [_first_value(o) for o in overrides if not _is_hydra_sweep(o)]
    check_keys_of_swept_options(first_job, overrides)  # attention=a,b attention.x=1: both have x
    config, run_dir, study = _compose(first_job, overrides, groups, multirun)
    check_trainer_hardware(config.get("trainer") or {})
    check_config(config)
    check_folders(config, run_dir)
    for sweep in sweeps:
        _check_every_value(sweep, config, groups)
    if multirun:
        _check_study_sweep(study, {o.key_or_group for o in overrides}, config, groups, loader)


def _check_study_sweep(study: dict[str, Any], given: set[str], config: dict[str, Any],
                       groups: set[str], loader: Any) -> None:
    """Every value of a study's ``sweep:`` (``hydra.sweeper.params``) the command line does not
    replace, checked as the command line's are: before the first job trains."""
    for key, value in study.items():
        if key in given:
            continue
        line = f"{key}={','.join(map(str, value)) if isinstance(value, list) else value}"
        try:
            [sweep] = OverridesParser.create(config_loader=loader).parse_overrides([line])
            _check_every_value(sweep, config, groups)
        except OverrideParseException as error:
            raise ConfigError(f"the study's sweep {line} does not parse ({_parse_reason(error)})"
                              f": {OVERRIDE_SYNTAX}") from error
        except ConfigError as error:
            raise ConfigError(f"{error} (a value of the study's sweep {line})") from error


def _is_hydra_sweep(override: Override) -> bool:
    return override.is_hydra_override() and override.is_sweep_override()


def _first_value(override: Override) -> str:
    """The override as one job of a sweep at its first value (itself when it sweeps nothing)."""
    if not override.is_sweep_override():
        return override.input_line
    values = list(override.sweep_string_iterator())
    if not values:
        raise ConfigError(f"{override.input_line} sweeps no value: list at least one")
    return f"{override.get_key_element()}={values[0]}"


def _check_every_value(sweep: Override, config: dict[str, Any], groups: set[str]) -> None:
    """Each value of a swept group must be one of its options; each value of a swept key one
    its declaration accepts (the first job's config with that value in place), and of a swept
    ``trainer.*`` key one the machine can run."""
    key = sweep.key_or_group
    values = list(sweep.sweep_iterator()) if sweep.is_sweep_override() else [sweep.value()]
    if key in groups:  # a study's sweep may give one value (seed: 0): checked as one
        options = GlobalHydra.instance().config_loader().get_group_options(key)
        for option in map(str, values):
            if option not in options:
                raise _not_an_option(key, option, options)
        return
    for value in values:
        if key.startswith("trainer."):
            check_trainer_hardware({**(config.get("trainer") or {}), key.split(".", 1)[1]: value})
        swept = _with_value(config, key, value)
        if swept is not None:
            check_config(swept)


def _with_value(config: dict[str, Any], key: str, value: Any) -> dict[str, Any] | None:
    """A copy of ``config`` with the dotted ``key`` set to ``value`` (None where a node on its
    path is not a mapping)."""
    *parents, last = key.split(".")
    changed = copy.deepcopy(config)
    node = changed
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return None
    node[last] = value
    return changed


def _compose(arguments: list[str], overrides: list[Override], groups: set[str],
             multirun: bool) -> tuple[dict[str, Any], tuple[str, Path] | None, dict[str, Any]]:
    """The resolved job config of ``arguments``, the key and path of its run directory (None
    where it does not resolve here) and the study's sweep (``hydra.sweeper.params``); a
    composition error as one ConfigError."""
    try:
        config = compose(config_name="config", overrides=arguments, return_hydra_config=True)
    except MissingConfigException as error:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        if not (group and error.options):
            raise ConfigError(_first_line(error)) from error
        raise _not_an_option(group, option, list(error.options)) from error
    except ConfigCompositionException as error:
        cause = error.__cause__
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
            raise _not_a_key(cause.full_key, overrides, groups) from error
        raise ConfigError(_first_line(error)) from error
    except HydraException as error:
        raise ConfigError(_first_line(error)) from error
    run_dir = _run_dir(config, multirun)
    try:
        params = config.hydra.sweeper.get("params")
        study = OmegaConf.to_container(params, resolve=True) if params is not None else {}
        with open_dict(config):
            del config["hydra"]
        return OmegaConf.to_container(config, resolve=True), run_dir, study
    except OmegaConfBaseException as error:
        raise ConfigError(f"{error.full_key} does not resolve ({_first_line(error)}): point its "
                          "${...} at an existing key, or give a plain value") from error


def _run_dir(config: DictConfig, multirun: bool) -> tuple[str, Path] | None:
    """``("hydra.run.dir", its path)`` (``hydra.sweep.dir`` with ``-m``), as Hydra will make it."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        path = OmegaConf.select(config, key)
    except OmegaConfBaseException:
        return None
    return (key, Path(str(path))) if path else None


def _not_an_option(group: str, option: str, options: list[str]) -> ConfigError:
    nearest = difflib.get_close_matches(option, options, n=1, cutoff=SIMILARITY)
    guess = f" (did you mean {group}={nearest[0]}?)" if nearest else ""
    return ConfigError(f"{group}={option} is not an option of {group}{guess}; choose one of: "
                       f"{', '.join(options)}")


def _not_a_key(missing: str, overrides: list[Override], groups: set[str]) -> ConfigError:
    """``missing`` (a dotted path: its last part is the first that does not exist) with the
    nearest key of the same node, or that node's keys."""
    override = next((o for o in overrides if o.key_or_group == missing
                     or o.key_or_group.startswith(missing + ".")), None)
    parent, _, name = missing.rpartition(".")
    siblings = _keys_under(parent, overrides, groups)
    chosen = next((o.input_line for o in overrides if o.key_or_group == parent), None)
    where = (f"a key of {chosen or parent}" if parent else "a config group or key")
    nearest = difflib.get_close_matches(name, siblings, n=1, cutoff=SIMILARITY)
    if not nearest:
        listing = f"; choose one of: {', '.join(sorted(siblings))}" if siblings else ""
        return ConfigError(f"{missing} is not {where}{listing}")
    fixed = f"{parent}.{nearest[0]}" if parent else nearest[0]
    if override is not None:
        fixed += override.key_or_group[len(missing):]
        value = override.input_line.partition("=")[2]
        fixed += f"={value}" if value else ""
    return ConfigError(f"{missing} is not {where}: did you mean {fixed}?")


def _keys_under(parent: str, overrides: list[Override], groups: set[str]) -> list[str]:
    """The keys of node ``parent`` ("" for the top, groups included) in the config of the
    command line's group choices (so ``data.*`` are the chosen dataset's keys)."""
    choices = [o.input_line for o in overrides if o.key_or_group in groups
               and not o.is_sweep_override()]
    config = None
    for arguments in (choices, []):
        try:
            config = compose(config_name="config", overrides=arguments)
            break
        except HydraException:
            continue
    node = OmegaConf.select(config, parent) if parent else config
    keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    return sorted(set(keys) | groups) if not parent else keys


def _parse_reason(error: OverrideParseException) -> str:
    """The parser's own words, without Hydra's heading and link."""
    lines = [line for line in error.message.splitlines()
             if line and not line.startswith(("Error parsing override", "See "))]
    return lines[0] if lines else "not KEY=VALUE"


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
