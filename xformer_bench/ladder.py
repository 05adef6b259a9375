"""Ablation ladders: the chain of configurations from a baseline preset (``model=vanilla``) to a
system preset (``model=transformer_xl``), one part changed at a time, so a table can split the
system's gain into its parts.

The parts are the preset's differences from the baseline, as the table's confound notes find
them (:func:`xformer_bench.results.confounds.differences`, on the two composed configs): a group
choice (``position=xl_relative``) or the changed keys of one config node (``eval.lanes=10,
eval.warm=true``; a node's keys change together: a shape is d_model with n_heads).  They are
taken in one declared order, :data:`PART_ORDER`: position, norm, activation, feed-forward,
stack (memory), attention, any other group, any other node, the evaluation protocol last.

Rung 0 is the baseline; rung k is the baseline plus the first k parts; the last rung is the
preset itself (``model=<preset>``: the same run as the study's row of that preset).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from xformer_bench.config import choice_groups, compose_config, find_config, group_order, options
from xformer_bench.errors import ConfigError

PART_ORDER = ("position", "norm", "activation", "ffn", "stack", "attention")
"""Groups in the order a ladder adds them; other groups follow, then other config nodes
(model sizes, optimiser), then :data:`EVALUATION`."""
EVALUATION = "eval"
DEFAULT_BASELINE = "vanilla"


@dataclass(frozen=True)
class Part:
    """One step of a ladder: a group's new option or one node's changed keys."""
    name: str                    # "position", "eval", "model"
    changes: tuple[str, ...]     # ("position=xl_relative",), ("eval.lanes=10", "eval.warm=true")
    overrides: tuple[str, ...]   # the Hydra overrides that make them
    baseline_option: str | None = None  # a group's option in the baseline ("sinusoidal")


@dataclass(frozen=True)
class Rung:
    index: int
    name: str                    # "model=vanilla", "+position=xl_relative"
    overrides: tuple[str, ...]   # the command line of this rung (before the study's others)
    part: Part | None = None     # what this rung adds to the previous one (None: the baseline)


@dataclass(frozen=True)
class Ladder:
    system: str
    baseline: str
    rungs: tuple[Rung, ...]

    def tag(self, rung: Rung) -> dict[str, Any]:
        """What a run of ``rung`` records as ``ladder``."""
        return {"system": self.system, "rung": rung.index, "name": rung.name}


def _check_preset(preset: str) -> None:
    if find_config("model", preset) is None:
        presets = options("model")
        near = difflib.get_close_matches(preset, presets, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else f"presets: {', '.join(presets)}"
        raise ConfigError(f"no ladder for model={preset}: not a preset of conf/model/ ({hint})")


def comparable(choices: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A configuration in the shape :func:`differences` reads, the model group's choice left
    out: the model node's keys are then compared like any other node's."""
    return {"choices": {g: c for g, c in choices.items() if g != "model"}, "config": config}


def composed(*overrides: str) -> dict[str, Any]:
    """:func:`comparable` of the config ``overrides`` compose to."""
    config = compose_config(*overrides)
    return comparable({g: config[g]["name"] for g in choice_groups()
                       if "name" in (config.get(g) or {})}, config)


def study_overrides(study: str | None) -> tuple[str, ...]:
    """``experiment=<study>`` when ``study`` is a study of conf/experiment/, else nothing."""
    return (f"experiment={study}",) if study and find_config("experiment", study) else ()


def _part_rank(name: str) -> tuple:
    if name == EVALUATION:
        return (3, name)
    if name in PART_ORDER:
        return (0, PART_ORDER.index(name), name)
    return (1, *group_order(name)) if name in choice_groups() else (2, name)


def parts(system: str, baseline: str = DEFAULT_BASELINE, study: str | None = None
          ) -> list[Part]:
    """What ``model=<system>`` changes from ``model=<baseline>`` (under ``experiment=<study>``),
    one part per group or config node, in :data:`PART_ORDER`."""
    from xformer_bench.results.confounds import differences

    base = composed(*study_overrides(study), f"model={baseline}")
    top = composed(*study_overrides(study), f"model={system}")
    by_root: dict[str, list[str]] = {}
    for difference in differences(top, base, named=()):
        by_root.setdefault(difference.name.split(".")[0], []).append(difference.text)
    groups = choice_groups()
    return [Part(root, tuple(changes),
                 tuple(change if root in groups else f"++{change}" for change in changes),
                 base["choices"].get(root))
            for root, changes in sorted(by_root.items(), key=lambda item: _part_rank(item[0]))]


def ladder(system: str, baseline: str = DEFAULT_BASELINE, study: str | None = None) -> Ladder:
    """The rungs from ``model=<baseline>`` to ``model=<system>``; :class:`ConfigError` (one
    line) for a name that is not a model preset."""
    for preset in (baseline, system):
        _check_preset(preset)
    steps = parts(system, baseline, study) if system != baseline else []
    rungs = [Rung(0, f"model={baseline}", (f"model={baseline}",))]
    for k, part in enumerate(steps, start=1):
        added = tuple(o for p in steps[:k] for o in p.overrides)
        last = k == len(steps)
        rungs.append(Rung(k, "+" + ", ".join(part.changes),
                          (f"model={system}",) if last else (f"model={baseline}", *added), part))
    return Ladder(system, baseline, tuple(rungs))
