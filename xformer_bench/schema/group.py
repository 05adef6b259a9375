"""A config group's declaration: the keys every option of it has, and each option's own."""

from __future__ import annotations

from dataclasses import dataclass, field

from xformer_bench.schema.keys import Key, Text

NAMED = {
    "name": Text("the option's registered name: conf/<group>/<name>.yaml"),
    "label": Text("the option's row name in tables"),
}
"""The keys of every option of a group of named parts."""


@dataclass(frozen=True)
class Group:
    """``common``: the keys of every option (or, for a group whose node has no ``name`` --
    ``trainer`` -- of the group); ``options``: each option's own keys, by its ``name``;
    ``computes``: whether its choice can change what a run computes."""

    name: str
    common: dict[str, Key]
    options: dict[str, dict[str, Key]] = field(default_factory=dict)
    computes: bool = True  # False: no key of it changes what a run computes (``logger``)

    @property
    def named(self) -> bool:
        """Whether its node names its option (``attention.name``); ``trainer``'s does not."""
        return "name" in self.common

    def keys_of(self, option: str | None) -> dict[str, Key] | None:
        """Every key of ``option`` (of the group, for an unnamed group); None for an option
        with no declaration (the registry names it, or it is new: its keys are not known)."""
        if not self.named:
            return self.common
        if option not in self.options:
            return None
        return {**self.common, **self.options[option]}

    def declaring(self, key: str) -> list[Key]:
        """The declarations of ``key`` across the options (a global YAML sets ``head.tie``
        whichever head is chosen)."""
        if key in self.common:
            return [self.common[key]]
        return [keys[key] for keys in self.options.values() if key in keys]
