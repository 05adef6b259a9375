"""Parameter matching: re-solve ``model.d_ff`` so a variant has the parameter count of a
reference configuration, as comparisons of modifications do (Narang et al. 2021 shrink the
GLU variants' hidden width; Shazeer 2019 widens the feed-forward of multi-query attention to
make up for its smaller key/value projections).

A study asks for it with ``match_params: {reference: {attention: full}, tolerance: 0.02}``
(or ``{model: vanilla}`` for system presets).  Before the run (and before ``skip_completed``
looks for it, since d_ff is part of what it trains), :func:`match_params` composes the
reference -- the run's own command line with the named groups' choices replaced, and their
option keys (``attention.window=...``) dropped; model sizes (``model.d_model=...``) stay --
builds it and the variant at two widths, solves the affine count ``P(d_ff) = a + b d_ff`` for
the reference's count, and rounds.  A variant already within the tolerance keeps its
d_ff (and so its run id).  Where the feed-forward cannot make up the difference -- no
feed-forward, or the width would have to be below 1 -- the run goes on at its own defaults
and says so; the outcome is kept in ``config["match_params"]["result"]``, which the record
stores with the config.

Counting builds models on the meta device (no memory, no initialisation); a part whose
construction reads tensor values (Performer's orthogonal features) is built on the CPU.
The embedding and output layer are the same in reference and variant, so the solved width
does not depend on the vocabulary: a nominal byte vocabulary is used.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from xformer_bench.config import CONF_DIR, compose_config
from xformer_bench.errors import ConfigError, XbenchError

NOMINAL_VOCAB = 256


def match_params(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``config`` (composed from ``overrides``) with ``model.d_ff`` solved for the requested
    parameter count (a copy; the input unchanged), or ``config`` itself when nothing is
    requested."""
    request = config.get("match_params")
    if not request:
        return config
    reference, tolerance = _read_request(request)
    target = count_parameters(compose_config(*reference_overrides(overrides, reference)))
    d_ff = config["model"]["d_ff"]
    own = count_parameters(config)
    result: dict[str, Any] = {"reference_params": target, "d_ff_default": d_ff}
    if abs(own - target) <= tolerance * target:
        result.update(status="matched", d_ff=d_ff, gap=own / target - 1)
    else:
        step = max(1, d_ff // 2)
        slope = (count_parameters(_with_d_ff(config, d_ff + step)) - own) / step
        solved = round(d_ff + (target - own) / slope) if slope else None
        if solved is None or solved < 1:
            need = ("its parameters do not depend on model.d_ff" if solved is None
                    else f"model.d_ff={solved} would be needed")
            result.update(status="unmatched", d_ff=d_ff, gap=own / target - 1, reason=need)
        else:
            got = count_parameters(_with_d_ff(config, solved))
            within = abs(got - target) <= tolerance * target
            result.update(status="matched" if within else "unmatched", d_ff=solved,
                          gap=got / target - 1)
    matched = _with_d_ff(config, result["d_ff"] if result["status"] == "matched" else d_ff)
    matched["match_params"] = {**request, "result": result}
    return matched


def describe(result: dict[str, Any]) -> str:
    """One line for the terminal: what the match did."""
    gap = f"{100 * result['gap']:+.1f} %"
    if result["status"] == "matched":
        changed = (f"model.d_ff {result['d_ff_default']} -> {result['d_ff']}"
                   if result["d_ff"] != result["d_ff_default"] else "model.d_ff unchanged")
        return f"params matched to {result['reference_params']:,} ({changed}, {gap})"
    why = f": {result['reason']}" if "reason" in result else ""
    return f"params NOT matched to {result['reference_params']:,} ({gap}{why})"


def count_parameters(config: dict[str, Any]) -> int:
    """The model's parameter count for ``config``, built without allocating its weights."""
    from xformer_bench.models.build import build_model

    try:
        with torch.device("meta"):
            return build_model(config, NOMINAL_VOCAB).num_parameters()
    except XbenchError:
        raise
    except (RuntimeError, NotImplementedError):  # construction read a meta tensor's value
        return build_model(config, NOMINAL_VOCAB).num_parameters()


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


def _read_request(request: dict[str, Any]) -> tuple[dict[str, str], float]:
    reference = request.get("reference") or {}
    if not reference or "tolerance" not in request:
        raise ConfigError("match_params needs reference: {GROUP: OPTION} and tolerance: "
                          "e.g. match_params={reference: {attention: full}, tolerance: 0.02}")
    for group, option in reference.items():
        if not (CONF_DIR / group / f"{option}.yaml").is_file():
            raise ConfigError(f"match_params.reference {group}={option} is not an option of "
                              f"conf/{group}/")
    return reference, float(request["tolerance"])


def _with_d_ff(config: dict[str, Any], d_ff: int) -> dict[str, Any]:
    widened = copy.deepcopy(config)
    widened["model"]["d_ff"] = d_ff
    return widened
