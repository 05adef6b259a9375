"""A key of a swept group on the command line: ``xbench -m attention=strided,fixed
attention.stride=64`` runs each option with that key set.

Hydra composes a multirun's first config (the one its sweeper and launcher read) without the
sweep's overrides, so ``attention.stride=64`` lands on the group's default option
(``attention=full``, which has no stride) and the sweep stops before its first job: "Could not
override 'attention.stride' ... Key 'stride' is not in struct" -- Hydra's documented behaviour
(facebookresearch/hydra issues 283 and 2888: the sweep-level config is built from the non-sweep
overrides).  :func:`held_for_jobs` hands such a key to Hydra as a one-value sweep
(``attention.stride=choice(64)``): left out of that first config and applied in every job after
its group choice, recorded there as written (``attention.stride=64``).

An option of the sweep without the key is one line naming that option before anything runs
(:func:`check_keys_of_swept_options`, from the preflight), not Hydra's error in mid-sweep.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from xformer_bench.config import config_groups
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DESCRIPTIVE_KEYS


def _swept_groups(overrides: Sequence[Override]) -> set[str]:
    """The config groups ``overrides`` sweep over several options (``attention=a,b``)."""
    groups = config_groups()
    return {o.key_or_group for o in overrides if o.is_sweep_override()
            and o.is_discrete_sweep() and o.key_or_group in groups}


def _key_of_group(override: Override, groups: set[str]) -> bool:
    """Whether ``override`` sets one value (not a sweep, not ``+`` or ``~``) on a key under one
    of ``groups`` (``attention.stride=64`` under ``attention``)."""
    return (override.type is OverrideType.CHANGE and not override.is_sweep_override()
            and "." in override.key_or_group and override.key_or_group.split(".")[0] in groups)


def held_for_jobs(argv: Sequence[str]) -> list[str]:
    """``argv`` with each key of a swept group written as a one-value sweep (itself where it
    sweeps no group, has no ``-m`` or does not parse: the preflight has said why)."""
    from xformer_bench.preflight import MULTIRUN_FLAGS

    if not any(arg in MULTIRUN_FLAGS for arg in argv):
        return list(argv)
    parser = OverridesParser.create()
    try:
        parsed = {arg: parser.parse_override(arg) for arg in argv if arg not in MULTIRUN_FLAGS}
    except HydraException:  # a Hydra flag (--cfg job) or a bad override: left as it is
        return list(argv)
    groups = _swept_groups(list(parsed.values()))
    return [f"{parsed[arg].key_or_group}=choice({parsed[arg].get_value_element_as_str()})"
            if arg in parsed and _key_of_group(parsed[arg], groups) else arg for arg in argv]


def check_keys_of_swept_options(first_job: Sequence[str], overrides: Sequence[Override]) -> None:
    """:class:`ConfigError` naming the first option of a swept group that lacks a key the
    command line sets under that group; ``first_job``: the overrides of the sweep's first job
    (run inside Hydra's ``initialize_config_dir``)."""
    groups = _swept_groups(overrides)
    keys = [o.key_or_group for o in overrides if _key_of_group(o, groups)]
    for sweep in (o for o in overrides if o.is_sweep_override() and o.key_or_group in groups):
        group = sweep.key_or_group
        for option in map(str, sweep.sweep_iterator()):
            job = [f"{group}={option}" if arg.split("=", 1)[0] == group else arg
                   for arg in first_job]
            missing = _missing_key(job, [k for k in keys if k.startswith(group + ".")])
            if missing is not None:
                raise ConfigError(
                    f"{missing} is not a key of {group}={option}, which {sweep.input_line} runs "
                    f"(its keys: {', '.join(_keys_of(job, missing))}): drop {missing}, or "
                    "sweep only the options that have it")


def _missing_key(job: list[str], keys: list[str]) -> str | None:
    """The first of ``keys`` the config of ``job`` does not have (None: it composes, or fails
    for another reason, which the preflight's own checks report)."""
    if not keys:
        return None
    try:
        compose(config_name="config", overrides=job)
    except ConfigCompositionException as error:
        cause = error.__cause__
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            return next((k for k in keys if k == cause.full_key
                         or k.startswith(f"{cause.full_key}.")), None)
    except HydraException:
        return None
    return None


def _keys_of(job: list[str], missing: str) -> list[str]:
    """The keys of the node ``missing`` would sit in, in the config of ``job`` without it."""
    parent = missing.rsplit(".", 1)[0]
    config = compose(config_name="config",
                     overrides=[a for a in job if not f"{a.split('=', 1)[0]}.".startswith(
                         f"{missing}.")])
    node = OmegaConf.select(config, parent)
    return ([str(k) for k in node.keys() if k not in DESCRIPTIVE_KEYS]
            if isinstance(node, DictConfig) else [])
