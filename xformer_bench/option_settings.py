"""A study's settings for one option of a swept group: ``option_settings: {attention: {local:
{window: 16}}}`` sets ``attention.window=16`` in the runs of that study that choose
``attention=local`` and leaves the other rows alone -- a sweep over options cannot set a key that
only some of them have.  An option's defaults are its paper's; a study changes them here when
its length needs it (MQAR at T = 64: local's 256-key window and LSH's 64-position chunks would
be full attention, which the study refuses), and the run's config, hence its identity and its
record, carries the value used.  The command line wins: ``attention.window=32`` is kept.
"""

from __future__ import annotations

import copy
from typing import Any

from xformer_bench.errors import ConfigError
from xformer_bench.paper_rows import key_of


def apply_option_settings(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``config`` with the study's ``option_settings`` for the options it chose merged in; a
    setting the option does not have is a :class:`ConfigError` naming the option's keys."""
    declared = config.get("option_settings") or {}
    if not declared:
        return config
    given = {key_of(o) for o in overrides}  # the command line's keys: they win
    settled = copy.deepcopy(config)
    for group, by_option in declared.items():
        chosen = settled.get(group)
        if not isinstance(chosen, dict) or not isinstance(by_option, dict):
            raise ConfigError(f"option_settings.{group}: expected {{OPTION: {{KEY: VALUE}}}} "
                              f"for the config group {group}")
        for key, value in (by_option.get(chosen.get("name")) or {}).items():
            if key not in chosen or key == "name":
                keys = ", ".join(k for k in chosen if k != "name")
                raise ConfigError(f"option_settings.{group}.{chosen['name']}.{key}: "
                                  f"{group}={chosen['name']} has no key {key!r} (its keys: "
                                  f"{keys})")
            if f"{group}.{key}" not in given:
                chosen[key] = value
    return settled
