"""Parameter matching: re-solve ``model.d_ff`` (or, where it cannot close the gap,
``model.d_model``) -- or, asked, the token mixer's own width -- so a variant has the parameter
count of a reference configuration, as comparisons of modifications do (Narang et al. 2021
shrink the GLU variants' hidden width; Shazeer 2019 widens the feed-forward of multi-query
attention to make up for its smaller key/value projections).

A study asks for it with ``match_params: {reference: {attention: full}, tolerance: 0.02}``
(or ``{model: vanilla}`` for system presets).  Before the run (and before ``skip_completed``
looks for it, since d_ff is part of what it trains), :func:`match_params` composes the
reference -- the run's own command line with the named groups' choices replaced, and their
option keys (``attention.window=...``) dropped; model sizes (``model.d_model=...``) stay --
builds it and the variant at two widths, solves the affine count ``P(d_ff) = a + b d_ff`` for
the reference's count, and rounds.  A variant already within the tolerance keeps its
d_ff (and so its run id).  Where the feed-forward cannot make up the difference -- no
feed-forward, or the width would have to be below 1 (GTrXL's gates, all-attention's
persistent vectors) -- d_model is re-solved instead (:func:`_solve_d_model`).

``by: mixer`` (default ``d_ff``) keeps d_ff and d_model and re-solves the attention option's
own width instead -- the key its class names as ``param_width`` (RetNet: ``expand_v``), to
whole channels (:func:`_solve_mixer`); an option that names none is refused.  The d_ff route
changes the feed-forward of the options it matches (RetNet and Mamba-2 get about half of
full attention's at d_model 128), which the tables name (:mod:`~xformer_bench.results.confounds`).

Where no width comes within the tolerance the run goes on at its own defaults and says so:
``params NOT matched`` on the terminal, ``status: unmatched`` and the reason in
``config["match_params"]["result"]`` (which the record stores with the config), and the table
names the row's parameter gap.  Only parameters are counted: one that never trains (no
gradient reaches it) counts as any other.

Counting builds models on the meta device (no memory, no initialisation); a part whose
construction reads tensor values (Performer's orthogonal features) is built on the CPU.
The embedding and output layer are the same in reference and variant, so the solved width
does not depend on the vocabulary: a nominal byte vocabulary is used.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch

from xformer_bench.config import compose_config, find_config
from xformer_bench.errors import ConfigError, XbenchError

NOMINAL_VOCAB = 256
BY = ("d_ff", "mixer")
"""What ``match_params.by`` re-solves: model.d_ff (the default), or the mixer's own width."""
MIXER_SEARCH = 32
"""Whole channel counts tried either side of the solved mixer width."""


def match_params(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``config`` (composed from ``overrides``) with ``model.d_ff`` -- or, where the
    feed-forward cannot close the gap, ``model.d_model`` and then ``model.d_ff``; with
    ``by: mixer`` the mixer's own width -- solved for the requested parameter count (a copy;
    the input unchanged), or ``config`` itself when nothing is requested."""
    request = config.get("match_params")
    if not request:
        return config
    reference, tolerance, by = _read_request(request)
    target = count_parameters(compose_config(*reference_overrides(overrides, reference)))
    model = config["model"]
    own = count_parameters(config)
    result: dict[str, Any] = {"reference_params": target, "by": by, "d_ff_default": model["d_ff"],
                              "d_model_default": model["d_model"]}
    matched, got, reason = config, own, None
    within = abs(own - target) <= tolerance * target
    if not within:
        matched, got, reason = (_match_mixer(config, target, own, tolerance, result)
                                if by == "mixer" else _match_d_ff(config, target, own, tolerance))
    if not within and matched is config:
        result.update(status="unmatched", gap=own / target - 1)
        if reason is not None:
            result["reason"] = reason
    else:
        result.update(status="matched", gap=got / target - 1)
    result.update(d_ff=matched["model"]["d_ff"], d_model=matched["model"]["d_model"])
    if "width" in result:
        result["width_value"] = _width(matched, result["width"])
    matched = copy.deepcopy(matched)
    matched["match_params"] = {**request, "result": result}
    return matched


def _match_d_ff(config: dict[str, Any], target: int, own: int, tolerance: float
                ) -> tuple[dict[str, Any], int, str | None]:
    """(the config, its count, why not): d_ff re-solved, else d_model (``config`` itself
    with the reason when neither comes within the tolerance)."""
    d_ff, got, reason = _solve_d_ff(config, target, own)
    if d_ff is not None and abs(got - target) <= tolerance * target:
        return _with_sizes(config, d_ff=d_ff), got, None
    widened = _solve_d_model(config, target, scales_ff=reason is None or "=" in reason)
    if widened is not None:
        candidate, nearest = widened
        if abs(nearest - target) <= tolerance * target:
            return candidate, nearest, None
        reason = (f"{reason or 'no model.d_ff within the tolerance'}; nor any model.d_model "
                  f"(nearest {candidate['model']['d_model']}: "
                  f"{100 * (nearest / target - 1):+.1f} %)")
    return config, own, reason


def _match_mixer(config: dict[str, Any], target: int, own: int, tolerance: float,
                 result: dict[str, Any]) -> tuple[dict[str, Any], int, str | None]:
    """(the config, its count, why not): the mixer's own width re-solved, d_ff and d_model
    kept (``config`` itself with the reason when it does not come within the tolerance);
    names the width and its default in ``result``."""
    key = mixer_width(config)
    result.update(width=key, width_default=_width(config, key))
    candidate, got, reason = _solve_mixer(config, key, target, own)
    if candidate is not None and abs(got - target) > tolerance * target:
        reason = (f"no {key} within the tolerance (nearest {_width(candidate, key)}: "
                  f"{100 * (got / target - 1):+.1f} %)")
    if reason is not None:
        return config, own, reason
    return candidate, got, None


def mixer_width(config: dict[str, Any]) -> str:
    """``attention.<key>``: the width ``by: mixer`` re-solves, the ``param_width`` the
    attention option's class declares (ConfigError, one line, for an option without one)."""
    from xformer_bench.registry import ATTENTION

    name = config["attention"]["name"]
    key = getattr(ATTENTION.get(name), "param_width", None)
    if key is None:
        raise ConfigError(f"match_params.by=mixer: attention={name} declares no width of its "
                          "own to re-solve (its class's param_width); match it by: d_ff")
    return f"attention.{key}"


def _solve_mixer(config: dict[str, Any], key: str, target: int, own: int
                 ) -> tuple[dict[str, Any] | None, int, str | None]:
    """The affine count ``P(c) = a + b c`` in the width's channels ``c = value x d_model``
    solved for ``target``; the whole channel count nearest it that builds (a mixer refuses
    widths its heads do not split), as ``value = c / d_model``; or None and why none can."""
    d, value = config["model"]["d_model"], _width(config, key)
    doubled = count_parameters(_with_width(config, key, 2 * value))
    slope = (doubled - own) / (value * d)
    if not slope:
        return None, own, f"its parameters do not depend on {key}"
    solved = value * d + (target - own) / slope
    for channels in sorted(range(max(1, int(solved) - MIXER_SEARCH),
                                 int(solved) + MIXER_SEARCH + 1), key=lambda c: abs(c - solved)):
        candidate = _with_width(config, key, channels // d if channels % d == 0 else channels / d)
        try:
            return candidate, count_parameters(candidate), None
        except (XbenchError, ValueError, TypeError):  # a width it does not take
            continue
    return None, own, f"no {key} near {solved / d:.4g} builds"


def _solve_d_ff(config: dict[str, Any], target: int, own: int
                ) -> tuple[int | None, int, str | None]:
    """The d_ff of the affine count ``P(d_ff) = a + b d_ff`` that hits ``target``, with its
    count; or None and why no width can."""
    d_ff = config["model"]["d_ff"]
    step = max(1, d_ff // 2)
    slope = (count_parameters(_with_sizes(config, d_ff=d_ff + step)) - own) / step
    solved = round(d_ff + (target - own) / slope) if slope else None
    if solved is None:
        return None, own, "its parameters do not depend on model.d_ff"
    if solved < 1:
        return None, own, f"model.d_ff={solved} would be needed"
    return solved, count_parameters(_with_sizes(config, d_ff=solved)), None


def _solve_d_model(config: dict[str, Any], target: int, scales_ff: bool = True
                   ) -> tuple[dict[str, Any], int] | None:
    """Where the feed-forward cannot close the gap (GTrXL's gates, all-attention's persistent
    vectors, no feed-forward): d_model in steps of n_heads (widths a part refuses skipped), d_ff at the
    preset's ratio to it, then re-solved within half to twice that ratio (the shape stays the
    preset's; d_ff stays as it is when nothing depends on it, ``scales_ff`` false); the
    candidate nearest the target (None when no width builds)."""
    model = config["model"]
    step, ratio = model["n_heads"], model["d_ff"] / model["d_model"]
    best: tuple[dict[str, Any], int] | None = None
    for d_model in range(step, 2 * model["d_model"] + 1, step):
        d_ff = max(1, round(ratio * d_model)) if scales_ff else model["d_ff"]
        candidate = _with_sizes(config, d_ff=d_ff, d_model=d_model)
        try:
            got = count_parameters(candidate)
        except (XbenchError, ValueError):  # a width a part refuses (rotary: odd head width)
            continue
        d_ff, refined, _ = _solve_d_ff(candidate, target, got) if scales_ff else (None, got, "")
        near_ratio = d_ff is not None and 0.5 <= d_ff / (ratio * d_model) <= 2
        if near_ratio and abs(refined - target) < abs(got - target):
            candidate, got = _with_sizes(candidate, d_ff=d_ff), refined
        if best is None or abs(got - target) < abs(best[1] - target):
            best = (candidate, got)
        if got > target and best[1] != got:
            break  # counts grow with d_model: the nearest is behind
    return best


def describe(result: dict[str, Any]) -> str:
    """One line for the terminal: what the match did."""
    gap = f"{100 * result['gap']:+.1f} %"
    if result["status"] == "matched":
        changed = [f"model.{key} {result[key + '_default']} -> {result[key]}"
                   for key in ("d_model", "d_ff")
                   if result.get(key + "_default", result.get(key)) != result.get(key)]
        if result.get("width_value", result.get("width_default")) != result.get("width_default"):
            changed.append(f"{result['width']} {result['width_default']} -> "
                           f"{result['width_value']}")
        what = ", ".join(changed) or f"{result.get('width', 'model.d_ff')} unchanged"
        return f"params matched to {result['reference_params']:,} ({what}, {gap})"
    why = f": {result['reason']}" if "reason" in result else ""
    return f"params NOT matched to {result['reference_params']:,} ({gap}{why})"


class Seq2SeqData(NamedTuple):
    """What the encoder-decoder reads of a translation datamodule (a nominal vocabulary)."""

    vocab_size: int = NOMINAL_VOCAB
    pad_id: int = 0


SEQ2SEQ_DATA = Seq2SeqData()


def count_parameters(config: dict[str, Any], seq2seq: Seq2SeqData | None = None) -> int:
    """The model's parameter count for ``config``, built without allocating its weights: the
    decoder-only LM, or with ``seq2seq`` the encoder-decoder over that data."""
    from xformer_bench.models.build import build_model, build_seq2seq

    def build():
        return (build_model(config, NOMINAL_VOCAB) if seq2seq is None
                else build_seq2seq(config, seq2seq))

    try:
        with torch.device("meta"):
            return build().num_parameters()
    except XbenchError:
        raise
    except (RuntimeError, NotImplementedError):  # construction read a meta tensor's value
        return build().num_parameters()


def reference_overrides(overrides: list[str], reference: dict[str, str]) -> list[str]:
    """The command line of the reference: ``overrides`` with the choice of each group in
    ``reference`` replaced and that group's option keys dropped (``model.*`` sizes stay)."""
    def target(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    def replaced(override: str) -> bool:
        key = target(override)
        group = key.split(".", 1)[0]
        return group in reference and (key == group or group != "model")

    return [o for o in overrides if not replaced(o)] + [f"{g}={o}" for g, o in reference.items()]


def _read_request(request: dict[str, Any]) -> tuple[dict[str, str], float, str]:
    reference, by = request.get("reference") or {}, request.get("by") or BY[0]
    if by not in BY:
        raise ConfigError(f"match_params.by={by} is not one of: {', '.join(BY)}")
    if not reference or "tolerance" not in request:
        raise ConfigError("match_params needs reference: {GROUP: OPTION} and tolerance: "
                          "e.g. match_params={reference: {attention: full}, tolerance: 0.02}")
    for group, option in reference.items():
        if find_config(group, str(option)) is None:
            raise ConfigError(f"match_params.reference {group}={option} is not an option of "
                              f"conf/{group}/")
    return reference, float(request["tolerance"]), by


def _with_sizes(config: dict[str, Any], d_ff: int, d_model: int | None = None) -> dict[str, Any]:
    resized = copy.deepcopy(config)
    resized["model"]["d_ff"] = d_ff
    if d_model is not None:
        resized["model"]["d_model"] = d_model
    return resized


def _width(config: dict[str, Any], key: str) -> Any:
    group, name = key.split(".")
    return config[group][name]


def _with_width(config: dict[str, Any], key: str, value: float) -> dict[str, Any]:
    resized = copy.deepcopy(config)
    group, name = key.split(".")
    resized[group][name] = value
    return resized
