"""Whether ``conf/`` and the declarations agree: every key a YAML writes has a declaration, and
every declaration is written by some YAML (the tests read these two lists; both must be empty).

A YAML's keys are read as Hydra places them: ``conf/<group>/<option>.yaml`` under its group
node, a ``# @package _global_`` file (model presets, bundles, studies, study rows) at the top.
``hydra`` nodes and ``conf/hydra/`` are Hydra's own settings, which Hydra checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from xformer_bench.config import CONF_DIR
from xformer_bench.schema.keys import Key, Mapping, Node, OptionOf
from xformer_bench.schema.study import PLANNED
from xformer_bench.schema.validate import GROUPS, TOP_KEYS

HYDRA = "hydra"
OPTION_OF_FILE = {"model": "model", "study_rows": "attention"}
"""Global files whose name is an option of a group: a preset is ``model=<stem>``, a study row
applies to ``attention=<stem>``."""


@dataclass(frozen=True)
class Written:
    """One key a YAML writes: its file, its dotted path, its value, and the group options it
    is written for (``{"attention": "fixed"}`` in ``conf/study_rows/lra/fixed.yaml``)."""

    file: Path
    path: tuple[str, ...]
    value: Any
    options: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return ".".join(self.path)


def _flat(node: dict, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, (*prefix, str(key)))
        else:
            yield (*prefix, str(key)), value


@cache
def written_keys(conf: Path = CONF_DIR) -> tuple[Written, ...]:
    """Every key of every YAML of ``conf`` (Hydra's own excepted), read once."""
    found = []
    for file in sorted(conf.rglob("*.yaml")):
        folder = file.relative_to(conf).parts[0] if file.parent != conf else ""
        if folder == HYDRA:
            continue
        text = file.read_text()
        node = OmegaConf.to_container(OmegaConf.load(file), resolve=False) or {}
        node.pop("defaults", None)
        if "@package _global_" in text or not folder:
            group = OPTION_OF_FILE.get(folder)
            options = ((group, file.stem),) if group else ()
        else:
            node, options = {folder: node}, ((folder, file.stem),)
        found += [Written(file, path, value, options) for path, value in _flat(node)
                  if path[0] != HYDRA]
    return tuple(found)


def declarations(path: tuple[str, ...], options: tuple[tuple[str, str], ...] = ()) -> list[Key]:
    """The declarations of the key at ``path`` (the option's own where ``options`` names the
    option, else any option's of its group); [] when none declares it.  A key inside a
    :class:`~.keys.Mapping` (``sweep.seed``) is declared by the mapping."""
    head, rest = path[0], path[1:]
    if head in GROUPS and rest:
        group, chosen = GROUPS[head], dict(options).get(head)
        keys = group.keys_of(chosen) if chosen else None
        found = [keys[rest[0]]] if keys and rest[0] in keys else group.declaring(rest[0])
        reached = [_reach(spec, rest[1:]) for spec in found]
    else:
        reached = [_reach(TOP_KEYS[head], rest)] if head in TOP_KEYS else []
    return [spec for spec in reached if spec is not None]


def _reach(spec: Key, rest: tuple[str, ...]) -> Key | None:
    if not rest or isinstance(spec, Mapping):
        return spec
    if isinstance(spec, Node) and rest[0] in spec.keys:
        return _reach(spec.keys[rest[0]], rest[1:])
    if isinstance(spec, OptionOf):  # an option node of another group: any option's key
        return next(iter(declarations((spec.group, *rest))), None)
    return None


def undeclared(conf: Path = CONF_DIR) -> list[str]:
    """``file: key`` of each key a YAML writes that nothing declares."""
    return [f"{w.file.relative_to(conf)}: {w.key}" for w in written_keys(conf)
            if not declarations(w.path, w.options)]


def declared_paths() -> Iterator[tuple[tuple[str, ...], str | None]]:
    """Every declared key, as ``(path, option)``: a group's common keys with option None."""
    for group in GROUPS.values():
        for key in group.common:
            yield (group.name, key), None
        for option, keys in group.options.items():
            for key in keys:
                if key not in group.common:
                    yield (group.name, key), option
    for key, spec in TOP_KEYS.items():
        if key in PLANNED:
            continue  # written by xbench on the runs it plans, never in a YAML
        yield (key,), None
        if isinstance(spec, Node):
            yield from (((key, sub), None) for sub in spec.keys)


def unwritten(conf: Path = CONF_DIR) -> list[str]:
    """Each declaration that no YAML writes (a key removed from its YAML, or a typo)."""
    keys = written_keys(conf)
    by_option = {(w.path[:2], dict(w.options).get(w.path[0])) for w in keys}
    anywhere = {w.path[:2] for w in keys} | {w.path[:1] for w in keys}
    return [".".join(path) + (f" (of {path[0]}={option})" if option else "")
            for path, option in declared_paths()
            if ((path, option) not in by_option if option else path not in anywhere)]


def refused_values(conf: Path = CONF_DIR) -> list[str]:
    """``file: key=value`` of each value a YAML writes that its declaration refuses (an
    interpolation is judged once resolved, by the preflight; an entry of a free mapping by the
    mapping's consumer)."""
    return [f"{w.file.relative_to(conf)}: {w.key}={w.value}" for w in written_keys(conf)
            if not (isinstance(w.value, str) and "${" in w.value)
            for spec in declarations(w.path, w.options)
            if not isinstance(spec, Mapping) and not spec.accepts(w.value)]
