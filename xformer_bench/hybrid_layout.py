"""Hybrid layouts: another token mixer -- softmax or sliding-window attention -- at declared
depths among the layers of the ``attention`` option (Samba, Ren et al. 2024: Mamba and
sliding-window attention alternating; Griffin, De et al. 2024: two recurrent blocks, then one
local-attention block; Jamba, Lieber et al. 2024: one attention layer in eight).

``model.hybrid`` (absent or null: every layer has the ``attention`` option)::

    model:
      hybrid:
        attention: full          # an attention option's name (its conf/attention YAML), or its
                                 # node ({name: local, window: 128, ...}; a preset composes it
                                 # with `- /attention@model.hybrid.attention: local`)
        every: 4                 # layers i with i % every == offset (0-based) ...
        offset: 3                # ... default every - 1: "every 4th layer" is 3, 7, 11, ...
        layers: null             # or the layers themselves, [3, 7] (0-based), instead of every

On the command line: ``xbench attention=gla +model.hybrid={attention:local,every:3}``
(Griffin's layout, at least 3 layers), ``+model.hybrid={attention:full,every:8,offset:4}``
(Jamba's, at least 5).  Presets: ``model=samba``, ``model=mambaformer`` (conf/model/).

This module reads and checks the key and says it in words; the model builder
(:mod:`xformer_bench.models.hybrid`) gives those layers the other mixer, and the tables
(:func:`xformer_bench.results.variants.label_of`) name it, e.g. "Linear attention + full
attention every 2nd layer".  No torch here: the results read it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xformer_bench.errors import ConfigError

KEYS = ("attention", "every", "offset", "layers")
"""The keys of ``model.hybrid``."""


@dataclass(frozen=True)
class HybridLayout:
    attention: dict[str, Any]   # the other mixer's option node: name, label, its keys
    layers: tuple[int, ...]     # the depths (0-based, ascending) that get it
    every: int | None = None    # how they were declared: every / offset, or the list
    offset: int | None = None


def attention_option(value: Any) -> dict[str, Any]:
    """The option node of ``model.hybrid.attention``: given, or read from the option's YAML
    (``conf/attention/<name>.yaml``) when named; one ConfigError line for an unknown option."""
    from xformer_bench.config import find_config
    from xformer_bench.config import options as group_options

    options = group_options("attention")
    name = value.get("name") if isinstance(value, Mapping) else value
    if not isinstance(name, str) or name not in options:
        raise ConfigError(f"model.hybrid.attention={name!r} is not an attention option; "
                          f"choose one of: {', '.join(options)}")
    if isinstance(value, Mapping):
        return dict(value)
    import yaml

    return yaml.safe_load(find_config("attention", value).read_text())


def _int(key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"model.hybrid.{key}={value!r} must be an integer >= {low}")
    return value


def hybrid_layout(spec: Any, n_layers: int) -> HybridLayout | None:
    """The layout ``model.hybrid`` declares for a stack of ``n_layers``, or None (no hybrid).
    One ConfigError line for an unknown key, an unknown option, a layer out of range, or a
    layout that gives the other mixer no layer or every layer."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise ConfigError(f"model.hybrid={spec!r} must be a mapping of {', '.join(KEYS)} "
                          "(or null: no hybrid)")
    for key in spec:
        if key not in KEYS:
            raise ConfigError(f"model.hybrid.{key} is not a key of model.hybrid; choose one "
                              f"of: {', '.join(KEYS)}")
    if "attention" not in spec:
        raise ConfigError("model.hybrid names no attention: set model.hybrid.attention=OPTION")
    attention = attention_option(spec["attention"])
    every, offset, layers = spec.get("every"), spec.get("offset"), spec.get("layers")
    if (every is None) == (layers is None):
        raise ConfigError("model.hybrid needs exactly one of every (with offset) and layers")
    if layers is not None:
        if offset is not None:
            raise ConfigError("model.hybrid.offset goes with every, not with layers: drop it")
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            raise ConfigError(f"model.hybrid.layers={layers!r} must be a list of layer indices")
        chosen = sorted({_int("layers", i, 0) for i in layers})
        outside = [i for i in chosen if i >= n_layers]
        if outside:
            raise ConfigError(f"model.hybrid.layers={list(layers)}: layer {outside[0]} is out "
                              f"of range for model.n_layers={n_layers} (0 .. {n_layers - 1})")
    else:
        every = _int("every", every, 1)
        offset = every - 1 if offset is None else _int("offset", offset, 0)
        if offset >= every:
            raise ConfigError(f"model.hybrid.offset={offset} must be below model.hybrid.every"
                              f"={every}")
        chosen = [i for i in range(n_layers) if i % every == offset]
    name = attention["name"]
    if not chosen:
        raise ConfigError(f"model.hybrid places attention={name} at no layer of "
                          f"model.n_layers={n_layers}: lower model.hybrid.every or "
                          "model.hybrid.offset, or add layers")
    if len(chosen) == n_layers:
        raise ConfigError(f"model.hybrid gives every layer attention={name}: choose "
                          f"attention={name} and drop model.hybrid")
    return HybridLayout(attention, tuple(chosen), every if layers is None else None,
                        offset if layers is None else None)


def _ordinal(n: int) -> str:
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _lowered(label: str) -> str:
    """"Full attention" -> "full attention"; an acronym ("LSH attention") stays."""
    return label[:1].lower() + label[1:] if label[1:2].islower() else label


def describe(layout: HybridLayout) -> str:
    """The layout in words: "full attention every 4th layer", "local attention at layers 3, 7"
    (0-based, as the config counts)."""
    what = _lowered(str(layout.attention.get("label") or layout.attention["name"]))
    if layout.every is None:
        return f"{what} at layer{'s' * (len(layout.layers) > 1)} " \
               f"{', '.join(map(str, layout.layers))}"
    start = "" if layout.offset == layout.every - 1 else f" from layer {layout.offset}"
    return f"{what} every {_ordinal(layout.every)} layer{start}"


def hybrid_label(config: Mapping[str, Any]) -> str | None:
    """A run's token mixers in words, "Mamba-2 + full attention every 4th layer", when its
    ``model.hybrid`` declares a layout; else None.  A config whose layout no longer builds
    says so rather than failing (tables read old records)."""
    model = config.get("model") or {}
    if model.get("hybrid") is None:
        return None
    attention = config.get("attention") or {}
    base = str(attention.get("label") or attention.get("name") or "attention")
    try:
        layout = hybrid_layout(model["hybrid"], int(model.get("n_layers", 0)))
    except ConfigError:
        return f"{base} + an invalid model.hybrid"
    return f"{base} + {describe(layout)}"
