"""Name -> builder registries, one per configurable component family.

A variant is one module in its family's package that decorates its builder with
``@REGISTRY.register("name")``; the YAML under ``conf/<group>/name.yaml`` carries
``name: <name>`` plus the builder's keyword arguments.  Importing a family package
imports every module in it, so adding a variant never touches shared code.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from xformer_bench.errors import ConfigError, XbenchError


class UnknownVariantError(XbenchError, ValueError):
    """Raised for a name that no module registered: one ``error:`` line, before training."""


class Registry:
    def __init__(self, group: str, package: str):
        self.group = group
        self.package = package
        self._builders: dict[str, Callable[..., Any]] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorate(builder: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._builders and self._builders[name] is not builder:
                raise ValueError(f"{self.group} '{name}' is registered twice")
            self._builders[name] = builder
            return builder

        return decorate

    def _load(self) -> None:
        if self._loaded:
            return
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{self.package}.{module.name}")
        self._loaded = True

    def names(self) -> list[str]:
        self._load()
        return sorted(self._builders)

    def get(self, name: str) -> Callable[..., Any]:
        self._load()
        if name not in self._builders:
            raise UnknownVariantError(
                f"unknown {self.group} '{name}'; choose one of: {', '.join(self.names())}"
            )
        return self._builders[name]

    def build(self, spec: Mapping[str, Any], **context: Any) -> Any:
        """Build from a config node ``{name, label, family, **kwargs}`` plus call-site context
        (``label`` is the human name used in tables, ``family`` the attention family)."""
        kwargs = {k: v for k, v in dict(spec).items()
                  if k not in DESCRIPTIVE_KEYS and k not in RUN_KEYS.get(self.group, ())}
        builder = self.get(spec["name"])
        parameters = inspect.signature(builder).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            for key in kwargs.keys() - parameters.keys():  # e.g. left by a modification bundle
                raise ConfigError(f"{self.group}={spec['name']} takes no key {key}; choose "
                                  f"another {self.group} or drop {self.group}.{key}")
        return builder(**kwargs, **context)


DESCRIPTIVE_KEYS = ("name", "label", "family")
"""Keys of an option's YAML that describe it and are not its builder's arguments."""

RUN_KEYS = {"data": ("val_subsample",)}
"""Keys of a group's YAML that the run reads (its validation schedule), not the builder."""

ATTENTION = Registry("attention", "xformer_bench.attention")
NORM = Registry("norm", "xformer_bench.norm")
ACTIVATION = Registry("activation", "xformer_bench.activation")
POSITION = Registry("position", "xformer_bench.position")
FFN = Registry("ffn", "xformer_bench.ffn")
STACK = Registry("stack", "xformer_bench.stacks")
DATA = Registry("data", "xformer_bench.data")
EMBEDDING = Registry("embedding", "xformer_bench.embedding")
HEAD = Registry("head", "xformer_bench.heads")

REGISTRIES = {r.group: r for r in (ATTENTION, NORM, ACTIVATION, POSITION, FFN, STACK, DATA,
                                   EMBEDDING, HEAD)}
